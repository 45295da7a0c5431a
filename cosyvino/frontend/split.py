"""Sentence splitting of normalized text into synthesis segments (CosyVoice ``split_paragraph``).

Official behaviour (upstream HEAD, reproduced here):

* terminators: zh ``。？！；：、.?!;``, en ``.?!;:`` (plus ``，`` ``,`` with ``comma_split``);
* a terminator is appended when the text does not end with one (``。`` zh, ``.`` en);
* the text is cut after every terminator (kept with the left piece); an empty piece is dropped
  together with its terminator; a ``"`` or ``”`` right after a terminator goes with the left piece;
* length = characters (zh) or text tokens (en);
* greedy merge: before adding a piece, if ``len(acc + piece) > token_max_n`` and
  ``len(acc) > token_min_n`` the accumulator is emitted; a final remainder shorter than
  ``merge_len`` is glued to the previous segment.

Deliberate improvement (documented in docs/frontend.md): the official splitter never cuts a
piece that has no terminator, so a long run without punctuation (20,000 Chinese characters, a
long English word run) became ONE huge segment, and the merge could also build segments of any
size. Here every segment is bounded by ``hard_max_n`` (default ``2 * token_max_n``, i.e. 160
characters / tokens):

* a piece longer than ``hard_max_n`` is cut into sub-pieces of at most ``token_max_n``,
  preferring commas (``，`` ``,`` ``、``), then spaces, then any character boundary (never
  inside a ``<|...|>`` tag);
* the merge also emits the accumulator when adding a piece would exceed ``hard_max_n``, and the
  final short remainder is glued only when the result stays within ``hard_max_n``.

Text is never dropped by the splitter (only the empty-piece terminators described above).
Inputs whose pieces all fit the bound produce exactly the official segments.
Must not import torch.
"""

from __future__ import annotations

import re
from typing import Callable, Sequence

__all__ = [
    "TERMINATORS_ZH",
    "TERMINATORS_EN",
    "TAG_RE",
    "split_paragraph",
]

TERMINATORS_ZH = frozenset("。？！；：、.?!;")
TERMINATORS_EN = frozenset(".?!;:")
_COMMAS = frozenset("，,")
_CLOSING_QUOTES = frozenset('"”')

#: A literal special-token tag such as ``<|en|>`` or ``<|0.00|>``; treated as one atom.
TAG_RE = re.compile(r"<\|[^<>|\s]{1,32}\|>")

# Cut points for over-long pieces, in order of preference (the cut is at the match end).
_COMMA_CUT = re.compile(r"[，,、]+")
_SPACE_CUT = re.compile(r"(?=\s)")  # before a space: the space starts the next sub-piece


def _atoms(text: str) -> list[str]:
    """Characters of ``text``, with every ``<|...|>`` tag kept as one atom."""
    if "<|" not in text:
        return list(text)
    out: list[str] = []
    pos = 0
    for m in TAG_RE.finditer(text):
        out.extend(text[pos:m.start()])
        out.append(m.group())
        pos = m.end()
    out.extend(text[pos:])
    return out


def _cut_units(text: str, pattern: re.Pattern) -> list[str]:
    """``text`` cut at the ends of ``pattern`` matches (zero-width allowed); no tag is split."""
    cuts = []
    for m in pattern.finditer(text):
        end = m.end()
        if 0 < end < len(text):
            cuts.append(end)
    if not cuts:
        return [text]
    # never cut inside a tag
    tags = [m.span() for m in TAG_RE.finditer(text)] if "<|" in text else []
    units, start = [], 0
    for c in cuts:
        if any(a < c < b for a, b in tags) or c <= start:
            continue
        units.append(text[start:c])
        start = c
    units.append(text[start:])
    return units


def _pack(units: Sequence[str], measure: Callable[[str], int], limit: int) -> list[str]:
    out: list[str] = []
    acc = ""
    for u in units:
        if acc and measure(acc + u) > limit:
            out.append(acc)
            acc = u
        else:
            acc += u
    if acc:
        out.append(acc)
    return out


def _hard_split(piece: str, measure: Callable[[str], int], limit: int,
                level: int = 0) -> list[str]:
    """Cut ``piece`` into parts of measure <= ``limit`` (commas, then spaces, then atoms)."""
    if measure(piece) <= limit:
        return [piece]
    if level == 0:
        units = _cut_units(piece, _COMMA_CUT)
    elif level == 1:
        units = _cut_units(piece, _SPACE_CUT)
    else:
        return _pack(_atoms(piece), measure, limit)
    expanded: list[str] = []
    for u in units:
        if measure(u) > limit:
            expanded.extend(_hard_split(u, measure, limit, level + 1))
        else:
            expanded.append(u)
    return _pack(expanded, measure, limit)


def _cut_at_terminators(text: str, terminators: frozenset) -> list[str]:
    pieces: list[str] = []
    n = len(text)
    start = i = 0
    while i < n:
        c = text[i]
        if c == "<" and text.startswith("<|", i):
            m = TAG_RE.match(text, i)
            if m:
                i = m.end()
                continue
        if c not in terminators:
            i += 1
            continue
        end = i + 1
        if end < n and text[end] in _CLOSING_QUOTES:
            end += 1
        if i > start:
            pieces.append(text[start:end])
            start = i = end
        elif end > i + 1 and pieces:
            # empty piece: its terminator is dropped, a closing quote still joins the left piece
            pieces[-1] += text[i + 1:end]
            start = i = end
        else:
            # empty piece: drop the terminator (a following quote, if any, starts the next piece)
            start = i = i + 1
    if start < n:  # only reachable when the text does not end with a terminator
        pieces.append(text[start:])
    return pieces


def split_paragraph(text: str, tokenize: Callable[[str], Sequence[int]], lang: str = "zh",
                    token_max_n: int = 80, token_min_n: int = 60, merge_len: int = 20,
                    comma_split: bool = False, hard_max_n: int | None = None) -> list[str]:
    """Split normalized ``text`` into segments (official ``split_paragraph`` + a hard bound).

    ``lang`` is ``"zh"`` (length = characters) or ``"en"`` (length = ``len(tokenize(s))``).
    Every returned segment has length <= ``hard_max_n`` (default ``2 * token_max_n``).
    An empty ``text`` gives ``[]``.
    """
    if lang not in ("zh", "en"):
        raise ValueError(f"lang must be 'zh' or 'en', got {lang!r}")
    hard_max = 2 * token_max_n if hard_max_n is None else int(hard_max_n)
    if hard_max < max(token_max_n, 4):
        raise ValueError(
            f"hard_max_n ({hard_max}) must be >= token_max_n ({token_max_n}) and >= 4")
    if not text:
        return []

    if lang == "zh":
        measure: Callable[[str], int] = len
        terminators = TERMINATORS_ZH
        final_mark = "。"
    else:
        def measure(s: str) -> int:
            return len(tokenize(s))
        terminators = TERMINATORS_EN
        final_mark = "."
    if comma_split:
        terminators = terminators | _COMMAS
    if text[-1] not in terminators:
        text += final_mark

    pieces: list[str] = []
    for piece in _cut_at_terminators(text, terminators):
        if measure(piece) > hard_max:
            pieces.extend(_hard_split(piece, measure, token_max_n))
        else:
            pieces.append(piece)

    segments: list[str] = []
    acc = ""
    for piece in pieces:
        if acc:
            joined = measure(acc + piece)
            if (joined > token_max_n and measure(acc) > token_min_n) or joined > hard_max:
                segments.append(acc)
                acc = ""
        acc += piece
    if acc:
        if (segments and measure(acc) < merge_len
                and measure(segments[-1] + acc) <= hard_max):
            segments[-1] += acc
        else:
            segments.append(acc)
    return segments
