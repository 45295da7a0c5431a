"""Flow parity with the official implementation: estimator, length regulation, CFM mel.

Golden dirs: ``cosyvino/testing/fixtures/tiny-a`` plus every dir in the env var
``COSYVINO_GOLDEN_DIRS`` (colon-separated; each holds ``cosyvoice.yaml``, ``flow.pt`` and
``golden.pt`` with a ``flow`` entry as described in shared/reference README).
Tolerance (fp32, max abs): 1e-4.

Also: :func:`cosyvino.families.cosyvoice1.length_regulation.interpolation_matrix` against ``F.interpolate``, the CFM
time grid against upstream's torch expression, and export-friendliness (``torch.jit.trace`` /
``torch.export`` with a dynamic, odd frame count).
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

from cosyvino.families.cosyvoice1.cfm import cosine_time_grid, solve_euler_cfg  # noqa: E402
from cosyvino.families.cosyvoice1.length_regulation import (  # noqa: E402
    interpolation_matrix,
    linear_interp_matrix,
    mel_frames_for_tokens,
)
from cosyvino.families.cosyvoice1.torch.estimator import ConditionalDecoder  # noqa: E402
from cosyvino.families.cosyvoice1.torch.length_regulator import (  # noqa: E402
    InterpolateRegulator,
    LengthRegulatorStage,
)

from conftest import TINY_A, golden_dirs  # noqa: E402
from cosyvino.families.cosyvoice1.yaml_config import read_model_config  # noqa: E402
TOL = 1e-4


GOLDEN_DIRS = golden_dirs()


_IDS = [d.name if d == TINY_A else str(d) for d in GOLDEN_DIRS]


@functools.lru_cache(maxsize=None)
def _model_config(model_dir: Path):
    return read_model_config(model_dir / "cosyvoice.yaml")


@functools.lru_cache(maxsize=None)
@torch.inference_mode(False)
def _state_dict(model_dir: Path) -> dict:
    return torch.load(model_dir / "flow.pt", map_location="cpu", weights_only=True)


def _sub(sd: dict, prefix: str) -> dict:
    return {k[len(prefix):]: v for k, v in sd.items() if k.startswith(prefix)}


@functools.lru_cache(maxsize=None)
def _golden(model_dir: Path) -> dict:
    golden = torch.load(model_dir / "golden.pt", map_location="cpu", weights_only=False)
    if "flow" not in golden:
        pytest.skip(f"{model_dir}/golden.pt has no 'flow' entry")
    return golden["flow"]


@functools.lru_cache(maxsize=None)
@torch.inference_mode(False)  # cached modules must not hold inference tensors (export, trace)
def _estimator(model_dir: Path) -> ConditionalDecoder:
    est = ConditionalDecoder(_model_config(model_dir).flow.estimator).eval()
    est.load_state_dict(_sub(_state_dict(model_dir), "decoder.estimator."), strict=True)
    return est


@functools.lru_cache(maxsize=None)
@torch.inference_mode(False)
def _regulator(model_dir: Path) -> InterpolateRegulator:
    cfg = _model_config(model_dir).flow
    reg = InterpolateRegulator(cfg.length_regulator_channels,
                               cfg.length_regulator_sampling_ratios).eval()
    reg.load_state_dict(_sub(_state_dict(model_dir), "length_regulator."), strict=True)
    return reg


def _numpy_estimator(est: ConditionalDecoder):
    def call(x, mask, mu, t, spks, cond):
        with torch.inference_mode():
            args = [torch.from_numpy(np.ascontiguousarray(a)) for a in (x, mask, mu, t, spks, cond)]
            return est(*args).numpy()
    return call


def _solve(model_dir: Path, noise, mu_tm, spks, cond) -> np.ndarray:
    """CFM with our estimator; mu_tm time-major float32 [1, T, 80]."""
    cfg = _model_config(model_dir).flow.cfm
    golden = _golden(model_dir)
    n_steps = int(golden.get("n_timesteps", cfg.n_timesteps))
    cfg_rate = float(golden.get("inference_cfg_rate", cfg.inference_cfg_rate))
    t = mu_tm.shape[1]
    return solve_euler_cfg(_numpy_estimator(_estimator(model_dir)), noise,
                           np.ones((1, 1, t), np.float32), mu_tm.transpose(0, 2, 1), spks,
                           cond, n_timesteps=n_steps, cfg_rate=cfg_rate)


def _maxabs(a, b) -> float:
    a = a.detach().numpy() if hasattr(a, "detach") else np.asarray(a)
    b = b.detach().numpy() if hasattr(b, "detach") else np.asarray(b)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max())


# ---------------------------------------------------------------------------------- golden


@pytest.mark.parametrize("model_dir", GOLDEN_DIRS, ids=_IDS)
def test_estimator_parity(model_dir):
    g = _golden(model_dir)
    e = g["estimator_in"]
    est = _estimator(model_dir)
    with torch.inference_mode():
        out = est(e["x"], e["mask"], e["mu"], e["t"], e["spks"], e["cond"])
    assert _maxabs(out, g["estimator_out"]) <= TOL


@pytest.mark.parametrize("model_dir", GOLDEN_DIRS, ids=_IDS)
def test_length_regulated_parity(model_dir):
    g = _golden(model_dir)
    n = g["encoder_proj_out"].shape[1]
    m = mel_frames_for_tokens(n, _model_config(model_dir).flow.input_frame_rate)
    assert m == g["length_regulated"].shape[1]
    interp = torch.from_numpy(interpolation_matrix(0, n, 0, m))
    stage = LengthRegulatorStage(_regulator(model_dir))
    with torch.inference_mode():
        mu = stage(g["encoder_proj_out"], interp)
    assert _maxabs(mu, g["length_regulated"]) <= TOL


@pytest.mark.parametrize("model_dir", GOLDEN_DIRS, ids=_IDS)
def test_mel_parity(model_dir):
    """encoder_proj_out -> length regulation -> 10 Euler/CFG steps from the golden noise."""
    g = _golden(model_dir)
    n = g["encoder_proj_out"].shape[1]
    m = mel_frames_for_tokens(n, _model_config(model_dir).flow.input_frame_rate)
    interp = torch.from_numpy(interpolation_matrix(0, n, 0, m))
    reg = _regulator(model_dir)
    with torch.inference_mode():
        mu = reg(g["encoder_proj_out"], interp).numpy()
    mel = _solve(model_dir, g["noise"].numpy(), mu, g["spk_proj"].numpy(),
                 np.zeros((1, mu.shape[2], m), np.float32))
    assert _maxabs(mel, g["mel"]) <= TOL


@pytest.mark.parametrize("model_dir", GOLDEN_DIRS, ids=_IDS)
def test_mel_with_prompt_parity(model_dir):
    """prompt ⧺ tokens through the flow encoder, prompt/generated length regulation, CFM with
    the prompt mel as cond; compare the generated frames (architecture sheet 5.2)."""
    try:
        from cosyvino.families.cosyvoice1.torch.flow import Flow
        from cosyvino.families.cosyvoice1.torch.flow_encoder import FlowEncoderStage
    except ImportError as exc:  # pragma: no cover - the flow encoder stage is not written yet
        pytest.skip(f"flow encoder stage not importable: {exc}")
    g = _golden(model_dir)
    cfg = _model_config(model_dir).flow
    flow = Flow(cfg).eval()
    flow.load_state_dict(_state_dict(model_dir), strict=True)

    prompt_tok, tok = g["prompt_speech_token"], g["speech_token"]
    n1, n2 = prompt_tok.shape[1], tok.shape[1]
    m1 = g["prompt_feat"].shape[1]
    m2 = mel_frames_for_tokens(n2, cfg.input_frame_rate)
    assert m2 == g["mel_with_prompt"].shape[2]
    with torch.inference_mode():
        h, spks = FlowEncoderStage(flow)(torch.cat([prompt_tok, tok], dim=1), g["embedding"])
        assert _maxabs(spks, g["spk_proj"]) <= TOL
        interp = torch.from_numpy(interpolation_matrix(n1, n2, m1, m2))
        mu = LengthRegulatorStage(flow.length_regulator)(h, interp).numpy()
    cond = np.zeros((1, mu.shape[2], m1 + m2), np.float32)
    cond[:, :, :m1] = g["prompt_feat"].numpy().transpose(0, 2, 1)
    mel = _solve(model_dir, g["noise_with_prompt"].numpy(), mu, spks.numpy(), cond)
    assert _maxabs(mel[:, :, m1:], g["mel_with_prompt"]) <= TOL


# ------------------------------------------------------------------------- length regulation


@pytest.mark.parametrize("n_in,n_out", [(1, 1), (1, 5), (2, 5), (3, 2), (7, 12), (20, 34),
                                        (34, 20), (40, 68), (57, 98), (60, 103), (100, 31)])
def test_linear_interp_matrix_matches_torch(n_in, n_out):
    x = torch.randn(1, 80, n_in, generator=torch.Generator().manual_seed(n_in * 1000 + n_out))
    ref = F.interpolate(x, size=n_out, mode="linear", align_corners=False)[0].T
    w = torch.from_numpy(linear_interp_matrix(n_in, n_out))
    assert w.shape == (n_out, n_in)
    assert _maxabs(w @ x[0].T, ref) <= 1e-6
    # The weights themselves: interpolating an identity gives W^T (1-ulp slack for kernels
    # that do not fuse the index multiply-add).
    eye = F.interpolate(torch.eye(n_in)[None], size=n_out, mode="linear")[0].T
    assert _maxabs(w, eye) <= 2.5e-7


def _upstream_length_regulate(h: torch.Tensor, n1: int, m1: int, m2: int) -> torch.Tensor:
    """Upstream ``InterpolateRegulator.inference`` resize part (before the conv stack)."""
    def interp(x, size):
        return F.interpolate(x.transpose(1, 2), size=size, mode="linear")
    x1, x2 = h[:, :n1], h[:, n1:]
    edge = mel_frames_for_tokens(20)
    if x2.shape[1] > 40:
        x2 = torch.cat([interp(x2[:, :20], edge), interp(x2[:, 20:-20], m2 - 2 * edge),
                        interp(x2[:, -20:], edge)], dim=2)
    else:
        x2 = interp(x2, m2)
    if n1 > 0:
        return torch.cat([interp(x1, m1), x2], dim=2)
    return x2


@pytest.mark.parametrize("n1,n2,m1", [(0, 1, 0), (0, 17, 0), (0, 40, 0), (0, 41, 0),
                                      (0, 60, 0), (0, 257, 0), (20, 60, 34), (7, 30, 13),
                                      (33, 41, 50), (1, 120, 2)])
def test_interpolation_matrix_matches_upstream(n1, n2, m1):
    m2 = mel_frames_for_tokens(n2)
    h = torch.randn(1, n1 + n2, 80, generator=torch.Generator().manual_seed(n1 * 977 + n2))
    w = interpolation_matrix(n1, n2, m1, m2)
    assert w.dtype == np.float32 and w.shape == (m1 + m2, n1 + n2)
    ref = _upstream_length_regulate(h, n1, m1, m2)[0].T
    assert _maxabs(torch.from_numpy(w) @ h[0], ref) <= 1e-6


def test_interpolation_matrix_block_structure():
    w = interpolation_matrix(20, 60, 34, 103)
    assert not w[:34, 20:].any() and not w[34:, :20].any()   # prompt block separate
    assert not w[34:68, 40:].any() and not w[68:, 20:40].any()  # 20-token head -> 34 frames
    assert not w[-34:, :-20].any() and not w[:-34, -20:].any()  # 20-token tail -> 34 frames
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-6)


def test_mel_frames_for_tokens():
    assert mel_frames_for_tokens(20) == 34
    assert mel_frames_for_tokens(60) == 103
    assert mel_frames_for_tokens(0) == 0
    for n in range(0, 500, 7):
        assert mel_frames_for_tokens(n) == int(n / 50 * 22050 / 256)


@pytest.mark.parametrize("args", [(0, 5, 3, 8), (3, 5, 0, 8), (0, 5, 0, 0), (0, 41, 0, 60),
                                  (-1, 5, 0, 8)])
def test_interpolation_matrix_rejects_bad_lengths(args):
    from cosyvino.errors import InputError
    with pytest.raises(InputError):
        interpolation_matrix(*args)


# -------------------------------------------------------------------------------------- CFM


def test_cosine_time_grid_matches_upstream_v1():
    ref = 1 - torch.cos(torch.linspace(0, 1, 11, dtype=torch.float32) * 0.5 * torch.pi)
    grid = cosine_time_grid(10)
    assert grid.dtype == np.float32
    np.testing.assert_array_equal(grid, ref.numpy())
    for n in (1, 3, 20, 50):
        ref = 1 - torch.cos(torch.linspace(0, 1, n + 1, dtype=torch.float32) * 0.5 * torch.pi)
        assert _maxabs(cosine_time_grid(n), ref) <= 2.5e-7


# ----------------------------------------------------------------------------------- export


def _estimator_inputs(t_frames: int, seed: int = 0, pad: int = 0):
    gen = torch.Generator().manual_seed(seed)
    x, mu, cond = (torch.randn(2, 80, t_frames, generator=gen) for _ in range(3))
    mask = torch.ones(2, 1, t_frames)
    if pad:
        mask[1, :, t_frames - pad:] = 0
    t = torch.rand(2, generator=gen)
    spks = torch.randn(2, 80, generator=gen)
    return x, mask, mu, t, spks, cond


def test_estimator_jit_trace_dynamic_length():
    est = _estimator(TINY_A)
    with torch.inference_mode():
        traced = torch.jit.trace(est, _estimator_inputs(57), check_trace=False)
        for t_frames in (57, 40, 33, 1, 2):
            args = _estimator_inputs(t_frames, seed=t_frames)
            assert _maxabs(traced(*args), est(*args)) <= 1e-5


def test_estimator_torch_export_dynamic_odd_length():
    est = _estimator(TINY_A)
    # min 3: at T <= 2 the half-rate length is 1, which torch.export always specialises.
    T = torch.export.Dim("T", min=3, max=4096)
    shapes = {"x": {2: T}, "mask": {2: T}, "mu": {2: T}, "t": None, "spks": None,
              "cond": {2: T}}
    with torch.no_grad():
        ep = torch.export.export(est, _estimator_inputs(57), dynamic_shapes=shapes)
        mod = ep.module()
        for t_frames in (57, 64, 31, 3):
            args = _estimator_inputs(t_frames, seed=t_frames)
            assert _maxabs(mod(*args), est(*args)) <= 1e-5


def test_estimator_padding_mask():
    """Values in padded frames do not matter and the output is zero there. (Not equal to an
    unpadded run: upstream GroupNorm statistics include the padded frames.)"""
    est = _estimator(TINY_A)
    x, mask, mu, t, spks, cond = _estimator_inputs(41, pad=9)
    with torch.inference_mode():
        full = est(x, mask, mu, t, spks, cond)
        x2, mu2, cond2 = x.clone(), mu.clone(), cond.clone()
        for a in (x2, mu2, cond2):
            a[1, :, 32:] = 100.0
        other = est(x2, mask, mu2, t, spks, cond2)
    assert float(full[1, :, 32:].abs().max()) == 0.0
    assert _maxabs(full, other) <= 1e-5


def test_length_regulator_stage_export_dynamic():
    stage = LengthRegulatorStage(_regulator(TINY_A)).eval()
    n, m = torch.export.Dim("N", min=2, max=4096), torch.export.Dim("M", min=2, max=8192)
    h = torch.randn(1, 60, 80)
    interp = torch.from_numpy(interpolation_matrix(0, 60, 0, 103))
    with torch.no_grad():
        ep = torch.export.export(stage, (h, interp),
                                 dynamic_shapes={"h": {1: n}, "interp": {0: m, 1: n}})
        for n1, n2, m1 in ((0, 60, 0), (20, 60, 34), (5, 13, 9)):
            m2 = mel_frames_for_tokens(n2)
            hh = torch.randn(1, n1 + n2, 80)
            w = torch.from_numpy(interpolation_matrix(n1, n2, m1, m2))
            assert _maxabs(ep.module()(hh, w), stage(hh, w)) <= 1e-5


# --------------------------------------------------------------------------- 300M key layout


def test_300m_keys_and_shapes_match_official():
    """Full-size modules (on the meta device) have exactly the official flow.pt keys/shapes."""
    import json

    from cosyvino.families.cosyvoice1.presets import full_300m

    ref = json.loads((Path(__file__).parent / "fixtures"
                      / "cosyvoice-300m-state-dict-keys.json").read_text())["flow.pt"]
    cfg = full_300m().flow
    with torch.device("meta"):
        est = ConditionalDecoder(cfg.estimator)
        reg = InterpolateRegulator(cfg.length_regulator_channels,
                                   cfg.length_regulator_sampling_ratios)
    for prefix, module in (("decoder.estimator.", est), ("length_regulator.", reg)):
        want = {k[len(prefix):]: list(v) for k, v in ref.items() if k.startswith(prefix)}
        got = {k: list(v.shape) for k, v in module.state_dict().items()}
        assert got == want
        assert list(got) == list(want)  # registration order = file order
