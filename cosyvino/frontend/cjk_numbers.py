"""Digits inside Korean and Japanese text, read in the text's language (cosyvino addition).

The official frontend sends Korean text (no CJK ideograph) down its English path, where every
digit run is spelled with inflect ("3개" -> "three개"), and Japanese text with a kanji down the
Chinese path (Chinese readings: "2024年" -> "二零二四年", "50%" -> "百分之五十"). Here
(docs/frontend.md, "Korean and Japanese digits"):

* Korean: Sino-Korean numerals in Hangul (``num2words(n, lang="ko")``: 2024 -> 이천이십사,
  1,500 -> 천오백), except that a whole number 1..99 directly before a native-Korean counter
  (개, 명, 살, 마리, 시, 시간 ...; not after 제) uses the native attributive form (3개 -> 세개,
  20살 -> 스무살). Digit-by-digit runs read 0 as 공 (telephone style), a decimal part as 영.
* Japanese: kanji numerals (``num2words(n, lang="ja")``: 2024 -> 二千二十四, 1500 -> 千五百,
  10000 -> 一万).
* Both: a decimal part reads digit by digit after 점 / 点 (3.5 -> 삼점오 / 三点五); thousands
  separators (``1,500``) are part of the number; telephone-like groups joined by hyphens
  (three groups, or a first group starting with 0: ``090-1234-5678``) read digit by digit, and
  so does any other run that starts with 0 and has more digits (codes) or is too long for
  num2words;
  ``%`` after a number reads 퍼센트 / パーセント; a clock time ``H:MM`` reads 시/분 (the hour
  native for 1..12: 10:30 -> 열시삼십분) / 時/分 (10:30 -> 十時三十分). Signs are not read (a
  ``-`` stays as it is).

The number replaces the digits in place; the surrounding text (counters, particles, spacing)
is unchanged. Must not import torch.
"""

from __future__ import annotations

import re
import threading
from typing import Callable

__all__ = ["read_numbers_ko", "read_numbers_ja", "digit_words_ko", "digit_words_ja",
           "cardinal_ko", "cardinal_ja"]

# A number: an integer (optionally with 3-digit thousands groups) and an optional decimal part.
# Not preceded or followed by further digits.
_NUMBER_RE = re.compile(r"(?<!\d)(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(?!\d)(\s?%)?")

# Native-Korean counters: a whole number 1..99 right before one reads natively.
_KO_NATIVE_COUNTERS = ("시간", "마리", "사람", "그루", "송이", "켤레", "가지", "군데", "번째",
                       "개", "명", "살", "시", "권", "잔", "병", "장", "벌", "달", "곳", "채",
                       "척", "통", "대")
_KO_COUNTER_RE = re.compile(r"\s?(?:" + "|".join(_KO_NATIVE_COUNTERS) + ")")
_KO_NATIVE_ONES = ("", "한", "두", "세", "네", "다섯", "여섯", "일곱", "여덟", "아홉")
_KO_NATIVE_TENS = ("", "열", "스물", "서른", "마흔", "쉰", "예순", "일흔", "여든", "아흔")
_KO_DIGITS = "공일이삼사오육칠팔구"
# A clock time: hours 0..24, minutes 00..59.
_TIME_RE = re.compile(r"(?<![\d:])([01]?\d|2[0-4]):([0-5]\d)(?![\d:])")
# Telephone-like: digit groups joined by hyphens, three groups or a first group starting with 0.
_PHONE_RE = re.compile(r"(?<![\d-])(?:\d{2,4}(?:-\d{2,4}){2}|0\d+(?:-\d+)+)(?![\d-])")
_JA_DIGITS = "零一二三四五六七八九"

_LOCK = threading.Lock()


def _num2words(value: int, lang: str) -> str:
    from num2words import num2words  # imported on first use (pure Python)
    with _LOCK:
        return num2words(value, lang=lang)


def digit_words_ko(digits: str) -> str:
    """Korean digit-by-digit reading of decimal digits: "010" -> "공일공"."""
    return "".join(_KO_DIGITS[int(d)] for d in digits)


def digit_words_ja(digits: str) -> str:
    """Japanese digit-by-digit reading of decimal digits: "090" -> "零九零"."""
    return "".join(_JA_DIGITS[int(d)] for d in digits)


def _cardinal(digits: str, lang: str, by_digit: Callable[[str], str]) -> str:
    if len(digits) > 1 and digits[0] in "0０":
        return by_digit(digits)
    try:
        return _num2words(int(digits), lang).replace(" ", "")
    except (OverflowError, ValueError, IndexError, KeyError):  # beyond the largest unit
        return by_digit(digits)


def cardinal_ko(digits: str) -> str:
    """Sino-Korean reading of a run of decimal digits: "2024" -> "이천이십사"."""
    return _cardinal(digits, "ko", digit_words_ko)


def cardinal_ja(digits: str) -> str:
    """Japanese kanji reading of a run of decimal digits: "2024" -> "二千二十四"."""
    return _cardinal(digits, "ja", digit_words_ja)


def _native_ko(value: int) -> str:
    if value == 20:
        return "스무"
    return _KO_NATIVE_TENS[value // 10] + _KO_NATIVE_ONES[value % 10]


def _read(text: str, cardinal: Callable[[str], str], by_digit: Callable[[str], str],
          point: str, decimal_digits: Callable[[str], str], percent: str,
          native: Callable[[str, re.Match], str | None],
          clock: Callable[[int, int], str]) -> str:
    def repl(m: re.Match) -> str:
        integer = m.group(1).replace(",", "")
        words = native(integer, m) if m.group(2) is None and m.group(3) is None else None
        if words is None:
            words = cardinal(integer)
            if m.group(2) is not None:
                words += point + decimal_digits(m.group(2))
        if m.group(3) is not None:
            words += percent
        return words

    def phone(m: re.Match) -> str:
        return "-".join(by_digit(g) for g in m.group().split("-"))

    out, pos = [], 0
    for m in _PHONE_RE.finditer(text):
        out.append(_number_pass(text[pos:m.start()], repl, clock))
        out.append(phone(m))
        pos = m.end()
    out.append(_number_pass(text[pos:], repl, clock))
    return "".join(out)


def _number_pass(part: str, repl: Callable[[re.Match], str],
                 clock: Callable[[int, int], str]) -> str:
    """Clock times first (``10:30``), then every other number, in ``part``."""
    out, pos = [], 0
    for m in _TIME_RE.finditer(part):
        out.append(_NUMBER_RE.sub(repl, part[pos:m.start()]))
        out.append(clock(int(m.group(1)), int(m.group(2))))
        pos = m.end()
    out.append(_NUMBER_RE.sub(repl, part[pos:]))
    return "".join(out)


def read_numbers_ko(text: str) -> str:
    """``text`` with every number read in Korean ("3개의 사과" -> "세개의 사과")."""
    def native(integer: str, m: re.Match) -> str | None:
        value = int(integer)
        if not 1 <= value <= 99 or integer[0] in "0０" or "," in m.group(1):
            return None
        where = m.string  # the piece being read (between telephone numbers / times)
        if m.start() > 0 and where[m.start() - 1] == "제":
            return None
        if _KO_COUNTER_RE.match(where, m.end()) is None:
            return None
        return _native_ko(value)

    def clock(hour: int, minute: int) -> str:
        h = _native_ko(hour) if 1 <= hour <= 12 else cardinal_ko(str(hour))
        return h + "시" + (cardinal_ko(str(minute)) + "분" if minute else "")
    return _read(text, cardinal_ko, digit_words_ko, "점",
                 lambda d: digit_words_ko(d).replace("공", "영"), "퍼센트", native, clock)


def read_numbers_ja(text: str) -> str:
    """``text`` with every number read in Japanese kanji ("2024年" -> "二千二十四年")."""
    def clock(hour: int, minute: int) -> str:
        return cardinal_ja(str(hour)) + "時" + (cardinal_ja(str(minute)) + "分" if minute else "")
    return _read(text, cardinal_ja, digit_words_ja, "点", digit_words_ja, "パーセント",
                 lambda i, m: None, clock)
