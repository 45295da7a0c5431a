"""HiFT vocoder parity with the official implementation, weight-norm folding, NSF source sanity.

Golden dirs: ``cosyvino/testing/fixtures/tiny-a`` plus every dir in the env var
``COSYVINO_GOLDEN_DIRS`` (colon-separated; each holds ``cosyvoice.yaml``, ``hift.pt`` and
``golden.pt`` with a ``hift`` entry: ``mel`` [1,80,T],
``f0`` [1,T], ``source`` [1,1,256T], ``wav`` [1,256T]).
Tolerances (fp32, max abs): f0 1e-4, waveform 1e-3 (HiFT amplifies rounding differences;
shared/reference README).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cosyvino.families.cosyvoice1.torch.hift import (  # noqa: E402
    DecodeStage,
    F0Stage,
    HiFTGenerator,
    SourceStage,
    stft_bases,
)
from cosyvino.families.cosyvoice1.weight_norm import (  # noqa: E402
    fold_weight_norm,
    strip_generator_prefix,
    unfold_weight_norm,
)
from cosyvino.families.cosyvoice1.nsf import draw_source_noise  # noqa: E402

from conftest import TINY_A, golden_dirs  # noqa: E402
from cosyvino.families.cosyvoice1.yaml_config import read_model_config  # noqa: E402
_PG, _PV = ".parametrizations.weight.original0", ".parametrizations.weight.original1"


GOLDEN_DIRS = golden_dirs()


def _hift_config(model_dir: Path):
    return read_model_config(model_dir / "cosyvoice.yaml").hift


@functools.lru_cache(maxsize=None)
def _raw_state_dict(model_dir: Path) -> dict:
    return torch.load(model_dir / "hift.pt", map_location="cpu", weights_only=True)


@functools.lru_cache(maxsize=None)
def _golden(model_dir: Path) -> dict:
    golden = torch.load(model_dir / "golden.pt", map_location="cpu", weights_only=False)
    if "hift" not in golden:
        pytest.skip(f"{model_dir}/golden.pt has no 'hift' entry")
    return golden["hift"]


@functools.lru_cache(maxsize=None)
def _model(model_dir: Path) -> HiFTGenerator:
    model = HiFTGenerator(_hift_config(model_dir)).eval()
    sd = fold_weight_norm(strip_generator_prefix(_raw_state_dict(model_dir)))
    model.load_state_dict(sd, strict=True)
    return model


def _ids(dirs):
    return [d.name for d in dirs]


@pytest.fixture(params=GOLDEN_DIRS, ids=_ids(GOLDEN_DIRS))
def golden_dir(request) -> Path:
    return request.param


# ---------------------------------------------------------------- golden parity


def test_strict_load_and_weight_normed_names(golden_dir):
    raw = _raw_state_dict(golden_dir)
    model = _model(golden_dir)  # strict load inside
    official = {k[: -len(_PG)] + ".weight" for k in raw if k.endswith(_PG)}
    official |= {k[: -len(".weight_g")] + ".weight" for k in raw if k.endswith(".weight_g")}
    assert set(model.weight_normed_parameters()) == official
    assert len(model.weight_normed_parameters()) == len(official)
    # our state_dict has exactly the folded official keys and shapes
    folded = fold_weight_norm(raw)
    ours = model.state_dict()
    assert set(ours) == set(folded)  # (order differs: upstream registers weight after bias)
    assert {k: tuple(v.shape) for k, v in ours.items()} == \
        {k: tuple(v.shape) for k, v in folded.items()}


def test_f0_parity(golden_dir):
    gold = _golden(golden_dir)
    with torch.no_grad():
        f0 = F0Stage(_model(golden_dir))(gold["mel"])
    assert f0.shape == gold["f0"].shape and f0.dtype == torch.float32
    err = (f0 - gold["f0"]).abs().max().item()
    assert err <= 1e-4, f"f0 max abs error {err:.3g}"


def test_wav_parity(golden_dir):
    gold = _golden(golden_dir)
    with torch.no_grad():
        wav = DecodeStage(_model(golden_dir))(gold["mel"], gold["source"])
    assert wav.shape == gold["wav"].shape and wav.dtype == torch.float32
    err = (wav - gold["wav"]).abs().max().item()
    assert err <= 1e-3, f"wav max abs error {err:.3g}"


# ---------------------------------------------------------------- weight norm


def _to_old_spelling(sd: dict) -> dict:
    out = {}
    for k, v in sd.items():
        if k.endswith(_PG):
            out[k[: -len(_PG)] + ".weight_g"] = v
        elif k.endswith(_PV):
            out[k[: -len(_PV)] + ".weight_v"] = v
        else:
            out[k] = v
    return out


def _max_diff(a: dict, b: dict) -> float:
    assert list(a) == list(b)
    return max(float((torch.as_tensor(a[k]) - torch.as_tensor(b[k])).abs().max()) for k in a)


def test_fold_matches_torch_parametrization():
    raw = _raw_state_dict(TINY_A)
    folded = fold_weight_norm(raw)
    wn = torch.nn.utils.parametrizations.weight_norm
    for name, make in (("conv_pre", lambda v: torch.nn.Conv1d(v.shape[1], v.shape[0], v.shape[2])),
                       ("ups.0", lambda v: torch.nn.ConvTranspose1d(v.shape[0], v.shape[1],
                                                                    v.shape[2]))):
        v = raw[name + _PV]
        mod = wn(make(v))
        mod.parametrizations.weight.original0.data.copy_(raw[name + _PG])
        mod.parametrizations.weight.original1.data.copy_(v)
        assert (mod.weight.detach() - folded[name + ".weight"]).abs().max().item() <= 1e-6


@pytest.mark.parametrize("spelling", ["parametrizations", "weight_g"])
def test_weight_norm_round_trip(spelling):
    raw = _raw_state_dict(TINY_A)
    folded = fold_weight_norm(raw)
    names = HiFTGenerator(_hift_config(TINY_A)).weight_normed_parameters()
    unfolded = unfold_weight_norm(folded, names, spelling=spelling)
    expect_layout = raw if spelling == "parametrizations" else _to_old_spelling(raw)
    assert list(unfolded) == list(expect_layout)
    assert all(tuple(unfolded[k].shape) == tuple(expect_layout[k].shape) for k in unfolded)
    # (g, v) is only defined up to a positive rescaling of v, so compare folded weights and the
    # canonical form (g = ||v||) rather than the official g/v, whose g need not equal ||v||.
    assert _max_diff(fold_weight_norm(unfolded), folded) <= 1e-6
    assert _max_diff(unfold_weight_norm(fold_weight_norm(unfolded), names, spelling), unfolded) <= 1e-6


def test_fold_spellings_agree_and_numpy_works():
    raw = _raw_state_dict(TINY_A)
    a = fold_weight_norm(raw)
    b = fold_weight_norm(_to_old_spelling(raw))
    assert _max_diff(a, b) == 0.0
    c = fold_weight_norm({k: v.numpy() for k, v in raw.items()})
    assert all(isinstance(v, np.ndarray) for v in c.values())
    assert _max_diff(a, c) <= 1e-6
    names = HiFTGenerator(_hift_config(TINY_A)).weight_normed_parameters()
    d = unfold_weight_norm(c, names, spelling="weight_g")
    assert all(isinstance(v, np.ndarray) for v in d.values())
    assert _max_diff(fold_weight_norm(d), c) <= 1e-6


def test_fold_errors_and_generator_prefix():
    raw = _raw_state_dict(TINY_A)
    broken = dict(raw)
    del broken["conv_pre" + _PV]
    with pytest.raises(KeyError):
        fold_weight_norm(broken)
    with pytest.raises(ValueError):
        unfold_weight_norm(fold_weight_norm(raw), ["conv_pre.weight"], spelling="bogus")
    wrapped = {"generator." + k: v for k, v in raw.items()}
    assert list(strip_generator_prefix(wrapped)) == list(raw)


# ---------------------------------------------------------------- STFT / iSTFT


def test_stft_istft_match_torch():
    ds = DecodeStage(_model(TINY_A))
    x = torch.randn(1, 1, 4096, generator=torch.Generator().manual_seed(0))
    window = torch.hann_window(16)
    ref = torch.stft(x[:, 0], 16, 4, 16, window=window, return_complex=True)
    ours = ds._stft(x)
    assert (ours - torch.cat([ref.real, ref.imag], 1)).abs().max().item() <= 1e-5
    back = torch.istft(ref, 16, 4, 16, window=window)
    assert (ds._istft(ours) - back).abs().max().item() <= 1e-5
    assert stft_bases(16)[0].shape == (18, 1, 16)


# ---------------------------------------------------------------- NSF source


def _source_reference(model: HiFTGenerator, f0, phase, noise) -> np.ndarray:
    """Independent float64 numpy restatement of SineGen + SourceModuleHnNSF (fact sheet 6.3)."""
    cfg = model.cfg
    f0 = np.asarray(f0, np.float64)[0]
    f0_up = np.repeat(f0, cfg.hop_length)                                   # [L]
    n = np.arange(1, cfg.nb_harmonics + 2, dtype=np.float64)[:, None]      # [H, 1]
    theta = 2 * np.pi * (np.cumsum(f0_up[None] * n / cfg.sampling_rate, axis=1) % 1.0)
    sines = cfg.nsf_alpha * np.sin(theta + np.asarray(phase, np.float64)[0][:, None])
    uv = (f0_up > cfg.nsf_voiced_threshold).astype(np.float64)[None]
    amp = uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3
    sines = sines * uv + amp * np.asarray(noise, np.float64)[0]
    w = model.m_source.l_linear.weight.detach().double().numpy()[0]
    b = float(model.m_source.l_linear.bias.detach()[0])
    return np.tanh(w @ sines + b)[None, None]


def test_draw_source_noise():
    phase, noise = draw_source_noise(np.random.default_rng(3), 5)
    assert phase.shape == (1, 9) and phase.dtype == np.float32
    assert noise.shape == (1, 9, 1280) and noise.dtype == np.float32
    assert np.all(phase[:, 0] == 0) and np.all(np.abs(phase) <= np.pi)
    p2, n2 = draw_source_noise(np.random.default_rng(3), 5)
    assert np.array_equal(phase, p2) and np.array_equal(noise, n2)
    assert draw_source_noise(np.random.default_rng(0), 0)[1].shape == (1, 9, 0)


def test_source_stage_sanity():
    model = _model(TINY_A)
    stage = SourceStage(model)
    n_frames = 24
    rng = np.random.default_rng(11)
    phase, noise = draw_source_noise(rng, n_frames)
    f0 = np.linspace(80.0, 320.0, n_frames, dtype=np.float32)[None]
    f0[:, :4] = 0.0  # an unvoiced head
    args = [torch.from_numpy(a) for a in (f0, phase, noise)]
    with torch.no_grad():
        s = stage(*args)
        s2 = stage(*args)
    assert s.shape == (1, 1, 256 * n_frames) and s.dtype == torch.float32
    assert s.abs().max().item() <= 1.0
    assert torch.equal(s, s2)
    ref = _source_reference(model, f0, phase, noise)
    assert np.abs(s.numpy() - ref).max() <= 1e-3

    # unvoiced: sines gated off, only noise of std nsf_alpha/3 remains
    w = model.m_source.l_linear.weight.detach()[0]
    b = model.m_source.l_linear.bias.detach()[0]
    zeros = torch.zeros(1, n_frames)
    with torch.no_grad():
        silent = stage(zeros, args[1], torch.zeros_like(args[2]))
        unvoiced = stage(zeros, args[1], args[2])
    assert torch.allclose(silent, torch.tanh(b).expand_as(silent), atol=1e-7)
    bound = w.abs().sum().item() * (0.1 / 3) * args[2].abs().max().item()
    assert (unvoiced - torch.tanh(b)).abs().max().item() <= bound + 1e-6
    assert (unvoiced - torch.tanh(b)).std().item() < (s[..., 1024:] - torch.tanh(b)).std().item()


# ---------------------------------------------------------------- export friendliness


def test_stages_export_for_two_lengths():
    """Each stage exports with a dynamic frame count T (torch.export) and the exported program,
    traced at T=12, reproduces eager outputs at T=12 and T=29."""
    from torch.export import Dim, export

    model = _model(TINY_A)
    gen = torch.Generator().manual_seed(5)
    T = Dim("T", min=2, max=1 << 16)
    mels = [torch.randn(1, 80, t, generator=gen) for t in (12, 29)]
    srcs = [torch.rand(1, 1, 256 * t, generator=gen) * 0.6 - 0.3 for t in (12, 29)]
    draws = [draw_source_noise(np.random.default_rng(t), t) for t in (12, 29)]
    f0s = [torch.rand(1, t, generator=gen) * 300.0 for t in (12, 29)]
    with torch.no_grad():
        f0_stage, dec_stage, src_stage = (F0Stage(model).eval(), DecodeStage(model).eval(),
                                          SourceStage(model).eval())
        f0_ep = export(f0_stage, (mels[0],), dynamic_shapes=({2: T},)).module()
        dec_ep = export(dec_stage, (mels[0], srcs[0]),
                        dynamic_shapes=({2: T}, {2: 256 * T})).module()
        phase0, noise0 = (torch.from_numpy(a) for a in draws[0])
        src_ep = export(src_stage, (f0s[0], phase0, noise0),
                        dynamic_shapes=({1: T}, None, {2: 256 * T})).module()
        for mel, src, (phase, noise), f0 in zip(mels, srcs, draws, f0s):
            assert torch.allclose(f0_ep(mel), f0_stage(mel), atol=1e-6)
            out = dec_ep(mel, src)
            assert out.shape == (1, src.shape[-1])
            assert torch.allclose(out, dec_stage(mel, src), atol=1e-6)
            phase, noise = torch.from_numpy(phase), torch.from_numpy(noise)
            assert torch.allclose(src_ep(f0, phase, noise), src_stage(f0, phase, noise), atol=1e-6)


def test_generator_forward_composes_stages():
    model = _model(TINY_A)
    gold = _golden(TINY_A)
    n_frames = gold["mel"].shape[-1]
    phase, noise = (torch.from_numpy(a)
                    for a in draw_source_noise(np.random.default_rng(0), n_frames))
    with torch.no_grad():
        wav, source = model(gold["mel"], phase, noise)
        f0 = F0Stage(model)(gold["mel"])
        assert torch.equal(source, SourceStage(model)(f0, phase, noise))
        assert torch.equal(wav, DecodeStage(model)(gold["mel"], source))
    assert wav.shape == (1, 256 * n_frames) and source.shape == (1, 1, 256 * n_frames)
    assert math.isfinite(wav.abs().max().item())
