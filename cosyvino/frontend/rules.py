"""Rewrites applied before wetext where wetext reads a construct wrongly (cosyvino addition).

Each rule turns the text into a form that wetext itself reads correctly (docs/frontend.md,
"Numbers, money and hyphens"); nothing here spells numbers. Must not import torch.

English (wetext 0.1.8 ``lang="en"``):

* :func:`rewrite_money_en`: a currency symbol amount (``$ € £ ¥ ₩``, optional thousands
  separators, optional one or two decimals, not followed by a scale word such as "million")
  becomes "<integer> <unit(s)> [and <cents> <subunit(s)>]": ``$12.50`` -> ``12 dollars and 50
  cents`` (wetext: "twelve point five dollars"), ``$0.99`` -> ``99 cents``, ``€1.01`` -> ``1 euro
  and 1 cent``, ``£5.05`` -> ``5 pounds and 5 pence``; one decimal is tenths (``$2.5`` -> 50
  cents).
  Yen and won have no subunit in use: a decimal amount keeps wetext's "point" reading. The
  integer is written with thousands separators so wetext reads it as a cardinal, not a year.
* :func:`rewrite_thousands_en`: wetext drops the "one" of 1,000..1,999 written with a separator
  (``1,234`` -> "thousand two hundred and thirty four"); ``1,234`` becomes ``1 thousand 234``,
  which wetext reads "one thousand two hundred and thirty four".

Chinese (wetext ``lang="zh"``):

* :func:`rewrite_thousands_zh`: separators are removed from a well-formed grouped number
  (``1,234.56`` -> ``1234.56``); wetext reads ``1,234.56`` as "一,两百三十四点五六".
* :func:`rewrite_hyphen_zh`: an ASCII letter, ``-``, a digit (``COVID-19``, ``RTX-4090``)
  becomes letter, space, digit; wetext otherwise reads the hyphen as a minus sign
  (``COVID负十九``). The space is removed by the Chinese path's blank rule afterwards.
* :func:`rewrite_symbol_before_unit_zh`: a currency symbol amount followed by a currency word
  (``¥299.9元``, ``$5美元``) loses the symbol: the word already says the unit, and wetext reads
  the pair wrongly (``¥299.9元`` -> "二元九十九点九元", ``¥2元`` -> "¥两元", ``$5美元`` ->
  "五美元美元", ``¥1.5万元`` -> "¥一点五万元"); ``299.9元`` reads "两百九十九点九元".
"""

from __future__ import annotations

import re

__all__ = ["rewrite_money_en", "rewrite_thousands_en", "rewrite_thousands_zh",
           "rewrite_hyphen_zh", "rewrite_symbol_before_unit_zh"]

# symbol -> (unit singular, unit plural, subunit singular, subunit plural or None)
_CURRENCIES = {
    "$": ("dollar", "dollars", "cent", "cents"),
    "€": ("euro", "euros", "cent", "cents"),
    "£": ("pound", "pounds", "penny", "pence"),
    "¥": ("yen", "yen", None, None),
    "₩": ("won", "won", None, None),
}
_SCALE_WORDS = r"(?:thousand|million|billion|trillion|[kKmMbB]n?|bn)\b"
_MONEY_RE = re.compile(
    r"(?<![\w$€£¥₩])([$€£¥₩]) ?(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d{1,2}))?(?![\d,.]?\d)"
    r"(?! ?" + _SCALE_WORDS + ")")
_THOUSAND_ONE_RE = re.compile(r"(?<![\d,.])1,(\d{3})(?![\d]|,\d)")
_GROUPED_RE = re.compile(r"(?<![\d,.])\d{1,3}(?:,\d{3})+(?![\d]|,\d)")
_HYPHEN_RE = re.compile(r"(?<=[A-Za-z])-(?=\d)")
# the Chinese currency words a symbol amount can be followed by (the unit read after a number)
_ZH_CURRENCY_WORDS = ("元", "圆", "块", "人民币", "美元", "美金", "欧元", "英镑", "日元",
                      "日圆", "韩元", "港元", "港币", "澳元", "加元", "台币", "新台币")
_SYMBOL_BEFORE_UNIT_RE = re.compile(
    r"[$€£¥₩] ?([0-9]+(?:,[0-9]{3})*(?:\.[0-9]+)?) ?(?=[十百千万亿]*(?:"
    + "|".join(_ZH_CURRENCY_WORDS) + "))")


def rewrite_money_en(text: str) -> str:
    """``$12.50`` -> ``12 dollars and 50 cents`` and the like (see the module docstring)."""
    def repl(m: re.Match) -> str:
        symbol, integer, decimals = m.groups()
        unit, units, sub, subs = _CURRENCIES[symbol]
        if decimals is not None and sub is None:
            return m.group()  # yen / won with decimals: wetext's "point" reading
        value = int(integer.replace(",", ""))
        cents = int(decimals.ljust(2, "0")) if decimals is not None else 0
        parts = []
        if value or not cents:
            parts.append(f"{value:,} {unit if value == 1 else units}")
        if cents:
            parts.append(f"{cents} {sub if cents == 1 else subs}")
        return " and ".join(parts)
    return _MONEY_RE.sub(repl, text)


def rewrite_thousands_en(text: str) -> str:
    """``1,234`` -> ``1 thousand 234`` and ``1,000`` -> ``1 thousand`` (1,000..1,999 only)."""
    def repl(m: re.Match) -> str:
        rest = m.group(1).lstrip("0")
        return "1 thousand" + (f" {rest}" if rest else "")
    return _THOUSAND_ONE_RE.sub(repl, text)


def rewrite_thousands_zh(text: str) -> str:
    """``1,234,567.8`` -> ``1234567.8`` (well-formed groups of three digits only)."""
    return _GROUPED_RE.sub(lambda m: m.group().replace(",", ""), text)


def rewrite_hyphen_zh(text: str) -> str:
    """``COVID-19`` -> ``COVID 19`` (an ASCII letter, a hyphen, a digit)."""
    return _HYPHEN_RE.sub(" ", text)


def rewrite_symbol_before_unit_zh(text: str) -> str:
    """``¥299.9元`` -> ``299.9元``, ``$ 5 美元`` -> ``5美元``, ``¥1.5万元`` -> ``1.5万元`` (a
    symbol amount before a currency word, optionally with a scale 十百千万亿 between);
    ``¥299.9`` alone is left to wetext ("两百九十九点九元")."""
    return _SYMBOL_BEFORE_UNIT_RE.sub(r"\1", text)
