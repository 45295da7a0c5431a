"""URLs, e-mail addresses, dotted names and version numbers: found and read as one unit.

On the official Chinese path every ``.`` becomes the sentence end ``。`` after wetext, so
``www.example.com`` is read ``www。example。com`` and the splitter may cut one address across two
synthesis segments; ``v2.3.1`` becomes ``v二。三点一``. cosyvino (docs/frontend.md, "Addresses
and versions") finds these spans before wetext, keeps wetext away from them and reads them
itself, so no ``.`` inside is left for the sentence rules:

* a **span** is a URL (``http://``, ``https://``, ``ftp://`` or ``www.`` and the ASCII URL
  characters after it), an e-mail address, a dotted name (ASCII word parts joined by ``.``
  with a letter somewhere and a part of two or more characters: ``example.com``,
  ``config.yaml``, ``Node.js``, ``v2.3.1``; not ``U.S.A``), or a number with two or more dots
  (``2.3.1``, ``192.168.1.1``); a trailing ``.``/``,``/``:`` etc. is not part of it;
* in a span, ``.`` reads as the language's word for "dot" (zh 点, ja ドット, ko 점, with a space
  around it in Korean) and each digit run reads either as a number (one or two digits, no
  leading zero: ``v2.10`` -> ``v二点十``) or digit by digit (``163`` -> ``一六三``); letters and
  every other character (``@``, ``/``, ``:``, ``-``, ``_``) stay as they are;
* a Chinese span of three numbers that is a date (year 1000..2999, month 1..12, day 1..31:
  ``2024.3.5``) reads as ``2024年3月5日`` through wetext.

English text does not need spans: wetext en reads URLs and e-mails ("dot", "at") and only its
reading of a multi-dot number is wrong (``2.3.1`` -> ``two.three point one``), which
:func:`rewrite_versions_en` fixes before wetext. Must not import torch.
"""

from __future__ import annotations

import re
from typing import Callable

__all__ = ["DOT_WORDS", "find_spans", "read_span", "rewrite_versions_en"]

#: The word read for "." inside a span, per path.
DOT_WORDS = {"zh": "点", "ja": "ドット", "ko": " 점 "}

_URL = r"(?i:https?://|ftp://|www\.)[A-Za-z0-9\-._~:/?#\[\]@!$&'*+;=%]*[A-Za-z0-9\-_~/#=&%]"
_EMAIL = r"[A-Za-z0-9][A-Za-z0-9._%+\-]*@[A-Za-z0-9\-]+(?:\.[A-Za-z0-9\-]+)+"
_DOTTED = r"[A-Za-z0-9_\-]+(?:\.[A-Za-z0-9_\-]+)+"
_SPAN_RE = re.compile(r"(?<![A-Za-z0-9_\-.@/])(?:" + _URL + "|" + _EMAIL + "|" + _DOTTED
                      + r")(?![A-Za-z0-9_\-@]|\.[A-Za-z0-9_\-])")
_MULTI_DOT_NUMBER_RE = re.compile(r"\d+(?:\.\d+){2,}")
_DATE_RE = re.compile(r"([12]\d{3})\.(0?[1-9]|1[0-2])\.(0?[1-9]|[12]\d|3[01])")
_DIGITS_RE = re.compile(r"\d+")


def _is_span(s: str) -> bool:
    low = s.lower()
    if low.startswith(("http://", "https://", "ftp://", "www.")) or "@" in s:
        return True
    if _MULTI_DOT_NUMBER_RE.fullmatch(s):
        return True
    parts = s.split(".")
    # a dotted name: a letter somewhere and a part longer than one character (not "U.S.A");
    # "3.14" (digits only, one dot) is a decimal number and stays with wetext
    return any(c.isalpha() for c in s) and any(len(p) > 1 for p in parts)


def find_spans(text: str) -> list[tuple[int, int]]:
    """``(start, end)`` of every URL / e-mail / dotted name / multi-dot number in ``text``.

    Spans are ASCII-only, sorted and disjoint. Pure function, no errors.
    """
    return [m.span() for m in _SPAN_RE.finditer(text) if _is_span(m.group())]


def read_span(span: str, lang: str, cardinal: Callable[[str], str],
              by_digit: Callable[[str], str],
              normalize_date: Callable[[str], str] | None = None) -> str:
    """The reading of one span for path ``lang`` ("zh", "ja" or "ko").

    ``cardinal`` / ``by_digit`` read a digit run as a number / digit by digit in that language;
    ``normalize_date`` (zh) turns ``"2024年3月5日"`` into words. Raises KeyError for another
    ``lang``.
    """
    dot = DOT_WORDS[lang]
    if normalize_date is not None:
        m = _DATE_RE.fullmatch(span)
        if m:
            y, mo, d = m.groups()
            return normalize_date(f"{y}年{int(mo)}月{int(d)}日")

    def digits(m: re.Match) -> str:
        run = m.group()
        if len(run) <= 2 and run[0] != "0" or run == "0":
            return cardinal(run)
        return by_digit(run)
    return ".".join(_DIGITS_RE.sub(digits, part) for part in span.split(".")).replace(".", dot)


_VERSION_EN_RE = re.compile(r"(?<![\w.])([vV]?)(\d+(?:\.\d+){2,}|(?<=[vV])\d+\.\d+)(?![\w]|\.\d)")
_IP_RE = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")


def rewrite_versions_en(text: str) -> str:
    """English: ``2.3.1`` / ``v1.2`` -> ``2 point 3 point 1`` / ``v1 point 2`` before wetext.

    IPv4 addresses (four parts of up to three digits) are left to wetext, which reads them
    digit by digit with "dot".
    """
    def repl(m: re.Match) -> str:
        if _IP_RE.fullmatch(m.group(2)):
            return m.group()
        return m.group(1) + " point ".join(m.group(2).split("."))
    return _VERSION_EN_RE.sub(repl, text)
