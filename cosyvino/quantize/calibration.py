"""Calibration text set for post-training quantization (``cosyvino/quantize/calib/``, package
data: it ships inside the wheel). Must not import torch.

The shipped set (``calib/texts.jsonl`` + ``calib/manifest.json``, written for this project) holds
Mandarin, English, Japanese, Cantonese and Korean texts in the proportions of CosyVoice-300M-SFT's
seven built-in speakers. Quantization runs the FP32 pipeline over the ``calibration`` split to
capture stage inputs and compares INT8 against FP32 on the held-out ``evaluation`` split.

``load_calibration_set()`` reads the shipped set or a user's own file: JSON Lines in the same
format (only ``text`` is required) or plain text, one sentence per line (language guessed from
the script, see :func:`guess_language`). See docs/quantization.md, "Calibration texts".

Maintenance: ``python -m cosyvino.quantize.calibration refresh`` (no dir: the shipped set in
``cosyvino/quantize/calib``) recomputes the derived fields
(speaker when missing, length class, split) and the manifest after texts were added or edited
(a plain ``texts.txt`` is never rewritten or deleted, see :func:`refresh`);
``python -m cosyvino.quantize.calibration check`` verifies the manifest and runs every text
through the frontend.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import sys
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable, Sequence

from cosyvino.errors import InputError, ModelDirError

log = logging.getLogger(__name__)

__all__ = [
    "CalibrationFileError",
    "CalibrationText",
    "FEATURES",
    "LANGUAGES",
    "LANGUAGE_TAGS",
    "LENGTH_CLASSES",
    "SPEAKERS",
    "SPLITS",
    "TARGET_PROPORTIONS",
    "assign_splits",
    "build_manifest",
    "count_text_tokens",
    "default_calib_dir",
    "detect_features",
    "guess_language",
    "length_class",
    "load_calibration_set",
    "read_calibration_file",
    "select_subset",
    "write_calibration_file",
    "write_manifest",
]

#: Language codes, in the order of the CosyVoice v1 / whisper language tags used for them.
LANGUAGES = ("zh", "en", "ja", "yue", "ko")
#: CosyVoice-300M-SFT's built-in speakers (``spk2info.pt``) and the language each one speaks.
SPEAKERS = {"中文女": "zh", "中文男": "zh", "英文女": "en", "英文男": "en",
            "日语男": "ja", "粤语女": "yue", "韩语女": "ko"}
#: Speakers per language, in the order used to assign a missing speaker (round robin).
LANGUAGE_SPEAKERS = {lang: tuple(s for s, sl in SPEAKERS.items() if sl == lang)
                     for lang in LANGUAGES}
#: Share of each language in the set: its share of the SFT model's built-in speakers.
TARGET_PROPORTIONS = {lang: len(LANGUAGE_SPEAKERS[lang]) / len(SPEAKERS) for lang in LANGUAGES}
PROPORTION_TOLERANCE = 0.02
#: Language tags (whisper special tokens in the v1 vocabulary). Texts of the shipped set in
#: ``TAGGED_LANGUAGES`` start with their tag, as sent for synthesis with those speakers.
LANGUAGE_TAGS = {lang: f"<|{lang}|>" for lang in LANGUAGES}
TAGGED_LANGUAGES = ("ja", "yue", "ko")

LENGTH_CLASSES = ("short", "medium", "long")
#: Length class from the number of text tokens the LLM receives (sum over the frontend's
#: segments): short <= 12, medium 13..32, long >= 33.
SHORT_MAX_TOKENS = 12
MEDIUM_MAX_TOKENS = 32

SPLITS = ("calibration", "evaluation")
#: Split rule: within each language, texts ordered by (length class, sha256 of the id); every
#: 5th text starting at position 2 is ``evaluation`` (20 %, stratified by length class).
EVALUATION_EVERY = 5
EVALUATION_OFFSET = 2

#: Feature labels. numbers, percent, question, exclamation and code-switch are detected
#: automatically (:func:`detect_features`); the others are annotated by hand in the shipped set.
FEATURES = ("numbers", "date", "time", "money", "phone", "percent", "units", "abbreviation",
            "code-switch", "question", "exclamation")

TEXTS_FILE = "texts.jsonl"
#: the shipped set (package data of ``cosyvino.quantize``, see pyproject.toml)
SHIPPED_CALIB_DIR = Path(__file__).resolve().parent / "calib"
PLAIN_TEXTS_FILE = "texts.txt"
MANIFEST_FILE = "manifest.json"
FORMAT = "cosyvino-calibration-texts"
SET_VERSION = 1
_FIELDS = ("id", "language", "speaker", "text", "length", "split", "features")
_EXTRA_FIELDS = ("meta",)  # free-form user metadata, ignored

_TAG_AT_START = re.compile(r"\s*<\|([a-z]{2,3})\|>")
_KANA = re.compile(r"[\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u31f0-\u31ff\uff66-\uff9d]")
_HANGUL = re.compile(r"[\uac00-\ud7af\u1100-\u11ff\u3130-\u318f\ua960-\ua97f\ud7b0-\ud7ff]")
_HAN = re.compile(r"[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\U00020000-\U0002ffff]")
_LATIN_WORD = re.compile(r"[A-Za-z]{2,}")
_DIGIT = re.compile(r"\d")


class CalibrationFileError(InputError):
    """A calibration text file has a bad line; ``path`` and ``line`` (1-based, or None for
    errors about the whole file) say where."""

    def __init__(self, message: str, path: str | os.PathLike | None = None,
                 line: int | None = None):
        where = f"{path}:{line}: " if path is not None and line is not None else (
            f"{path}: " if path is not None else "")
        super().__init__(where + message)
        self.path = None if path is None else str(path)
        self.line = line


@dataclass(frozen=True)
class CalibrationText:
    """One calibration text. ``length`` is a length class, ``split`` calibration/evaluation,
    ``features`` labels from :data:`FEATURES`."""

    id: str
    language: str
    speaker: str
    text: str
    length: str
    split: str
    features: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["features"] = list(self.features)
        return d


# --------------------------------------------------------------------------- derived fields

def guess_language(text: str) -> str:
    """Language code of ``text``: a language tag at the start (``<|yue|>...``) wins; else any
    kana -> ``ja``; else any Hangul -> ``ko``; else any Han character -> ``zh``; else ``en``.

    Kana is checked before Han because Japanese is written with both. Cantonese cannot be told
    from Mandarin by script: untagged Han text is ``zh``; tag Cantonese lines with ``<|yue|>``.
    """
    m = _TAG_AT_START.match(text)
    if m and m.group(1) in LANGUAGES:
        return m.group(1)
    if _KANA.search(text):
        return "ja"
    if _HANGUL.search(text):
        return "ko"
    if _HAN.search(text):
        return "zh"
    return "en"


def detect_features(text: str, language: str) -> tuple[str, ...]:
    """The features found automatically: numbers (a digit), percent, question, exclamation and,
    for zh/yue/ja/ko, code-switch (a Latin-letter word). Language tags are ignored."""
    body = re.sub(r"<\|[^|]*\|>", "", text)
    found = set()
    if _DIGIT.search(body):
        found.add("numbers")
    if "%" in body or "％" in body:
        found.add("percent")
    if "?" in body or "？" in body:
        found.add("question")
    if "!" in body or "！" in body:
        found.add("exclamation")
    if language != "en" and _LATIN_WORD.search(body):
        found.add("code-switch")
    return tuple(f for f in FEATURES if f in found)


_frontend = None


def _get_frontend():
    global _frontend
    if _frontend is None:
        from cosyvino.frontend import TextFrontend
        _frontend = TextFrontend()
    return _frontend


def count_text_tokens(text: str, frontend=None) -> int:
    """Text tokens the LLM receives for ``text``: the sum over ``frontend.segments(text)``
    (default: a shared :class:`cosyvino.frontend.TextFrontend`). Raises the frontend's errors
    (``EmptyTextError``) for text with nothing to speak."""
    fe = frontend if frontend is not None else _get_frontend()
    return sum(len(seg) for seg in fe.segments(text))


def length_class(n_tokens: int) -> str:
    """``short`` (<= 12 text tokens), ``medium`` (13..32) or ``long`` (>= 33)."""
    if n_tokens <= SHORT_MAX_TOKENS:
        return "short"
    if n_tokens <= MEDIUM_MAX_TOKENS:
        return "medium"
    return "long"


def _hash_key(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode("utf-8")).hexdigest()


def assign_splits(items: Iterable) -> dict[str, str]:
    """Deterministic calibration/evaluation split, ``{id: split}``.

    ``items``: objects with ``id``, ``language`` and ``length`` attributes (or dicts with those
    keys). Within each language the texts are ordered by (length class, sha256 of the id) and
    every 5th one, starting with the 3rd, is ``evaluation``: 20 % held out per language,
    spread over the length classes. Depends only on the ids, languages and length classes, not
    on file order.
    """
    def get(item, key):
        return item[key] if isinstance(item, dict) else getattr(item, key)

    by_lang: dict[str, list[tuple[int, str, str]]] = {}
    for item in items:
        ident, lang, length = get(item, "id"), get(item, "language"), get(item, "length")
        rank = LENGTH_CLASSES.index(length) if length in LENGTH_CLASSES else len(LENGTH_CLASSES)
        by_lang.setdefault(lang, []).append((rank, _hash_key("split", ident), ident))
    out = {}
    for entries in by_lang.values():
        for pos, (_, _, ident) in enumerate(sorted(entries)):
            out[ident] = ("evaluation" if pos % EVALUATION_EVERY == EVALUATION_OFFSET
                          else "calibration")
    return out


# --------------------------------------------------------------------------- locating files

def default_calib_dir() -> Path:
    """``$COSYVINO_CALIB_DIR`` if set, else the shipped set: ``calib/`` next to this module
    (package data, so in a wheel install as in a checkout). Raises ModelDirError when it does
    not exist."""
    env = os.environ.get("COSYVINO_CALIB_DIR")
    path = Path(env).expanduser() if env else SHIPPED_CALIB_DIR
    if not (path / TEXTS_FILE).is_file():
        raise ModelDirError(
            f"calibration set not found at {path} (no {TEXTS_FILE}); it ships inside the "
            "cosyvino package (cosyvino/quantize/calib/): reinstall cosyvino, set "
            "COSYVINO_CALIB_DIR, or pass the path of your own texts file", str(path))
    return path


def _resolve(path) -> Path:
    if path is None:
        return default_calib_dir() / TEXTS_FILE
    p = Path(path).expanduser()
    if p.is_dir():
        jsonl, plain = p / TEXTS_FILE, p / PLAIN_TEXTS_FILE
        if jsonl.is_file() and plain.is_file() \
                and plain.stat().st_mtime_ns > jsonl.stat().st_mtime_ns:
            log.warning("%s is newer than %s, but %s is the one read; edit %s (or remove it "
                        "and run `python -m cosyvino.quantize.calibration refresh --jsonl %s`)",
                        plain, jsonl.name, jsonl.name, jsonl.name, p)
        for name in (TEXTS_FILE, PLAIN_TEXTS_FILE):
            if (p / name).is_file():
                return p / name
        raise ModelDirError(
            f"no {TEXTS_FILE} or {PLAIN_TEXTS_FILE} in calibration directory {p}", str(p))
    if not p.is_file():
        raise ModelDirError(f"calibration texts file {p} does not exist", str(p))
    return p


def _is_jsonl(p: Path, lines: Sequence[str]) -> bool:
    suffix = p.suffix.lower()
    if suffix in (".jsonl", ".ndjson", ".json"):
        return True
    if suffix in (".txt", ".text"):
        return False
    for line in lines:
        if line.strip():
            return line.lstrip().startswith("{")
    return False


# --------------------------------------------------------------------------- reading

def _read_lines(p: Path) -> list[str]:
    try:
        data = p.read_bytes()
    except OSError as e:
        raise ModelDirError(f"cannot read calibration texts file {p}: {e}", str(p)) from e
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        raise CalibrationFileError(f"not UTF-8 ({e.reason} at byte {e.start})", p, line) from e
    return text.split("\n")


def _check_str(value, field: str, p: Path, line: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise CalibrationFileError(f"field {field!r} must be a non-empty string, got {value!r}",
                                   p, line)
    return value


def read_calibration_file(path=None, *, speakers: Iterable[str] | None = None,
                          frontend=None) -> list[CalibrationText]:
    """All texts of a calibration file, validated, in file order.

    ``path``: a texts file or a directory holding ``texts.jsonl`` (or ``texts.txt``); default:
    the shipped set (:func:`default_calib_dir`). JSON Lines (``.jsonl``, or a first line
    starting with ``{``): one object per line with ``text`` and optionally ``id``,
    ``language``, ``speaker``, ``length``, ``split``, ``features`` and free-form ``meta``.
    Plain text (``.txt``, or anything else): one sentence per line; blank lines and lines
    starting with ``#`` are skipped. Missing fields are derived: id ``<file stem>-<line>``,
    language by :func:`guess_language`, speaker round robin over the language's built-in
    speakers, length class from the frontend's token count, split by :func:`assign_splits`,
    features by :func:`detect_features`.

    ``speakers``: valid speaker names (default: the 7 built-in SFT speakers).

    Raises ModelDirError when the file is missing or unreadable and CalibrationFileError (an
    InputError, with ``.path`` and ``.line``) for a bad line: invalid JSON, unknown field,
    language, speaker, length class, split or feature, a language tag that contradicts the
    language, a duplicate id, or text with nothing to speak.
    """
    p = _resolve(path)
    lines = _read_lines(p)
    valid_speakers = set(SPEAKERS if speakers is None else speakers)
    jsonl = _is_jsonl(p, lines)
    stem = p.stem
    rows: list[dict] = []
    seen: dict[str, int] = {}
    spk_counter: Counter = Counter()
    for lineno, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        if jsonl:
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise CalibrationFileError(f"invalid JSON: {e.msg} (column {e.colno})", p,
                                           lineno) from e
            if not isinstance(obj, dict):
                raise CalibrationFileError(
                    f"expected a JSON object per line, got {type(obj).__name__}", p, lineno)
            unknown = sorted(set(obj) - set(_FIELDS) - set(_EXTRA_FIELDS))
            if unknown:
                raise CalibrationFileError(
                    f"unknown field(s) {', '.join(map(repr, unknown))}; allowed: "
                    f"{', '.join(_FIELDS + _EXTRA_FIELDS)}", p, lineno)
            if "text" not in obj:
                raise CalibrationFileError("missing field 'text'", p, lineno)
        else:
            if raw.lstrip().startswith("#"):
                continue
            obj = {"text": raw.strip()}
        text = _check_str(obj["text"], "text", p, lineno).strip()
        ident = _check_str(obj.get("id", f"{stem}-{lineno}"), "id", p, lineno)
        if ident in seen:
            raise CalibrationFileError(f"duplicate id {ident!r} (first on line {seen[ident]})",
                                       p, lineno)
        seen[ident] = lineno
        lang = obj.get("language")
        if lang is None:
            lang = guess_language(text)
        elif lang not in LANGUAGES:
            raise CalibrationFileError(
                f"unknown language {lang!r}; known: {', '.join(LANGUAGES)}", p, lineno)
        m = _TAG_AT_START.match(text)
        if m and m.group(1) in LANGUAGES and m.group(1) != lang:
            raise CalibrationFileError(
                f"text starts with language tag <|{m.group(1)}|> but language is {lang!r}",
                p, lineno)
        speaker = obj.get("speaker")
        if speaker is None:
            choices = LANGUAGE_SPEAKERS[lang]
            speaker = choices[spk_counter[lang] % len(choices)]
            spk_counter[lang] += 1
        elif speaker not in valid_speakers:
            raise CalibrationFileError(
                f"unknown speaker {speaker!r}; known: {', '.join(sorted(valid_speakers))}",
                p, lineno)
        length = obj.get("length")
        if length is None:
            try:
                length = length_class(count_text_tokens(text, frontend))
            except InputError as e:
                raise CalibrationFileError(f"text rejected by the frontend: {e}", p,
                                           lineno) from e
        elif length not in LENGTH_CLASSES:
            raise CalibrationFileError(
                f"unknown length class {length!r}; known: {', '.join(LENGTH_CLASSES)}",
                p, lineno)
        split = obj.get("split")
        if split is not None and split not in SPLITS:
            raise CalibrationFileError(
                f"unknown split {split!r}; known: {', '.join(SPLITS)}", p, lineno)
        features = obj.get("features")
        if features is None:
            features = detect_features(text, lang)
        else:
            if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
                raise CalibrationFileError("field 'features' must be a list of strings", p,
                                           lineno)
            bad = [f for f in features if f not in FEATURES]
            if bad:
                raise CalibrationFileError(
                    f"unknown feature(s) {', '.join(map(repr, bad))}; known: "
                    f"{', '.join(FEATURES)}", p, lineno)
            features = tuple(dict.fromkeys(features))
        rows.append({"id": ident, "language": lang, "speaker": speaker, "text": text,
                     "length": length, "split": split, "features": tuple(features)})
    if not rows:
        raise CalibrationFileError("no texts in file", p)
    if any(r["split"] is None for r in rows):
        auto = assign_splits(rows)
        for r in rows:
            if r["split"] is None:
                r["split"] = auto[r["id"]]
    if path is None or Path(path).expanduser().is_dir():
        _warn_if_manifest_stale(p)
    return [CalibrationText(**r) for r in rows]


def _warn_if_manifest_stale(texts_path: Path) -> None:
    manifest = texts_path.parent / MANIFEST_FILE
    if not manifest.is_file():
        return
    try:
        recorded = json.loads(manifest.read_text(encoding="utf-8")).get("sha256")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if recorded != _sha256(texts_path):
        log.warning("%s does not match %s (sha256); run `python -m cosyvino.quantize.calibration "
                    "manifest %s`", manifest, texts_path.name, texts_path.parent)


# --------------------------------------------------------------------------- selecting

def select_subset(texts: Sequence[CalibrationText], limit_per_language: int,
                  seed: int = 0) -> list[CalibrationText]:
    """At most ``limit_per_language`` texts of each language, chosen deterministically for
    ``seed`` and stratified by length class (quotas by largest remainder); file order kept."""
    if isinstance(limit_per_language, bool) or not isinstance(limit_per_language, int) \
            or limit_per_language < 0:
        raise InputError(f"limit_per_language must be an integer >= 0, got "
                         f"{limit_per_language!r}")
    chosen: set[str] = set()
    by_lang: dict[str, list[CalibrationText]] = {}
    for t in texts:
        by_lang.setdefault(t.language, []).append(t)
    for lang, items in by_lang.items():
        if len(items) <= limit_per_language:
            chosen.update(t.id for t in items)
            continue
        strata: dict[str, list[CalibrationText]] = {}
        for t in items:
            strata.setdefault(t.length, []).append(t)
        exact = {k: limit_per_language * len(v) / len(items) for k, v in strata.items()}
        quota = {k: int(x) for k, x in exact.items()}
        rest = limit_per_language - sum(quota.values())
        order = sorted(strata, key=lambda k: (-(exact[k] - quota[k]),
                                              _hash_key(str(seed), lang, k)))
        for k in order[:rest]:
            quota[k] += 1
        for k, v in strata.items():
            ranked = sorted(v, key=lambda t: _hash_key(str(seed), t.id))
            chosen.update(t.id for t in ranked[:quota[k]])
    return [t for t in texts if t.id in chosen]


def load_calibration_set(path=None, split: str | None = None,
                         languages: Iterable[str] | None = None,
                         limit_per_language: int | None = None, seed: int = 0, *,
                         speakers: Iterable[str] | None = None) -> list[CalibrationText]:
    """Calibration texts, filtered and optionally subsampled.

    ``path``: texts file or directory (default: the shipped ``calib/`` set); ``split``:
    ``"calibration"``, ``"evaluation"`` or None for both; ``languages``: codes to keep (None:
    all); ``limit_per_language``: keep at most this many per language, chosen deterministically
    for ``seed`` and stratified by length class (:func:`select_subset`); ``speakers``: valid
    speaker names for user files (default: the 7 SFT speakers). File order is kept.
    See :func:`read_calibration_file` for formats and errors.
    """
    if split is not None and split not in SPLITS:
        raise InputError(f"unknown split {split!r}; use one of {', '.join(SPLITS)} or None")
    wanted = None
    if languages is not None:
        if isinstance(languages, str):
            languages = [languages]
        wanted = list(languages)
        bad = [lang for lang in wanted if lang not in LANGUAGES]
        if bad:
            raise InputError(f"unknown language(s) {', '.join(map(repr, bad))}; known: "
                             f"{', '.join(LANGUAGES)}")
    texts = read_calibration_file(path, speakers=speakers)
    if split is not None:
        texts = [t for t in texts if t.split == split]
    if wanted is not None:
        texts = [t for t in texts if t.language in wanted]
    if limit_per_language is not None:
        texts = select_subset(texts, limit_per_language, seed)
    return texts


# --------------------------------------------------------------------------- writing / manifest

def _sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def write_calibration_file(texts: Iterable[CalibrationText], path) -> None:
    """Write ``texts`` as canonical JSON Lines (all fields, UTF-8, one object per line)."""
    lines = [json.dumps(t.to_dict(), ensure_ascii=False) for t in texts]
    tmp = Path(str(path) + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8", newline="\n")
    os.replace(tmp, path)


def build_manifest(texts_path=None) -> dict:
    """The manifest of a texts file: counts per language x split x length class, feature
    counts, proportions and the rules used, and the file's sha256."""
    p = _resolve(texts_path)
    texts = read_calibration_file(p)
    counts = {lang: {s: {**{c: 0 for c in LENGTH_CLASSES}, "total": 0} for s in SPLITS}
              for lang in LANGUAGES}
    features = {lang: {f: 0 for f in FEATURES} for lang in LANGUAGES}
    per_lang: Counter = Counter()
    speakers = {lang: Counter() for lang in LANGUAGES}
    for t in texts:
        counts[t.language][t.split][t.length] += 1
        counts[t.language][t.split]["total"] += 1
        per_lang[t.language] += 1
        speakers[t.language][t.speaker] += 1
        for f in t.features:
            features[t.language][f] += 1
    total = len(texts)
    return {
        "format": FORMAT,
        "version": SET_VERSION,
        "texts": p.name,
        "sha256": _sha256(p),
        "total": total,
        "totals": {s: sum(counts[lang][s]["total"] for lang in LANGUAGES) for s in SPLITS},
        "languages": {lang: {
            "total": per_lang[lang],
            "share": round(per_lang[lang] / total, 4) if total else 0.0,
            "target_share": round(TARGET_PROPORTIONS[lang], 4),
            "speakers": dict(sorted(speakers[lang].items())),
            "tag": LANGUAGE_TAGS[lang] if lang in TAGGED_LANGUAGES else None,
        } for lang in LANGUAGES},
        "proportions": {
            "rule": "each language's share of the texts equals its share of "
                    "CosyVoice-300M-SFT's 7 built-in speakers (zh 2/7: 中文女 中文男; "
                    "en 2/7: 英文女 英文男; ja 1/7: 日语男; yue 1/7: 粤语女; ko 1/7: 韩语女)",
            "tolerance": PROPORTION_TOLERANCE,
        },
        "length_classes": {
            "rule": "text tokens the LLM receives: sum of len(segment) over "
                    "cosyvino.frontend.TextFrontend().segments(text)",
            "short": f"<= {SHORT_MAX_TOKENS}",
            "medium": f"{SHORT_MAX_TOKENS + 1}..{MEDIUM_MAX_TOKENS}",
            "long": f">= {MEDIUM_MAX_TOKENS + 1}",
        },
        "split": {
            "rule": "per language, texts ordered by (length class, sha256('split\\0' + id)); "
                    f"position % {EVALUATION_EVERY} == {EVALUATION_OFFSET} -> evaluation, "
                    "else calibration",
            "evaluation_fraction": round(1 / EVALUATION_EVERY, 4),
        },
        "counts": counts,
        "features": features,
    }


def write_manifest(calib_dir=None) -> Path:
    """Write ``manifest.json`` next to the texts file of ``calib_dir``; returns its path."""
    p = _resolve(calib_dir)
    manifest = build_manifest(p)
    out = p.parent / MANIFEST_FILE
    tmp = Path(str(out) + ".tmp")
    tmp.write_text(json.dumps(manifest, ensure_ascii=False, indent=2) + "\n", encoding="utf-8",
                   newline="\n")
    os.replace(tmp, out)
    return out


def refresh(calib_dir=None, *, to_jsonl: bool = False) -> tuple[Path, Path]:
    """Bring a calibration directory's derived data up to date; returns ``(source of truth,
    manifest path)``.

    JSON Lines source (``texts.jsonl``): recompute the derived fields (speaker when missing,
    length class, split), rewrite the file in place as canonical JSON Lines (ids, languages,
    texts and given speakers and features kept) and write the manifest.

    Plain-text source (``texts.txt``): the user's file is never modified or deleted (its
    ``#`` comments stay). Its derived fields are computed the same way on every read, so only
    the manifest is written and ``texts.txt`` stays the source of truth. With ``to_jsonl``,
    ``texts.jsonl`` (every field, for hand-editing features or speakers) is written next to it
    and becomes the source of truth: a directory load reads ``texts.jsonl`` before
    ``texts.txt``, which is left as it was.

    Raises ModelDirError / CalibrationFileError as :func:`read_calibration_file`, and
    InputError when ``to_jsonl`` would overwrite a different ``texts.jsonl``.
    """
    p = _resolve(calib_dir)
    jsonl = _is_jsonl(p, _read_lines(p))
    if not jsonl and not to_jsonl:
        read_calibration_file(p)  # validate every line before recording the file
        return p, write_manifest(p)
    out = p if jsonl else p.parent / TEXTS_FILE
    if out != p and out.exists():
        raise InputError(f"{out} already exists; it is read before {p.name}, so edit it (and "
                         f"run refresh on it), or remove it to convert {p.name} again")
    texts = read_calibration_file(p)
    fe = _get_frontend()
    rows = [{**t.to_dict(), "length": length_class(count_text_tokens(t.text, fe))}
            for t in texts]
    splits = assign_splits(rows)
    write_calibration_file(
        [CalibrationText(**{**r, "split": splits[r["id"]], "features": tuple(r["features"])})
         for r in rows], out)
    return out, write_manifest(out)


def check(calib_dir=None) -> list[str]:
    """Problems with a calibration directory (empty list: fine): manifest missing or stale,
    a text the frontend rejects or splits into more than 3 segments, a stored length class
    or split that differs from the rule."""
    p = _resolve(calib_dir)
    problems = []
    manifest = p.parent / MANIFEST_FILE
    if not manifest.is_file():
        problems.append(f"{manifest} missing")
    else:
        recorded = json.loads(manifest.read_text(encoding="utf-8"))
        if recorded != build_manifest(p):
            problems.append(f"{manifest} is stale; run `python -m cosyvino.quantize.calibration "
                            f"manifest {p.parent}`")
    texts = read_calibration_file(p)
    fe = _get_frontend()
    for t in texts:
        try:
            segs = fe.segments(t.text)
        except InputError as e:
            problems.append(f"{t.id}: frontend error: {e}")
            continue
        if len(segs) > 3:
            problems.append(f"{t.id}: {len(segs)} segments (> 3)")
        n = sum(len(s) for s in segs)
        if length_class(n) != t.length:
            problems.append(f"{t.id}: length {t.length!r} but {n} tokens -> {length_class(n)!r}")
    splits = assign_splits(texts)
    problems += [f"{t.id}: split {t.split!r}, rule says {splits[t.id]!r}" for t in texts
                 if splits[t.id] != t.split]
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m cosyvino.quantize.calibration",
                                 description="Maintain a calibration text directory.")
    ap.add_argument("command", choices=("manifest", "refresh", "check"),
                    help="manifest: rewrite manifest.json; refresh: recompute length/split "
                         "(and missing speakers) and the manifest; check: verify everything")
    ap.add_argument("dir", nargs="?", default=None,
                    help="directory (default: the shipped set, cosyvino/quantize/calib/)")
    ap.add_argument("--jsonl", action="store_true",
                    help="refresh of a texts.txt directory: also write texts.jsonl (all "
                         "fields, for hand-editing), which then becomes the source of truth; "
                         "texts.txt is kept as it is")
    ap.epilog = ("refresh never modifies or deletes a plain-text texts.txt (comments "
                 "included): without --jsonl it stays the source of truth and only "
                 "manifest.json is written; a texts.jsonl is rewritten in place.")
    args = ap.parse_intermixed_args(argv)  # `refresh --jsonl DIR` as well as `refresh DIR --jsonl`
    try:
        if args.command == "manifest":
            print(f"wrote {write_manifest(args.dir)}")
        elif args.command == "refresh":
            before = _resolve(args.dir)
            source, manifest = refresh(args.dir, to_jsonl=args.jsonl)
            if source == before and not _is_jsonl(source, _read_lines(source)):
                print(f"{source} left unchanged; it is the source of truth (speakers, length "
                      "classes and splits are derived from it on every read)")
            elif source == before:
                print(f"rewrote {source} (source of truth)")
            else:
                print(f"wrote {source}: it is now the source of truth (read before "
                      f"{before.name}); {before} was left unchanged and is no longer read")
            print(f"wrote {manifest}")
        else:
            problems = check(args.dir)
            for line in problems:
                print(line)
            print("ok" if not problems else f"{len(problems)} problem(s)")
            return 1 if problems else 0
    except (InputError, ModelDirError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
