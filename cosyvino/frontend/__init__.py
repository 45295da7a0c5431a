"""Text frontend of cosyvino: normalization, sentence splitting and the v1 text tokenizer.

``TextFrontend().segments(text)`` turns user text into the segments CosyVoice v1 synthesizes one
by one, each with its text token ids, following the official frontend (upstream HEAD with the
wetext engine) plus the documented improvements of docs/frontend.md. Must not import torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from cosyvino.errors import EmptyTextError
from cosyvino.frontend.normalize import (
    HARD_MAX_N,
    MERGE_LEN,
    TOKEN_MAX_N,
    TOKEN_MIN_N,
    engine_name,
    normalize,
    normalize_and_split,
)
from cosyvino.frontend.split import split_paragraph
from cosyvino.frontend.tokenizer import LANGUAGES, TextTokenizer

__all__ = [
    "EmptyTextError",
    "HARD_MAX_N",
    "LANGUAGES",
    "MERGE_LEN",
    "Segment",
    "TOKEN_MAX_N",
    "TOKEN_MIN_N",
    "TextFrontend",
    "TextTokenizer",
    "engine_name",
    "normalize",
    "normalize_and_split",
    "split_paragraph",
]


@dataclass(frozen=True)
class Segment:
    """One synthesis unit: its normalized text and the text token ids the LLM receives."""

    text: str
    token_ids: tuple[int, ...]

    def __len__(self) -> int:
        return len(self.token_ids)


class TextFrontend:
    """Normalize, split and tokenize text for CosyVoice v1.

    ``tokenizer``: a :class:`TextTokenizer`; default: the vocabulary shipped with cosyvino.
    """

    def __init__(self, tokenizer: TextTokenizer | None = None):
        self.tokenizer = tokenizer if tokenizer is not None else TextTokenizer()

    def segments(self, text: str, *, text_frontend: bool = True) -> list[Segment]:
        """Segments of ``text`` (tts text). Raises EmptyTextError if nothing speakable remains.

        ``text_frontend=False`` skips normalization like upstream's flag (over-long text is
        still cut into bounded segments). Text containing ``<|`` and ``|>`` (language tags) is
        never normalized (upstream rule).
        """
        encode = self.tokenizer.encode
        return [Segment(s, tuple(encode(s)))
                for s in normalize_and_split(text, self.tokenizer, text_frontend=text_frontend)]

    def normalize(self, text: str, *, text_frontend: bool = True) -> str:
        """Normalized text without splitting (prompt / instruct text)."""
        return normalize(text, text_frontend=text_frontend)

    def tokenize(self, text: str) -> list[int]:
        """Token ids of ``text`` as is, no normalization (``allowed_special="all"``)."""
        return self.tokenizer.encode(text)
