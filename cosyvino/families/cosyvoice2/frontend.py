"""The CosyVoice2 text frontend: v1's normalization and splitting (sheet v2 §3.2: the same
function) measured and tokenized with the Qwen2 tokenizer of ``CosyVoice-BlankEN/`` (sheet v2
§3.3). Must not import torch.

Differences from v1 that follow from the tokenizer: English segment lengths count Qwen BPE
tokens; the fine-grained markers (``[laughter]``, ``<strong>`` ...) and ``<|endofprompt|>`` are
single special tokens (kept by normalization, matched whole by the tokenizer); language tags
such as ``<|en|>`` are plain text. The instruction of ``instruct2`` is tokenized as given
(:meth:`CosyVoice2Frontend.tokenize`, no normalization).
"""

from __future__ import annotations

from cosyvino.frontend import TextFrontend

from ..cosyvoice23.tokenizer import QwenTextTokenizer, load_qwen_tokenizer


class CosyVoice2Frontend(TextFrontend):
    """:class:`~cosyvino.frontend.TextFrontend` over a :class:`QwenTextTokenizer`
    (``segments``, ``normalize``, ``tokenize`` as there)."""

    def __init__(self, tokenizer: QwenTextTokenizer):
        super().__init__(tokenizer)

    @classmethod
    def from_model_dir(cls, model_dir: str) -> CosyVoice2Frontend:
        """The frontend of an official or converted CosyVoice2 dir (its ``CosyVoice-BlankEN/``
        tokenizer files). Raises ModelDirError / ConfigError (tokenizer files)."""
        return cls(load_qwen_tokenizer(model_dir))
