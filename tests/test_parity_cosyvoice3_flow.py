"""CosyVoice3 flow parity with the official implementation (``CausalMaskedDiffWithDiT``).

Golden dirs: ``tests/fixtures/tiny-e`` plus the CosyVoice3 dirs of ``COSYVINO_GOLDEN_DIRS``
(each holds ``cosyvoice3.yaml``, ``flow.pt`` and ``golden.pt`` with a ``flow`` entry, shared
reference README). Every size comes from the dir's yaml. Tolerance (fp32, max abs): 1e-4.

Also: the fixed CFM noise against the full-size official fingerprint, streaming incremental
consistency, the strict ``flow.pt`` loader (exact key set with the rotary ``inv_freq`` buffer,
fp16 upcast, named errors), the 0.5B key manifest, input errors, torch.export of the DiT with a
dynamic frame count, and the DiT under bf16 autocast (upstream reports fp16/bf16 NaNs).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import FIXTURES, TINY_E, cpu_has_native_bf16, golden_dirs_of
from torch.export import Dim, export

from cosyvino.errors import CheckpointError, InputError, ModelDirError
from cosyvino.families.cosyvoice3.flow_config import (
    FUN_COSYVOICE3_0_5B,
    read_flow_config,
)
from cosyvino.families.cosyvoice3.torch.flow_loading import (
    build_flow,
    expected_flow_shapes,
    load_flow,
    load_flow_checkpoint,
)
from cosyvino.families.cosyvoice3.torch.rotary import rope_inv_freq
from cosyvino.families.cosyvoice23.fixed_noise import (
    CFM_NOISE_SHAPE,
    make_cfm_noise_table,
)
from cosyvino.families.cosyvoice23.torch.flow_inference import (
    flow_inference,
    split_lookahead,
)

TOL = 1e-4
GOLDEN_DIRS = golden_dirs_of("cosyvoice3")
_IDS = [d.name if d == TINY_E else str(d) for d in GOLDEN_DIRS]
#: every CosyVoice3 golden dir
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


def _close(got, want, what: str, tol: float = TOL) -> float:
    want = want.numpy() if hasattr(want, "numpy") else np.asarray(want)
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = float(np.abs(got - want).max())
    assert err < tol, f"{what}: max abs diff {err:.3g}"
    return err


def _estimate(model_dir: Path, streaming: bool) -> torch.Tensor:
    ei = _golden(model_dir)["estimator_in"]
    est = _flow(model_dir).decoder.estimator
    with torch.inference_mode():
        return est(ei["x"], ei["mask"], ei["mu"], ei["t"], ei["spks"], ei["cond"],
                   streaming=streaming)


@each_dir
def test_config_matches_golden_shapes(model_dir):
    cfg = read_flow_config(model_dir)
    g = _golden(model_dir)
    assert g["n_timesteps"] == cfg.cfm.n_timesteps
    assert g["inference_cfg_rate"] == pytest.approx(cfg.cfm.inference_cfg_rate)
    assert g["embedding"].shape[1] == cfg.spk_embed_dim
    assert g["pre_lookahead_out"].shape == (1, g["speech_token"].shape[1], cfg.input_size)
    assert g["mel"].shape == (1, cfg.output_size,
                              cfg.token_mel_ratio * g["speech_token"].shape[1])


@each_dir
def test_speaker_projection(model_dir):
    g = _golden(model_dir)
    with torch.inference_mode():
        _close(_flow(model_dir).speaker(g["embedding"]), g["spk_proj"], "spk_proj")


@pytest.mark.parametrize("finalize,key", [(True, "pre_lookahead_out"),
                                          (False, "pre_lookahead_out_not_final")])
@each_dir
def test_pre_lookahead_out(model_dir, finalize, key):
    """Sheet v3 §5.2: embedding + pre-lookahead residual; a non-final call takes the last
    ``pre_lookahead_len`` tokens as right context only."""
    g = _golden(model_dir)
    flow = _flow(model_dir)
    with torch.inference_mode():
        out = flow.pre_lookahead(*split_lookahead(flow, g["speech_token"], finalize=finalize))
    _close(out, g[key], key)


@pytest.mark.parametrize("streaming,key", [(False, "estimator_out"),
                                           (True, "estimator_out_streaming")])
@each_dir
def test_estimator(model_dir, streaming, key):
    _close(_estimate(model_dir, streaming), _golden(model_dir)[key], key)


@each_dir
def test_estimator_modes_differ(model_dir):
    """The chunk mask matters (so both parity cases above test something) when the frames span
    two chunks."""
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
    """10 Euler steps, cosine schedule, CFG 0.7, the fixed seed-0 noise (sheet v3 §5.2, §5.4)."""
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


def test_noise_equals_full_size_official():
    """The table equals what the official full-size CosyVoice3 construction leaves (reference
    ``cosyvoice23-fixed-buffers.pt`` ``cosyvoice3`` -> ``cfm_noise_head`` [1,80,4096], shape,
    sum; the fixture keeps the shape, the float64 sums of the whole table and of the head, and
    the head's first and last 32 columns)."""
    ref = np.load(FIXTURES / "cosyvoice3-cfm-noise.npz")
    table = _noise()
    assert table.shape == tuple(ref["shape"]) == CFM_NOISE_SHAPE
    head = int(ref["head_len"])
    np.testing.assert_array_equal(table[:, :, :32], ref["head_first"])
    np.testing.assert_array_equal(table[:, :, head - 32:head], ref["head_last"])
    assert table[:, :, :head].astype(np.float64).sum() == pytest.approx(float(ref["head_sum"]),
                                                                         abs=1e-6)
    assert table.astype(np.float64).sum() == pytest.approx(float(ref["sum"]), abs=1e-6)


@each_dir
@pytest.mark.parametrize("with_prompt", [False, True], ids=["no_prompt", "prompt"])
def test_streaming_incremental_consistency(model_dir, with_prompt):
    """Sheet v3 §5.4: a streaming non-final call over tokens[:n] whose P + n - look-ahead tokens
    end on a DiT chunk boundary gives the same frames as one streaming final call over the
    whole utterance: frames of finished chunks do not change when tokens are appended (the
    position convs are causal, the pre-lookahead sees only the given look-ahead tokens)."""
    g = _golden(model_dir)
    flow = _flow(model_dir)
    cfg = flow.cfg
    tokens = g["speech_token"]
    prompt = ({"prompt_token": g["prompt_speech_token"], "prompt_feat": g["prompt_feat"]}
              if with_prompt else {})
    p = g["prompt_speech_token"].shape[1] if with_prompt else 0
    ahead, ratio = cfg.pre_lookahead_len, cfg.token_mel_ratio
    chunk = cfg.estimator.static_chunk_size // ratio  # tokens per DiT chunk
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
def test_rotary_inv_freq_is_loaded_and_is_the_formula(model_dir):
    """``rotary_embed.inv_freq`` is a ``flow.pt`` key (sheet v3 §5.3): 10000^(-2i/dim_head)."""
    cfg = read_flow_config(model_dir)
    inv = _flow(model_dir).decoder.estimator.rotary_embed.inv_freq
    assert inv.shape == (cfg.estimator.dim_head // 2,)
    assert torch.allclose(inv, rope_inv_freq(cfg.estimator.dim_head), rtol=1e-6, atol=0)
    assert torch.equal(inv, _file_state_dict(model_dir)
                       ["decoder.estimator.rotary_embed.inv_freq"].float())


@each_dir
@pytest.mark.parametrize("damage,key", [
    ("missing", "pre_lookahead_layer.conv1.weight"),
    ("missing", "decoder.estimator.rotary_embed.inv_freq"),
    ("unexpected", "decoder.estimator.long_skip_connection.weight"),
    ("shape", "decoder.estimator.transformer_blocks.0.attn.to_q.weight"),
])
def test_loader_rejects_mismatch(model_dir, tmp_path, damage, key):
    sd = _file_state_dict(model_dir)
    if damage == "missing":
        del sd[key]
    elif damage == "unexpected":
        sd[key] = torch.zeros(3)
    else:
        sd[key] = sd[key][..., :-1]
    path = tmp_path / "flow.pt"
    torch.save(sd, path)
    flow = build_flow(read_flow_config(model_dir))
    with pytest.raises(CheckpointError) as err:
        load_flow_checkpoint(flow, path)
    msg = str(err.value)
    assert str(path) in msg and "cosyvoice3.yaml" in msg and key in msg


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
    with pytest.raises(InputError, match="integer"):
        flow_inference(flow, tok.float(), emb, noise)
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
    """Our module tree at the Fun-CosyVoice3-0.5B sizes (sheet v3 §5.1) has exactly the keys,
    order and shapes of the official ``flow.pt`` (sheet §5.6, the reference key manifest; 330
    tensors with the ``inv_freq`` buffer)."""
    manifest = json.loads((FIXTURES / "cosyvoice3-0.5b-flow-keys.json").read_text())
    shapes = expected_flow_shapes(FUN_COSYVOICE3_0_5B)
    want = {k: tuple(v) for k, v in manifest["flow.pt"].items()}
    assert len(shapes) == 330
    assert list(shapes) == list(want)
    assert shapes == want
    assert sum(int(np.prod(s)) for s in shapes.values()) == manifest["flow.pt:params"]


# --- export ----------------------------------------------------------------------------------


class _Estimator(torch.nn.Module):
    def __init__(self, est, streaming: bool):
        super().__init__()
        self.est, self.streaming = est, streaming

    def forward(self, x, mask, mu, t, spks, cond):
        return self.est(x, mask, mu, t, spks, cond, streaming=self.streaming)


def _estimator_args(frames: int, gen: torch.Generator, mel: int = 80):
    def r(*shape):
        return torch.randn(*shape, generator=gen)

    return (r(2, mel, frames), torch.ones(2, 1, frames), r(2, mel, frames),
            torch.rand(2, generator=gen), r(2, mel), r(2, mel, frames))


@pytest.mark.parametrize("streaming", [False, True], ids=["full", "chunk"])
def test_estimator_exports_with_dynamic_frames(streaming):
    """What a converter traces: ``torch.export`` of the DiT with a dynamic frame count (one
    graph per attention mode); the program equals eager at another length, across chunks."""
    gen = torch.Generator().manual_seed(1)
    model = _Estimator(_flow(TINY_E).decoder.estimator, streaming)
    frames = Dim("T", min=2, max=15000)
    dyn = {"x": {2: frames}, "mask": {2: frames}, "mu": {2: frames}, "t": None, "spks": None,
           "cond": {2: frames}}
    ep = export(model, _estimator_args(120, gen), dynamic_shapes=dyn)
    for length in (77, 163):
        other = _estimator_args(length, gen)
        with torch.inference_mode():
            assert torch.allclose(ep.module()(*other), model(*other), atol=1e-5)


# --- reduced precision -----------------------------------------------------------------------


@pytest.mark.skipif(not cpu_has_native_bf16(), reason="this CPU has no native bf16 "
                    "(AVX512-BF16 / AMX); bf16 autocast would be emulated")
@each_dir
@pytest.mark.parametrize("streaming,key", [(False, "estimator_out"),
                                           (True, "estimator_out_streaming")])
def test_estimator_bf16_autocast_is_finite(model_dir, streaming, key):
    """Upstream reports NaNs from v3's DiT in fp16/bf16; with bf16 autocast on CPU our DiT gives
    finite output on the golden inputs, within bf16 rounding of fp32 (error measured in
    docs/performance.md)."""
    ei = _golden(model_dir)["estimator_in"]
    est = _flow(model_dir).decoder.estimator
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = est(ei["x"], ei["mask"], ei["mu"], ei["t"], ei["spks"], ei["cond"],
                  streaming=streaming)
    assert out.dtype == torch.bfloat16
    out = out.float()
    assert torch.isfinite(out).all()
    want = _golden(model_dir)[key]
    rel = float((out - want).abs().max() / want.abs().max())
    assert rel < 0.05, f"bf16 autocast vs fp32: max abs error {rel:.3g} of the output range"


def test_mu_narrower_than_the_mel():
    """``mu`` is ``input_size`` wide and the prompt condition ``output_size`` wide (upstream
    builds ``conds`` with ``output_size``); a config where they differ runs (random weights)."""
    import dataclasses

    small = read_flow_config(TINY_E)
    cfg = dataclasses.replace(
        small, input_size=48,
        pre_lookahead=dataclasses.replace(small.pre_lookahead, in_channels=48),
        estimator=dataclasses.replace(small.estimator, mu_dim=48))
    torch.manual_seed(0)
    flow = build_flow(cfg).eval()
    g = _golden(TINY_E)
    mel = flow_inference(flow, g["speech_token"][:, :20], g["embedding"], _noise(),
                         prompt_token=g["prompt_speech_token"], prompt_feat=g["prompt_feat"],
                         n_timesteps=2)
    assert mel.shape == (1, cfg.output_size, 40) and np.isfinite(mel).all()
