"""Text that arrives in pieces -> Qwen2 text ids, the same ids as the whole text would get.
Must not import torch.

The official bistream frontend tokenizes each piece on its own (sheet v2 §4.6), so its ids, and
therefore its audio, depend on where a client cut the text ("Hel" + "lo" is not "Hello"). Here
the ids depend on the text only: :class:`IncrementalTokenizer` holds back the part of the text
that later pieces could still change and releases the rest, tokenized exactly as the whole text
would be. Why the cut is safe (the Qwen2 tokenizer of sheet v2 §3.3):

* added specials (``<|endofprompt|>``, ``[laughter]`` ...) are split off first: a tail that is a
  proper prefix of one (``[laugh``) is held until it is completed or cannot be one;
* between specials the text is NFC-normalized, then cut by the Qwen2 pre-tokenizer regex
  (:data:`~.tokenizer.QWEN2_PRETOKENIZE_REGEX`, no look-behind), and BPE runs within each cut.
  A cut whose end is followed by another cut of the text so far is final (the regex decides it
  from its own characters and the one after), so every cut but the last is released. NFC can
  only join the last character with the next piece's first, and the last character is held.
"""

from __future__ import annotations

import unicodedata
from typing import Sequence

from .tokenizer import QWEN2_PRETOKENIZE_REGEX


class IncrementalTokenizer:
    """Qwen2 ids of a text given piece by piece (module docstring).

    ``push(piece)`` returns the ids that are final now; ``finish()`` the rest. The
    concatenation of every list returned equals ``tokenizer.encode(whole text)`` (tested over
    every 1..n-character split of tricky strings, tests/test_text_stream.py).

    Args:
        tokenizer: a :class:`~.tokenizer.QwenTextTokenizer` (``encode``, ``added_specials``).
    """

    def __init__(self, tokenizer):
        from tokenizers import Regex, pre_tokenizers

        self._tokenizer = tokenizer
        self._specials: Sequence[str] = tuple(getattr(tokenizer, "added_specials", ()))
        self._split = pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated")
        self._buffer = ""

    @property
    def pending(self) -> str:
        """The text held back (not yet released as ids)."""
        return self._buffer

    def push(self, piece: str) -> list[int]:
        """Add ``piece``; the ids that no later piece can change (maybe none)."""
        self._buffer = unicodedata.normalize("NFC", self._buffer + piece)
        cut = self._stable_end(self._buffer)
        if cut <= 0:
            return []
        done, self._buffer = self._buffer[:cut], self._buffer[cut:]
        return list(self._tokenizer.encode(done))

    def finish(self) -> list[int]:
        """The ids of the text still held (the text has ended); resets the buffer."""
        done, self._buffer = self._buffer, ""
        return list(self._tokenizer.encode(done)) if done else []

    # ---- where the final part of the buffer ends --------------------------------------------
    def _stable_end(self, text: str) -> int:
        limit = len(text) - self._special_prefix_tail(text)
        # the last complete special before ``limit``: text up to its end is final
        last_special_end, start = 0, 0
        while True:
            hit = self._next_special(text, start, limit)
            if hit is None:
                break
            start = last_special_end = hit
        run = text[last_special_end:limit]
        if not run:
            return last_special_end
        cuts = self._split.pre_tokenize_str(run)
        if len(cuts) < 2:
            return last_special_end
        # every cut but the last one of the run is final
        return last_special_end + cuts[-1][1][0]

    def _next_special(self, text: str, start: int, limit: int) -> int | None:
        """End of the earliest complete special in ``text[start:limit]`` (None: none)."""
        best = None
        for s in self._specials:
            i = text.find(s, start, limit)
            if i >= 0 and (best is None or i < best[0] or (i == best[0] and len(s) > best[1])):
                best = (i, len(s))
        return None if best is None else best[0] + best[1]

    def _special_prefix_tail(self, text: str) -> int:
        """Length of the longest tail of ``text`` that a longer special could start with."""
        longest = 0
        for s in self._specials:
            for k in range(min(len(s), len(text)), 0, -1):
                if k > longest and text.endswith(s[:k]) and (k < len(s) or self._longer(s)):
                    longest = k
                    break
        return longest

    def _longer(self, special: str) -> bool:
        """Whether a longer special starts with ``special`` (then a complete one is held)."""
        return any(o != special and o.startswith(special) for o in self._specials)
