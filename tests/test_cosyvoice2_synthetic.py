"""Synthetic CosyVoice2 dirs (`cosyvino make-model --family cosyvoice2`): the official layout,
read back by the v2 config readers and strict loaders, and the full-size key/shape set equal to
the 0.5B manifest (tests/fixtures/cosyvoice2-0.5b-state-dict-keys.json, from the reference
material)."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from conftest import FIXTURES, TINY_C

from cosyvino.errors import InputError, ModelDirError

torch = pytest.importorskip("torch")

from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml
from cosyvino.families.cosyvoice2 import synthetic
from cosyvino.families.cosyvoice2.config import read_cosyvoice2_config
from cosyvino.families.cosyvoice2.flow_config import read_flow_config
from cosyvino.families.cosyvoice2.hift_config import read_hift_config
from cosyvino.families.cosyvoice2.presets import PRESETS
from cosyvino.families.cosyvoice2.yaml_writer import render_cosyvoice2_yaml

MANIFEST = FIXTURES / "cosyvoice2-0.5b-state-dict-keys.json"
FILES = ("llm.pt", "flow.pt", "hift.pt")


def _config_dir(tmp_path, preset: str):
    """yaml + CosyVoice-BlankEN of ``preset`` (no weights)."""
    p = PRESETS[preset]()
    d = tmp_path / preset
    d.mkdir()
    (d / "cosyvoice2.yaml").write_text(render_cosyvoice2_yaml(p), encoding="utf-8")
    synthetic.write_qwen_dir(str(d), p.qwen)
    return d, p


def test_tiny_yaml_is_the_golden_recipe_yaml(tmp_path):
    """The tiny preset renders the official-code golden's yaml: same text (data-pipeline and
    training sections included) and the same inert parse."""
    d, _ = _config_dir(tmp_path, "tiny")
    ours = (d / "cosyvoice2.yaml").read_text(encoding="utf-8")
    assert ours.rstrip("\n") == (TINY_C / "cosyvoice2.yaml").read_text(encoding="utf-8")
    assert load_inert_yaml(d / "cosyvoice2.yaml") == load_inert_yaml(TINY_C / "cosyvoice2.yaml")
    golden = json.loads((TINY_C / "CosyVoice-BlankEN" / "config.json").read_text())
    assert json.loads((d / "CosyVoice-BlankEN" / "config.json").read_text()) == golden
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        assert (d / "CosyVoice-BlankEN" / name).read_bytes() == \
            (TINY_C / "CosyVoice-BlankEN" / name).read_bytes()


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_yaml_and_config_json_round_trip(tmp_path, preset):
    d, p = _config_dir(tmp_path, preset)
    cfg = read_cosyvoice2_config(d)
    assert cfg.llm == synthetic.llm_config(p)
    assert (cfg.sample_rate, cfg.token_frame_rate, cfg.token_mel_ratio, cfg.chunk_size) == \
        (24000, 25, 2, 25)
    assert read_flow_config(d) == p.flow
    assert read_hift_config(d) == p.hift


def test_full_size_key_and_shape_set_is_the_manifest():
    """Every key, shape and key order of the three 0.5B checkpoints make-model writes (computed
    on the meta device with the writer's own state-dict conversion), and the parameter counts
    (sheet v2 §1: the tied table counted twice in llm.pt)."""
    manifest = json.loads(MANIFEST.read_text())
    shapes = synthetic.checkpoint_shapes("0.5b")
    for name in FILES:
        want = {k: tuple(v) for k, v in manifest[name].items()}
        assert list(shapes[name]) == list(want), name
        assert shapes[name] == want, name
        assert sum(math.prod(s) for s in shapes[name].values()) == manifest[f"{name}:params"]
    assert len(shapes["llm.pt"]) == 295 and len(shapes["flow.pt"]) == 1121 and \
        len(shapes["hift.pt"]) == 328


def test_tiny_key_and_shape_set_is_the_golden_dirs():
    """The tiny preset's checkpoints have exactly the keys, shapes and order of the official
    code's tiny-c files."""
    shapes = synthetic.checkpoint_shapes("tiny")
    for name in FILES:
        golden = torch.load(TINY_C / name, map_location="cpu", weights_only=True)
        assert shapes[name] == {k: tuple(v.shape) for k, v in golden.items()}, name
        assert list(shapes[name]) == list(golden), name


def test_tiny_dir_loads_strictly(tiny_v2_model_dir):
    from cosyvino.families.cosyvoice2.llm_checkpoint import (
        EMBED_TOKENS_KEY,
        LM_HEAD_KEY,
    )
    from cosyvino.families.cosyvoice2.speakers import load_cosyvoice2_spk2info
    from cosyvino.families.cosyvoice2.torch.flow_loading import load_flow
    from cosyvino.families.cosyvoice2.torch.hift import load_hift
    from cosyvino.families.cosyvoice2.torch.llm import load_cosyvoice2_lm
    from cosyvino.families.cosyvoice23.tokenizer import load_qwen_tokenizer

    d = tiny_v2_model_dir
    assert sorted(os.listdir(d)) == sorted([
        "CosyVoice-BlankEN", "README.txt", "campplus.onnx", "cosyvoice2.yaml", "flow.pt",
        "hift.pt", "llm.pt", "speech_tokenizer_v2.onnx", "spk2info.pt"])
    assert synthetic.is_synthetic(d) and not synthetic.is_synthetic(TINY_C)
    cfg = read_cosyvoice2_config(d)
    llm = load_cosyvoice2_lm(d, cfg.llm)
    flow, hift = load_flow(d), load_hift(d)
    assert llm.llm_decoder.weight.shape == (6564, 32)
    assert flow.input_embedding.weight.shape == (6561, 512)
    assert hift.conv_post.weight.shape == (18, 32 // 8, 7)
    # the tied text table: two keys, one storage, as the official file
    sd = torch.load(os.path.join(d, "llm.pt"), map_location="cpu", weights_only=True)
    assert sd[EMBED_TOKENS_KEY].dtype == torch.float32
    assert sd[EMBED_TOKENS_KEY].data_ptr() == sd[LM_HEAD_KEY].data_ptr()
    assert os.path.getsize(os.path.join(d, "llm.pt")) < 1.2 * 4 * sum(
        v.numel() for k, v in sd.items() if k != LM_HEAD_KEY)
    hsd = torch.load(os.path.join(d, "hift.pt"), map_location="cpu", weights_only=True)
    assert "conv_pre.parametrizations.weight.original0" in hsd
    assert not any(k.endswith(".weight_g") for k in hsd)
    # EOS-biased speech head: EOS ~3 % per step, the other stop ids practically never
    p = torch.softmax(llm.llm_decoder.bias, 0)
    assert p[6561].item() == pytest.approx(0.03, rel=0.2)
    assert p[6562].item() < 1e-9 and p[6563].item() < 1e-9
    speakers = load_cosyvoice2_spk2info(os.path.join(d, "spk2info.pt"))
    assert len(speakers) == 7
    assert all(s.embedding.shape == (1, 192) and s.bundle is None for s in speakers.values())
    assert load_qwen_tokenizer(d).encode("Hello world.") == [9707, 1879, 13]


def test_prompt_model_stand_ins_keep_the_official_io(tiny_v2_model_dir):
    """campplus.onnx: feats [1, T, 80] -> [1, 192]; speech_tokenizer_v2.onnx: feats [1, 128, T]
    + length int32 [1] (fed by position) -> int64 [1, 1, ceil(ceil(T/2)/2)] in 0..6560."""
    ort = pytest.importorskip("onnxruntime")
    d = tiny_v2_model_dir
    cam = ort.InferenceSession(os.path.join(d, "campplus.onnx"))
    tok = ort.InferenceSession(os.path.join(d, "speech_tokenizer_v2.onnx"))
    rng = np.random.default_rng(0)
    (emb,) = cam.run(None, {cam.get_inputs()[0].name: rng.standard_normal(
        (1, 150, 80)).astype(np.float32)})
    assert emb.shape == (1, 192) and emb.dtype == np.float32
    names = [i.name for i in tok.get_inputs()]
    seen = set()
    for frames in (1, 4, 5, 7, 100, 401, 3000):
        feats = rng.standard_normal((1, 128, frames)).astype(np.float32)
        (ids,) = tok.run(None, dict(zip(names, [feats, np.array([frames], np.int32)])))
        assert ids.shape == (1, 1, math.ceil(math.ceil(frames / 2) / 2)) and ids.dtype == np.int64
        assert ids.min() >= 0 and ids.max() <= 6560
        seen.update(ids.reshape(-1).tolist())
    assert len(seen) > 50  # FSQ spreads random features over many codes


def test_make_model_errors(tmp_path, tiny_v2_model_dir):
    with pytest.raises(InputError, match="unknown CosyVoice2 preset '300m'.*tiny, 0.5b"):
        synthetic.make_model("300m", tmp_path / "x")
    with pytest.raises(InputError, match="dtype"):
        synthetic.make_model("tiny", tmp_path / "x", dtype="int8")
    with pytest.raises(ModelDirError, match="already exists"):
        synthetic.make_model("tiny", tiny_v2_model_dir)
    assert not (tmp_path / "x").exists()


def test_float16_and_weight_g_variants_load(tmp_path):
    """float16 storage (as the goldens) and the older weight_g spelling both load strictly;
    the tied table stays one storage in float16 too."""
    from cosyvino.families.cosyvoice2.llm_checkpoint import (
        EMBED_TOKENS_KEY,
        LM_HEAD_KEY,
    )
    from cosyvino.families.cosyvoice2.torch.hift import load_hift
    from cosyvino.families.cosyvoice2.torch.llm import load_cosyvoice2_lm

    d = synthetic.make_model("tiny", tmp_path / "h", dtype="float16",
                             hift_weight_norm="weight_g")
    sd = torch.load(os.path.join(d, "llm.pt"), map_location="cpu", weights_only=True)
    assert sd[EMBED_TOKENS_KEY].dtype == torch.float16
    assert sd[EMBED_TOKENS_KEY].data_ptr() == sd[LM_HEAD_KEY].data_ptr()
    hsd = torch.load(os.path.join(d, "hift.pt"), map_location="cpu", weights_only=True)
    assert list(hsd)[2:5] == ["conv_pre.bias", "conv_pre.weight_g", "conv_pre.weight_v"]
    load_cosyvoice2_lm(d)
    load_hift(d)


@pytest.mark.skipif(os.environ.get("COSYVINO_TEST_FULL_SIZE") != "1",
                    reason="writes a ~2.6 GB dir; set COSYVINO_TEST_FULL_SIZE=1")
def test_full_size_dir_is_the_manifest(tmp_path):
    """Opt-in: the written 0.5b files hold exactly the manifest's keys and shapes."""
    manifest = json.loads(MANIFEST.read_text())
    d = synthetic.make_model("0.5b", tmp_path / "full")
    for name in FILES:
        sd = torch.load(os.path.join(d, name), map_location="cpu", weights_only=True,
                        mmap=True)
        assert {k: list(v.shape) for k, v in sd.items()} == manifest[name]
    assert read_cosyvoice2_config(d).llm.qwen.num_hidden_layers == 24
