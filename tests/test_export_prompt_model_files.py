"""The shared conversion frame ships a family's prompt models (``ModelFamily.prompt_model_files``)
as they are, when the source dir has them: v1 and CosyVoice2 name their own files, the core
names none."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from cosyvino.export import common
from cosyvino.families import GraphTable, ModelFamily, get_family


def test_families_name_their_prompt_models():
    assert ModelFamily.prompt_model_files == ()
    assert get_family("cosyvoice1").prompt_model_files == ("campplus.onnx",
                                                           "speech_tokenizer_v1.onnx")
    assert get_family("cosyvoice2").prompt_model_files == ("campplus.onnx",
                                                           "speech_tokenizer_v2.onnx")


class _Family:
    """A stand-in family: no graphs, one config file, two prompt-model files."""

    name = "stub"
    prompt_model_files = ("campplus.onnx", "speech_tokenizer_v9.onnx")

    @classmethod
    def source_files(cls, model_dir):
        return ("stub.yaml",)

    @classmethod
    def load_torch_model(cls, model_dir):
        return SimpleNamespace(config=None, path=model_dir)

    @classmethod
    def graphs(cls, config):
        return GraphTable([])

    @classmethod
    def write_serving_files(cls, model, model_dir, out_dir):
        return []

    @classmethod
    def manifest_fields(cls, model, **kw):
        return {}


def test_convert_copies_the_familys_prompt_models_that_exist(tmp_path, monkeypatch):
    src = tmp_path / "src"
    src.mkdir()
    (src / "stub.yaml").write_text("x: 1\n")
    (src / "campplus.onnx").write_bytes(b"cam")
    (src / "speech_tokenizer_v1.onnx").write_bytes(b"v1")   # not this family's: left behind
    monkeypatch.setattr(common, "model_family", lambda d: _Family)
    out = common.convert_atomically(str(src), str(tmp_path / "out"), "x",
                                    write_stages=lambda *a: None, header={"format": 1},
                                    stateful=False)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"campplus.onnx"}
    assert manifest["files"]["campplus.onnx"]["precision"] == "onnx"
    assert (tmp_path / "out" / "campplus.onnx").read_bytes() == b"cam"
    assert out == str(tmp_path / "out")
