"""Strict loading of official-layout model directories, and synthetic checkpoints."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import torch

from cosyvino.errors import CheckpointError, ModelDirError
from cosyvino.families.cosyvoice1.checkpoint import load_spk2info, read_speaker_names
from cosyvino.families.cosyvoice1.presets import full_300m, tiny
from cosyvino.families.cosyvoice1.synthetic import SFT_SPEAKERS, make_model
from cosyvino.families.cosyvoice1.torch.loading import expected_checkpoint_shapes, load_torch_model
from conftest import FIXTURES, TINY_A


@pytest.fixture()
def tiny_copy(tmp_path):
    dst = tmp_path / "model"
    shutil.copytree(TINY_A, dst)
    for p in dst.iterdir():
        os.chmod(p, 0o644)
    (dst / "golden.pt").unlink()
    return dst


def test_loads_official_tiny_golden_dir():
    model = load_torch_model(TINY_A)
    assert sorted(model.speakers) == sorted(SFT_SPEAKERS)
    assert model.speakers["中文女"].shape == (1, 192)
    assert model.speakers["中文女"].dtype == np.float32


def test_300m_synthetic_layout_matches_official_manifest():
    manifest = json.loads((FIXTURES / "cosyvoice-300m-state-dict-keys.json").read_text())
    expected = expected_checkpoint_shapes(full_300m())
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        ours = {k: list(v) for k, v in expected[name].items()}
        assert ours == manifest[name], name
        assert set(ours) == set(manifest[name])
    counts = {n: sum(int(np.prod(s)) for s in expected[n].values()) for n in expected}
    assert counts == {"llm.pt": 310_718_465, "flow.pt": 104_874_752, "hift.pt": 20_460_591}


def test_tiny_preset_layout_matches_golden_files():
    expected = expected_checkpoint_shapes(tiny())
    for name in ("llm.pt", "flow.pt", "hift.pt"):
        sd = torch.load(TINY_A / name, weights_only=True)
        assert {k: tuple(v.shape) for k, v in sd.items()} == expected[name]


def _edit(path, fn):
    sd = torch.load(path, weights_only=True)
    fn(sd)
    torch.save(sd, path)


def test_missing_key_is_named(tiny_copy):
    _edit(tiny_copy / "llm.pt", lambda sd: sd.pop("llm_decoder.bias"))
    with pytest.raises(CheckpointError) as e:
        load_torch_model(tiny_copy)
    assert "llm.pt" in str(e.value) and "llm_decoder.bias" in str(e.value)
    assert e.value.missing == ["llm_decoder.bias"] and not e.value.unexpected


def test_unexpected_key_is_named(tiny_copy):
    _edit(tiny_copy / "flow.pt", lambda sd: sd.__setitem__("extra.weight", torch.zeros(3)))
    with pytest.raises(CheckpointError, match="unexpected keys: extra.weight") as e:
        load_torch_model(tiny_copy)
    assert "flow.pt" in str(e.value)


def test_shape_mismatch_is_named(tiny_copy):
    _edit(tiny_copy / "llm.pt",
          lambda sd: sd.__setitem__("speech_embedding.weight", torch.zeros(4096, 63)))
    with pytest.raises(CheckpointError) as e:
        load_torch_model(tiny_copy)
    assert e.value.mismatched == [("speech_embedding.weight", (4096, 64), (4096, 63))]
    assert "expected [4096, 64] found [4096, 63]" in str(e.value)


def test_truncated_checkpoint(tiny_copy):
    data = (tiny_copy / "flow.pt").read_bytes()
    (tiny_copy / "flow.pt").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError) as e:
        load_torch_model(tiny_copy)
    assert str(tiny_copy / "flow.pt") in str(e.value)


def test_garbage_checkpoint(tiny_copy):
    (tiny_copy / "hift.pt").write_bytes(b"this is not a checkpoint")
    with pytest.raises(CheckpointError, match="hift.pt"):
        load_torch_model(tiny_copy)


def test_missing_file_and_dir(tiny_copy, tmp_path):
    (tiny_copy / "hift.pt").unlink()
    with pytest.raises(ModelDirError, match="hift.pt is missing"):
        load_torch_model(tiny_copy)
    with pytest.raises(ModelDirError, match="not found"):
        load_torch_model(tmp_path / "nope")


def test_both_weight_norm_spellings_load_identically(tiny_copy):
    ref = load_torch_model(TINY_A).hift.state_dict()

    def rename(sd):
        for k in list(sd):
            if k.endswith(".parametrizations.weight.original0"):
                sd[k.replace(".parametrizations.weight.original0", ".weight_g")] = sd.pop(k)
            elif k.endswith(".parametrizations.weight.original1"):
                sd[k.replace(".parametrizations.weight.original1", ".weight_v")] = sd.pop(k)

    _edit(tiny_copy / "hift.pt", rename)
    assert any(k.endswith(".weight_g") for k in torch.load(tiny_copy / "hift.pt",
                                                            weights_only=True))
    got = load_torch_model(tiny_copy).hift.state_dict()
    assert set(got) == set(ref)
    for k in ref:
        torch.testing.assert_close(got[k], ref[k], rtol=0, atol=0)


def test_half_precision_hift_is_upcast_before_folding(tiny_copy):
    """A float16 hift.pt (as the v2/v3 golden dirs store them) loads like upstream's float32
    module: g * v / ||v|| of the upcast pair, not a fold in float16."""
    _edit(tiny_copy / "hift.pt", lambda sd: [sd.__setitem__(k, sd[k].half()) for k in list(sd)])
    raw = torch.load(tiny_copy / "hift.pt", weights_only=True)
    got = load_torch_model(tiny_copy).hift.state_dict()
    for name in ("conv_pre", "ups.0", "f0_predictor.condnet.0"):
        g = raw[f"{name}.parametrizations.weight.original0"].float()
        v = raw[f"{name}.parametrizations.weight.original1"].float()
        want = torch._weight_norm(v, g, 0)
        assert got[f"{name}.weight"].dtype == torch.float32
        torch.testing.assert_close(got[f"{name}.weight"], want, rtol=0, atol=1e-6)


def test_generator_prefix_is_accepted(tiny_copy):
    _edit(tiny_copy / "hift.pt",
          lambda sd: [sd.__setitem__("generator." + k, sd.pop(k)) for k in list(sd)])
    load_torch_model(tiny_copy)


def test_spk2info_extra_keys_ignored_and_bad_shape(tmp_path):
    p = tmp_path / "spk2info.pt"
    torch.save({"a": {"embedding": torch.ones(1, 192), "prompt_text": "x"}}, p)
    assert list(load_spk2info(p)) == ["a"]
    torch.save({"a": {"embedding": torch.ones(1, 80)}}, p)
    with pytest.raises(CheckpointError, match="'a' embedding has shape"):
        load_spk2info(p)


def test_speaker_names_are_read_without_torch_and_equal_the_full_read(tmp_path):
    import subprocess
    import sys

    # the official code's file (golden dir) and a synthetic one
    assert read_speaker_names(TINY_A / "spk2info.pt") == list(load_spk2info(TINY_A / "spk2info.pt"))
    p = tmp_path / "spk2info.pt"
    torch.save({"b": {"embedding": torch.ones(1, 192)}, "a": {"embedding": torch.zeros(1, 192)}}, p)
    assert read_speaker_names(p) == ["b", "a"]
    # no torch import on that path (a fresh interpreter)
    code = ("import sys; from cosyvino.families.cosyvoice1.checkpoint import read_speaker_names;"
            f"print(read_speaker_names({str(p)!r})); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["['b',", "'a']", "False"]
    # a legacy (non-zip) file is read by torch
    torch.save({"c": {"embedding": torch.ones(1, 192)}}, p, _use_new_zipfile_serialization=False)
    assert read_speaker_names(p) == ["c"]
    # a pickle that would run code is refused by both readers (typed error, nothing runs)
    import pickle
    import zipfile

    class Evil:
        def __reduce__(self):
            return (os.system, ("touch " + str(tmp_path / "ran"),))

    with zipfile.ZipFile(p, "w") as z:
        z.writestr("spk2info/data.pkl", pickle.dumps({"x": Evil()}))
    with pytest.raises(CheckpointError):
        read_speaker_names(p)
    assert not (tmp_path / "ran").exists()
    with pytest.raises(ModelDirError, match="not found"):
        read_speaker_names(tmp_path / "nope.pt")


def test_make_model_tiny_is_loadable_and_atomic(tmp_path):
    out = make_model("tiny", tmp_path / "m", seed=1, hift_weight_norm="weight_g")
    assert sorted(os.listdir(tmp_path)) == ["m"]  # no temp dir left behind
    model = load_torch_model(out)
    assert sorted(model.speakers) == sorted(SFT_SPEAKERS)
    with pytest.raises(ModelDirError, match="already exists"):
        make_model("tiny", out)
