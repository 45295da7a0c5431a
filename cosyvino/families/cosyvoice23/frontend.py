"""The CosyVoice2/3 text frontend: v1's normalization and splitting (sheet v2 §3.2, v3 §3.1: the
same function) measured and tokenized with the Qwen2 tokenizer of ``CosyVoice-BlankEN/`` (sheet
v2 §3.3; v3 §3.3 adds its phone / pinyin specials). Must not import torch.

Differences from v1 that follow from the tokenizer: English segment lengths count Qwen BPE
tokens; the fine-grained markers (``[laughter]``, ``<strong>`` ...) and ``<|endofprompt|>`` are
single special tokens (kept by normalization, matched whole by the tokenizer); language tags
such as ``<|en|>`` are plain text. An instruction is tokenized as given
(:meth:`QwenFrontend.tokenize`, no normalization).
"""

from __future__ import annotations

from collections.abc import Sequence

from cosyvino.frontend import TextFrontend

from .tokenizer import COSYVOICE2_ADDED_SPECIALS, QwenTextTokenizer, load_qwen_tokenizer


class QwenFrontend(TextFrontend):
    """:class:`~cosyvino.frontend.TextFrontend` over a :class:`QwenTextTokenizer`
    (``segments``, ``normalize``, ``tokenize`` as there)."""

    #: the specials the family's tokenizer adds (v2's; CosyVoice3 adds its own)
    added_specials: Sequence[str] = COSYVOICE2_ADDED_SPECIALS

    def __init__(self, tokenizer: QwenTextTokenizer):
        super().__init__(tokenizer)

    @classmethod
    def from_model_dir(cls, model_dir: str):
        """The frontend of an official or converted dir of the family (its
        ``CosyVoice-BlankEN/`` tokenizer files + :attr:`added_specials`). Raises ModelDirError /
        ConfigError (tokenizer files)."""
        return cls(load_qwen_tokenizer(model_dir, cls.added_specials))
