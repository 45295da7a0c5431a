"""CosyVoice2/3 modes: what each needs from a request and what it feeds the flow, the parts both
families share (sheet v2 §3.8; v3 §3.1: "mode plumbing is the v2 code"). Must not import torch.

========================  ======================  =======
mode                      flow prompt             flow spk
========================  ======================  =======
``zero_shot``             prompt tokens + mel     prompt
``cross_lingual``         prompt tokens + mel     prompt
``vc``                    prompt tokens + mel     prompt
``instruct2``             prompt tokens + mel     prompt
``sft``                   none                    speaker
========================  ======================  =======

What goes to the LLM differs per family (v2: :mod:`cosyvino.families.cosyvoice2.modes`, v3 adds
its ``<|endofprompt|>`` system-prompt convention: :mod:`cosyvino.families.cosyvoice3.modes`);
the helpers for it are here. Neither LLM gets a speaker embedding (sheet v2 §3.8 note 1).

Prompt voices come from a registered voice, from the model's ``spk2info.pt`` bundles
(:class:`~.voices.PromptVoice`) or from ``prompt_audio`` through the prompt models
(``campplus.onnx`` and the family's speech tokenizer; CosyVoice2:
:class:`cosyvino.families.cosyvoice2.prompt_models.PromptEncoder`, not run for CosyVoice3 yet).
A voice made from a recording keeps its uncut prompt; :func:`prompt_speech` and
:func:`flow_conditioning` align it per mode (:func:`~.prompt_align.align_prompt`, sheet v2 §3.6,
§3.8: the LLM gets ``tokens(wav)[:L]``, the same L as the flow). Without the prompt models the
prompt modes still run on stored voices; recordings are refused (:func:`prompt_models_reason`,
:class:`UnavailablePromptEncoder`).

Matching order of a request without a mode (:data:`MODES`): a source -> ``vc``; a prompt voice
with a transcript -> ``zero_shot``, without -> ``cross_lingual``; a prompt voice with an
instruction -> ``instruct2``; a speaker alone -> ``sft``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from cosyvino.errors import EmptyTextError, InputError, PromptModelsUnavailableError

from ..base import Mode
from ..cosyvoice1.modes import FlowConditioning
from .prompt_align import PROMPT_MEL, align_prompt, prompt_rate_reason
from .voices import PromptVoice

ZERO_SHOT = Mode("zero_shot", "clone the voice of a prompt (recording or stored voice) with its "
                 "transcript", needs_speaker=False, needs_prompt_audio=True,
                 needs_prompt_text=True)
CROSS_LINGUAL = Mode("cross_lingual", "the voice of a prompt, any language (no transcript)",
                     needs_speaker=False, needs_prompt_audio=True)
VC = Mode("vc", "voice conversion: source speech tokens spoken in the prompt's voice",
          needs_speaker=False, needs_prompt_audio=True, needs_source_audio=True)
INSTRUCT2 = Mode("instruct2", "a prompt voice following an instruction (e.g. a dialect or an "
                 "emotion), ended by <|endofprompt|>", needs_speaker=False,
                 needs_prompt_audio=True, needs_instruction=True)
SFT = Mode("sft", "a built-in SFT speaker (spk2info.pt entry with an embedding)",
           needs_speaker=True)

#: every CosyVoice2/3 mode, in matching order (module docstring)
MODES = {m.name: m for m in (ZERO_SHOT, CROSS_LINGUAL, VC, INSTRUCT2, SFT)}


@dataclass(frozen=True)
class LLMPrefix:
    """What goes before the tts text and after it in the LLM input
    (``[SOS][E_text(text_before ⧺ tts)][TASK][E_speech(prompt_speech)]``, sheet v2 §4.4).

    Attributes:
        text_before: int64 [1, L] Qwen ids before the tts text (prompt transcript or
            instruction; None: none).
        prompt_speech_token: int64 [1, N] LLM prompt speech tokens (None: none).
    """

    text_before: np.ndarray | None = None
    prompt_speech_token: np.ndarray | None = None


Tokenize = Callable[[str], list]


def text_ids(ids, what: str) -> np.ndarray:
    if len(ids) == 0:
        raise InputError(f"{what} has no text tokens")
    return np.asarray(ids, dtype=np.int64).reshape(1, -1)


def normalized_text(text: str, what: str, normalize: Callable[[str], str]) -> str:
    try:
        out = normalize(text).strip() if text.strip() else ""
    except EmptyTextError:
        out = ""
    if not out:
        raise InputError(f"{what} has nothing speakable (empty, or punctuation only)")
    return out


def prompt_speech(request) -> np.ndarray:
    """The LLM prompt speech tokens int64 [1, L]: a spk2info bundle's LLM tokens as stored
    (upstream aligned them when it made the bundle); else the voice's tokens aligned with its
    mel (sheet v2 §3.8: the LLM gets ``tokens(wav)[:L]``, the same L as the flow). Raises
    InputError (a prompt under one token)."""
    voice = request.voice
    if isinstance(voice, PromptVoice) and voice.llm_prompt_speech_tokens is not None:
        return np.asarray(voice.llm_prompt_speech_tokens, np.int64).reshape(1, -1)
    tokens, _ = aligned_prompt(voice)
    return tokens.reshape(1, -1)


def aligned_prompt(voice) -> tuple[np.ndarray, np.ndarray]:
    """``voice``'s prompt cut by :func:`~.prompt_align.align_prompt`: (tokens int64 [L], mel
    float32 [2L, bins]). Raises InputError naming the voice (a prompt under one token)."""
    try:
        return align_prompt(voice.prompt_speech_tokens, voice.prompt_mel)
    except InputError as e:
        raise InputError(f"voice {voice.name!r}: {e}") from None


def prompt_text_ids(request, tokenize: Tokenize, normalize: Callable[[str], str]) -> np.ndarray:
    """The zero-shot transcript as Qwen ids int64 [1, L]: a stored voice's official ids
    (:class:`~.voices.PromptVoice`) unless the request gives another ``prompt_text``, else the
    normalized transcript (sheet v2 §3.2: normalized without splitting) tokenized. Raises
    InputError (nothing speakable)."""
    voice = request.voice
    if isinstance(voice, PromptVoice) and voice.prompt_text_tokens is not None \
            and request.prompt_text == voice.prompt_text:
        return np.asarray(voice.prompt_text_tokens, np.int64).reshape(1, -1)
    text = normalized_text(request.prompt_text, "prompt_text", normalize)
    return text_ids(tokenize(text), "prompt_text")


def flow_conditioning(request) -> FlowConditioning:
    """The flow speaker embedding and prompt (tokens int64 [N], mel float32 [2N, 80]) of a
    validated request: the voice's prompt for every mode but ``sft``. The prompt is aligned
    as upstream (sheet v2 §3.6: ``L = min(mel frames // 2, tokens)``, mel cut to 2L frames)
    except for ``vc`` (note 3 of §3.8)."""
    voice = request.voice
    if request.mode == SFT.name or not voice.has_prompt:
        return FlowConditioning(embedding=voice.embedding)
    if request.mode == VC.name:
        tokens = np.asarray(voice.prompt_speech_tokens, np.int64).reshape(-1)
        mel = np.asarray(voice.prompt_mel, np.float32)
    else:
        tokens, mel = aligned_prompt(voice)
    return FlowConditioning(embedding=voice.embedding, prompt_token=tokens, prompt_feat=mel)


# ---- modes per checkpoint ----------------------------------------------------------------------

def missing_prompt_models(model_dir, files: Sequence[str]) -> list[str]:
    """The prompt-model ``files`` not in ``model_dir`` (all of them when it is None)."""
    if model_dir is None:
        return list(files)
    return [f for f in files if not os.path.isfile(os.path.join(model_dir, f))]


def missing_models_reason(model_dir, title: str, missing: Sequence[str]) -> str:
    """Why family ``title`` takes no recordings (``prompt_audio``, ``source_audio``) from
    ``model_dir``: the ``missing`` prompt-model files (one sentence naming them)."""
    where = "in the model dir" if model_dir is not None else "(no model dir)"
    return (f"{title} prompt recordings need the prompt models {', '.join(missing)} "
            f"{where}, which are missing; use a registered voice or one of the model's "
            "spk2info.pt voices instead")


def prompt_models_reason(model_dir, title: str, files: Sequence[str]) -> str:
    """Why a recording (``prompt_audio``, ``source_audio``) cannot be turned into a voice or
    speech tokens for family ``title`` here, a family whose prompt models cosyvino does not run
    (CosyVoice3): the missing prompt-model ``files`` (:func:`missing_models_reason`), or that
    they are not run (one sentence naming the files)."""
    missing = missing_prompt_models(model_dir, files)
    if missing:
        return missing_models_reason(model_dir, title, missing)
    return (f"cosyvino does not run the {title} prompt models ({', '.join(files)}) yet; use a "
            "registered voice or one of the model's spk2info.pt voices instead")


def unavailable_reason(speakers, name: str) -> str | None:
    """Why a checkpoint with SFT ``speakers`` does not offer mode ``name`` (None: it does).
    The prompt modes are always offered: with the prompt models (and an encoder that runs
    them) they take recordings (``prompt_audio``, ``source_audio``), and stored voices serve
    them without."""
    if name == SFT.name and not speakers:
        return "the model has no SFT speakers (spk2info.pt entries with an 'embedding')"
    return None


def modes_for(speakers) -> dict:
    """The modes a checkpoint with SFT ``speakers`` offers, in :data:`MODES` order."""
    return {n: m for n, m in MODES.items() if unavailable_reason(speakers, n) is None}


class UnavailablePromptEncoder:
    """The CosyVoice2/3 prompt encoder of a dir without the prompt models (or, CosyVoice3, of a
    family whose prompt models cosyvino does not run yet): voices and source tokens from
    recordings are refused with ``reason`` (:func:`prompt_models_reason`); stored voices are
    checked for the model's shapes and prompt-mel rate."""

    def __init__(self, model_dir, *, reason: str, embedding_dim: int, mel_bins: int,
                 speech_vocab: int):
        self.model_dir, self.reason = model_dir, reason
        self.embedding_dim, self.mel_bins, self.speech_vocab = embedding_dim, mel_bins, \
            speech_vocab

    @property
    def mel_rate(self) -> int:
        """The CosyVoice2/3 prompt-mel rate, 24000 Hz (sheet v2 §3.6; recordings are refused
        anyway)."""
        return PROMPT_MEL.sampling_rate

    def _refuse(self):
        raise PromptModelsUnavailableError(self.reason)

    def voice(self, audio, *, name: str, prompt_text: str | None = None):
        """Raises PromptModelsUnavailableError (always; see the class docstring)."""
        self._refuse()

    def speech_tokens(self, audio):
        """Raises PromptModelsUnavailableError (always; see the class docstring)."""
        self._refuse()

    def check_voice(self, voice) -> str | None:
        """Why a stored voice does not fit this model (embedding width, mel bins, token ids,
        prompt-mel rate: :func:`~.prompt_align.prompt_rate_reason`), or None."""
        if voice.embedding.shape[1] != self.embedding_dim:
            return f"its speaker embedding has {voice.embedding.shape[1]} values, " \
                   f"this model takes {self.embedding_dim}"
        if voice.has_prompt:
            if voice.prompt_mel.shape[1] != self.mel_bins:
                return f"its prompt mel has {voice.prompt_mel.shape[1]} bins, " \
                       f"this model takes {self.mel_bins}"
            if int(voice.prompt_speech_tokens.max()) >= self.speech_vocab:
                return "its prompt speech tokens are outside this model's vocabulary"
        return prompt_rate_reason(voice)

    def close(self) -> None:
        pass
