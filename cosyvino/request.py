"""A synthesis request, validated in one place. Must not import torch.

:class:`SynthesisRequest` is what every entry point builds (``Synthesizer.synthesize`` /
``stream`` / ``submit``, the CLI, the server) and what the engine runs. :meth:`SynthesisRequest
.validated` checks every field against the loaded model and returns a request whose voice is a
:class:`~cosyvino.voices.Voice` and whose seed is fixed (a request without a seed gets a random
one, recorded in the audio's stats, so any request can be replayed).
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from .errors import (InputError, PromptModelsUnavailableError, UnknownSpeakerError,
                     VoiceMismatchError)
from .voices import Voice

MIN_SPEED, MAX_SPEED = 0.25, 4.0
#: bounds of ``SynthesisRequest.n_timesteps`` (CFM Euler steps)
MIN_TIMESTEPS, MAX_TIMESTEPS = 1, 100
#: hop schedules a request may ask for (CosyVoice v1: cosyvino/families/cosyvoice1/streaming.py)
HOP_SCHEDULES = ("latency", "official", "segment")
#: how a CosyVoice2/3 stream computes its flow / vocoder hops (``StreamingOptions``); "auto":
#: incremental where the loaded backend runs it, else official
FLOW_STREAMING = ("auto", "official", "incremental")
#: how the last hop of a CosyVoice2/3 segment is computed (``StreamingOptions.final_hop``)
FINAL_HOPS = ("official", "incremental")


@dataclass(frozen=True)
class StreamingOptions:
    """How audio is cut into chunks.

    Attributes:
        hop_schedule: ``"latency"`` (default): token hops with a small first hop that grows,
            for the earliest first chunk; ``"official"``: the official v1 token hops (100 +
            20 overlap; parity with the official streaming); ``"segment"``: one chunk per text
            segment (sentences merged up to ~80 tokens), the official non-streaming audio.
        flow_streaming: CosyVoice2 token hops (v1 and v3 ignore it; v3's flow has no
            incremental form yet): ``"auto"`` (default) = ``"incremental"`` where the backend
            runs it (torch on an official dir), else ``"official"``; ``"official"``: every hop
            re-runs the flow over all tokens so far (upstream); ``"incremental"``: each hop
            computes only its new tokens from per-request chunk state, the same frames within
            1e-4 (docs/streaming.md; a backend without it falls back to official and logs
            why; the chunk's ``stats["flow_streaming"]`` says what ran).
        final_hop: the last hop of an incremental stream: ``"official"`` (default) re-runs the
            flow over every token with full attention as upstream (the stream's audio is
            then the official stream's); ``"incremental"`` computes only the last tokens with
            the chunk masks (no re-run: cheapest, a documented distance from upstream's).
        vocoder_streaming: CosyVoice3's causal vocoder (v1 and v2 ignore it): ``"auto"``
            (default) = ``"incremental"`` where the backend runs it (torch), else
            ``"official"`` (re-run over all mel so far, upstream); ``"incremental"``: a window
            of the new frames plus the vocoder's receptive field, the same samples up to
            float32 rounding.
    """

    hop_schedule: str = "latency"
    flow_streaming: str = "auto"
    final_hop: str = "official"
    vocoder_streaming: str = "auto"


@dataclass(frozen=True)
class SynthesisRequest:
    """What to say, with which voice, in which mode.

    Attributes:
        text: text to speak (zh/en/ja/yue/ko; language tags like ``<|en|>`` pass through);
            empty for voice conversion (``vc``).
        voice: a built-in speaker id or registered voice name, or a :class:`Voice`.
        mode: a mode of the loaded model (CosyVoice v1: ``sft``, ``zero_shot``,
            ``cross_lingual``, ``instruct``, ``vc``, as the checkpoint offers them); None = the
            first of the model's modes that fits the inputs given (v1: a source recording ->
            ``vc``, a prompt with a transcript -> ``zero_shot``, a prompt alone ->
            ``cross_lingual``, an instruction -> ``instruct``, a speaker alone -> ``sft``).
        prompt_text: the transcript of ``prompt_audio`` (or of a registered voice's recording,
            replacing the text stored with it); zero-shot.
        prompt_audio: a prompt recording, instead of ``voice``: a path, the bytes of a file, a
            binary file object, ``(samples, sample_rate)`` or an :class:`~cosyvino.audio.Audio`
            (:data:`cosyvino.prompt_audio.AudioSource`). Turned into a prompt bundle (speaker
            embedding, prompt speech tokens, prompt mel) once, at validation.
        source_audio: the recording to convert (``vc``), same types as ``prompt_audio``; its
            speech tokens are computed at validation.
        instruction: instruction text (``instruct``, Instruct models).
        speed: 0.25..4.0, tempo change by mel interpolation (upstream ``speed``).
        seed: non-negative int; same seed, same audio however the audio is chunked or batched.
        n_timesteps: flow-matching ODE steps (Euler steps of the CFM solver, 1..100; each is
            one estimator call), a speed/quality trade: None = the model's own (10 for
            CosyVoice v1, its ``flow.decoder.cfg.n_timesteps``); fewer steps are faster and
            drift from the official audio (the mel distance per step count is in
            docs/performance.md, "ODE steps").
        num_speech_tokens: force exactly this many speech tokens per segment (50 = 1 s; benchmarks).
        speech_tokens: int64 [N] speech tokens to vocode (token-to-wav; skips the LLM and the
            text, which may then be empty).
        streaming: :class:`StreamingOptions`.
        text_stream: the text comes while the request runs (text in,
            :meth:`cosyvino.Synthesizer.open_text_stream`); ``text`` must then be empty and
            ``num_speech_tokens`` / ``speech_tokens`` / ``source_audio`` unset.
    """

    text: str = ""
    voice: str | Voice | None = None
    mode: str | None = None
    prompt_text: str | None = None
    prompt_audio: object | None = None
    instruction: str | None = None
    speed: float = 1.0
    seed: int | None = None
    n_timesteps: int | None = None
    num_speech_tokens: int | None = None
    speech_tokens: np.ndarray | None = None
    streaming: StreamingOptions = field(default_factory=StreamingOptions)
    source_audio: object | None = None
    text_stream: bool = False

    def validated(self, *, modes: Mapping, voices: Mapping[str, Voice],
                  speech_vocab: int | None = None, prompts=None,
                  unavailable: Mapping[str, str] | None = None) -> "SynthesisRequest":
        """This request checked and normalized for a loaded model. Cheap checks run first; the
        prompt processing (``prompt_audio`` -> a prompt bundle, ``source_audio`` -> speech
        tokens) last, once.

        Args:
            modes: the modes the model offers (name -> :class:`cosyvino.families.base.Mode`),
                in matching order.
            voices: voices by name (built-in speakers and registered voices).
            speech_vocab: number of speech tokens (ids must be below it) for ``speech_tokens``.
            prompts: the family's prompt encoder
                (:meth:`cosyvino.families.base.ModelFamily.prompt_encoder`), used for
                ``prompt_audio`` / ``source_audio``; None: the model has none.
            unavailable: modes of the family the model does not offer -> why (for messages).

        Returns:
            a copy with ``mode`` a mode name, ``voice`` a :class:`Voice` (the prompt bundle of
            ``prompt_audio`` when given; None for a mode that uses no voice), ``prompt_text``
            the transcript the mode uses (None when it uses none), ``prompt_audio`` and
            ``source_audio`` None (processed), ``speed`` a float, ``seed`` an int,
            ``n_timesteps`` an int or None,
            ``speech_tokens`` int64 [N] (the source's for ``vc``) or None.

        Raises:
            UnknownSpeakerError: ``voice`` names no voice (the message lists valid ones).
            VoiceMismatchError: ``voice`` is a :class:`Voice` made for another model (the
                prompt encoder's ``check_voice``; stored voices are checked when read).
            cosyvino.prompt_audio.PromptAudioError (an InputError): bad ``prompt_audio`` /
                ``source_audio`` (not audio, empty, too short/long, silent, ...).
            InputError: any other bad field (text type, a mode the model does not offer, a
                missing mode input or one given to a mode that does not take it, voice and
                prompt_audio both given, speed, seed, n_timesteps, num_speech_tokens,
                speech_tokens).
            ModelDirError / BackendError: the prompt models are missing or failed.
        """
        if not isinstance(self.text, str):
            raise InputError(f"text must be a string, got {type(self.text).__name__}")
        for name in ("prompt_text", "instruction"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise InputError(f"{name} must be a string, got {type(value).__name__}")
        if self.text_stream is not False:
            if self.text_stream is not True:
                raise InputError(f"text_stream must be True or False, got {self.text_stream!r}")
            if self.text or self.num_speech_tokens is not None or self.speech_tokens is not None \
                    or self.source_audio is not None:
                raise InputError("a text stream takes its text as it comes: text, "
                                 "num_speech_tokens, speech_tokens and source_audio must be unset")
        voice = self._voice(voices) if self.voice is not None else None
        if isinstance(self.voice, Voice) and not voice.builtin:
            _check_fits(voice, prompts)
        if voice is not None and self.prompt_audio is not None:
            raise InputError("give either voice (a speaker or registered voice) or prompt_audio "
                             "(a recording), not both")
        if self.source_audio is not None and self.speech_tokens is not None:
            raise InputError("give either source_audio or speech_tokens, not both")
        mode = self._mode(modes, voice, unavailable or {})
        if mode.needs_speaker and voice is None:
            raise _unknown_voice(self.voice, voices)
        speed = _check_speed(self.speed)
        seed = _check_seed(self.seed)
        steps = _check_timesteps(self.n_timesteps)
        n = self.num_speech_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer))
                              or n < 1):
            raise InputError(f"num_speech_tokens must be a positive integer, got {n!r}")
        tokens = None if self.speech_tokens is None else _check_tokens(self.speech_tokens,
                                                                       speech_vocab)
        if not isinstance(self.streaming, StreamingOptions) or \
                self.streaming.hop_schedule not in HOP_SCHEDULES:
            raise InputError(f"streaming.hop_schedule must be one of {HOP_SCHEDULES}")
        for name, allowed in (("flow_streaming", FLOW_STREAMING), ("final_hop", FINAL_HOPS),
                              ("vocoder_streaming", FLOW_STREAMING)):
            if getattr(self.streaming, name) not in allowed:
                raise InputError(f"streaming.{name} must be one of {allowed}, got "
                                 f"{getattr(self.streaming, name)!r}")
        # the expensive part, once per request: prompt bundle, source tokens
        if self.prompt_audio is not None or self.source_audio is not None:
            if prompts is None:
                raise PromptModelsUnavailableError("this model has no prompt models: "
                                                   "prompt_audio / source_audio cannot be used")
        if self.prompt_audio is not None:
            voice = prompts.voice(self.prompt_audio, name="<prompt>",
                                  prompt_text=self.prompt_text)
        if self.source_audio is not None:
            tokens = _check_tokens(prompts.speech_tokens(self.source_audio), speech_vocab)
        prompt_text = None
        if mode.needs_prompt_text:
            prompt_text = self.prompt_text if self.prompt_text is not None else voice.prompt_text
        if not (mode.needs_speaker or mode.needs_prompt_audio):
            voice = None
        return dataclasses.replace(self, mode=mode.name, voice=voice, speed=speed, seed=seed,
                                   n_timesteps=steps,
                                   num_speech_tokens=None if n is None else int(n),
                                   speech_tokens=tokens, prompt_text=prompt_text,
                                   prompt_audio=None, source_audio=None)

    def _voice(self, voices: Mapping[str, Voice]) -> Voice:
        if isinstance(self.voice, Voice):
            return self.voice
        if not isinstance(self.voice, str) or self.voice not in voices:
            raise _unknown_voice(self.voice, voices)
        return voices[self.voice]

    def _misfit(self, mode, voice: Voice | None) -> str | None:
        """Why this request does not fit ``mode`` (the first problem), or None."""
        m = repr(mode.name)
        prompt_voice = voice is not None and voice.has_prompt
        if mode.needs_source_audio:
            if self.source_audio is None and self.speech_tokens is None:
                return f"mode {m} needs source_audio (the recording to convert)"
            if self.text.strip():
                return f"text is not used by mode {m} (it speaks the source recording)"
        elif self.source_audio is not None:
            return f"source_audio is not used by mode {m}"
        if mode.needs_prompt_audio:
            if self.prompt_audio is None and not prompt_voice:
                if voice is not None:
                    return (f"mode {m} needs prompt_audio or a registered voice; {voice.name!r} "
                            "is a built-in speaker")
                return f"mode {m} needs prompt_audio (or a registered voice)"
        elif self.prompt_audio is not None:
            return f"prompt_audio is not used by mode {m}"
        if mode.needs_prompt_text:
            stored = voice.prompt_text if prompt_voice else None
            if self.prompt_text is None and stored is None:
                return f"mode {m} needs prompt_text (the transcript of the prompt recording)"
        elif self.prompt_text is not None:
            return f"prompt_text is not used by mode {m}"
        if mode.needs_instruction and self.instruction is None:
            return f"mode {m} needs instruction"
        if not mode.needs_instruction and self.instruction is not None:
            return f"instruction is not used by mode {m}"
        return None

    def _mode(self, modes: Mapping, voice: Voice | None, unavailable: Mapping[str, str]):
        """The mode this request runs in (named, or the first that fits); raises InputError
        naming the problem and the model's modes."""
        offered = ", ".join(modes) or "none"
        if self.mode is not None:
            mode = modes.get(self.mode) if isinstance(self.mode, str) else None
            if mode is None:
                why = unavailable.get(self.mode) if isinstance(self.mode, str) else None
                raise InputError(f"mode {self.mode!r} is not supported by this model"
                                 f"{f' ({why})' if why else ''}; supported: {offered}")
            problem = self._misfit(mode, voice)
            if problem is not None:
                raise InputError(problem)
            return mode
        if not modes:
            raise InputError("this model offers no synthesis mode")
        for mode in modes.values():
            if self._misfit(mode, voice) is None and not (mode.needs_speaker and voice is None):
                return mode
        # nothing fits: the complaint of the mode that takes most of the inputs given (the
        # plainest of those), plus what the model offers
        prompt = self.prompt_audio is not None or (voice is not None and voice.has_prompt)
        given = (prompt, self.prompt_text is not None, self.instruction is not None,
                 self.source_audio is not None)

        def closeness(m):
            needs = (m.needs_prompt_audio, m.needs_prompt_text, m.needs_instruction,
                     m.needs_source_audio)
            return (-sum(g and n for g, n in zip(given, needs)), sum(needs))

        plain = min(modes.values(), key=closeness)
        problem = self._misfit(plain, voice)
        if problem is None:  # only the voice is missing
            return plain
        by_reason: dict[str, list[str]] = {}
        for n, why in unavailable.items():
            by_reason.setdefault(why, []).append(n)
        notes = "; ".join(f"{', '.join(names)}: {why}" for why, names in by_reason.items())
        if notes:  # lead with what the model lacks, not with a mode the user did not ask for
            raise InputError(f"the inputs given fit none of this model's modes ({offered}); "
                             f"not offered here: {notes}; nearest mode: {problem}")
        raise InputError(f"{problem}; this model's modes: {offered}")


def _check_speed(speed) -> float:
    try:
        speed = float(speed)
    except (TypeError, ValueError):
        raise InputError(f"speed must be a number, got {speed!r}") from None
    if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise InputError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
    return speed


def _check_timesteps(steps) -> int | None:
    if steps is None:
        return None
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or \
            not MIN_TIMESTEPS <= steps <= MAX_TIMESTEPS:
        raise InputError(f"n_timesteps must be an integer in [{MIN_TIMESTEPS}, {MAX_TIMESTEPS}] "
                         f"or None, got {steps!r}")
    return int(steps)


def _check_seed(seed) -> int:
    if seed is None:
        return secrets.randbits(63)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


def _check_tokens(speech_tokens, vocab: int | None) -> np.ndarray:
    tokens = np.asarray(speech_tokens)
    if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
        raise InputError("speech_tokens must be a non-empty 1-D sequence of integers")
    if vocab is not None and (tokens.min() < 0 or tokens.max() >= vocab):
        raise InputError(f"speech tokens must be in [0, {vocab - 1}]")
    return tokens.astype(np.int64)


def _check_fits(voice: Voice, prompts) -> None:
    """Raise VoiceMismatchError when the prompt encoder says ``voice`` (given as an object, so
    not checked by the voice store) does not fit the model; no encoder: no check."""
    check = getattr(prompts, "check_voice", None)
    why = check(voice) if check is not None else None
    if why:
        raise VoiceMismatchError(voice.name, why)


def _unknown_voice(name, voices: Mapping[str, Voice]) -> UnknownSpeakerError:
    """The error for a voice ``name`` not in ``voices``: built-in speakers listed first."""
    builtin = [n for n, v in voices.items() if getattr(v, "builtin", False)]
    return UnknownSpeakerError(str(name), builtin,
                               [n for n, v in voices.items() if not getattr(v, "builtin", False)])
