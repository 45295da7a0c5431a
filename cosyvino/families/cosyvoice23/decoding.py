"""The speech-token decoding rule of the Qwen2 speech LMs (non-streaming text), numpy only.

Sheet v2 §4.5: ``min_len = int(Ltts * 2)``, ``max_len = int(Ltts * 20)`` from the tts-text token
count (prompt / instruct text excluded); at each step the log-probabilities of the speech head
get the ids of :attr:`DecodingRule.masked_below_min_len` set to -inf while fewer than ``min_len``
tokens were drawn (v2 HEAD: only 6561, the EOS; 6562 / 6563 stay drawable), then one RAS draw
(:func:`cosyvino.families.cosyvoice1.sampling.ras_sample`, the same algorithm on 6564 values);
any id of :attr:`DecodingRule.stop_token_ids` ends the utterance and is not emitted. The loop
does not depend on the model: it asks a callback for the next log-probabilities.
CosyVoice3 uses the same loop with its own rule (its sheet: 6561 masked, 200 stop ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

import numpy as np

from cosyvino.errors import InputError
from cosyvino.families.cosyvoice1.config import SamplingConfig
from cosyvino.families.cosyvoice1.sampling import ras_sample


@dataclass(frozen=True)
class DecodingRule:
    """Length bounds and special ids of one family's decode loop (sheet v2 §4.5).

    ``min_token_text_ratio`` / ``max_token_text_ratio``: the upstream ``inference`` defaults
    (2 and 20). ``masked_below_min_len``: ids set to -inf while ``step < min_len``.
    ``stop_token_ids``: ids that end decoding.
    """

    stop_token_ids: frozenset[int]
    masked_below_min_len: tuple[int, ...]
    min_token_text_ratio: float = 2.0
    max_token_text_ratio: float = 20.0

    def length_limits(self, n_text_tokens: int) -> tuple[int, int]:
        """``(min_len, max_len)`` = ``(int(n * min_ratio), int(n * max_ratio))`` speech tokens
        for ``n`` tts-text tokens (truncation toward zero, as upstream ``int()``).

        Raises:
            InputError: ``n_text_tokens`` < 1 (nothing to speak: upstream would decode nothing).
        """
        if isinstance(n_text_tokens, bool) or int(n_text_tokens) != n_text_tokens \
                or n_text_tokens < 1:
            raise InputError(f"the tts text has {n_text_tokens!r} tokens; at least 1 is needed "
                             "to bound the speech length")
        return (int(n_text_tokens * self.min_token_text_ratio),
                int(n_text_tokens * self.max_token_text_ratio))

    def masked(self, logp: np.ndarray, step: int, min_len: int) -> np.ndarray:
        """``logp`` (float ``[V]``) with :attr:`masked_below_min_len` at -inf when
        ``step < min_len`` (a copy; the input is unchanged); else ``logp`` itself."""
        if step >= min_len or not self.masked_below_min_len:
            return logp
        out = np.array(logp, dtype=np.float32, copy=True)
        out[list(self.masked_below_min_len)] = -np.inf
        return out


#: ``next_logp(previous_token)``: the speech head's log-probabilities (float ``[V]``) after
#: feeding ``previous_token`` (None on the first call: after the prefix)
NextLogp = Callable[[int | None], np.ndarray]


def decode_speech_tokens(next_logp: NextLogp, n_text_tokens: int, rule: DecodingRule,
                         sampling: SamplingConfig, rng: np.random.Generator) -> Iterator[int]:
    """Yield the speech tokens of one utterance, as upstream ``Qwen2LM.inference`` (sheet v2 §4.5).

    ``next_logp`` is called once per step: first with None (the prefix), then with each emitted
    token, never after the last one (at most ``max_len`` calls). Stops at a stop id (not
    yielded) or after ``max_len`` tokens.

    Raises:
        InputError: ``n_text_tokens`` < 1.
    """
    min_len, max_len = rule.length_limits(n_text_tokens)
    out: list[int] = []
    previous: int | None = None
    for step in range(max_len):
        logp = rule.masked(np.asarray(next_logp(previous)), step, min_len)
        token = ras_sample(logp, out, rng, sampling)
        if token in rule.stop_token_ids:
            return
        out.append(token)
        yield token
        previous = token
