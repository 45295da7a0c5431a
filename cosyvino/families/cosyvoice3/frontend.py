"""The CosyVoice3 text frontend: the Qwen frontend shared with CosyVoice2
(:class:`cosyvino.families.cosyvoice23.frontend.QwenFrontend`) over the v3 tokenizer, whose
phone / pinyin specials (``[j][ǐ]``) are single tokens (sheet v3 §3.3). Text holding both ``<|``
and ``|>`` (e.g. a cross-lingual text with the system prefix) is neither normalized nor split
(sheet v3 §3.4, v1's rule). Must not import torch.
"""

from __future__ import annotations

from ..cosyvoice23.frontend import QwenFrontend
from .tokenizer import COSYVOICE3_ADDED_SPECIALS


class CosyVoice3Frontend(QwenFrontend):
    """:class:`QwenFrontend` with the CosyVoice3 specials."""

    added_specials = COSYVOICE3_ADDED_SPECIALS


__all__ = ["CosyVoice3Frontend"]
