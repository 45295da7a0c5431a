"""cosyvoice3.yaml + CosyVoice-BlankEN/config.json reading: inert, typed, clear errors; v1/v2
dirs and classes recognised (sheet v3 §1, §2, §4.1)."""

from __future__ import annotations

import random
import shutil
import subprocess
import sys

import pytest

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice3.config import CosyVoice3LLMConfig, read_cosyvoice3_config
from conftest import TINY_A, TINY_C, TINY_E, golden_dirs_of


def _golden(model_dir):
    torch = pytest.importorskip("torch")
    return torch.load(model_dir / "golden.pt", weights_only=False)


def _config_copy(tmp_path, src=TINY_E):
    """The config files of ``src`` (yaml + CosyVoice-BlankEN, no weights) under tmp_path."""
    dst = tmp_path / "m"
    dst.mkdir()
    shutil.copy(src / "cosyvoice3.yaml", dst / "cosyvoice3.yaml")
    shutil.copytree(src / "CosyVoice-BlankEN", dst / "CosyVoice-BlankEN")
    return dst


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice3"), ids=lambda p: p.name)
def test_sizes_match_the_goldens_config(model_dir):
    cfg = read_cosyvoice3_config(model_dir)
    want = _golden(model_dir)["config"]
    q = cfg.llm.qwen
    assert (q.hidden_size, q.num_hidden_layers, q.num_attention_heads, q.num_key_value_heads,
            q.intermediate_size) == (want["hidden"], want["layers"], want["heads"],
                                     want["kv_heads"], want["inter"])
    assert cfg.llm.llm_input_size == cfg.llm.llm_output_size == q.hidden_size


@pytest.mark.parametrize("model_dir", golden_dirs_of("cosyvoice3"), ids=lambda p: p.name)
def test_special_ids_match_the_official_constants(model_dir):
    cfg = read_cosyvoice3_config(model_dir).llm
    g = _golden(model_dir)["llm"]
    assert (cfg.sos, cfg.task_id, cfg.eos_token, cfg.fill_token) == (
        g["sos"], g["task_id"], g["eos_token"], g["fill_token"]) == (6561, 6563, 6562, 6564)
    assert list(cfg.stop_token_ids) == list(g["stop_token_ids"]) == list(range(6561, 6761))
    assert cfg.vocab_out == g["vocab_out"] == g["logp"].shape[-1] == 6761


def test_tiny_e_values():
    cfg = read_cosyvoice3_config(TINY_E)
    assert (cfg.sample_rate, cfg.token_frame_rate, cfg.token_mel_ratio, cfg.chunk_size) == (
        24000, 25, 2, 25)
    llm = cfg.llm
    assert isinstance(llm, CosyVoice3LLMConfig)
    assert llm.speech_token_size == 6561 and llm.mix_ratio == (5, 15)
    assert (llm.sampling.top_p, llm.sampling.top_k, llm.sampling.win_size,
            llm.sampling.tau_r) == (0.8, 25, 10, 0.1)
    assert (llm.min_token_text_ratio, llm.max_token_text_ratio) == (2.0, 20.0)
    assert llm.qwen.rope_theta == 1e6 and llm.qwen.vocab_size == 151936
    assert llm.qwen.tie_word_embeddings
    # the flow/hift readers get the inert sections
    assert cfg.sections["flow"].class_name == "CausalMaskedDiffWithDiT"
    assert cfg.sections["hift"].class_name == "CausalHiFTGenerator"


def test_reading_imports_and_runs_nothing():
    random.seed(123)
    expected = random.random()
    random.seed(123)
    for mod in ("cosyvoice", "matcha", "omegaconf", "hyperpyyaml", "transformers"):
        sys.modules.pop(mod, None)
    read_cosyvoice3_config(TINY_E)
    assert random.random() == expected  # the yaml's `!apply:random.seed [1986]` did not run
    for mod in ("cosyvoice", "matcha", "omegaconf", "hyperpyyaml", "transformers"):
        assert mod not in sys.modules


@pytest.mark.parametrize("src, family", [(TINY_A, "CosyVoice v1"), (TINY_C, "CosyVoice2")])
def test_v1_and_v2_dirs_given_as_v3(src, family):
    with pytest.raises(ModelDirError, match=f"is a {family} model dir, not a CosyVoice3 one") \
            as e:
        read_cosyvoice3_config(src)
    assert "cosyvoice3.yaml" in str(e.value) and e.value.path == str(src)


def test_v3_dir_given_as_v2():
    from cosyvino.families.cosyvoice2.config import read_cosyvoice2_config

    with pytest.raises(ModelDirError, match="is a CosyVoice3 model dir, not a CosyVoice2 one"):
        read_cosyvoice2_config(TINY_E)


def test_missing_dir_empty_dir_and_missing_blank_en(tmp_path):
    with pytest.raises(ModelDirError, match="not found"):
        read_cosyvoice3_config(tmp_path / "nope")
    with pytest.raises(ModelDirError, match="cosyvoice3.yaml"):
        read_cosyvoice3_config(tmp_path)
    d = _config_copy(tmp_path)
    (d / "CosyVoice-BlankEN" / "config.json").unlink()
    with pytest.raises(ModelDirError, match="CosyVoice-BlankEN/config.json"):
        read_cosyvoice3_config(d)


@pytest.mark.parametrize("old, new, key, match", [
    ("!new:cosyvoice.llm.llm.CosyVoice3LM", "!new:cosyvoice.llm.llm.Qwen2LM", "'llm'",
     "a CosyVoice2 LLM"),
    ("!new:cosyvoice.llm.llm.CosyVoice3LM", "!new:cosyvoice.llm.llm.TransformerLM", "'llm'",
     "CosyVoice v1"),
    ("!new:cosyvoice.llm.llm.Qwen2Encoder", "!new:mystery.Encoder", "'llm.llm'",
     "Qwen2Encoder"),
    ("!new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT",
     "!new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec", "'flow'", "the CosyVoice2 flow"),
    ("!new:cosyvoice.hifigan.generator.CausalHiFTGenerator",
     "!new:cosyvoice.hifigan.generator.HiFTGenerator", "'hift'", "v1/v2 vocoder"),
    ("!name:cosyvoice.utils.common.ras_sampling", "!name:mystery.sample", "'llm.sampling'",
     "ras_sampling"),
])
def test_yaml_naming_other_classes(tmp_path, old, new, key, match):
    d = _config_copy(tmp_path)
    path = d / "cosyvoice3.yaml"
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new), encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as e:
        read_cosyvoice3_config(d)
    assert key in str(e.value) and str(path) in str(e.value)


@pytest.mark.parametrize("old, new, match", [
    ("\nflow: !new:", "\nnot_flow: !new:", "no 'flow:' section"),
    ("llm_input_size: 32", "llm_input_size: 48", "llm.llm_input_size' is 48.*hidden_size 32"),
    ("    speech_token_size: 6561\n", "", "'llm' lacks required key 'speech_token_size'"),
    ("    speech_token_size: 6561\n", "    speech_token_size: many\n",
     "'llm.speech_token_size' must be a number"),
    ("    mix_ratio: [5, 15]\n", "    mix_ratio: [5]\n", "mix_ratio' must be two positive"),
    ("sample_rate: 24000", "sample_rate: fast", r"'\(top level\).sample_rate' must be a number"),
])
def test_bad_yaml_values_name_file_and_key(tmp_path, old, new, match):
    d = _config_copy(tmp_path)
    path = d / "cosyvoice3.yaml"
    text = path.read_text(encoding="utf-8")
    assert old in text
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as e:
        read_cosyvoice3_config(d)
    assert str(path) in str(e.value)


def test_config_tokenizer_decoding_prompt_and_info_modules_do_not_import_torch():
    code = ("import sys\n"
            "from cosyvino.families.cosyvoice3 import config, decoding, info, prompt, tokenizer\n"
            "from cosyvino.families.cosyvoice3 import llm_checkpoint\n"
            "from cosyvino.families.cosyvoice23 import lm_config, lm_checkpoint, speakers\n"
            f"config.read_cosyvoice3_config({str(TINY_E)!r})\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
