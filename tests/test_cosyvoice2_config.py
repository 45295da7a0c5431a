"""cosyvoice2.yaml + CosyVoice-BlankEN/config.json reading: inert, typed, clear errors
(sheet v2 §1, §4.1)."""

from __future__ import annotations

import json
import random
import shutil
import sys

import pytest

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice2.config import read_cosyvoice2_config
from cosyvino.families.cosyvoice23.qwen2_config import (
    QWEN2_0_5B,
    qwen2_config_from_dict,
    read_qwen2_config,
)
from conftest import TINY_A, TINY_C, golden_dirs_of

torch = pytest.importorskip("torch")


def _golden(model_dir):
    return torch.load(model_dir / "golden.pt", weights_only=False)


def _config_copy(tmp_path, src=TINY_C):
    """The config files of ``src`` (yaml + CosyVoice-BlankEN, no weights) under tmp_path."""
    dst = tmp_path / "m"
    dst.mkdir()
    shutil.copy(src / "cosyvoice2.yaml", dst / "cosyvoice2.yaml")
    shutil.copytree(src / "CosyVoice-BlankEN", dst / "CosyVoice-BlankEN")
    return dst


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice2"), ids=lambda p: p.name)
def test_sizes_match_the_goldens_config(model_dir):
    cfg = read_cosyvoice2_config(model_dir)
    want = _golden(model_dir)["config"]
    q = cfg.llm.qwen
    assert (q.hidden_size, q.num_hidden_layers, q.num_attention_heads, q.num_key_value_heads,
            q.intermediate_size) == (want["hidden"], want["layers"], want["heads"],
                                     want["kv_heads"], want["inter"])
    assert cfg.llm.llm_input_size == cfg.llm.llm_output_size == q.hidden_size


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice2"), ids=lambda p: p.name)
def test_special_ids_match_the_official_constants(model_dir):
    cfg = read_cosyvoice2_config(model_dir).llm
    g = _golden(model_dir)["llm"]
    assert (cfg.sos, cfg.task_id, cfg.eos_token, cfg.fill_token) == (
        g["sos"], g["task_id"], g["eos_token"], g["fill_token"])
    assert list(cfg.stop_token_ids) == list(g["stop_token_ids"])
    assert cfg.vocab_out == g["vocab_out"] == g["logp"].shape[-1]


def test_tiny_c_values():
    cfg = read_cosyvoice2_config(TINY_C)
    assert (cfg.sample_rate, cfg.token_frame_rate, cfg.token_mel_ratio, cfg.chunk_size) == (
        24000, 25, 2, 25)
    llm = cfg.llm
    assert llm.speech_token_size == 6561 and llm.mix_ratio == (5, 15)
    assert (llm.sampling.top_p, llm.sampling.top_k, llm.sampling.win_size,
            llm.sampling.tau_r) == (0.8, 25, 10, 0.1)
    assert (llm.min_token_text_ratio, llm.max_token_text_ratio) == (2.0, 20.0)
    assert llm.qwen.rope_theta == 1e6 and llm.qwen.rms_norm_eps == 1e-6
    assert llm.qwen.vocab_size == 151936 and llm.qwen.tie_word_embeddings
    assert llm.qwen.attention_head_dim == 8 and llm.qwen.kv_width == 16
    # the flow/hift readers get the inert sections
    assert cfg.sections["flow"].class_name == "CausalMaskedDiffWithXvec"


def test_reading_imports_and_runs_nothing():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    for mod in ("cosyvoice", "matcha", "omegaconf", "hyperpyyaml", "transformers"):
        sys.modules.pop(mod, None)
    read_cosyvoice2_config(TINY_C)
    assert random.random() == expected  # the yaml's `!apply:random.seed [1986]` did not run
    for mod in ("cosyvoice", "matcha", "omegaconf", "hyperpyyaml", "transformers"):
        assert mod not in sys.modules


def test_full_size_qwen_config_parses():
    data = {"model_type": "qwen2", "hidden_size": 896, "num_hidden_layers": 24,
            "num_attention_heads": 14, "num_key_value_heads": 2, "intermediate_size": 4864,
            "vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
            "tie_word_embeddings": True, "hidden_act": "silu", "rope_scaling": None}
    cfg = qwen2_config_from_dict(data, "config.json")
    assert cfg == QWEN2_0_5B
    assert (cfg.attention_head_dim, cfg.kv_width, cfg.q_width) == (64, 128, 896)


def test_missing_blank_en_config(tmp_path):
    d = _config_copy(tmp_path)
    (d / "CosyVoice-BlankEN" / "config.json").unlink()
    with pytest.raises(ModelDirError, match="CosyVoice-BlankEN/config.json") as e:
        read_cosyvoice2_config(d)
    assert e.value.path.endswith("config.json")


def test_missing_blank_en_dir(tmp_path):
    d = _config_copy(tmp_path)
    shutil.rmtree(d / "CosyVoice-BlankEN")
    with pytest.raises(ModelDirError, match="CosyVoice-BlankEN"):
        read_cosyvoice2_config(d)


@pytest.mark.parametrize("change, key, match", [
    ({"model_type": "llama"}, "model_type", "expected 'qwen2'"),
    ({"num_key_value_heads": 3}, "num_key_value_heads", "not a multiple"),
    ({"hidden_size": "big"}, "hidden_size", "positive integer"),
    ({"rope_scaling": {"type": "yarn", "factor": 4}}, "rope_scaling", "plain RoPE"),
    ({"hidden_act": "gelu"}, "hidden_act", "silu"),
])
def test_bad_qwen_config(tmp_path, change, key, match):
    d = _config_copy(tmp_path)
    path = d / "CosyVoice-BlankEN" / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data.update(change)
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as e:
        read_qwen2_config(d)
    assert key in str(e.value) and str(path) in str(e.value)


def test_qwen_config_not_json(tmp_path):
    d = _config_copy(tmp_path)
    (d / "CosyVoice-BlankEN" / "config.json").write_text("{nope", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid JSON"):
        read_cosyvoice2_config(d)


@pytest.mark.parametrize("old, new, key, match", [
    ("!new:cosyvoice.llm.llm.Qwen2LM", "!new:cosyvoice.llm.llm.TransformerLM", "'llm'",
     "CosyVoice v1"),
    ("!new:cosyvoice.llm.llm.Qwen2LM", "!new:cosyvoice.llm.llm.CosyVoice3LM", "'llm'",
     "CosyVoice3"),
    ("!new:cosyvoice.llm.llm.Qwen2Encoder", "!new:mystery.Encoder", "'llm.llm'",
     "Qwen2Encoder"),
    ("!new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec", "!new:mystery.Flow", "'flow'",
     "CausalMaskedDiffWithXvec"),
    ("!new:cosyvoice.hifigan.generator.HiFTGenerator",
     "!new:cosyvoice.hifigan.generator.CausalHiFTGenerator", "'hift'", "CosyVoice3 vocoder"),
    ("!name:cosyvoice.utils.common.ras_sampling", "!name:mystery.sample", "'llm.sampling'",
     "ras_sampling"),
])
def test_yaml_naming_other_classes(tmp_path, old, new, key, match):
    d = _config_copy(tmp_path)
    path = d / "cosyvoice2.yaml"
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as e:
        read_cosyvoice2_config(d)
    assert key in str(e.value) and str(path) in str(e.value)


def test_yaml_without_flow_section(tmp_path):
    d = _config_copy(tmp_path)
    path = d / "cosyvoice2.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace("\nflow: !new:", "\nnot_flow: !new:"),
                    encoding="utf-8")
    with pytest.raises(ConfigError, match="no 'flow:' section"):
        read_cosyvoice2_config(d)


def test_yaml_size_disagrees_with_qwen_config(tmp_path):
    d = _config_copy(tmp_path)
    path = d / "cosyvoice2.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace("llm_input_size: 32",
                                                             "llm_input_size: 48"),
                    encoding="utf-8")
    with pytest.raises(ConfigError, match="llm.llm_input_size' is 48.*hidden_size 32"):
        read_cosyvoice2_config(d)


def test_missing_required_llm_key(tmp_path):
    d = _config_copy(tmp_path)
    path = d / "cosyvoice2.yaml"
    path.write_text(path.read_text(encoding="utf-8").replace("    speech_token_size: 6561\n", ""),
                    encoding="utf-8")
    with pytest.raises(ConfigError, match="'llm' lacks required key 'speech_token_size'"):
        read_cosyvoice2_config(d)


def test_v1_dir_given_as_v2():
    with pytest.raises(ModelDirError, match="CosyVoice v1 model dir") as e:
        read_cosyvoice2_config(TINY_A)
    assert "cosyvoice2.yaml" in str(e.value) and e.value.path == str(TINY_A)


def test_missing_dir_and_empty_dir(tmp_path):
    with pytest.raises(ModelDirError, match="not found"):
        read_cosyvoice2_config(tmp_path / "nope")
    with pytest.raises(ModelDirError, match="cosyvoice2.yaml"):
        read_cosyvoice2_config(tmp_path)


def test_config_tokenizer_decoding_and_speakers_modules_do_not_import_torch():
    import subprocess

    code = ("import sys\n"
            "from cosyvino.families.cosyvoice2 import config, decoding, info, speakers\n"
            "from cosyvino.families.cosyvoice2 import llm_checkpoint\n"
            "from cosyvino.families.cosyvoice23 import tokenizer, qwen2_checkpoint\n"
            "from cosyvino.families import official\n"
            f"config.read_cosyvoice2_config({str(TINY_C)!r})\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
