"""Voices: who speaks. A built-in speaker of the model (``spk2info.pt``) or a prompt bundle made
from a recording (speaker embedding, prompt speech tokens, prompt mel, prompt text). Requests
name a voice; modes decide which parts of it they use. Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import InputError


@dataclass(frozen=True, eq=False)
class Voice:
    """One voice.

    Attributes:
        name: the name requests use (a built-in speaker id or a registered voice name).
        embedding: float32 [1, S] speaker x-vector (S = 192 for CosyVoice v1), used by the LLM
            speaker slot and the flow.
        prompt_speech_tokens: int64 [N] speech tokens of the prompt recording (None: built-in).
        prompt_mel: float32 [M, 80] mel of the prompt recording at the model rate.
        prompt_text: transcript of the prompt recording.
        builtin: True for a speaker shipped with the model.
    """

    name: str
    embedding: np.ndarray
    prompt_speech_tokens: np.ndarray | None = None
    prompt_mel: np.ndarray | None = None
    prompt_text: str | None = None
    builtin: bool = False

    def __post_init__(self):
        emb = np.asarray(self.embedding, dtype=np.float32)
        if emb.ndim == 1:
            emb = emb[None, :]
        if emb.ndim != 2 or emb.shape[0] != 1 or not np.all(np.isfinite(emb)):
            raise InputError(f"voice {self.name!r}: embedding must be finite float32 [1, S], "
                             f"got shape {np.shape(self.embedding)}")
        object.__setattr__(self, "embedding", emb)
        if (self.prompt_speech_tokens is None) != (self.prompt_mel is None):
            raise InputError(f"voice {self.name!r}: prompt speech tokens and prompt mel come "
                             "together")

    @classmethod
    def speaker(cls, name: str, embedding: np.ndarray) -> "Voice":
        """A built-in speaker."""
        return cls(name=name, embedding=embedding, builtin=True)

    @property
    def has_prompt(self) -> bool:
        """True for a prompt bundle (zero-shot capable)."""
        return self.prompt_speech_tokens is not None


def builtin_voices(speakers: dict[str, np.ndarray]) -> dict[str, Voice]:
    """Built-in speakers (name -> float32 [1, S]) as voices."""
    return {name: Voice.speaker(name, emb) for name, emb in speakers.items()}
