"""CosyVoice2 modes: what each needs from a request and what it feeds the LLM and the flow
(sheet v2 §3.8). Must not import torch.

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

The v2 LLM never gets a speaker embedding (sheet v2 §3.8 note 1). A zero-shot transcript is
normalized without splitting (sheet v2 §3.2); a voice from the model's ``spk2info.pt``
(:class:`~.voices.PromptVoice`) brings its transcript as the official token ids, which are used
as they are unless the request gives another ``prompt_text``. The instruction of ``instruct2``
is NOT normalized (sheet v2 §3.2) and must end with ``<|endofprompt|>`` (upstream's example
does; appended when missing, as the token the LLM was trained to see before the tts text).

Prompt voices come from a registered voice, from the model's ``spk2info.pt`` bundles (tiny-c:
``alice``, ``bob``) or from ``prompt_audio`` through the prompt models (``campplus.onnx``,
``speech_tokenizer_v2.onnx``; :class:`~.prompt_models.PromptEncoder`). A voice made from a
recording keeps its uncut prompt; :func:`llm_prefix` and :func:`flow_conditioning` align it
per mode (:func:`~.prompt_models.align_prompt`, sheet v2 §3.6). Without the prompt models the
prompt modes still run on stored voices; recordings are refused (:func:`prompt_models_reason`).

Matching order of a request without a mode (:data:`MODES`): a source -> ``vc``; a prompt voice
with a transcript -> ``zero_shot``, without -> ``cross_lingual``; a prompt voice with an
instruction -> ``instruct2``; a speaker alone -> ``sft``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from cosyvino.errors import EmptyTextError, InputError, PromptModelsUnavailableError

from ..base import Mode
from ..cosyvoice1.modes import FlowConditioning
from .prompt_models import align_prompt, prompt_rate_reason
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

#: every v2 mode, in matching order (module docstring)
MODES = {m.name: m for m in (ZERO_SHOT, CROSS_LINGUAL, VC, INSTRUCT2, SFT)}
#: the prompt models of an official CosyVoice2 dir (sheet v2 §1, §3.4, §3.5)
PROMPT_MODEL_FILES = ("campplus.onnx", "speech_tokenizer_v2.onnx")
#: the instruction end marker (sheet v2 §3.3: a special token, id 151646)
END_OF_PROMPT = "<|endofprompt|>"


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


def _ids(ids, what: str) -> np.ndarray:
    if len(ids) == 0:
        raise InputError(f"{what} has no text tokens")
    return np.asarray(ids, dtype=np.int64).reshape(1, -1)


def _normalized(text: str, what: str, normalize: Callable[[str], str]) -> str:
    try:
        out = normalize(text).strip() if text.strip() else ""
    except EmptyTextError:
        out = ""
    if not out:
        raise InputError(f"{what} has nothing speakable (empty, or punctuation only)")
    return out


def instruction_text(instruction: str) -> str:
    """The instruction as the LLM reads it: as given (not normalized, sheet v2 §3.2), with
    ``<|endofprompt|>`` appended unless it already ends with it. Raises InputError when only
    the marker (or nothing) is left."""
    body = instruction.rstrip()
    body = body.removesuffix(END_OF_PROMPT)
    if not body.strip():
        raise InputError("instruction is empty")
    return body + END_OF_PROMPT


def _prompt_speech(request) -> np.ndarray:
    """int64 [1, L]: a spk2info bundle's LLM tokens as stored (upstream aligned them when it
    made the bundle); else the voice's tokens aligned with its mel (sheet v2 §3.8: the LLM
    gets ``tokens(wav)[:L]``, the same L as the flow)."""
    voice = request.voice
    if isinstance(voice, PromptVoice) and voice.llm_prompt_speech_tokens is not None:
        return np.asarray(voice.llm_prompt_speech_tokens, np.int64).reshape(1, -1)
    tokens, _ = _aligned(voice)
    return tokens.reshape(1, -1)


def _aligned(voice) -> tuple[np.ndarray, np.ndarray]:
    try:
        return align_prompt(voice.prompt_speech_tokens, voice.prompt_mel)
    except InputError as e:
        raise InputError(f"voice {voice.name!r}: {e}") from None


def llm_prefix(request, tokenize: Tokenize, normalize: Callable[[str], str]) -> LLMPrefix:
    """The LLM prefix of a validated request in its v2 mode (module docstring). ``tokenize``:
    the Qwen tokenizer (str -> ids), ``normalize``: the frontend's text normalization without
    splitting. Raises InputError for a transcript or instruction with nothing speakable."""
    mode, voice = request.mode, request.voice
    if mode == ZERO_SHOT.name:
        if isinstance(voice, PromptVoice) and voice.prompt_text_tokens is not None \
                and request.prompt_text == voice.prompt_text:
            before = np.asarray(voice.prompt_text_tokens, np.int64).reshape(1, -1)
        else:
            text = _normalized(request.prompt_text, "prompt_text", normalize)
            before = _ids(tokenize(text), "prompt_text")
        return LLMPrefix(before, _prompt_speech(request))
    if mode == INSTRUCT2.name:
        return LLMPrefix(_ids(tokenize(instruction_text(request.instruction)), "instruction"))
    return LLMPrefix()  # sft, cross_lingual; vc runs no LLM


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
        tokens, mel = _aligned(voice)
    return FlowConditioning(embedding=voice.embedding, prompt_token=tokens, prompt_feat=mel)


# ---- modes per checkpoint ----------------------------------------------------------------------

def missing_prompt_models(model_dir) -> list[str]:
    """The prompt-model files of :data:`PROMPT_MODEL_FILES` not in ``model_dir``."""
    if model_dir is None:
        return list(PROMPT_MODEL_FILES)
    return [f for f in PROMPT_MODEL_FILES if not os.path.isfile(os.path.join(model_dir, f))]


def prompt_models_reason(model_dir) -> str:
    """Why a recording (``prompt_audio``, ``source_audio``) cannot be turned into a voice or
    speech tokens for CosyVoice2 here: the prompt-model files missing from ``model_dir`` (one
    sentence naming them)."""
    missing = missing_prompt_models(model_dir) or list(PROMPT_MODEL_FILES)
    where = "in the model dir" if model_dir is not None else "(no model dir)"
    return (f"CosyVoice2 prompt recordings need the prompt models {', '.join(missing)} "
            f"{where}, which are missing; use a registered voice or one of the model's "
            "spk2info.pt voices instead")


def unavailable_reason(speakers, name: str) -> str | None:
    """Why a checkpoint with SFT ``speakers`` does not offer mode ``name`` (None: it does).
    The prompt modes are always offered: with the prompt models they take recordings
    (``prompt_audio``, ``source_audio``), and stored voices serve them without."""
    if name == SFT.name and not speakers:
        return "the model has no SFT speakers (spk2info.pt entries with an 'embedding')"
    return None


def modes_for(speakers) -> dict:
    """The modes a checkpoint with SFT ``speakers`` offers, in :data:`MODES` order."""
    return {n: m for n, m in MODES.items() if unavailable_reason(speakers, n) is None}


class UnavailablePromptEncoder:
    """The v2 prompt encoder of a dir without the prompt models: voices and source tokens from
    recordings are refused with :func:`prompt_models_reason`; stored voices are checked for the
    v2 shapes and prompt-mel rate."""

    def __init__(self, model_dir, *, embedding_dim: int, mel_bins: int, speech_vocab: int):
        self.model_dir = model_dir
        self.embedding_dim, self.mel_bins, self.speech_vocab = embedding_dim, mel_bins, \
            speech_vocab

    @property
    def mel_rate(self) -> int:
        """The CosyVoice2 prompt-mel rate, 24000 Hz (recordings are refused anyway)."""
        from .prompt_models import PROMPT_MEL

        return PROMPT_MEL.sampling_rate

    def _refuse(self):
        raise PromptModelsUnavailableError(prompt_models_reason(self.model_dir))

    def voice(self, audio, *, name: str, prompt_text: str | None = None):
        """Raises PromptModelsUnavailableError (always; see the class docstring)."""
        self._refuse()

    def speech_tokens(self, audio):
        """Raises PromptModelsUnavailableError (always; see the class docstring)."""
        self._refuse()

    def check_voice(self, voice) -> str | None:
        """Why a stored voice does not fit this model (embedding width, mel bins, token ids,
        prompt-mel rate: :func:`~.prompt_models.prompt_rate_reason`)."""
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
