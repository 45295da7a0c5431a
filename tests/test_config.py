"""cosyvoice.yaml parsing: inert (nothing imported or run), typed, with clear errors."""

from __future__ import annotations

import sys

import pytest

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice1.presets import full_300m, tiny
from cosyvino.families.cosyvoice1.yaml_config import read_model_config
from cosyvino.families.cosyvoice1.yaml_writer import render_cosyvoice_yaml
from conftest import TINY_A


def test_official_tiny_yaml_parses_to_tiny_preset():
    cfg = read_model_config(TINY_A / "cosyvoice.yaml")
    assert cfg == tiny()
    assert cfg.llm.sampling.top_k == 25 and cfg.llm.sampling.top_p == 0.8
    assert cfg.llm.text_encoder.static_chunk_size == 1
    assert cfg.llm.llm.input_layer == "linear_legacy"
    assert cfg.flow.cfm.inference_cfg_rate == 0.7 and cfg.flow.cfm.sigma_min == 1e-6
    assert cfg.hift.hop_length == 256


def test_parsing_imports_and_runs_nothing(monkeypatch):
    import random

    random.seed(123)
    expected = random.random()
    random.seed(123)
    for mod in ("cosyvoice", "whisper", "matcha", "omegaconf", "hyperpyyaml"):
        sys.modules.pop(mod, None)
    read_model_config(TINY_A)
    # the yaml's `!apply:random.seed [1986]` must not have run
    assert random.random() == expected
    for mod in ("cosyvoice", "whisper", "matcha", "omegaconf", "hyperpyyaml"):
        assert mod not in sys.modules


@pytest.mark.parametrize("preset", [tiny, full_300m])
def test_writer_round_trip(tmp_path, preset):
    cfg = preset()
    p = tmp_path / "cosyvoice.yaml"
    p.write_text(render_cosyvoice_yaml(cfg, "test"), encoding="utf-8")
    assert read_model_config(p) == cfg


def test_missing_yaml(tmp_path):
    with pytest.raises(ModelDirError) as e:
        read_model_config(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_yaml_without_llm_section(tmp_path):
    text = (TINY_A / "cosyvoice.yaml").read_text(encoding="utf-8")
    p = tmp_path / "cosyvoice.yaml"
    p.write_text(text.replace("llm: !new:", "not_llm: !new:"), encoding="utf-8")
    with pytest.raises(ConfigError, match="no 'llm:' section") as e:
        read_model_config(p)
    assert e.value.path == str(p)


def test_invalid_yaml_and_bad_values(tmp_path):
    p = tmp_path / "cosyvoice.yaml"
    p.write_text("llm: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        read_model_config(p)
    text = (TINY_A / "cosyvoice.yaml").read_text(encoding="utf-8")
    p.write_text(text.replace("num_blocks: 2", "num_blocks: two", 1), encoding="utf-8")
    with pytest.raises(ConfigError, match="num_blocks"):
        read_model_config(p)


def test_unsupported_architecture(tmp_path):
    text = (TINY_A / "cosyvoice.yaml").read_text(encoding="utf-8")
    p = tmp_path / "cosyvoice.yaml"
    p.write_text(text.replace("cosyvoice.llm.llm.TransformerLM", "cosyvoice.llm.llm.Qwen2LM"),
                 encoding="utf-8")
    with pytest.raises(ConfigError, match="Qwen2LM"):
        read_model_config(p)
