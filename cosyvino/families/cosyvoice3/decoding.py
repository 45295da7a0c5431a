"""CosyVoice3's decoding rule (sheet v3 §4.3, §9, §10.2), two ways to treat the minimum length.

Common to both: ``min_len = int(2 · Ltts)``, ``max_len = int(20 · Ltts)`` (Ltts = tts-text
tokens, prompt / instruct text excluded), one RAS draw per step over the 6761 log-probabilities,
and any of the 200 ids 6561..6760 ends the utterance (not emitted). The loop is shared with
CosyVoice2 (:func:`cosyvino.families.cosyvoice23.decoding.decode_speech_tokens`).

- ``min_length="official"`` (default, what upstream HEAD does): below min_len only index
  ``speech_token_size`` = 6561 is set to -inf. In v2 that index is the EOS; in v3 it is the SOS,
  so the EOS 6562 (and every other stop id) stays drawable and the minimum length is NOT
  enforced: an utterance may end at any step. The tiny-e golden shows it (15 text tokens,
  min_len 30, the official generator stopped after 19 tokens).
- ``min_length="enforced"``: below min_len all 200 stop ids are set to -inf, so at least
  ``min_len`` speech tokens are emitted (the intent of the ratio; upstream before commit
  ``0e62489`` (2026-02-11) got the same effect by re-drawing while a stop id came up). Which of
  the two the released model was evaluated with is unknown (sheet v3 §10.2).

Must not import torch.
"""

from __future__ import annotations

from typing import Literal

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice23.decoding import DecodingRule

from .config import CosyVoice3LLMConfig

#: the ways to treat min_len (module docstring)
MinLength = Literal["official", "enforced"]
MIN_LENGTH_CHOICES: tuple[str, ...] = ("official", "enforced")


def decoding_rule(cfg: CosyVoice3LLMConfig, min_length: MinLength = "official") -> DecodingRule:
    """The v3 rule for ``cfg`` (ids derive from ``speech_token_size``, 6561 at 0.5B).

    Args:
        min_length: ``"official"`` masks only index 6561 below min_len (upstream HEAD: not
            enforced); ``"enforced"`` masks all 200 stop ids below min_len.
    Raises:
        InputError: ``min_length`` is neither.
    """
    if min_length == "official":
        masked: tuple[int, ...] = (cfg.speech_token_size,)  # upstream indexes speech_token_size
    elif min_length == "enforced":
        masked = tuple(cfg.stop_token_ids)
    else:
        raise InputError(f"min_length must be one of {', '.join(MIN_LENGTH_CHOICES)}, got "
                         f"{min_length!r}")
    return DecodingRule(stop_token_ids=frozenset(cfg.stop_token_ids),
                        masked_below_min_len=masked,
                        min_token_text_ratio=cfg.min_token_text_ratio,
                        max_token_text_ratio=cfg.max_token_text_ratio)
