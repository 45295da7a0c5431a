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
