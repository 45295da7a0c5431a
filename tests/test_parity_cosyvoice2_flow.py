"""CosyVoice2 flow parity with the official implementation (``CausalMaskedDiffWithXvec``).

Golden dirs: ``tests/fixtures/tiny-c`` plus the CosyVoice2 dirs of ``COSYVINO_GOLDEN_DIRS``
(each holds ``cosyvoice2.yaml``, ``flow.pt`` and ``golden.pt`` with a ``flow`` entry, shared
reference README). Every size comes from the dir's yaml. Tolerance (fp32, max abs): 1e-4.

Also: streaming incremental consistency (sheet v2 §5.6), the strict ``flow.pt`` loader (exact
key set, fp16 upcast, named errors), the full-size key manifest, and input errors.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import FIXTURES, TINY_C, golden_dirs_of

from cosyvino.errors import CheckpointError, InputError, ModelDirError
from cosyvino.families.cosyvoice2.flow_config import read_flow_config
from cosyvino.families.cosyvoice2.torch.flow_inference import (
    flow_inference,
    flow_mu,
)
from cosyvino.families.cosyvoice2.torch.flow_loading import (
    build_flow,
    expected_flow_shapes,
    load_flow,
    load_flow_checkpoint,
)
from cosyvino.families.cosyvoice23.fixed_noise import make_cfm_noise_table

TOL = 1e-4
GOLDEN_DIRS = golden_dirs_of("cosyvoice2")
_IDS = [d.name if d == TINY_C else str(d) for d in GOLDEN_DIRS]
#: every CosyVoice2 golden dir
each_dir = pytest.mark.parametrize("model_dir", GOLDEN_DIRS, ids=_IDS)


@functools.cache
def _flow(model_dir: Path):
    return load_flow(model_dir)


@functools.cache
def _golden(model_dir: Path) -> dict:
    return torch.load(model_dir / "golden.pt", map_location="cpu", weights_only=False)["flow"]


@functools.cache
def _noise() -> np.ndarray:
    return make_cfm_noise_table()


def _close(got, want, what: str) -> None:
    want = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
    got = np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = float(np.abs(got - want).max())
    assert err < TOL, f"{what}: max abs diff {err:.3g}"


@each_dir
def test_config_matches_golden_shapes(model_dir):
    cfg = read_flow_config(model_dir)
    g = _golden(model_dir)
    assert g["n_timesteps"] == cfg.cfm.n_timesteps
    assert g["inference_cfg_rate"] == pytest.approx(cfg.cfm.inference_cfg_rate)
    assert g["embedding"].shape[1] == cfg.spk_embed_dim
    assert g["encoder_proj_out"].shape == (1, cfg.token_mel_ratio * g["speech_token"].shape[1],
                                           cfg.output_size)


@each_dir
def test_speaker_projection(model_dir):
    g = _golden(model_dir)
    with torch.inference_mode():
        _close(_flow(model_dir).speaker(g["embedding"]), g["spk_proj"], "spk_proj")


@each_dir
def test_encoder_proj_out(model_dir):
    g = _golden(model_dir)
    _close(flow_mu(_flow(model_dir), g["speech_token"]), g["encoder_proj_out"],
           "encoder_proj_out")


@each_dir
def test_encoder_proj_out_not_final(model_dir):
    # upstream only makes non-final calls in streaming mode; the golden is such a call
    g = _golden(model_dir)
    _close(flow_mu(_flow(model_dir), g["speech_token"], finalize=False, streaming=True),
           g["encoder_proj_out_not_final"], "encoder_proj_out_not_final")


@pytest.mark.parametrize("streaming,key", [(False, "estimator_out"),
                                           (True, "estimator_out_streaming")])
@each_dir
def test_estimator(model_dir, streaming, key):
    g = _golden(model_dir)
    ei = g["estimator_in"]
    est = _flow(model_dir).decoder.estimator
    with torch.inference_mode():
        out = est(ei["x"], ei["mask"], ei["mu"], ei["t"], ei["spks"], ei["cond"],
                  streaming=streaming)
    _close(out, g[key], key)


@each_dir
def test_estimator_modes_differ(model_dir):
    """The chunk mask matters (so both parity cases above test something): the golden
    full-attention and chunk-mask outputs differ, when the frames span two chunks."""
    g = _golden(model_dir)
    cfg = read_flow_config(model_dir)
    if g["estimator_in"]["x"].shape[-1] <= cfg.estimator.static_chunk_size:
        pytest.skip("one chunk: both modes are the same attention")
    assert float((g["estimator_out"] - g["estimator_out_streaming"]).abs().max()) > 1e-3


_MEL_CASES = {
    "mel": {"streaming": False, "finalize": True, "prompt": False},
    "mel_streaming": {"streaming": True, "finalize": True, "prompt": False},
    "mel_not_final": {"streaming": True, "finalize": False, "prompt": False},
    "mel_with_prompt": {"streaming": False, "finalize": True, "prompt": True},
    "mel_with_prompt_streaming": {"streaming": True, "finalize": True, "prompt": True},
}


@each_dir
@pytest.mark.parametrize("key", list(_MEL_CASES))
def test_mel(model_dir, key):
    """10 Euler steps, cosine schedule, CFG 0.7, the fixed seed-0 noise (sheet v2 §5.3-§5.4)."""
    g = _golden(model_dir)
    case = _MEL_CASES[key]
    prompt = ({"prompt_token": g["prompt_speech_token"], "prompt_feat": g["prompt_feat"]}
              if case["prompt"] else {})
    mel = flow_inference(_flow(model_dir), g["speech_token"], g["embedding"], _noise(),
                         streaming=case["streaming"], finalize=case["finalize"], **prompt)
    _close(mel, g[key], key)


@each_dir
def test_golden_noise_is_the_table_head(model_dir):
    g = _golden(model_dir)
    n = g["noise"].shape[-1]
    np.testing.assert_array_equal(_noise()[:, :, :n], g["noise"].numpy())


@each_dir
@pytest.mark.parametrize("with_prompt", [False, True], ids=["no_prompt", "prompt"])
def test_streaming_incremental_consistency(model_dir, with_prompt):
    """Sheet v2 §5.6: a streaming non-final call over tokens[:n] whose P + n - look-ahead tokens
    end on an encoder-chunk boundary gives the same frames as one streaming final call over
    the whole utterance, i.e. frames of finished chunks do not change when tokens are
    appended (what incremental streaming relies on)."""
    g = _golden(model_dir)
    flow = _flow(model_dir)
    cfg = flow.cfg
    tokens = g["speech_token"]
    prompt = ({"prompt_token": g["prompt_speech_token"], "prompt_feat": g["prompt_feat"]}
              if with_prompt else {})
    p = g["prompt_speech_token"].shape[1] if with_prompt else 0
    chunk, ahead, ratio = cfg.encoder.static_chunk_size, cfg.pre_lookahead_len, cfg.token_mel_ratio
    full = flow_inference(flow, tokens, g["embedding"], _noise(), streaming=True, **prompt)
    cuts = [k * chunk + ahead - p for k in range(1, 8)]
    cuts = [n for n in cuts if 0 < n - ahead and n < tokens.shape[1]]
    assert cuts, "the golden utterance is too short for a chunk boundary"
    for n in cuts:
        part = flow_inference(flow, tokens[:, :n], g["embedding"], _noise(), streaming=True,
                              finalize=False, **prompt)
        frames = ratio * (n - ahead)
        assert part.shape[-1] == frames
        err = float(np.abs(part - full[:, :, :frames]).max())
        assert err < TOL, f"first {frames} frames changed by {err:.3g} after {n} tokens"
    # ... while full attention (non-streaming) lacks this property once the prefix spans
    # more than one chunk (so the check above depends on the chunk masks)
    n = cuts[-1]
    if n - ahead + p <= chunk:
        return
    nonstream = flow_inference(flow, tokens[:, :n], g["embedding"], _noise(), finalize=False,
                               **prompt)
    frames = ratio * (n - ahead)
    assert float(np.abs(nonstream - full[:, :, :frames]).max()) > 1e-3


# --- strict loader ---------------------------------------------------------------------------


def _file_state_dict(model_dir: Path) -> dict:
    return dict(torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True))


@each_dir
def test_loader_upcasts_to_float32_and_matches_file(model_dir):
    flow = _flow(model_dir)
    sd = _file_state_dict(model_dir)
    own = flow.state_dict()
    assert list(own) == list(sd), "key order differs from the official registration order"
    for k, v in sd.items():
        assert own[k].dtype == torch.float32
        assert torch.equal(own[k], v.float()), k


@each_dir
@pytest.mark.parametrize("damage", ["missing", "unexpected", "shape"])
def test_loader_rejects_mismatch(model_dir, tmp_path, damage):
    sd = _file_state_dict(model_dir)
    key = "encoder.pre_lookahead_layer.conv1.weight"
    if damage == "missing":
        del sd[key]
    elif damage == "unexpected":
        sd["decoder.estimator.extra.weight"] = torch.zeros(3)
    else:
        sd[key] = sd[key][..., :-1]
    path = tmp_path / "flow.pt"
    torch.save(sd, path)
    flow = build_flow(read_flow_config(model_dir))
    with pytest.raises(CheckpointError) as err:
        load_flow_checkpoint(flow, path)
    msg = str(err.value)
    assert str(path) in msg and "cosyvoice2.yaml" in msg
    assert ("decoder.estimator.extra.weight" if damage == "unexpected" else key) in msg


@each_dir
def test_loader_typed_errors_for_bad_files(model_dir, tmp_path):
    flow = build_flow(read_flow_config(model_dir))
    with pytest.raises(ModelDirError):
        load_flow_checkpoint(flow, tmp_path / "absent.pt")
    truncated = tmp_path / "flow.pt"
    truncated.write_bytes((model_dir / "flow.pt").read_bytes()[:4096])
    with pytest.raises(CheckpointError):
        load_flow_checkpoint(flow, truncated)
    with pytest.raises(ModelDirError):
        load_flow(tmp_path / "no-such-dir")


# --- input errors ----------------------------------------------------------------------------


@each_dir
def test_inference_input_errors(model_dir):
    g = _golden(model_dir)
    flow = _flow(model_dir)
    cfg = flow.cfg
    tok, emb, noise = g["speech_token"], g["embedding"], _noise()
    with pytest.raises(InputError, match="vocabulary"):
        flow_inference(flow, torch.full_like(tok, cfg.vocab_size), emb, noise)
    with pytest.raises(InputError, match="prompt_feat"):
        flow_inference(flow, tok, emb, noise, prompt_token=g["prompt_speech_token"],
                       prompt_feat=g["prompt_feat"][:, :-1])
    with pytest.raises(InputError, match="together"):
        flow_inference(flow, tok, emb, noise, prompt_token=g["prompt_speech_token"])
    with pytest.raises(InputError, match="embedding"):
        flow_inference(flow, tok, emb[:, :-1], noise)
    with pytest.raises(InputError, match="tokens"):
        flow_inference(flow, tok[:, :cfg.pre_lookahead_len], emb, noise, finalize=False)
    with pytest.raises(InputError, match="mel frames"):
        flow_inference(flow, tok, emb, noise[:, :, :10])


# --- full-size key manifest (not per golden dir) --------------------------------------------


def test_full_size_key_manifest():
    """Our module tree at the CosyVoice2-0.5B sizes (sheet v2 §5.1) has exactly the keys and
    shapes of the official ``flow.pt`` (sheet §5.8, the reference key manifest)."""
    manifest = json.loads((FIXTURES / "cosyvoice2-0.5b-flow-keys.json").read_text())
    small = read_flow_config(TINY_C)
    cfg = dataclasses.replace(
        small,
        encoder=dataclasses.replace(small.encoder, attention_heads=8, linear_units=2048,
                                    num_blocks=6),
        estimator=dataclasses.replace(small.estimator, channels=(256,), attention_head_dim=64,
                                      n_blocks=4, num_mid_blocks=12, num_heads=8))
    shapes = expected_flow_shapes(cfg)
    want = {k: tuple(v) for k, v in manifest["flow.pt"].items()}
    assert list(shapes) == list(want)
    assert shapes == want
    assert sum(int(np.prod(s)) for s in shapes.values()) == manifest["flow.pt:params"]
