"""The CosyVoice3 flow hyperparameters read from the official ``cosyvoice3.yaml`` (inert parse)
and the typed errors for missing, inconsistent or unsupported values (each naming the key)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import TINY_E

from cosyvino.errors import ConfigError, ModelDirError
from cosyvino.families.cosyvoice3.flow_config import (
    FUN_COSYVOICE3_0_5B,
    read_flow_config,
)

YAML = (TINY_E / "cosyvoice3.yaml").read_text(encoding="utf-8")


def _write(tmp_path, text: str):
    path = tmp_path / "cosyvoice3.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_reads_tiny_e():
    cfg = read_flow_config(TINY_E)  # a directory works too
    assert (cfg.input_size, cfg.output_size, cfg.spk_embed_dim, cfg.vocab_size) == \
        (80, 80, 192, 6561)
    assert (cfg.input_frame_rate, cfg.token_mel_ratio, cfg.pre_lookahead_len) == (25, 2, 3)
    pre = cfg.pre_lookahead
    assert (pre.in_channels, pre.channels, pre.pre_lookahead_len) == (80, 48, 3)
    est = cfg.estimator
    assert (est.dim, est.depth, est.heads, est.dim_head, est.ff_mult) == (64, 2, 4, 16, 2)
    assert (est.mel_dim, est.mu_dim, est.spk_dim) == (80, 80, 80)
    assert (est.inner_dim, est.ff_inner, est.input_width) == (64, 128, 320)
    # "!ref <chunk_size> * <token_mel_ratio>": the product, as hyperpyyaml evaluates it
    assert est.static_chunk_size == 50
    assert cfg.cfm.sigma_min == pytest.approx(1e-6)
    assert (cfg.cfm.solver, cfg.cfm.t_scheduler) == ("euler", "cosine")
    assert cfg.cfm.inference_cfg_rate == pytest.approx(0.7)
    assert cfg.cfm.n_timesteps == 10


def test_full_size_values():
    """Sheet v3 §5.1: DiT 22 × 1024, 16 heads of 64, FF 2048, pre-lookahead 1024 wide."""
    est = FUN_COSYVOICE3_0_5B.estimator
    assert (est.dim, est.depth, est.inner_dim, est.ff_inner) == (1024, 22, 1024, 2048)
    assert FUN_COSYVOICE3_0_5B.pre_lookahead.channels == 1024


def test_mu_dim_defaults_to_mel_dim(tmp_path):
    """Upstream ``DiT``: ``mu_dim=None`` means ``mel_dim``."""
    text = YAML.replace("            mu_dim: 80\n", "            mu_dim: null\n", 1)
    assert text != YAML
    assert read_flow_config(_write(tmp_path, text)).estimator.mu_dim == 80


@pytest.mark.parametrize("old,new,key", [
    ("cosyvoice.flow.flow.CausalMaskedDiffWithDiT", "cosyvoice.flow.flow.CausalMaskedDiffWithXvec",
     "CausalMaskedDiffWithDiT"),
    ("cosyvoice.flow.DiT.dit.DiT", "cosyvoice.flow.decoder.CausalConditionalDecoder", "DiT"),
    ("cosyvoice.transformer.upsample_encoder.PreLookaheadLayer",
     "cosyvoice.transformer.upsample_encoder.Other", "PreLookaheadLayer"),
    ("            dim: 64\n", "            dim: 60\n", "flow.decoder.estimator.dim"),
    ("            dim: 64\n", "            dim: wide\n", "flow.decoder.estimator.dim"),
    ("dim_head: 16", "dim_head: 15", "flow.decoder.estimator.dim_head"),
    ("            mu_dim: 80\n", "            mu_dim: 40\n", "flow.decoder.estimator.mu_dim"),
    ("            spk_dim: 80\n", "            spk_dim: 64\n", "flow.decoder.estimator.spk_dim"),
    ("            spk_dim: 80\n", "", "spk_dim"),
    ("            mel_dim: 80\n", "            mel_dim: 100\n", "flow.decoder.estimator.mel_dim"),
    ("            depth: 2\n", "            depth: 0\n", "flow.decoder.estimator.depth"),
    ("            depth: 2\n", "            depth: 2\n            long_skip_connection: True\n",
     "flow.decoder.estimator.long_skip_connection"),
    ("        in_channels: 80\n        channels: 48", "        in_channels: 64\n        channels: 48",
     "flow.pre_lookahead_layer.in_channels"),
    ("        channels: 48\n        pre_lookahead_len: 3",
     "        channels: 48\n        pre_lookahead_len: 2", "flow.pre_lookahead_layer.pre_lookahead_len"),
    ("    output_size: 80\n", "    output_size: 100\n", "flow.output_size"),
    ("solver: 'euler'", "solver: 'rk4'", "flow.decoder.cfm_params.solver"),
    ("static_chunk_size: !ref <chunk_size> * <token_mel_ratio>",
     "static_chunk_size: !ref <chunk_size> / 3", "flow.decoder.estimator.static_chunk_size"),
    ("output_type: 'mel'", "output_type: 'wav'", "flow.output_type"),
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


def test_config_modules_do_not_import_torch():
    """Reading the flow config (v3 and v2, via the shared cosyvoice23 yaml helpers) needs no
    torch: the serving side reads it from a converted dir."""
    code = ("import sys\n"
            "from cosyvino.families.cosyvoice3.flow_config import read_flow_config\n"
            "from cosyvino.families.cosyvoice2 import flow_config as v2\n"
            "from cosyvino.families.cosyvoice23 import flow_yaml\n"
            f"read_flow_config({str(TINY_E)!r})\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stderr
