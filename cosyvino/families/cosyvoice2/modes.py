"""CosyVoice2 modes: what each needs from a request and what it feeds the LLM and the flow
(sheet v2 §3.8). The mode definitions, the flow conditioning and the prompt-encoder stand-in are
shared with CosyVoice3 (:mod:`cosyvino.families.cosyvoice23.modes`); the LLM side is v2's.
Must not import torch.

========================  =====================================  ======================  =======
mode                      LLM text (before the tts text) /       flow prompt             flow
                          LLM prompt speech tokens                                       spk
========================  =====================================  ======================  =======
``zero_shot``             prompt transcript / prompt tokens      prompt tokens + mel     prompt
``cross_lingual``         none / none                            prompt tokens + mel     prompt
``vc``                    (no LLM: the source speech tokens)     prompt tokens + mel     prompt
``instruct2``             instruction (raw) / none               prompt tokens + mel     prompt
``sft``                   none / none                            none                    speaker
========================  =====================================  ======================  =======

A zero-shot transcript is normalized without splitting (sheet v2 §3.2); a voice from the model's
``spk2info.pt`` brings its transcript as the official token ids, which are used as they are
unless the request gives another ``prompt_text``. The instruction of ``instruct2`` is NOT
normalized (sheet v2 §3.2) and must end with ``<|endofprompt|>`` (upstream's example does;
appended when missing, as the token the LLM was trained to see before the tts text).

Prompt voices come from a registered voice, from the model's ``spk2info.pt`` bundles (tiny-c:
``alice``, ``bob``) or from ``prompt_audio`` through the prompt models (``campplus.onnx``,
``speech_tokenizer_v2.onnx``; :class:`~.prompt_models.PromptEncoder`). A voice made from a
recording keeps its uncut prompt; the LLM prefix and :func:`flow_conditioning` align it per mode
(:func:`~cosyvino.families.cosyvoice23.modes.aligned_prompt`, sheet v2 §3.6). Without the prompt
models the prompt modes still run on stored voices; recordings are refused
(:func:`prompt_models_reason`).
"""

from __future__ import annotations

from collections.abc import Callable

from cosyvino.errors import InputError

from ..cosyvoice23 import modes as shared
from ..cosyvoice23.modes import (  # noqa: F401  (the v2 names of the shared modes)
    CROSS_LINGUAL,
    INSTRUCT2,
    MODES,
    SFT,
    VC,
    ZERO_SHOT,
    LLMPrefix,
    Tokenize,
    UnavailablePromptEncoder,
    flow_conditioning,
    modes_for,
    unavailable_reason,
)
from ..cosyvoice23.tokenizer import END_OF_PROMPT

#: the prompt models of an official CosyVoice2 dir (sheet v2 §1, §3.4, §3.5)
PROMPT_MODEL_FILES = ("campplus.onnx", "speech_tokenizer_v2.onnx")


def instruction_text(instruction: str) -> str:
    """The instruction as the LLM reads it: as given (not normalized, sheet v2 §3.2), with
    ``<|endofprompt|>`` appended unless it already ends with it. Raises InputError when only
    the marker (or nothing) is left."""
    body = instruction.rstrip()
    body = body.removesuffix(END_OF_PROMPT)
    if not body.strip():
        raise InputError("instruction is empty")
    return body + END_OF_PROMPT


def llm_prefix(request, tokenize: Tokenize, normalize: Callable[[str], str]) -> LLMPrefix:
    """The LLM prefix of a validated request in its v2 mode (module docstring). ``tokenize``:
    the Qwen tokenizer (str -> ids), ``normalize``: the frontend's text normalization without
    splitting. Raises InputError for a transcript or instruction with nothing speakable."""
    mode = request.mode
    if mode == ZERO_SHOT.name:
        return LLMPrefix(shared.prompt_text_ids(request, tokenize, normalize),
                         shared.prompt_speech(request))
    if mode == INSTRUCT2.name:
        return LLMPrefix(shared.text_ids(tokenize(instruction_text(request.instruction)),
                                         "instruction"))
    return LLMPrefix()  # sft, cross_lingual; vc runs no LLM


def missing_prompt_models(model_dir) -> list[str]:
    """The prompt-model files of :data:`PROMPT_MODEL_FILES` not in ``model_dir``."""
    return shared.missing_prompt_models(model_dir, PROMPT_MODEL_FILES)


def prompt_models_reason(model_dir) -> str:
    """Why a recording (``prompt_audio``, ``source_audio``) cannot be turned into a voice or
    speech tokens for CosyVoice2 here: the prompt-model files missing from ``model_dir`` (one
    sentence naming them; all of them when none is missing, as the encoder is then the real
    one and this is not asked)."""
    missing = missing_prompt_models(model_dir) or list(PROMPT_MODEL_FILES)
    return shared.missing_models_reason(model_dir, "CosyVoice2", missing)
