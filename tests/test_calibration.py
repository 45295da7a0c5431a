"""The calibration text set (cosyvino/quantize/calib/) and its loader (cosyvino.quantize.calibration)."""

from __future__ import annotations

import hashlib
import json
import pathlib
import random
import shutil
import subprocess
import sys
from collections import Counter

import pytest

from cosyvino.quantize import calibration as cal
from cosyvino.quantize.calibration import (
    FEATURES,
    LANGUAGES,
    LENGTH_CLASSES,
    SPEAKERS,
    SPLITS,
    TARGET_PROPORTIONS,
    CalibrationFileError,
    CalibrationText,
    load_calibration_set,
)
from cosyvino.errors import InputError, ModelDirError

CALIB = pathlib.Path(__file__).resolve().parent.parent / "cosyvino" / "quantize" / "calib"
assert CALIB == cal.SHIPPED_CALIB_DIR
TEXTS = CALIB / "texts.jsonl"
MANIFEST = CALIB / "manifest.json"


@pytest.fixture(scope="module")
def shipped() -> list[CalibrationText]:
    return load_calibration_set(CALIB)


@pytest.fixture(scope="module")
def manifest() -> dict:
    return json.loads(MANIFEST.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def segments(shipped):
    from cosyvino.frontend import TextFrontend

    fe = TextFrontend()
    return {t.id: fe.segments(t.text) for t in shipped}


# --------------------------------------------------------------------------- the shipped set

def test_size_and_records(shipped):
    assert len(shipped) >= 420
    assert len({t.id for t in shipped}) == len(shipped)
    for t in shipped:
        assert isinstance(t, CalibrationText)
        assert t.language in LANGUAGES
        assert SPEAKERS[t.speaker] == t.language, t
        assert t.length in LENGTH_CLASSES and t.split in SPLITS
        assert set(t.features) <= set(FEATURES)
        assert t.id.startswith(t.language + "-")
    with pytest.raises(AttributeError):
        shipped[0].text = "x"  # frozen


def test_default_path_is_shipped_set(shipped):
    assert load_calibration_set() == shipped
    assert load_calibration_set(TEXTS) == shipped
    assert load_calibration_set(str(CALIB)) == shipped


def test_file_is_canonical_jsonl():
    lines = TEXTS.read_text(encoding="utf-8").splitlines()
    for line in lines:
        assert list(json.loads(line)) == ["id", "language", "speaker", "text", "length",
                                          "split", "features"]


def test_proportions_and_manifest_counts(shipped, manifest):
    per_lang = Counter(t.language for t in shipped)
    assert manifest["total"] == len(shipped)
    for lang in LANGUAGES:
        assert manifest["languages"][lang]["total"] == per_lang[lang]
        share = per_lang[lang] / len(shipped)
        assert abs(share - TARGET_PROPORTIONS[lang]) <= 0.02, (lang, share)
        for split in SPLITS:
            for length in LENGTH_CLASSES:
                n = sum(1 for t in shipped
                        if (t.language, t.split, t.length) == (lang, split, length))
                assert manifest["counts"][lang][split][length] == n
            assert manifest["counts"][lang][split]["total"] == sum(
                1 for t in shipped if (t.language, t.split) == (lang, split))
    assert TARGET_PROPORTIONS == pytest.approx(
        {"zh": 2 / 7, "en": 2 / 7, "ja": 1 / 7, "yue": 1 / 7, "ko": 1 / 7})


def test_manifest_sha256_and_fresh(manifest):
    assert manifest["sha256"] == hashlib.sha256(TEXTS.read_bytes()).hexdigest()
    assert manifest["texts"] == "texts.jsonl"
    assert manifest == cal.build_manifest(CALIB)  # nothing stale (counts, rules, features)


def test_language_tags(shipped):
    for t in shipped:
        if t.language in cal.TAGGED_LANGUAGES:
            assert t.text.startswith(cal.LANGUAGE_TAGS[t.language]), t.id
        else:
            assert "<|" not in t.text, t.id
        assert cal.guess_language(t.text) == t.language, t.id


def test_coverage_per_language(shipped):
    for lang in LANGUAGES:
        mine = [t for t in shipped if t.language == lang]
        lengths = Counter(t.length for t in mine)
        assert all(lengths[c] >= 0.1 * len(mine) for c in LENGTH_CLASSES), (lang, lengths)
        feats = Counter(f for t in mine for f in t.features)
        for f in ("numbers", "date", "time", "money", "phone", "question", "exclamation"):
            assert feats[f] >= 2, (lang, f)
        if lang in ("zh", "en"):
            assert feats["abbreviation"] >= 5 and feats["percent"] >= 2, lang
    zh_cs = [t for t in shipped if t.language == "zh" and "code-switch" in t.features]
    assert len(zh_cs) >= 10


def test_auto_features_consistent(shipped):
    for t in shipped:
        assert set(cal.detect_features(t.text, t.language)) <= set(t.features), t.id
        assert ("question" in t.features) == ("?" in t.text or "？" in t.text)


def test_every_text_passes_frontend(shipped, segments):
    for t in shipped:
        segs = segments[t.id]
        assert 1 <= len(segs) <= 3, (t.id, len(segs))
        n = sum(len(s) for s in segs)
        assert cal.length_class(n) == t.length, (t.id, n, t.length)
    assert max(len(s) for s in segments.values()) >= 2  # some texts exercise splitting


def test_split_rule_deterministic_and_disjoint(shipped):
    cal_ids = {t.id for t in load_calibration_set(CALIB, split="calibration")}
    eval_ids = {t.id for t in load_calibration_set(CALIB, split="evaluation")}
    assert cal_ids and eval_ids and not cal_ids & eval_ids
    assert cal_ids | eval_ids == {t.id for t in shipped}
    rule = cal.assign_splits(shipped)
    assert rule == {t.id: t.split for t in shipped}
    shuffled = list(shipped)
    random.Random(7).shuffle(shuffled)
    assert cal.assign_splits(shuffled) == rule  # independent of file order
    for lang in LANGUAGES:
        mine = [t for t in shipped if t.language == lang]
        ev = [t for t in mine if t.split == "evaluation"]
        assert 0.18 <= len(ev) / len(mine) <= 0.22, lang
        assert {t.length for t in ev} == set(LENGTH_CLASSES), lang  # stratified


def test_refresh_reproduces_shipped_file(tmp_path):
    """Dropping the derived fields and running `refresh` gives the shipped file back."""
    rows = [json.loads(line) for line in TEXTS.read_text(encoding="utf-8").splitlines()]
    src = tmp_path / "texts.jsonl"
    src.write_text("\n".join(json.dumps({k: r[k] for k in ("id", "language", "text",
                                                           "features")}, ensure_ascii=False)
                             for r in rows) + "\n", encoding="utf-8")
    assert cal.main(["refresh", str(tmp_path)]) == 0
    assert src.read_bytes() == TEXTS.read_bytes()
    written = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert written == json.loads(MANIFEST.read_text(encoding="utf-8"))


def test_check_command(tmp_path, capsys):
    shutil.copy(TEXTS, tmp_path / "texts.jsonl")
    assert cal.main(["check", str(tmp_path)]) == 1  # no manifest
    cal.write_manifest(tmp_path)
    assert cal.main(["check", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith("ok")


# --------------------------------------------------------------------------- filtering / subsets

def test_filters(shipped):
    ja = load_calibration_set(languages=["ja"])
    assert ja and all(t.language == "ja" for t in ja)
    assert load_calibration_set(languages="ko") == [t for t in shipped if t.language == "ko"]
    ev = load_calibration_set(split="evaluation", languages=["zh", "en"])
    assert ev == [t for t in shipped if t.split == "evaluation" and t.language in ("zh", "en")]
    with pytest.raises(InputError, match="unknown split"):
        load_calibration_set(split="test")
    with pytest.raises(InputError, match="unknown language"):
        load_calibration_set(languages=["fr"])
    with pytest.raises(InputError, match="limit_per_language"):
        load_calibration_set(limit_per_language=-1)


def test_subset_deterministic_and_stratified(shipped):
    a = load_calibration_set(split="calibration", limit_per_language=20, seed=0)
    b = load_calibration_set(split="calibration", limit_per_language=20, seed=0)
    c = load_calibration_set(split="calibration", limit_per_language=20, seed=1)
    assert a == b and a != c
    assert Counter(t.language for t in a) == {lang: 20 for lang in LANGUAGES}
    pool = [t for t in shipped if t.split == "calibration"]
    assert [t.id for t in a] == [t.id for t in pool if t.id in {x.id for x in a}]  # file order
    for lang in LANGUAGES:
        mine = [t for t in pool if t.language == lang]
        got = Counter(t.length for t in a if t.language == lang)
        for length in LENGTH_CLASSES:
            expect = 20 * sum(t.length == length for t in mine) / len(mine)
            assert abs(got[length] - expect) < 1, (lang, length, got, expect)
    assert load_calibration_set(limit_per_language=10**6) == shipped
    assert load_calibration_set(limit_per_language=0) == []
    one = load_calibration_set(limit_per_language=1, seed=3)
    assert Counter(t.language for t in one) == {lang: 1 for lang in LANGUAGES}


# --------------------------------------------------------------------------- user files / errors

def _write(tmp_path, name, lines) -> pathlib.Path:
    p = tmp_path / name
    p.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return p


def test_plain_text_user_file(tmp_path):
    p = _write(tmp_path, "domain.txt", [
        "# support-desk phrases",
        "您的工单已提交到App，我们会在24小时内回复。",
        "",
        "Your ticket has been escalated to tier 2 support.",
        "お問い合わせありがとうございます。",
        "고객님의 주문이 출발했습니다!",
        "<|yue|>你張單我哋已經收到喇。",
        "Please confirm your order?",
    ])
    texts = load_calibration_set(p)
    assert [t.language for t in texts] == ["zh", "en", "ja", "ko", "yue", "en"]
    assert [t.id for t in texts] == ["domain-2", "domain-4", "domain-5", "domain-6",
                                     "domain-7", "domain-8"]
    assert [t.speaker for t in texts] == ["中文女", "英文女", "日语男", "韩语女", "粤语女",
                                          "英文男"]
    assert texts[0].features == ("numbers", "code-switch")
    assert "exclamation" in texts[3].features and "question" in texts[5].features
    assert all(t.length in LENGTH_CLASSES and t.split in SPLITS for t in texts)
    assert load_calibration_set(p) == texts
    assert load_calibration_set(p, limit_per_language=1, seed=0) == \
        load_calibration_set(p, limit_per_language=1, seed=0)
    # a directory holding texts.txt works too
    d = tmp_path / "mycalib"
    d.mkdir()
    shutil.copy(p, d / "texts.txt")
    assert [t.text for t in load_calibration_set(d)] == [t.text for t in texts]


def test_jsonl_user_file_minimal_fields_and_custom_speakers(tmp_path):
    p = _write(tmp_path, "mine.jsonl", [
        json.dumps({"text": "Reset the router, then wait 30 seconds."}),
        json.dumps({"id": "b", "text": "重启路由器。", "speaker": "客服小李",
                    "meta": {"source": "faq"}}),
    ])
    with pytest.raises(CalibrationFileError, match="unknown speaker") as ei:
        load_calibration_set(p)
    assert ei.value.line == 2
    texts = load_calibration_set(p, speakers=["客服小李", *SPEAKERS])
    assert [(t.id, t.language, t.speaker) for t in texts] == [
        ("mine-1", "en", "英文女"), ("b", "zh", "客服小李")]
    assert texts[0].features == ("numbers",)


def test_guess_language():
    g = cal.guess_language
    assert g("今天天气不错。") == "zh"
    assert g("今日は天気がいいです。") == "ja"   # kana wins over Han
    assert g("東京") == "zh"                      # Han only: cannot tell, zh
    assert g("서울에 갑니다.") == "ko"
    assert g("Hello 123") == "en" and g("12:30") == "en"
    assert g("<|yue|>你食咗飯未？") == "yue" and g("<|ja|>東京") == "ja"
    assert g("<|fr|>Bonjour") == "en"             # unknown tag: by script


@pytest.mark.parametrize("lines, line, match", [
    (['{"text": "ok."}', '{"text": "broken"', '{"text": "fine."}'], 2, "invalid JSON"),
    (['{"text": "ok."}', '["text"]'], 2, "JSON object"),
    (['{"text": "ok.", "language": "fr"}'], 1, "unknown language"),
    (['{"text": "ok."}', '', '{"text": "ok.", "speaker": "nobody"}'], 3, "unknown speaker"),
    (['{"id": "a", "text": "one."}', '{"id": "a", "text": "two."}'], 2,
     "duplicate id 'a' \\(first on line 1\\)"),
    (['{"text": "ok.", "lang": "en"}'], 1, "unknown field"),
    (['{"id": "x"}'], 1, "missing field 'text'"),
    (['{"text": ""}'], 1, "non-empty string"),
    (['{"text": 5}'], 1, "non-empty string"),
    (['{"text": "ok.", "length": "huge"}'], 1, "unknown length class"),
    (['{"text": "ok.", "split": "train"}'], 1, "unknown split"),
    (['{"text": "ok.", "features": ["numbers", "rhymes"]}'], 1, "unknown feature"),
    (['{"text": "ok.", "features": "numbers"}'], 1, "list of strings"),
    (['{"text": "<|ja|>こんにちは", "language": "ko"}'], 1, "language tag"),
    (['{"text": "ok."}', '{"text": "。。。！！！"}'], 2, "rejected by the frontend"),
])
def test_bad_jsonl_lines(tmp_path, lines, line, match):
    p = _write(tmp_path, "bad.jsonl", lines)
    with pytest.raises(CalibrationFileError, match=match) as ei:
        load_calibration_set(p)
    err = ei.value
    assert isinstance(err, InputError) and isinstance(err, ValueError)
    assert err.line == line and err.path == str(p)
    assert f"{p}:{line}: " in str(err)


def test_bad_files(tmp_path, monkeypatch):
    with pytest.raises(ModelDirError, match="does not exist") as ei:
        load_calibration_set(tmp_path / "nope.jsonl")
    assert ei.value.path == str(tmp_path / "nope.jsonl")
    with pytest.raises(ModelDirError, match="no texts.jsonl"):
        load_calibration_set(tmp_path)
    empty = _write(tmp_path, "empty.txt", ["# only a comment", ""])
    with pytest.raises(CalibrationFileError, match="no texts") as ei:
        load_calibration_set(empty)
    assert ei.value.line is None
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("fine line\nsecond line\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(CalibrationFileError, match="not UTF-8") as ei:
        load_calibration_set(latin1)
    assert ei.value.line == 3
    plain_bad = _write(tmp_path, "p.txt", ["Hello.", "   ...   "])
    with pytest.raises(CalibrationFileError, match="frontend") as ei:
        load_calibration_set(plain_bad)
    assert ei.value.line == 2
    # default location: $COSYVINO_CALIB_DIR overrides; a missing set is a ModelDirError
    monkeypatch.setenv("COSYVINO_CALIB_DIR", str(tmp_path / "elsewhere"))
    with pytest.raises(ModelDirError, match="COSYVINO_CALIB_DIR"):
        load_calibration_set()
    monkeypatch.setenv("COSYVINO_CALIB_DIR", str(CALIB))
    assert len(load_calibration_set(languages=["ko"])) == 63


def test_stale_manifest_warns(tmp_path, caplog):
    rows = TEXTS.read_text(encoding="utf-8").splitlines()[:30]
    (tmp_path / "texts.jsonl").write_text("\n".join(rows) + "\n", encoding="utf-8")
    shutil.copy(MANIFEST, tmp_path / "manifest.json")
    with caplog.at_level("WARNING", logger="cosyvino.quantize.calibration"):
        assert len(load_calibration_set(tmp_path)) == 30
    assert "manifest" in caplog.text


def test_no_torch_import():
    code = ("import sys, cosyvino.quantize.calibration as c; c.load_calibration_set(); "
            "assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


PLAIN = "# my domain texts\nHello.\n\n你好。\n"


def test_refresh_keeps_plain_texts_file_as_source(tmp_path, capsys):
    """`refresh` on a texts.txt dir never rewrites or deletes it: it writes only the manifest
    (recording texts.txt's sha256) and says texts.txt is the source of truth."""
    src = tmp_path / "texts.txt"
    src.write_text(PLAIN, encoding="utf-8")
    assert cal.main(["refresh", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{src} left unchanged; it is the source of truth" in out
    assert src.read_text(encoding="utf-8") == PLAIN  # comment line kept
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json", "texts.txt"]
    manifest = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["texts"] == "texts.txt"
    assert manifest["sha256"] == hashlib.sha256(PLAIN.encode()).hexdigest()
    assert manifest["total"] == 2
    assert manifest["languages"]["en"]["total"] == 1 and manifest["languages"]["zh"]["total"] == 1
    assert cal.check(tmp_path) == []
    assert [t.text for t in load_calibration_set(tmp_path)] == ["Hello.", "你好。"]


def test_refresh_jsonl_writes_jsonl_next_to_kept_plain_file(tmp_path, capsys):
    src = tmp_path / "texts.txt"
    src.write_text(PLAIN, encoding="utf-8")
    assert cal.main(["refresh", "--jsonl", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    jsonl = tmp_path / "texts.jsonl"
    assert f"wrote {jsonl}: it is now the source of truth (read before texts.txt)" in out
    assert src.read_text(encoding="utf-8") == PLAIN
    rows = [json.loads(line) for line in jsonl.read_text(encoding="utf-8").splitlines()]
    assert [(r["id"], r["language"], r["speaker"], r["text"], r["length"]) for r in rows] == [
        ("texts-2", "en", "英文女", "Hello.", "short"),
        ("texts-4", "zh", "中文女", "你好。", "short")]
    manifest = json.loads((tmp_path / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["texts"] == "texts.jsonl"
    assert manifest["sha256"] == hashlib.sha256(jsonl.read_bytes()).hexdigest()
    # converting the plain file again would overwrite the jsonl that is now read: refused
    with pytest.raises(InputError, match="texts.jsonl already exists"):
        cal.refresh(src, to_jsonl=True)
    assert src.read_text(encoding="utf-8") == PLAIN


def test_refresh_help_says_plain_file_is_kept(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cal.main(["--help"])
    assert exit_info.value.code == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "refresh never modifies or deletes a plain-text texts.txt" in help_text
    assert "--jsonl" in help_text
