"""Voices: who speaks. A built-in speaker of the model (``spk2info.pt``) or a prompt bundle made
from a recording (speaker embedding, prompt speech tokens, prompt mel, prompt text). Requests
name a voice; modes decide which parts of it they use. Must not import torch.
"""

from __future__ import annotations

import hashlib
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
        prompt_text: transcript of the prompt recording (None: none; the voice then serves
            cross-lingual, not zero-shot, by default).
        builtin: True for a speaker shipped with the model.
        prompt_seconds: length of the prompt recording, seconds (None: unknown / built-in).
    """

    name: str
    embedding: np.ndarray
    prompt_speech_tokens: np.ndarray | None = None
    prompt_mel: np.ndarray | None = None
    prompt_text: str | None = None
    builtin: bool = False
    prompt_seconds: float | None = None

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
        if self.prompt_speech_tokens is not None:
            tokens = np.asarray(self.prompt_speech_tokens)
            if tokens.ndim != 1 or tokens.size == 0 or not np.issubdtype(tokens.dtype,
                                                                          np.integer):
                raise InputError(f"voice {self.name!r}: prompt speech tokens must be int [N], "
                                 f"N >= 1, got {tokens.dtype} {list(tokens.shape)}")
            mel = np.asarray(self.prompt_mel, dtype=np.float32)
            if mel.ndim != 2 or mel.shape[0] == 0 or not np.all(np.isfinite(mel)):
                raise InputError(f"voice {self.name!r}: prompt mel must be finite float32 "
                                 f"[M, bins], M >= 1, got shape {list(mel.shape)}")
            object.__setattr__(self, "prompt_speech_tokens", tokens.astype(np.int64))
            object.__setattr__(self, "prompt_mel", mel)
        if self.prompt_text is not None and not isinstance(self.prompt_text, str):
            raise InputError(f"voice {self.name!r}: prompt text must be a string")

    @classmethod
    def speaker(cls, name: str, embedding: np.ndarray) -> "Voice":
        """A built-in speaker."""
        return cls(name=name, embedding=embedding, builtin=True)

    @property
    def has_prompt(self) -> bool:
        """True for a prompt bundle (zero-shot / cross-lingual / vc capable)."""
        return self.prompt_speech_tokens is not None

    def digest(self) -> str:
        """sha256 (hex) of what the voice feeds the model: embedding, prompt tokens, prompt
        mel (dtype, shape and bytes of each) and prompt text; equal digests, equal audio for a
        seed. For result caches and the voice store's checksum."""
        h = hashlib.sha256()
        for key, arr in (("embedding", self.embedding),
                         ("prompt_speech_tokens", self.prompt_speech_tokens),
                         ("prompt_mel", self.prompt_mel)):
            if arr is None:
                h.update(f"{key}:none;".encode())
                continue
            a = np.ascontiguousarray(arr)
            a = a.astype(a.dtype.newbyteorder("<"), copy=False)
            h.update(f"{key}:{a.dtype.str}:{list(a.shape)};".encode())
            h.update(a.tobytes())
        text = self.prompt_text
        h.update(b"text:none;" if text is None else b"text:" + text.encode("utf-8"))
        return h.hexdigest()

    def describe(self) -> dict:
        """JSON-ready summary (no arrays): ``name``, ``builtin``, ``has_prompt``,
        ``prompt_text``, ``prompt_tokens`` (count), ``prompt_seconds``, ``embedding_dim``."""
        return {"name": self.name, "builtin": self.builtin, "has_prompt": self.has_prompt,
                "prompt_text": self.prompt_text,
                "prompt_tokens": (int(self.prompt_speech_tokens.size) if self.has_prompt
                                  else 0),
                "prompt_seconds": self.prompt_seconds,
                "embedding_dim": int(self.embedding.shape[1])}


def builtin_voices(speakers: dict[str, np.ndarray]) -> dict[str, Voice]:
    """Built-in speakers (name -> float32 [1, S]) as voices."""
    return {name: Voice.speaker(name, emb) for name, emb in speakers.items()}
