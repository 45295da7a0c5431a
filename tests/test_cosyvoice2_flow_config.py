"""The CosyVoice2 flow hyperparameters read from the official ``cosyvoice2.yaml`` (inert parse)
and the typed errors for missing or unsupported values (each naming the key)."""

from __future__ import annotations

import pytest
from conftest import TINY_C

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice2.flow_config import read_flow_config

YAML = (TINY_C / "cosyvoice2.yaml").read_text(encoding="utf-8")


def _write(tmp_path, text: str):
    path = tmp_path / "cosyvoice2.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_tiny_c():
    cfg = read_flow_config(TINY_C)  # a directory works too
    assert (cfg.input_size, cfg.output_size, cfg.spk_embed_dim, cfg.vocab_size) == \
        (512, 80, 192, 6561)
    assert (cfg.input_frame_rate, cfg.token_mel_ratio, cfg.pre_lookahead_len) == (25, 2, 3)
    enc = cfg.encoder
    assert (enc.output_size, enc.attention_heads, enc.linear_units, enc.num_blocks) == \
        (512, 4, 64, 1)
    assert (enc.static_chunk_size, enc.num_up_blocks, enc.upsample_stride) == (25, 4, 2)
    est = cfg.estimator
    assert (est.in_channels, est.out_channels, est.channels) == (320, 80, (32,))
    assert (est.attention_head_dim, est.n_blocks, est.num_mid_blocks, est.num_heads) == \
        (16, 1, 2, 2)
    assert est.act_fn == "gelu"
    # "!ref <chunk_size> * <token_mel_ratio>": the product, as hyperpyyaml evaluates it
    assert est.static_chunk_size == 50
    assert cfg.cfm.sigma_min == pytest.approx(1e-6)
    assert (cfg.cfm.solver, cfg.cfm.t_scheduler) == ("euler", "cosine")
    assert cfg.cfm.inference_cfg_rate == pytest.approx(0.7)
    assert cfg.cfm.n_timesteps == 10


@pytest.mark.parametrize("old,new,key", [
    ("        input_size: 512\n        use_cnn_module", "        use_cnn_module",
     "input_size"),
    ("pos_enc_layer_type: 'rel_pos_espnet'", "pos_enc_layer_type: 'rel_pos'",
     "flow.encoder.pos_enc_layer_type"),
    ("macaron_style: False", "macaron_style: True", "flow.encoder.macaron_style"),
    ("        output_size: 512\n        attention_heads", ("        output_size: 256\n"
     "        attention_heads"), "flow.encoder.output_size"),
    ("attention_heads: 4", "attention_heads: 3", "flow.encoder.attention_heads"),
    ("act_fn: 'gelu'", "act_fn: 'snake'", "flow.decoder.estimator.act_fn"),
    ("channels: [32]", "channels: [32, 32]", "flow.decoder.estimator.channels"),
    ("solver: 'euler'", "solver: 'rk4'", "flow.decoder.cfm_params.solver"),
    ("num_blocks: 1", "num_blocks: many", "flow.encoder.num_blocks"),
    ("static_chunk_size: !ref <chunk_size> * <token_mel_ratio>",
     "static_chunk_size: !ref <chunk_size> / 3", "flow.decoder.estimator.static_chunk_size"),
    ("in_channels: 320", "in_channels: 240", "flow.decoder.estimator.in_channels"),
    ("cosyvoice.flow.flow.CausalMaskedDiffWithXvec", "cosyvoice.flow.flow.MaskedDiffWithXvec",
     "CausalMaskedDiffWithXvec"),
    ("cosyvoice.flow.decoder.CausalConditionalDecoder", "cosyvoice.flow.decoder.Other",
     "CausalConditionalDecoder"),
])
def test_errors_name_the_key(tmp_path, old, new, key):
    assert old in YAML
    path = _write(tmp_path, YAML.replace(old, new, 1))
    with pytest.raises(ConfigError) as err:
        read_flow_config(path)
    assert key in str(err.value) and str(path) in str(err.value)


def test_no_flow_section(tmp_path):
    path = _write(tmp_path, "sample_rate: 24000\n")
    with pytest.raises(ConfigError, match="flow"):
        read_flow_config(path)


def test_missing_file(tmp_path):
    with pytest.raises(ModelDirError):
        read_flow_config(tmp_path)


def test_arithmetic_refs_evaluate_nothing_else(tmp_path):
    """Only numbers and + - * / are evaluated in a substituted ``!ref``; a name is an error,
    never looked up or called."""
    path = _write(tmp_path, YAML.replace("chunk_size: 25 #", "chunk_size: __import__ #", 1))
    with pytest.raises(ConfigError, match="static_chunk_size"):
        read_flow_config(path)
