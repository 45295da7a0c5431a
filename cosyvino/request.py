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

from .errors import InputError, UnknownSpeakerError
from .voices import Voice

MIN_SPEED, MAX_SPEED = 0.25, 4.0
#: hop schedules a request may ask for (the token-level ones arrive with streaming)
HOP_SCHEDULES = ("segment",)


@dataclass(frozen=True)
class StreamingOptions:
    """How audio is cut into chunks.

    Attributes:
        hop_schedule: ``"segment"``: one chunk per text segment (sentences merged up to ~80
            tokens).
    """

    hop_schedule: str = "segment"


@dataclass(frozen=True)
class SynthesisRequest:
    """What to say, with which voice, in which mode.

    Attributes:
        text: text to speak (zh/en/ja/yue/ko; language tags like ``<|en|>`` pass through).
        voice: a built-in speaker id or registered voice name, or a :class:`Voice`.
        mode: a mode of the model's family (CosyVoice v1: ``sft``); None = the family's first
            (default) mode.
        prompt_text / prompt_audio / instruction: mode inputs (prompt transcript, prompt
            recording as float32 samples, instruction text); None when the mode needs none.
        speed: 0.25..4.0, tempo change by mel interpolation (upstream ``speed``).
        seed: non-negative int; same seed, same audio however the audio is chunked or batched.
        num_speech_tokens: force exactly this many speech tokens per segment (50 = 1 s; benchmarks).
        speech_tokens: int64 [N] speech tokens to vocode (token-to-wav; skips the LLM and the
            text, which may then be empty).
        streaming: :class:`StreamingOptions`.
    """

    text: str = ""
    voice: str | Voice | None = None
    mode: str | None = None
    prompt_text: str | None = None
    prompt_audio: np.ndarray | None = None
    instruction: str | None = None
    speed: float = 1.0
    seed: int | None = None
    num_speech_tokens: int | None = None
    speech_tokens: np.ndarray | None = None
    streaming: StreamingOptions = field(default_factory=StreamingOptions)

    def validated(self, *, modes: Mapping, voices: Mapping[str, Voice],
                  speech_vocab: int | None = None) -> "SynthesisRequest":
        """This request checked and normalized for a loaded model.

        Args:
            modes: the family's modes (name -> :class:`cosyvino.families.base.Mode`).
            voices: voices by name (built-in speakers and registered voices).
            speech_vocab: number of speech tokens (ids must be below it) for ``speech_tokens``.

        Returns:
            a copy with ``mode`` a mode name, ``voice`` a :class:`Voice`, ``speed`` a float,
            ``seed`` an int,
            ``speech_tokens`` int64 [N] or None.

        Raises:
            UnknownSpeakerError: ``voice`` names no voice (the message lists valid ones).
            InputError: any other bad field (text type, mode, speed, seed, num_speech_tokens,
                speech_tokens, a mode input given to a mode that does not take it).
        """
        if not isinstance(self.text, str):
            raise InputError(f"text must be a string, got {type(self.text).__name__}")
        name = next(iter(modes), None) if self.mode is None else self.mode
        mode = modes.get(name) if isinstance(name, str) else None
        if mode is None:
            raise InputError(f"mode {self.mode!r} is not supported by this model; supported: "
                             f"{', '.join(sorted(modes))}")
        for name, needed in (("prompt_text", mode.needs_prompt_text),
                             ("prompt_audio", mode.needs_prompt_audio),
                             ("instruction", mode.needs_instruction)):
            given = getattr(self, name) is not None
            if given and not needed:
                raise InputError(f"{name} is not used by mode {mode.name!r}")
            if needed and not given:
                raise InputError(f"mode {mode.name!r} needs {name}")
        voice = self._voice(voices) if mode.needs_speaker else None
        speed = _check_speed(self.speed)
        seed = _check_seed(self.seed)
        n = self.num_speech_tokens
        if n is not None and (isinstance(n, bool) or not isinstance(n, (int, np.integer))
                              or n < 1):
            raise InputError(f"num_speech_tokens must be a positive integer, got {n!r}")
        tokens = None if self.speech_tokens is None else _check_tokens(self.speech_tokens,
                                                                       speech_vocab)
        if not isinstance(self.streaming, StreamingOptions) or \
                self.streaming.hop_schedule not in HOP_SCHEDULES:
            raise InputError(f"streaming.hop_schedule must be one of {HOP_SCHEDULES}")
        return dataclasses.replace(self, mode=mode.name, voice=voice, speed=speed, seed=seed,
                                   num_speech_tokens=None if n is None else int(n),
                                   speech_tokens=tokens)

    def _voice(self, voices: Mapping[str, Voice]) -> Voice:
        if isinstance(self.voice, Voice):
            return self.voice
        if not isinstance(self.voice, str) or self.voice not in voices:
            raise UnknownSpeakerError(str(self.voice), list(voices))
        return voices[self.voice]


def _check_speed(speed) -> float:
    try:
        speed = float(speed)
    except (TypeError, ValueError):
        raise InputError(f"speed must be a number, got {speed!r}") from None
    if not (math.isfinite(speed) and MIN_SPEED <= speed <= MAX_SPEED):
        raise InputError(f"speed must be in [{MIN_SPEED}, {MAX_SPEED}], got {speed}")
    return speed


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
