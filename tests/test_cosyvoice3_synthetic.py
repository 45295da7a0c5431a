"""Synthetic CosyVoice3 dirs (`cosyvino make-model --family cosyvoice3`): the official layout,
read back by the v3 config readers and strict loaders; the full-size key/shape set and order
equal to the Fun-CosyVoice3-0.5B manifest (tests/fixtures/cosyvoice3-0.5b-{llm,flow,hift}-keys.json,
the reference manifest split per file) computed on the meta device (nothing big in CI); the
tiny preset equal to the official-code golden tiny-e; random-weight utterances that end."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import FIXTURES, TINY_E

from cosyvino.errors import InputError, ModelDirError

torch = pytest.importorskip("torch")

from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml
from cosyvino.families.cosyvoice3 import synthetic
from cosyvino.families.cosyvoice3.config import read_cosyvoice3_config
from cosyvino.families.cosyvoice3.fixed_tables import read_table_recipe
from cosyvino.families.cosyvoice3.flow_config import read_flow_config
from cosyvino.families.cosyvoice3.hift_config import read_hift_config
from cosyvino.families.cosyvoice3.presets import PRESETS
from cosyvino.families.cosyvoice3.yaml_writer import render_cosyvoice3_yaml

FILES = ("llm.pt", "flow.pt", "hift.pt")
TEXT = "Hello world, this is a test of the synthetic model."


def _manifest(name: str) -> dict:
    return json.loads((FIXTURES / f"cosyvoice3-0.5b-{name[:-3]}-keys.json").read_text())


def _config_dir(tmp_path, preset: str):
    p = PRESETS[preset]()
    d = tmp_path / preset
    d.mkdir()
    (d / "cosyvoice3.yaml").write_text(render_cosyvoice3_yaml(p), encoding="utf-8")
    synthetic.write_qwen_dir(str(d), p.qwen)
    return d, p


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return synthetic.make_model("tiny", tmp_path_factory.mktemp("models") / "tiny-v3", seed=3)


def test_tiny_yaml_is_the_golden_recipe_yaml(tmp_path):
    d, _ = _config_dir(tmp_path, "tiny")
    assert (d / "cosyvoice3.yaml").read_text(encoding="utf-8") == \
        (TINY_E / "cosyvoice3.yaml").read_text(encoding="utf-8")
    assert load_inert_yaml(d / "cosyvoice3.yaml") == load_inert_yaml(TINY_E / "cosyvoice3.yaml")
    golden = json.loads((TINY_E / "CosyVoice-BlankEN" / "config.json").read_text())
    assert json.loads((d / "CosyVoice-BlankEN" / "config.json").read_text()) == golden


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_yaml_and_config_json_round_trip(tmp_path, preset):
    d, p = _config_dir(tmp_path, preset)
    cfg = read_cosyvoice3_config(d)
    assert cfg.llm == synthetic.llm_config(p)
    assert (cfg.sample_rate, cfg.token_frame_rate, cfg.token_mel_ratio, cfg.chunk_size) == \
        (24000, 25, 2, 25)
    assert read_flow_config(d) == p.flow
    assert read_hift_config(d) == p.hift
    read_table_recipe(d)  # the recipe's construction order: the fixed NSF tables replay it


def test_full_size_key_and_shape_set_is_the_manifest():
    """Every key, shape and the key order of the three 0.5B checkpoints make-model writes (the
    writer's own state-dict conversion, on the meta device) and the value counts."""
    shapes = synthetic.checkpoint_shapes("0.5b")
    assert list(shapes) == list(FILES)
    for name in FILES:
        want = _manifest(name)
        assert [(k, list(s)) for k, s in shapes[name].items()] == list(want[name].items()), name
        assert sum(math.prod(s) for s in shapes[name].values()) == want[f"{name}:params"]
    assert _manifest("llm.pt")["llm.pt:params"] == 642_283_136


def test_tiny_key_and_shape_set_is_the_golden_dir(tiny_dir):
    for name in FILES:
        ours = torch.load(os.path.join(tiny_dir, name), weights_only=True)
        golden = torch.load(TINY_E / name, weights_only=True)
        assert [(k, tuple(v.shape)) for k, v in ours.items()] == \
            [(k, tuple(v.shape)) for k, v in golden.items()], name
    sd = torch.load(os.path.join(tiny_dir, "llm.pt"), weights_only=True)
    assert sd["llm.model.model.embed_tokens.weight"].data_ptr() == \
        sd["llm.model.lm_head.weight"].data_ptr()  # the tied table, one storage
    assert synthetic.is_synthetic(tiny_dir) and not synthetic.is_synthetic(TINY_E)


def test_tiny_dir_serves_and_its_utterances_end(tiny_dir):
    """Loaded strictly by the torch backend; utterances stop at a few seconds, well before the
    20x-text max_len, although HEAD's v3 rule lets a stop id through from the first step."""
    from cosyvino import Synthesizer

    tts = Synthesizer(tiny_dir, backend="torch", voices_dir=False)
    try:
        assert tts.family.name == "cosyvoice3" and len(tts.speakers) == 7
        lengths = []
        for seed in range(6):
            a = tts.synthesize(TEXT, tts.speakers[0], seed=seed)
            assert a.samples.size == 960 * a.speech_tokens.size
            lengths.append(a.speech_tokens.size)
        # max_len is 20x the text tokens (~12 here); SYNTHETIC_EOS_PROB is 0.01 per step
        assert len(set(lengths)) > 1 and max(lengths) < 240 and np.mean(lengths) > 20, lengths
    finally:
        tts.close()


def test_make_model_errors(tmp_path, tiny_dir):
    with pytest.raises(InputError, match="unknown CosyVoice3 preset '300m'.*tiny, 0.5b"):
        synthetic.make_model("300m", tmp_path / "x")
    with pytest.raises(InputError, match="dtype"):
        synthetic.make_model("tiny", tmp_path / "x", dtype="int8")
    with pytest.raises(ModelDirError, match="already exists"):
        synthetic.make_model("tiny", tiny_dir)
    assert not (tmp_path / "x").exists()


def test_cli_makes_a_v3_dir_with_family_and_0_5b_alone_stays_v2(tmp_path):
    from cosyvino.cli.main import main, synthetic_family

    assert synthetic_family("cosyvoice3", "0.5b").name == "cosyvoice3"
    assert synthetic_family(None, "0.5b").name == "cosyvoice2"
    out = str(tmp_path / "m")
    r = CliRunner().invoke(main, ["make-model", "--family", "cosyvoice3", "--preset", "tiny",
                                  "--hift-weight-norm", "weight_g", out])
    assert r.exit_code == 0, r.output
    assert read_cosyvoice3_config(out).llm.qwen.hidden_size == 32
    hsd = torch.load(os.path.join(out, "hift.pt"), weights_only=True)
    assert "conv_pre.weight_g" in hsd
    from cosyvino.families.cosyvoice3.torch.hift import load_hift

    load_hift(out)
