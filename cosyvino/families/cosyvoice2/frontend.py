"""The CosyVoice2 text frontend: the shared Qwen frontend
(:class:`cosyvino.families.cosyvoice23.frontend.QwenFrontend`) with the v2 tokenizer specials
(sheet v2 §3.3). The instruction of ``instruct2`` is tokenized as given (no normalization).
Must not import torch.
"""

from __future__ import annotations

from ..cosyvoice23.frontend import QwenFrontend


class CosyVoice2Frontend(QwenFrontend):
    """:class:`QwenFrontend` with the 19 CosyVoice2 specials."""


__all__ = ["CosyVoice2Frontend"]
