"""CosyVoice v1 modes: what each needs from a request and how it builds the LLM prefix and the
flow conditioning (architecture sheet section 3.8). Must not import torch.

A mode is one :class:`Mode` entry in :data:`MODES` (what ``SynthesisRequest.validated``
checks: speaker, prompt audio/text, instruction, source audio) and its two builders in
:data:`BUILDERS`: ``llm_prefix(request, tokenize) -> LLMPrefix`` and ``flow_conditioning(request)
-> FlowConditioning``; both get the validated request (its ``voice`` a
:class:`cosyvino.voices.Voice`: a built-in speaker, or a prompt bundle made from
``prompt_audio`` or registered; ``prompt_text`` the effective transcript) and ``tokenize`` is
the family frontend's text tokenizer (str -> list of int). The program calls them once per
request; nothing else changes for a new mode.

What each mode feeds the models (sheet 3.8):

========================  ================================  =====================  ==========
mode                      LLM prefix                        flow prompt            flow spk
========================  ================================  =====================  ==========
``zero_shot``             SPK(prompt) ⧺ TEXT(prompt_text ⧺  prompt tokens + mel    prompt
                          text) ⧺ TASK ⧺ prompt tokens
``cross_lingual``         SPK(prompt) ⧺ TEXT(text) ⧺ TASK   prompt tokens + mel    prompt
``vc``                    (no LLM: source speech tokens)    prompt tokens + mel    prompt
``instruct``              no SPK ⧺ TEXT(instruction +       none                   speaker
                          marker ⧺ text) ⧺ TASK
``sft``                   SPK(speaker) ⧺ TEXT(text) ⧺ TASK  none                   speaker
========================  ================================  =====================  ==========

The order of :data:`MODES` is the order in which a request that names no mode is matched (the
first whose needs it meets and that takes every input given): a source recording -> ``vc``; a
prompt (``prompt_audio`` or a registered voice) with a transcript -> ``zero_shot``, without ->
``cross_lingual``; an instruction -> ``instruct``; a built-in speaker alone -> ``sft``.

Which modes a checkpoint offers (:func:`modes_for`): the official runtime tells an Instruct
model by its directory name (``'-Instruct' in model_dir``), so do we (the basename, case
insensitive, or the parent's for a converted dir): ``instruct`` only there; ``sft`` wherever
``spk2info.pt`` has speakers; the prompt modes on a base model (a dir named neither ``-SFT``
nor ``-Instruct``: CosyVoice-300M or a ``make-model`` dir) whose prompt models
(``campplus.onnx``, ``speech_tokenizer_v1.onnx``) are there. ``Synthesizer(modes=...)``
overrides the list (e.g. a renamed Instruct dir).

Instruct end marker (sheet 3.3 and open question 4): the v1-era frontend appended the literal
``<endofprompt>`` (BPE 27, 521, 2670, 28722, 662, 29) to the normalized instruction; upstream
HEAD appends nothing and its example ends the instruction with ``<|endofprompt|>`` (BPE 27, 91,
521, 2670, 28722, 662, 91, 29). Neither is a special token for the v1 tokenizer. We append
:data:`INSTRUCT_END_MARKER` = ``<endofprompt>``: the code the v1 Instruct weights were released
(and trained) with used it, while HEAD's spelling comes from CosyVoice2, whose tokenizer has it
as a special token. An instruction that already ends with either spelling keeps its own (no
second marker), so HEAD-style instructions work unchanged.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Callable

import numpy as np

from cosyvino.errors import InputError

from ..base import Mode

ZERO_SHOT = Mode("zero_shot", "clone the voice of a prompt recording with its transcript",
                 needs_speaker=False, needs_prompt_audio=True, needs_prompt_text=True)
CROSS_LINGUAL = Mode("cross_lingual", "the voice of a prompt recording, any language (no "
                     "transcript; language tags like <|en|> in the text)",
                     needs_speaker=False, needs_prompt_audio=True)
VC = Mode("vc", "voice conversion: a source recording spoken again in the prompt's voice",
          needs_speaker=False, needs_prompt_audio=True, needs_source_audio=True)
INSTRUCT = Mode("instruct", "a built-in speaker following an instruction (Instruct model)",
                needs_speaker=True, needs_instruction=True)
SFT = Mode("sft", "a built-in speaker (spk2info.pt) of an SFT model", needs_speaker=True)

#: every v1 mode, in matching order (module docstring); a checkpoint offers :func:`modes_for`
MODES = {m.name: m for m in (ZERO_SHOT, CROSS_LINGUAL, VC, INSTRUCT, SFT)}
#: modes that need the prompt models (a prompt bundle or source tokens)
PROMPT_MODES = (ZERO_SHOT.name, CROSS_LINGUAL.name, VC.name)

#: appended to the normalized instruction (module docstring: the v1-era spelling)
INSTRUCT_END_MARKER = "<endofprompt>"
#: the spellings an instruction may already end with (v1-era, upstream HEAD)
INSTRUCT_END_MARKERS = ("<endofprompt>", "<|endofprompt|>")
#: the two prompt-model files (sheet 1)
PROMPT_MODEL_FILES = ("campplus.onnx", "speech_tokenizer_v1.onnx")


@dataclass(frozen=True)
class LLMPrefix:
    """What goes before the generated speech tokens:
    ``[SOS][SPK][TEXT_ENC(prompt_text ⧺ text)][TASK][PROMPT_SPEECH]``.

    Attributes:
        embedding: float32 [1, 192] for the SPK slot (None: no slot, instruct mode).
        prompt_text_token: int64 [1, L] tokens encoded before the text (a prompt transcript,
            or an instruction; None: none).
        prompt_speech_token: int64 [1, N] prompt speech tokens (None: none).
    """

    embedding: np.ndarray | None
    prompt_text_token: np.ndarray | None = None
    prompt_speech_token: np.ndarray | None = None


@dataclass(frozen=True)
class FlowConditioning:
    """The flow's speaker and prompt: embedding float32 [1, 192], prompt tokens int64 [N1] and
    prompt mel float32 [M1, 80] (both None without a prompt)."""

    embedding: np.ndarray
    prompt_token: np.ndarray | None = None
    prompt_feat: np.ndarray | None = None


Tokenize = Callable[[str], list]


def _normalized(text: str, what: str) -> str:
    """``text`` normalized without splitting (sheet 3.2: prompt and instruct text)."""
    from cosyvino.errors import EmptyTextError
    from cosyvino.frontend.normalize import normalize

    try:
        out = normalize(text).strip() if text.strip() else ""
    except EmptyTextError:
        out = ""
    if not out:
        raise InputError(f"{what} has nothing speakable (empty, or punctuation only)")
    return out


def _tokens(ids: list, what: str) -> np.ndarray:
    if not ids:
        raise InputError(f"{what} has no text tokens")
    return np.asarray(ids, dtype=np.int64).reshape(1, -1)


def instruction_text(instruction: str) -> str:
    """The instruction as the LLM reads it: normalized, then :data:`INSTRUCT_END_MARKER`
    appended, unless it already ends with one of :data:`INSTRUCT_END_MARKERS` (kept as given;
    the text before it is normalized). Raises InputError for an empty instruction."""
    body, marker = instruction.rstrip(), INSTRUCT_END_MARKER
    for m in INSTRUCT_END_MARKERS:
        if body.endswith(m):
            body, marker = body[: -len(m)], m
            break
    return _normalized(body, "instruction") + marker


def _prompt_tokens(request) -> np.ndarray:
    return np.asarray(request.voice.prompt_speech_tokens, dtype=np.int64).reshape(1, -1)


def _zero_shot_prefix(request, tokenize: Tokenize) -> LLMPrefix:
    text = _normalized(request.prompt_text, "prompt_text")
    return LLMPrefix(embedding=request.voice.embedding,
                     prompt_text_token=_tokens(tokenize(text), "prompt_text"),
                     prompt_speech_token=_prompt_tokens(request))


def _speaker_prefix(request, tokenize: Tokenize) -> LLMPrefix:  # sft, cross_lingual
    return LLMPrefix(embedding=request.voice.embedding)


def _instruct_prefix(request, tokenize: Tokenize) -> LLMPrefix:
    return LLMPrefix(embedding=None,  # dropped on purpose (sheet 3.8)
                     prompt_text_token=_tokens(tokenize(instruction_text(request.instruction)),
                                               "instruction"))


def _no_llm(request, tokenize: Tokenize) -> LLMPrefix:  # vc: the source tokens skip the LLM
    return LLMPrefix(embedding=None)


def _prompt_conditioning(request) -> FlowConditioning:
    voice = request.voice
    return FlowConditioning(embedding=voice.embedding,
                            prompt_token=np.asarray(voice.prompt_speech_tokens, np.int64),
                            prompt_feat=np.asarray(voice.prompt_mel, np.float32))


def _speaker_conditioning(request) -> FlowConditioning:
    return FlowConditioning(embedding=request.voice.embedding)


#: mode name -> (llm_prefix builder, flow_conditioning builder)
BUILDERS = {
    ZERO_SHOT.name: (_zero_shot_prefix, _prompt_conditioning),
    CROSS_LINGUAL.name: (_speaker_prefix, _prompt_conditioning),
    VC.name: (_no_llm, _prompt_conditioning),
    INSTRUCT.name: (_instruct_prefix, _speaker_conditioning),
    SFT.name: (_speaker_prefix, _speaker_conditioning),
}


def llm_prefix(request, tokenize: Tokenize) -> LLMPrefix:
    """The LLM prefix of a validated request in its mode. Raises InputError for a prompt text
    or instruction with nothing left after normalization."""
    return BUILDERS[request.mode][0](request, tokenize)


def flow_conditioning(request) -> FlowConditioning:
    """The flow conditioning of a validated request in its mode."""
    return BUILDERS[request.mode][1](request)


# ---- modes per checkpoint ----------------------------------------------------------------------
def _named(name: str, word: str) -> bool:
    return re.search(rf"(^|[-_. ]){word}([-_. ]|$)", name, flags=re.IGNORECASE) is not None


def checkpoint_kind(model_dir: str | os.PathLike | None) -> str:
    """``"instruct"``, ``"sft"`` or ``"base"`` from the dir name (the official rule:
    ``'-Instruct' in model_dir``; here ``instruct`` / ``sft`` as a dash-separated word of the
    basename, any case; for a converted dir, which holds ``manifest.json``, of its parent's
    too). None or any other name: ``"base"``."""
    if model_dir is None:
        return "base"
    path = os.path.abspath(os.fspath(model_dir))
    names = [os.path.basename(path)]
    if os.path.isfile(os.path.join(path, "manifest.json")):
        names.append(os.path.basename(os.path.dirname(path)))
    for kind in ("instruct", "sft"):
        if any(_named(n, kind) for n in names):
            return kind
    return "base"


def has_prompt_models(model_dir: str | os.PathLike | None) -> bool:
    """Both prompt-model files are in ``model_dir``."""
    return model_dir is not None and all(
        os.path.isfile(os.path.join(os.fspath(model_dir), f)) for f in PROMPT_MODEL_FILES)


def unavailable_reason(model_dir, speakers, name: str) -> str | None:
    """Why the checkpoint at ``model_dir`` (built-in ``speakers``) does not offer mode
    ``name`` (None: it does; module docstring)."""
    kind = checkpoint_kind(model_dir)
    if name in PROMPT_MODES:
        if kind != "base":
            what = "an SFT" if kind == "sft" else "an Instruct"
            return (f"voice cloning modes run on the base CosyVoice-300M model; this is "
                    f"{what} model (by its dir name)")
        if not has_prompt_models(model_dir):
            return (f"the prompt models ({', '.join(PROMPT_MODEL_FILES)}) are not in the model "
                    "dir")
        return None
    if name == INSTRUCT.name:
        if kind != "instruct":
            return "instruct needs a CosyVoice-300M-Instruct model (a dir named *-Instruct)"
        return None if speakers else "the model has no built-in speakers (spk2info.pt)"
    if name == SFT.name:
        return None if speakers else "the model has no built-in speakers (spk2info.pt)"
    return None


def modes_for(model_dir, speakers) -> dict:
    """The modes the checkpoint at ``model_dir`` with built-in ``speakers`` offers, in
    :data:`MODES` order (modes this module does not know are kept)."""
    return {n: m for n, m in MODES.items() if unavailable_reason(model_dir, speakers, n) is None}
