"""cosyvino.converted helpers that need no runtime: locating a converted dir (a missing dir is
reported as missing, not as unconverted), manifest runtime checks, speaker names."""

from __future__ import annotations

import json

import pytest

from cosyvino.converted import (
    MANIFEST,
    find_converted_dir,
    read_manifest,
    read_speaker_names,
    write_manifest,
)
from cosyvino.errors import ConvertedModelError, ModelDirError


@pytest.mark.parametrize("runtime", ["openvino", "onnxruntime"])
def test_missing_model_dir_is_reported_as_missing(tmp_path, runtime):
    missing = tmp_path / "nope"
    with pytest.raises(ModelDirError) as info:
        find_converted_dir(str(missing), runtime)
    # same message as the torch backend; still a ConvertedModelError for callers that catch it
    assert str(info.value) == f"model directory not found: {missing}"
    assert isinstance(info.value, ConvertedModelError)
    assert info.value.path == str(missing)
    assert "cosyvino convert" not in str(info.value)


def test_existing_unconverted_dir_says_to_convert(tmp_path):
    with pytest.raises(ConvertedModelError, match=r"run `cosyvino convert --format onnx "
                                                  r"--model-dir .*` first"):
        find_converted_dir(str(tmp_path), "onnxruntime")


def _fake_converted(path, runtime="openvino", speakers=("中文女", "英文男")):
    path.mkdir()
    write_manifest(str(path), {"format": 1, "runtime": runtime, "files": {}})
    (path / "speakers.json").write_text(json.dumps(list(speakers), ensure_ascii=False),
                                        encoding="utf-8")
    return path


def test_other_runtime_message_uses_right_article(tmp_path):
    conv = _fake_converted(tmp_path / "ov", "openvino")
    with pytest.raises(ConvertedModelError,
                       match="is an openvino conversion, not onnxruntime; re-run "
                             "`cosyvino convert --format onnx`"):
        read_manifest(str(conv), "onnxruntime")
    assert find_converted_dir(str(conv), "onnxruntime") == (str(conv), None)
    assert (conv / MANIFEST).is_file()


def test_read_speaker_names(tmp_path):
    conv = _fake_converted(tmp_path / "ov")
    assert read_speaker_names(conv) == ["中文女", "英文男"]
    (conv / "speakers.json").write_text('{"a": 1}', encoding="utf-8")
    with pytest.raises(ConvertedModelError, match="speakers.json: cannot read speakers "
                                                  r"\(expected a JSON list"):
        read_speaker_names(conv)
    (conv / "speakers.json").unlink()
    with pytest.raises(ConvertedModelError, match="re-run `cosyvino convert`"):
        read_speaker_names(conv)


# ---- the single freshness rule (Backend.prepare and `cosyvino convert`) ----------------------
def _source_and_conversion(tmp_path, runtime="onnxruntime", **fields):
    """An official-looking source dir (yaml + one .pt) and its conversion in the runtime's
    default subdir, the manifest recording the sources and one graph file."""
    from cosyvino.converted import RUNTIME_SUBDIRS, file_record, source_record

    src = tmp_path / "model"
    src.mkdir()
    (src / "cosyvoice.yaml").write_text("llm: {}\n")
    (src / "llm.pt").write_bytes(b"\1" * 64)
    conv = src / RUNTIME_SUBDIRS[runtime]
    conv.mkdir()
    (conv / "llm.onnx").write_bytes(b"\2" * 32)
    write_manifest(str(conv), {
        "format": 1, "runtime": runtime,
        "source": {n: source_record(str(src / n)) for n in ("cosyvoice.yaml", "llm.pt")},
        "files": {"llm.onnx": file_record(str(conv / "llm.onnx"), stage="llm")}, **fields})
    return src, conv


def test_conversion_status_keeps_a_current_conversion(tmp_path):
    from cosyvino.converted import conversion_status

    src, conv = _source_and_conversion(tmp_path, weights="fp32", cosyvino_version="9.9",
                                       llm={"pos_bucket": 64})
    st = conversion_status(str(src), None, "onnxruntime",
                           {"weights": "fp32", "cosyvino_version": "9.9",
                            "llm": {"pos_bucket": 64}})
    assert st.current and st.dir == str(conv)
    assert st.reason == "same source files, fp32 weights, cosyvino 9.9"
    # the same dir named explicitly; the converted dir given as the model dir itself
    assert conversion_status(str(src), str(conv), "onnxruntime", {}).current
    itself = conversion_status(str(conv), None, "onnxruntime", {"weights": "fp16"})
    assert itself.current and itself.dir == str(conv)


def test_conversion_status_redoes_stale_conversions(tmp_path):
    from cosyvino.converted import conversion_status

    src, conv = _source_and_conversion(tmp_path, cosyvino_version="9.9")  # no weights, no llm
    # fields a manifest predates count with their historical values: fp32, pos_bucket 1
    assert conversion_status(str(src), None, "onnxruntime",
                             {"weights": "fp32", "llm": {"pos_bucket": 1}}).current
    st = conversion_status(str(src), None, "onnxruntime", {"llm": {"pos_bucket": 64}})
    assert not st.current and st.dir == str(conv) and "llm.pos_bucket is 1" in st.reason
    st = conversion_status(str(src), None, "onnxruntime", {"cosyvino_version": "10.0"})
    assert not st.current and "cosyvino_version is '9.9'" in st.reason
    assert not conversion_status(str(src), None, "onnxruntime", {"weights": "fp16"}).current
    (src / "llm.pt").write_bytes(b"\3" * 64)  # same size, new content
    st = conversion_status(str(src), None, "onnxruntime", {})
    assert not st.current and "stale conversion" in st.reason
    missing = conversion_status(str(src), str(tmp_path / "nowhere"), "onnxruntime", {})
    assert missing == (False, None, f"no conversion in {tmp_path / 'nowhere'}")
    assert not conversion_status(str(tmp_path / "nope"), None, "onnxruntime", {}).current


def test_conversion_status_refuses_another_runtimes_dir_as_the_model(tmp_path):
    from cosyvino.converted import conversion_status

    conv = _fake_converted(tmp_path / "ov", "openvino")
    with pytest.raises(ConvertedModelError, match="openvino conversion, not onnxruntime"):
        conversion_status(str(conv), None, "onnxruntime", {})
