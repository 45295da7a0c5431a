"""CosyVoice2's decoding rule (sheet v2 §4.5): ``min_len = int(2 · Ltts)``, ``max_len =
int(20 · Ltts)``, only the EOS 6561 masked below min_len, stop at 6561, 6562 or 6563. The loop
itself is shared with CosyVoice3 (:func:`cosyvino.families.cosyvoice23.decoding.decode_speech_tokens`).
Must not import torch.
"""

from __future__ import annotations

from cosyvino.families.cosyvoice23.decoding import DecodingRule

from .config import CosyVoice2LLMConfig


def decoding_rule(cfg: CosyVoice2LLMConfig) -> DecodingRule:
    """The v2 HEAD rule for ``cfg`` (ids derive from ``speech_token_size``, 6561 at 0.5B).

    Upstream before 2026-02-11 (``0e62489``) re-drew while any id >= 6561 came up below min_len;
    HEAD masks only the EOS, so 6562 / 6563 can end an utterance early (sheet v2 §4.5, §10.6)."""
    return DecodingRule(stop_token_ids=frozenset(cfg.stop_token_ids),
                        masked_below_min_len=(cfg.eos_token,),
                        min_token_text_ratio=cfg.min_token_text_ratio,
                        max_token_text_ratio=cfg.max_token_text_ratio)
