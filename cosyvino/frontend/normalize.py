"""Text normalization of CosyVoice v1 (upstream HEAD ``text_normalize`` with the wetext engine).

Pipeline of :func:`normalize_and_split` (see docs/frontend.md for the full list of deliberate
differences from the official code, each marked "deliberate" below):

1. Clean-up (deliberate): ANSI escape sequences are removed; line breaks (``\\r\\n``,
   ``\\r``, VT, FF, U+0085, U+2028/2029 ...) become ``\\n``; tabs and other Unicode spaces
   become a space; other control and invisible format characters (C0/C1 controls, zero-width
   and bidi marks, BOM, soft hyphen, lone surrogates) are removed; runs of spaces collapse to
   one; leading/trailing space is stripped.
2. Text containing both ``<|`` and ``|>`` (a language tag like ``<|en|>``) is neither
   normalized nor split (HEAD rule), except that a text longer than the segment bound is split
   (deliberate, see :mod:`cosyvino.frontend.split`) and each later segment is prefixed with the
   language tag in force at its start. Other text gets its full-width digits, letters,
   currency signs, ``％`` ... folded to their half-width forms (deliberate,
   :mod:`cosyvino.frontend.fullwidth`; Chinese punctuation is kept).
3. Path (:func:`text_path`): kana -> Japanese (deliberate), else a CJK ideograph -> Chinese,
   else Hangul -> Korean (deliberate), else English.
   Chinese path (text contains a character in U+4E00..U+9FFF): URLs, e-mails, dotted names and
   multi-dot numbers are read as units (deliberate, :mod:`cosyvino.frontend.addresses`), the rest
   gets the rewrites of :mod:`cosyvino.frontend.rules` (deliberate: thousands separators,
   letter-hyphen-digit, a currency symbol before a currency word) and wetext zh TN
   (``Normalizer(lang="zh", operator="tn", remove_erhua=False)``), delete ``\\n``, remove spaces
   except between two non-space ASCII characters, ``²``->``平方`` ``³``->``立方``, ``.``->``。``,
   ``" - "``->``，``, delete ``（）【】`` and backticks, ``——``->space, a trailing run of
   ``，,、`` becomes ``。``; split with lang "zh".
4. English path: the rewrites of :mod:`cosyvino.frontend.rules` and
   :func:`~cosyvino.frontend.addresses.rewrite_versions_en` (deliberate: money, 1,000..1,999,
   versions), wetext en TN (``Normalizer(lang="en", operator="tn")``), then every run of
   decimal digits is spelled out with ``inflect`` (``number_to_words``); split with lang "en".
   Japanese path (deliberate): numbers in kanji (:mod:`cosyvino.frontend.cjk_numbers`),
   addresses as units, no wetext, then the Chinese path's rule-based steps; split with lang
   "zh". Korean path (deliberate): numbers in Hangul, addresses as units, no wetext, line
   breaks read as spaces; split with lang "en".
5. Segments without any letter or digit are dropped; if nothing remains,
   :class:`cosyvino.errors.EmptyTextError` is raised.

wetext is run in chunks (lines, then pieces of at most ``MAX_CHUNK`` characters cut at sentence
ends / commas / spaces) so a 20,000-character text normalizes in linear time and bounded memory;
texts shorter than ``MAX_CHUNK`` per line are normalized in one call, exactly like upstream.
If wetext is not installed the engine step is skipped (upstream's fallback), and with it the
rewrites and span readings around it on the Chinese and English paths; the other rule-based
steps (and the Japanese and Korean paths, which do not use wetext) still run. Must not import
torch.
"""

from __future__ import annotations

import logging
import re
import threading
import unicodedata
from typing import Callable, Sequence

import regex

from cosyvino.errors import EmptyTextError, InputError
from cosyvino.frontend import addresses, cjk_numbers, rules
from cosyvino.frontend.fullwidth import fold_fullwidth
from cosyvino.frontend.split import TAG_RE, split_paragraph
from cosyvino.frontend.tokenizer import LANGUAGES

__all__ = [
    "TOKEN_MAX_N",
    "TOKEN_MIN_N",
    "MERGE_LEN",
    "HARD_MAX_N",
    "MAX_CHUNK",
    "clean_text",
    "contains_chinese",
    "has_tags",
    "is_speakable",
    "spell_out_numbers",
    "engine_name",
    "text_path",
    "normalize",
    "normalize_and_split",
]

log = logging.getLogger(__name__)

TOKEN_MAX_N = 80
TOKEN_MIN_N = 60
MERGE_LEN = 20
#: Upper bound of every segment (characters for zh, text tokens for en). Deliberate addition.
HARD_MAX_N = 2 * TOKEN_MAX_N
#: Longest piece of text given to wetext in one call.
MAX_CHUNK = 400
_MIN_CHUNK = 100

_CHINESE_RE = re.compile(r"[\u4e00-\u9fff]")
# Hiragana, katakana (with phonetic extensions) and half-width katakana; Hangul syllables and jamo.
_KANA_RE = re.compile(r"[\u3040-\u309f\u30a0-\u30ff\u31f0-\u31ff\uff66-\uff9d]")
_HANGUL_RE = re.compile(r"[\uac00-\ud7a3\u1100-\u11ff\u3130-\u318f]")
_SPEAKABLE_RE = regex.compile(r"[\p{L}\p{N}]")
_LANG_TAG_RE = re.compile(r"<\|(?:" + "|".join(LANGUAGES) + r")\|>")

# -- 1. clean-up ---------------------------------------------------------------------------
# ANSI/VT100 escape sequences (CSI ... final byte, OSC ... BEL/ST, two-byte ESC x)
_ANSI_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)?|[@-Z\\-_])")
_NEWLINES_RE = re.compile(r"\r\n|[\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]")
# Removed outright: C0/C1 controls except \t \n, DEL, soft hyphen, combining grapheme joiner,
# Mongolian vowel separator, zero-width/bidi/invisible operators, BOM, interlinear annotation,
# lone surrogates.
_REMOVE_RE = re.compile(
    "[\x00-\x08\x0e-\x1b\x1f\x7f-\x84\x86-\x9f\u00ad\u034f\u180e\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\ufeff\ufff9-\ufffb\ud800-\udfff]")
_SPACES_RE = re.compile(r"[\t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000]")
_SPACE_RUN_RE = re.compile(r" {2,}")
_SPACE_NL_RE = re.compile(r" *\n[ \n]*")


def clean_text(text: str) -> str:
    """Deliberate clean-up: unify line breaks/spaces, drop control/invisible chars, strip."""
    if not isinstance(text, str):
        raise InputError(f"text must be a str, got {type(text).__name__}")
    if "\x1b" in text:
        text = _ANSI_RE.sub("", text)
    text = _NEWLINES_RE.sub("\n", text)
    text = _REMOVE_RE.sub("", text)
    text = _SPACES_RE.sub(" ", text)
    text = _SPACE_RUN_RE.sub(" ", text)
    text = _SPACE_NL_RE.sub("\n", text)
    return text.strip()


def contains_chinese(text: str) -> bool:
    """True when ``text`` has a CJK unified ideograph (U+4E00..U+9FFF): the Chinese path."""
    return _CHINESE_RE.search(text) is not None


def text_path(text: str) -> str:
    """The normalization path of (cleaned, untagged) ``text``: "ja", "zh", "ko" or "en".

    Kana anywhere -> "ja" (deliberate; official: "zh" with a kanji, else "en"); else a CJK
    ideograph -> "zh"; else Hangul -> "ko" (deliberate; official: "en"); else "en".
    """
    if _KANA_RE.search(text):
        return "ja"
    if contains_chinese(text):
        return "zh"
    if _HANGUL_RE.search(text):
        return "ko"
    return "en"


def has_tags(text: str) -> bool:
    """HEAD's rule for "contains a special-token tag": both ``<|`` and ``|>`` occur."""
    return "<|" in text and "|>" in text


def is_speakable(text: str) -> bool:
    """True when ``text`` has a letter or a digit outside ``<|...|>`` tags."""
    if "<|" in text:
        text = TAG_RE.sub("", text)
    return _SPEAKABLE_RE.search(text) is not None


# -- engines (lazy, shared, locked) --------------------------------------------------------
_ENGINE_LOCK = threading.Lock()
_ENGINES: dict[str, object] = {}
_ENGINE_MISSING = object()


def _engine(lang: str):
    """The wetext normalizer for ``lang`` or None when wetext is unavailable."""
    eng = _ENGINES.get(lang)
    if eng is None:
        with _ENGINE_LOCK:
            eng = _ENGINES.get(lang)
            if eng is None:
                try:
                    from wetext import Normalizer
                except Exception as exc:  # pragma: no cover - depends on the environment
                    log.warning("wetext is not available (%s); text normalization engine "
                                "skipped, only the rule-based steps run", exc)
                    eng = _ENGINE_MISSING
                else:
                    if lang == "zh":
                        eng = Normalizer(lang="zh", operator="tn", remove_erhua=False)
                    else:
                        eng = Normalizer(lang="en", operator="tn")
                _ENGINES[lang] = eng
    return None if eng is _ENGINE_MISSING else eng


def engine_name() -> str:
    """``"wetext <version>"`` or ``"none"``."""
    if _engine("zh") is None:
        return "none"
    try:
        from importlib.metadata import version
        return f"wetext {version('wetext')}"
    except Exception:  # pragma: no cover
        return "wetext"


_UNESCAPE_RE = re.compile(r'\\([\\"])')


def _run_wetext(eng, text: str) -> str:
    try:
        with _ENGINE_LOCK:
            out = eng.normalize(text)
    except Exception as exc:  # wetext asserts on some inputs; keep the text rather than fail
        log.warning("wetext failed on %r (%s: %s); text kept unnormalized",
                    text[:40], type(exc).__name__, exc)
        return text
    # wetext 0.1.x escapes `"` and `\` once too often in FST output (`"` -> `\"`); undo it when
    # the output carries more backslashes than the input did.
    if out.count("\\") > text.count("\\"):
        out = _UNESCAPE_RE.sub(r"\1", out)
    return out


# Preferred chunk ends for wetext, best first (the chunk ends at the match end).
_CHUNK_CUTS = (
    re.compile(r"[。！？；…]+[”’」』）)]*"),
    re.compile(r"[!?;]+[\"”')]*(?= )"),
    re.compile(r"(?<=[a-z0-9)]{2})\.[\"”')]*(?= +[A-Z\"“(])"),
    re.compile(r"[，、：]+|[,:](?= )"),
    re.compile(r"(?<=[^\d]) (?=[^\d])"),
    re.compile(r"(?<![\dA-Za-z.,])(?![\dA-Za-z.,])"),
)


def _chunks(line: str) -> list[str]:
    """``line`` cut into pieces of at most MAX_CHUNK chars at the most natural boundaries."""
    if len(line) <= MAX_CHUNK:
        return [line]
    out, pos, n = [], 0, len(line)
    while n - pos > MAX_CHUNK:
        window_lo, window_hi = pos + _MIN_CHUNK, pos + MAX_CHUNK
        cut = None
        for pattern in _CHUNK_CUTS:
            best = None
            for m in pattern.finditer(line, window_lo - 1, window_hi):
                if window_lo <= m.end() <= window_hi:
                    best = m.end()
            if best is not None:
                cut = best
                break
        if cut is None or cut <= pos:
            cut = window_hi
        out.append(line[pos:cut])
        pos = cut
    out.append(line[pos:])
    return out


def _wetext_keep_spaces(eng, text: str) -> str:
    """wetext on ``text`` without its leading/trailing spaces (the en grammar asserts on them)."""
    core = text.strip(" ")
    if not core:
        return text
    lead = text[:len(text) - len(text.lstrip(" "))]
    trail = text[len(text.rstrip(" ")):]
    return lead + _run_wetext(eng, core) + trail


_ZH_DIGITS = str.maketrans("0123456789", "零一二三四五六七八九")


def _with_spans(text: str, lang: str, plain: Callable[[str], str],
                cardinal: Callable[[str], str], by_digit: Callable[[str], str],
                normalize_date: Callable[[str], str] | None = None) -> str:
    """``plain`` applied between the address/version spans of ``text``, spans read as units."""
    spans = addresses.find_spans(text)
    if not spans:
        return plain(text)
    out, pos = [], 0
    for start, end in spans:
        out.append(plain(text[pos:start]) if start > pos else "")
        out.append(addresses.read_span(text[start:end], lang, cardinal, by_digit,
                                       normalize_date))
        pos = end
    if pos < len(text):
        out.append(plain(text[pos:]))
    return "".join(out)


def _normalize_piece(eng, text: str, lang: str) -> str:
    """wetext on one chunk, with cosyvino's rules around it (rules.py, addresses.py)."""
    if lang == "en":
        text = rules.rewrite_money_en(text)
        text = rules.rewrite_thousands_en(text)
        text = addresses.rewrite_versions_en(text)
        return _run_wetext(eng, text)

    def plain(part: str) -> str:
        part = rules.rewrite_hyphen_zh(rules.rewrite_thousands_zh(part))
        part = rules.rewrite_symbol_before_unit_zh(part)
        return _wetext_keep_spaces(eng, part)

    def words(part: str) -> str:
        return _wetext_keep_spaces(eng, part)

    return _with_spans(text, "zh", plain, words, lambda d: d.translate(_ZH_DIGITS), words)


def _engine_normalize(text: str, lang: str, line_sep: str) -> str:
    eng = _engine(lang)
    if eng is None:
        return text.replace("\n", line_sep)
    lines = []
    for line in text.split("\n"):
        parts = []
        for chunk in _chunks(line):
            core = chunk.strip(" ")
            if not core:
                parts.append(chunk)
                continue
            lead = chunk[:len(chunk) - len(chunk.lstrip(" "))]
            trail = chunk[len(chunk.rstrip(" ")):]
            parts.append(lead + _normalize_piece(eng, core, lang) + trail)
        lines.append("".join(parts))
    return line_sep.join(lines)


# -- 3. Chinese path -----------------------------------------------------------------------
def _replace_blank(text: str) -> str:
    """Keep a space only when both neighbours are non-space ASCII characters."""
    out = []
    last = len(text) - 1
    for i, c in enumerate(text):
        if c == " ":
            if (0 < i < last and text[i - 1].isascii() and text[i - 1] != " "
                    and text[i + 1].isascii() and text[i + 1] != " "):
                out.append(c)
        else:
            out.append(c)
    return "".join(out)


_ZH_DELETE = str.maketrans({"（": None, "）": None, "【": None, "】": None, "`": None})
_ZH_TRAILING_COMMAS_RE = re.compile(r"[，,、]+$")


def _normalize_zh(text: str) -> str:
    return _zh_rules(_engine_normalize(text, "zh", ""))


def _zh_rules(text: str) -> str:
    """The Chinese path's rule-based steps after the engine (also used for Japanese)."""
    text = text.replace("\n", "")
    text = _replace_blank(text)
    text = text.replace("²", "平方").replace("³", "立方")
    text = text.replace(".", "。")
    text = text.replace(" - ", "，")
    text = text.translate(_ZH_DELETE)
    text = text.replace("——", " ")
    text = _ZH_TRAILING_COMMAS_RE.sub("。", text)
    return text


# -- 4. English path -----------------------------------------------------------------------
_INFLECT = None
_INFLECT_LOCK = threading.Lock()
_DIGITS_RE = re.compile(r"\d+")  # Unicode decimal digits (Nd): ASCII, full-width, Arabic-Indic ...

def _number_to_words(digits: str) -> str:
    global _INFLECT
    with _INFLECT_LOCK:
        if _INFLECT is None:
            import inflect
            _INFLECT = inflect.engine()
        try:
            return _INFLECT.number_to_words(digits)
        except Exception:
            # deliberate: inflect rejects numbers above ~10**66; read them digit by digit
            return " ".join(_INFLECT.number_to_words(str(unicodedata.decimal(d))) for d in digits)


def _other_digit_words(text: str, i: int) -> str:
    """Words for the non-decimal digit ``text[i]`` (superscript, circled ...), spaced off."""
    c = text[i]
    if c == "²":
        words = "squared"
    elif c == "³":
        words = "cubed"
    else:
        value = unicodedata.digit(c, None)
        if value is None:  # pragma: no cover - isdigit() chars all have a digit value
            return c
        words = _number_to_words(str(value))
    before = " " if i > 0 and text[i - 1].isalnum() else ""
    after = " " if i + 1 < len(text) and text[i + 1].isalnum() else ""
    return before + words + after


def spell_out_numbers(text: str) -> str:
    """Spell every run of decimal digits with inflect ("2024" -> "two thousand and twenty-four").

    Upstream spells every run of ``str.isdigit()`` characters; for the non-decimal ones
    (superscripts, circled numbers) inflect returns "zero", so here (deliberate) ``²``/``³``
    read "squared"/"cubed" and other such characters read their value.
    """
    text = _DIGITS_RE.sub(lambda m: _number_to_words(m.group()), text)
    if any(c.isdigit() for c in text):  # only non-decimal digits can be left
        text = "".join(_other_digit_words(text, i) if c.isdigit() else c
                       for i, c in enumerate(text))
    return text


def _normalize_en(text: str) -> str:
    text = _engine_normalize(text, "en", " ")
    return spell_out_numbers(text)


# -- 5. Japanese and Korean paths (deliberate) ---------------------------------------------
def _normalize_ja(text: str) -> str:
    """Japanese: numbers in kanji, addresses read as units, then the Chinese path's rules."""
    text = _with_spans(text, "ja", cjk_numbers.read_numbers_ja, cjk_numbers.cardinal_ja,
                       cjk_numbers.digit_words_ja)
    return _zh_rules(text)


def _normalize_ko(text: str) -> str:
    """Korean: numbers in Hangul (Sino-Korean / native with counters), addresses as units."""
    text = text.replace("\n", " ")
    text = _with_spans(text, "ko", cjk_numbers.read_numbers_ko, cjk_numbers.cardinal_ko,
                       cjk_numbers.digit_words_ko)
    return spell_out_numbers(text)  # only non-decimal digits (², ①) can be left


_PATHS = {"zh": (_normalize_zh, "zh"), "en": (_normalize_en, "en"),
          "ja": (_normalize_ja, "zh"), "ko": (_normalize_ko, "en")}


# -- public entry points -------------------------------------------------------------------
def _empty(original: str) -> EmptyTextError:
    shown = original if len(original) <= 40 else original[:40] + "..."
    return EmptyTextError(
        f"the text has nothing to speak (input {shown!r}, {len(original)} chars: empty, "
        "whitespace, punctuation, emoji or control characters only); give text with at least "
        "one letter or digit")


def _encoder(tokenizer) -> Callable[[str], Sequence[int]]:
    if tokenizer is None:
        from cosyvino.frontend.tokenizer import TextTokenizer
        tokenizer = TextTokenizer()
    encode = getattr(tokenizer, "encode", None)
    if encode is None:
        if not callable(tokenizer):
            raise TypeError("tokenizer must have .encode(text) or be callable")
        encode = tokenizer
    return encode


def _propagate_language_tags(segments: list[str]) -> list[str]:
    out = []
    current = None
    for i, seg in enumerate(segments):
        if i > 0 and current is not None and not seg.startswith("<|"):
            seg = current + seg.lstrip(" ")
        tags = _LANG_TAG_RE.findall(seg)
        if tags:
            current = tags[-1]
        out.append(seg)
    return out


def _prepare(text: str, text_frontend: bool) -> tuple[str, str | None]:
    """Cleaned text and its path: "zh", "en", "ja", "ko" or None (no normalization)."""
    cleaned = clean_text(text)
    if not cleaned:
        raise _empty(text)
    if not text_frontend or has_tags(cleaned):
        return cleaned, None
    # deliberate: full-width digits, letters, currency signs, % ... read as their half-width
    # forms (Chinese punctuation is kept); the path does not depend on them
    return fold_fullwidth(cleaned), text_path(cleaned)


def normalize(text: str, *, text_frontend: bool = True) -> str:
    """Normalized ``text`` without splitting (upstream ``text_normalize(text, split=False)``).

    Used for prompt and instruct texts. Raises EmptyTextError when nothing speakable remains.
    """
    cleaned, path = _prepare(text, text_frontend)
    out = cleaned if path is None else _PATHS[path][0](cleaned)
    if not is_speakable(out):
        raise _empty(text)
    return out


def normalize_and_split(text: str, tokenizer=None, *, text_frontend: bool = True) -> list[str]:
    """Normalize ``text`` and split it into synthesis segments (upstream ``text_normalize``).

    ``tokenizer``: a :class:`~cosyvino.frontend.tokenizer.TextTokenizer` (or anything with
    ``.encode``, or a callable), used to measure English segments; default: the shipped one.
    ``text_frontend=False`` skips normalization (and splitting, unless the text exceeds the
    segment bound), like upstream's flag. Every segment has at most ``HARD_MAX_N`` characters
    (Chinese) or tokens (otherwise). Raises EmptyTextError when nothing speakable remains.
    """
    encode = _encoder(tokenizer)
    cleaned, path = _prepare(text, text_frontend)
    if path is None:
        if not is_speakable(cleaned):
            raise _empty(text)
        lang = "zh" if contains_chinese(cleaned) else "en"
        size = len(cleaned) if lang == "zh" else len(encode(cleaned))
        if size <= HARD_MAX_N:
            return [cleaned]
        # deliberate: bound over-long unnormalized/tagged text; leave room for a repeated tag
        segments = split_paragraph(cleaned, encode, lang, TOKEN_MAX_N, TOKEN_MIN_N, MERGE_LEN,
                                   comma_split=False, hard_max_n=HARD_MAX_N - 8)
        segments = _propagate_language_tags(segments)
    else:
        normalize_path, split_lang = _PATHS[path]
        segments = split_paragraph(normalize_path(cleaned), encode, split_lang, TOKEN_MAX_N,
                                   TOKEN_MIN_N, MERGE_LEN, comma_split=False,
                                   hard_max_n=HARD_MAX_N)
    segments = [s for s in segments if is_speakable(s)]
    if not segments:
        raise _empty(text)
    return segments
