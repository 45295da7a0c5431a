"""The ``<|endofprompt|>`` rule of CosyVoice3 (sheet v3 §3.4, §4.3, §9).

Facts: CosyVoice3 was trained with a system / instruction part that ends with
``<|endofprompt|>`` (id 151646) right after SOS (``[SOS, instruct..., text, TASK, speech...]``),
and upstream ``CosyVoice3LM.inference`` asserts that 151646 occurs in ``prompt_text ⧺ tts_text``
(an ``AssertionError`` otherwise). Every official example supplies it: zero-shot prompt text
``You are a helpful assistant.<|endofprompt|>`` + transcript; cross-lingual tts text with that
prefix; instruct2 ``You are a helpful assistant. <instruction><|endofprompt|>``.

What cosyvino does (:func:`llm_text_ids`): with ``policy="add"`` (default) a request whose
prompt text and text both lack the marker gets the conventional prefix
``You are a helpful assistant.<|endofprompt|>`` put in front of the prompt text, so plain text
and voices registered without the prefix (the tiny-e ``alice`` / ``bob`` transcripts have none)
work. The LLM input is then exactly the one the official cross-lingual convention builds
(prompt text and text are concatenated in the same place), but the prefix is counted as prompt,
not as tts text, so it does not enter min_len / max_len (upstream counts a prefix written into
the tts text; cosyvino does too when the caller writes it there). With ``policy="require"``
such a request is an :class:`~cosyvino.errors.InputError` (upstream's assertion, typed).
Instructions go through :func:`instruct_prompt`. Must not import torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice23.tokenizer import END_OF_PROMPT, END_OF_PROMPT_ID

#: the system sentence of every official CosyVoice3 example (``example.py``, ``instruct_list``)
SYSTEM_PROMPT = "You are a helpful assistant."
#: what cosyvino puts in front of the prompt text when neither side has the marker
DEFAULT_PREFIX = SYSTEM_PROMPT + END_OF_PROMPT

#: the ways to treat a request without the marker (module docstring)
EndOfPromptPolicy = Literal["add", "require"]
POLICIES: tuple[str, ...] = ("add", "require")


def has_end_of_prompt(ids: Sequence[int]) -> bool:
    """Whether token 151646 (``<|endofprompt|>``) is among ``ids``."""
    return END_OF_PROMPT_ID in [int(i) for i in ids]


def llm_text_ids(text_ids: Sequence[int], prompt_text_ids: Sequence[int] = (), *,
                 prefix_ids: Sequence[int], policy: EndOfPromptPolicy = "add"
                 ) -> tuple[list[int], list[int]]:
    """``(prompt_text_ids, text_ids)`` to build the LLM prefix from, the marker rule applied.

    Args:
        text_ids: the tts text's Qwen2 ids (what min_len / max_len count).
        prompt_text_ids: the zero-shot transcript or instruct text ids (may be empty).
        prefix_ids: the ids of :data:`DEFAULT_PREFIX` (``tokenizer.encode(DEFAULT_PREFIX)``;
            must contain 151646).
        policy: ``"add"`` or ``"require"`` (module docstring).
    Returns:
        The prompt ids (with ``prefix_ids`` in front when the marker was missing on both sides
        and the policy is ``"add"``) and the text ids, unchanged.
    Raises:
        InputError: ``policy="require"`` and neither side holds ``<|endofprompt|>``; an unknown
            policy; ``prefix_ids`` without the marker.
    """
    if policy not in POLICIES:
        raise InputError(f"the <|endofprompt|> policy must be one of {', '.join(POLICIES)}, got "
                         f"{policy!r}")
    prompt, text = [int(i) for i in prompt_text_ids], [int(i) for i in text_ids]
    if has_end_of_prompt(prompt) or has_end_of_prompt(text):
        return prompt, text
    if policy == "require":
        raise InputError(
            f"CosyVoice3 needs {END_OF_PROMPT} in the prompt text or the text: the model reads a "
            f"system or instruction part ending with it before the text (e.g. prompt text "
            f"'{DEFAULT_PREFIX}' + the transcript of the prompt audio, or "
            f"'{SYSTEM_PROMPT} <instruction>{END_OF_PROMPT}'); neither has it")
    if not has_end_of_prompt(prefix_ids):
        raise InputError(f"the default prefix ids {list(prefix_ids)} lack {END_OF_PROMPT} "
                         f"({END_OF_PROMPT_ID}); is this a CosyVoice3 tokenizer?")
    return [int(i) for i in prefix_ids] + prompt, text


def instruct_prompt(instruction: str) -> str:
    """The instruct2 prompt text for ``instruction`` in the official form
    ``You are a helpful assistant. <instruction><|endofprompt|>`` (``instruct_list`` of upstream
    ``cosyvoice/utils/common.py``, sheet v3 §3.4). An instruction that already holds the marker is
    returned unchanged (it is the caller's complete system part).

    Raises:
        InputError: an empty instruction.
    """
    if END_OF_PROMPT in instruction:
        return instruction
    body = instruction.strip()
    if not body:
        raise InputError("the instruction is empty")
    return f"{SYSTEM_PROMPT} {body}{END_OF_PROMPT}"
