"""Full-width forms read as their half-width forms (cosyvino addition, docs/frontend.md).

Chinese and Japanese text often writes digits, Latin letters, currency signs and ``%`` in their
full-width forms (Unicode "Halfwidth and Fullwidth Forms", U+FF01..U+FF5E and U+FFE0..U+FFE6).
wetext and the other readers of :mod:`cosyvino.frontend` only know the ASCII forms of the
symbols: ``＄5`` was left as ``＄五`` (Chinese) or failed wetext's English grammar, ``５０％`` read
``五十％``, ``１５．５`` read ``十五．五``. :func:`fold_fullwidth` rewrites these characters into
the half-width character Unicode's compatibility decomposition (NFKC) gives, so they read
exactly as the half-width text does:

* always: the digits ``０``..``９``, the letters ``Ａ``..``Ｚ`` ``ａ``..``ｚ``, ``＄ ％ ＆ ＋ ／ ＝ ＠``
  and the currency signs ``￠ ￡ ￥ ￦``;
* inside numbers and names only: ``．`` with a digit or Latin letter on both sides (decimal
  point, ``ｗｗｗ．ｅｘａｍｐｌｅ．ｃｏｍ``); ``～`` with a digit on both sides (range);
  ``－`` before a digit (minus sign, range, ``COVID－19``); ``，`` only as a thousands
  separator of well-formed groups (``１，２３４，５６７``), as the ASCII rules read ``,``.

Everything else stays, deliberately: the Chinese punctuation ``，。！？：；、（）`` and friends
is what the sentence splitter cuts at and the tokenizer was trained on (``：`` between digits is
left too: wetext already reads ``10：30`` as a time, and ``问题1：3个`` is a label colon), and
``＜ ＞ ｜`` are never folded (``＜｜en｜＞`` must not turn into a special-token tag). Must not
import torch.
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["ALWAYS_FOLDED", "fold_fullwidth"]

#: Full-width characters always replaced by their NFKC (half-width) form.
ALWAYS_FOLDED = ("０１２３４５６７８９"
                 "ＡＢＣＤＥＦＧＨＩＪＫＬＭＮＯＰＱＲＳＴＵＶＷＸＹＺ"
                 "ａｂｃｄｅｆｇｈｉｊｋｌｍｎｏｐｑｒｓｔｕｖｗｘｙｚ"
                 "＄％＆＋／＝＠￠￡￥￦")
# the half-width forms are Unicode's compatibility mappings, not a hand-written table
_ALWAYS = str.maketrans({c: unicodedata.normalize("NFKC", c) for c in ALWAYS_FOLDED})
_ANY_ALWAYS_RE = re.compile("[" + ALWAYS_FOLDED + "]")

_IN_NUMBER_RE = re.compile(r"(?<=[0-9])～(?=[0-9])|(?<=[0-9A-Za-z])．(?=[0-9A-Za-z])")
_MINUS_RE = re.compile(r"－(?=[0-9])")
# a grouped number with full-width (or mixed) separators, as rules._GROUPED_RE for ","
_GROUPED_RE = re.compile(r"(?<![0-9,，.])[0-9]{1,3}(?:[,，][0-9]{3})+(?![0-9]|[,，][0-9])")


def fold_fullwidth(text: str) -> str:
    """``text`` with the full-width forms above replaced by their half-width forms.

    ``"￥２９９．９元"`` -> ``"¥299.9元"``, ``"５０％"`` -> ``"50%"``, ``"１，２３４"`` -> ``"1,234"``;
    ``"今天，天气好！"`` is returned unchanged. Each replaced character becomes one character, so
    the length never changes. Raises nothing.
    """
    if _ANY_ALWAYS_RE.search(text) is None and not any(c in text for c in "．～－，"):
        return text
    text = text.translate(_ALWAYS)
    text = _IN_NUMBER_RE.sub(lambda m: unicodedata.normalize("NFKC", m.group()), text)
    text = _MINUS_RE.sub("-", text)
    if "，" in text:
        text = _GROUPED_RE.sub(lambda m: m.group().replace("，", ","), text)
    return text
