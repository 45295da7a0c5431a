"""CosyVoice2 vocoder (HiFTGenerator at 24 kHz, SineGen2 source) against the official code.

Golden dirs: ``golden_dirs_of("cosyvoice2")`` (tests/fixtures/tiny-c plus the v2 entries of
COSYVINO_GOLDEN_DIRS); sizes come from each dir's ``cosyvoice2.yaml``. ``golden.pt['hift']``:
``mel`` [1,80,T], ``f0`` [1,T], ``source`` [1,1,480T] (the NSF source the official code drew),
``wav`` [1,480T] = decode(mel, source). Tolerances (fp32, max abs): f0 1e-4, waveform 1e-3
(shared/reference README).

What of the source is recoverable from the golden: the official draw is torch's global RNG in an
unknown state, so the noise cannot be replayed. tiny-c's f0 is below the 10 Hz voiced threshold
on every frame (random weights), so its source is ``tanh(b + (alpha/3) W n)`` with n ~ N(0, 1):
the golden pins the unvoiced noise scale, ``l_linear`` and tanh (a statistical check), and that
the sines do not leak into unvoiced frames. The voiced sines are checked against the sheet's
sample-rate formulation (§6.2, random initial phase included) and against its float64 closed form.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from cosyvino.errors import CheckpointError, ConfigError, InputError  # noqa: E402
from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml  # noqa: E402
from cosyvino.families.cosyvoice2.hift_config import (  # noqa: E402
    HiFTConfig,
    hift_config_from_data,
    read_hift_config,
)
from cosyvino.families.cosyvoice2.nsf import draw_sine_noise  # noqa: E402
from cosyvino.families.cosyvoice2.torch.hift import (  # noqa: E402
    HiFTGenerator,
    SineGen2SourceStage,
    hift_checkpoint_shapes,
    load_hift,
)

from conftest import FIXTURES, golden_dirs_of  # noqa: E402

GOLDEN_DIRS = golden_dirs_of("cosyvoice2")
_PG, _PV = ".parametrizations.weight.original0", ".parametrizations.weight.original1"


@pytest.fixture(params=GOLDEN_DIRS, ids=[d.name for d in GOLDEN_DIRS])
def golden_dir(request) -> Path:
    return request.param


@functools.lru_cache(maxsize=None)
def _golden(model_dir: Path) -> dict:
    golden = torch.load(model_dir / "golden.pt", map_location="cpu", weights_only=False)
    if "hift" not in golden:
        pytest.skip(f"{model_dir}/golden.pt has no 'hift' entry")
    return golden["hift"]


@functools.lru_cache(maxsize=None)
def _model(model_dir: Path) -> HiFTGenerator:
    return load_hift(model_dir)


@functools.lru_cache(maxsize=None)
def _raw(model_dir: Path) -> dict:
    return torch.load(model_dir / "hift.pt", map_location="cpu", weights_only=True)


# ---------------------------------------------------------------- config


def test_config_from_yaml(golden_dir):
    cfg = read_hift_config(golden_dir)
    hift = load_inert_yaml(golden_dir / "cosyvoice2.yaml")["hift"].args
    assert cfg.base_channels == hift["base_channels"]
    assert cfg.f0_cond_channels == hift["f0_predictor"].args["cond_channels"]
    assert cfg.upsample_rates == (8, 5, 3) and cfg.upsample_kernel_sizes == (16, 11, 7)
    assert cfg.source_resblock_kernel_sizes == (7, 7, 11)
    assert (cfg.istft_n_fft, cfg.istft_hop_len, cfg.sampling_rate) == (16, 4, 24000)
    assert cfg.hop_length == 480  # sheet §2: 8*5*3 * 4


def test_full_size_defaults_match_official_key_manifest():
    """The default config builds exactly the official full-size hift.pt keys and shapes
    (sheet §6.4; manifest copied from shared/reference)."""
    manifest = json.loads((FIXTURES / "cosyvoice2-0.5b-state-dict-keys.json").read_text())
    with torch.device("meta"):
        hift = HiFTGenerator(HiFTConfig())
    shapes = hift_checkpoint_shapes(hift)
    assert shapes == {k: tuple(v) for k, v in manifest["hift.pt"].items()}
    assert sum(math.prod(s) for s in shapes.values()) == manifest["hift.pt:params"]


def _yaml_data(golden_dir, **changes):
    data = load_inert_yaml(golden_dir / "cosyvoice2.yaml")
    node = data["hift"]
    for k, v in changes.items():
        node.args[k] = v
    return data


@pytest.mark.parametrize("changes, match", [
    ({"sampling_rate": 22050}, "SineGen"),
    ({"upsample_kernel_sizes": [16, 11]}, "upsample_kernel_sizes"),
    ({"source_resblock_kernel_sizes": [7, 11]}, "source_resblock_kernel_sizes"),
    ({"base_channels": "wide"}, "must be a number"),
    ({"upsample_rates": 8}, "list of integers"),
    ({"base_channels": 36}, "divisible"),
])
def test_config_errors(golden_dir, changes, match):
    with pytest.raises(ConfigError, match=match):
        hift_config_from_data(_yaml_data(golden_dir, **changes), "x.yaml")


def test_config_rejects_other_vocoders(golden_dir):
    data = _yaml_data(golden_dir)
    data["hift"].target = "cosyvoice.hifigan.generator.CausalHiFTGenerator"
    with pytest.raises(ConfigError, match="CausalHiFTGenerator"):
        hift_config_from_data(data, "x.yaml")
    data = _yaml_data(golden_dir)
    del data["hift"]
    with pytest.raises(ConfigError, match="hift"):
        hift_config_from_data(data, "x.yaml")
    data = _yaml_data(golden_dir)
    data["hift"].args["f0_predictor"].target = "x.CausalConvRNNF0Predictor"
    with pytest.raises(ConfigError, match="f0_predictor"):
        hift_config_from_data(data, "x.yaml")


def test_v1_config_refused():
    from cosyvino.families.cosyvoice1.config import HiFTConfig as V1
    v1 = V1(80, 32, 8, 22050, 0.1, 0.003, 10.0, (8, 8), (16, 16), 16, 4, (3, 7, 11),
            ((1, 3, 5),) * 3, (7, 11), ((1, 3, 5),) * 2)
    with pytest.raises(TypeError, match="cosyvoice2 HiFTConfig"):
        HiFTGenerator(v1)


# ---------------------------------------------------------------- strict loading


def test_strict_load_keys(golden_dir):
    raw = _raw(golden_dir)
    model = _model(golden_dir)
    assert set(raw) == set(hift_checkpoint_shapes(model))
    official_wn = {k[: -len(_PG)] + ".weight" for k in raw if k.endswith(_PG)}
    assert set(model.weight_normed_parameters()) == official_wn
    assert all(v.dtype == torch.float32 for v in model.state_dict().values())
    assert not any(p.requires_grad for p in model.parameters()) and not model.training


def test_fp16_file_is_upcast_before_folding(golden_dir):
    """The folded weight equals upstream's float32 g*v/||v|| of the upcast pair."""
    raw = _raw(golden_dir)
    got = _model(golden_dir).state_dict()["conv_pre.weight"]
    g, v = raw["conv_pre" + _PG].float(), raw["conv_pre" + _PV].float()
    want = torch._weight_norm(v, g, 0)
    assert (got - want).abs().max().item() <= 1e-6


def _write(tmp_path, sd, cfg_dir) -> Path:
    d = tmp_path / "m"
    d.mkdir()
    (d / "cosyvoice2.yaml").write_bytes((cfg_dir / "cosyvoice2.yaml").read_bytes())
    torch.save(sd, d / "hift.pt")
    return d


def test_generator_prefix_and_old_spelling_load(tmp_path, golden_dir):
    raw = _raw(golden_dir)
    old = {}
    for k, v in raw.items():
        if k.endswith(_PG):
            old[k[: -len(_PG)] + ".weight_g"] = v
        elif k.endswith(_PV):
            old[k[: -len(_PV)] + ".weight_v"] = v
        else:
            old[k] = v
    sd = {"generator." + k: v for k, v in old.items()}
    loaded = load_hift(_write(tmp_path, sd, golden_dir))
    want = _model(golden_dir).state_dict()
    for k, v in loaded.state_dict().items():
        assert torch.equal(v, want[k]), k


@pytest.mark.parametrize("edit, match", [
    ("drop", "missing keys"),
    ("extra", "unexpected keys"),
    ("shape", "shape mismatches"),
])
def test_strict_load_errors(tmp_path, golden_dir, edit, match):
    sd = dict(_raw(golden_dir))
    if edit == "drop":
        del sd["conv_post.bias"]
    elif edit == "extra":
        sd["conv_post.scale"] = torch.zeros(1)
    else:
        sd["conv_post.bias"] = torch.zeros(3)
    with pytest.raises(CheckpointError, match=match) as info:
        load_hift(_write(tmp_path, sd, golden_dir))
    assert "conv_post" in str(info.value)


def test_load_needs_config_for_a_file(golden_dir):
    with pytest.raises(InputError, match="needs cfg"):
        load_hift(golden_dir / "hift.pt")
    assert isinstance(load_hift(golden_dir / "hift.pt", read_hift_config(golden_dir)),
                      HiFTGenerator)


# ---------------------------------------------------------------- golden parity


def test_f0_parity(golden_dir):
    gold = _golden(golden_dir)
    with torch.no_grad():
        f0 = _model(golden_dir).f0_stage()(gold["mel"])
    assert f0.shape == gold["f0"].shape and f0.dtype == torch.float32
    err = (f0 - gold["f0"]).abs().max().item()
    assert err <= 1e-4, f"f0 max abs error {err:.3g}"


def test_wav_parity(golden_dir):
    gold = _golden(golden_dir)
    with torch.no_grad():
        wav = _model(golden_dir).decode_stage()(gold["mel"], gold["source"])
    assert wav.shape == gold["wav"].shape == (1, 480 * gold["mel"].shape[-1])
    err = (wav - gold["wav"]).abs().max().item()
    assert err <= 1e-3, f"wav max abs error {err:.3g}"


def test_forward_shapes_and_source_input(golden_dir):
    """forward(mel, noise) = decode(mel, source(f0(mel), noise)); the source is returned."""
    gold = _golden(golden_dir)
    model = _model(golden_dir)
    mel = gold["mel"][..., :20]
    noise = torch.from_numpy(draw_sine_noise(np.random.default_rng(0), 20))
    with torch.no_grad():
        wav, source = model(mel, noise)
        f0 = model.f0_stage()(mel)
        want_source = model.source_stage()(f0, noise)
        want_wav = model.decode_stage()(mel, want_source)
    assert wav.shape == (1, 9600) and source.shape == (1, 1, 9600)
    assert torch.equal(source, want_source) and torch.equal(wav, want_wav)


# ---------------------------------------------------------------- NSF source


def _l_linear(model):
    lin = model.m_source.l_linear
    return lin.weight.detach().double()[0], lin.bias.detach().double()[0]


def test_golden_source_is_unvoiced_noise_of_the_right_scale(golden_dir):
    """All golden frames are unvoiced, so atanh(source) - b = (alpha/3) W.n: its standard
    deviation pins the unvoiced noise amplitude alpha/3 = 0.0333 (57600 samples: the ratio's
    sampling error is ~0.3 %)."""
    gold = _golden(golden_dir)
    model = _model(golden_dir)
    cfg = model.cfg
    if bool((gold["f0"] > cfg.nsf_voiced_threshold).any()):
        pytest.skip("this golden has voiced frames; the statistical check assumes none")
    w, b = _l_linear(model)
    z = torch.atanh(gold["source"].double().reshape(-1)) - b
    scale = cfg.nsf_alpha / 3 * w.norm()
    ratio = (z.std() / scale).item()
    assert abs(ratio - 1) < 0.02, ratio
    assert abs(z.mean().item()) < 5 * scale.item() / math.sqrt(z.numel())


def test_source_unvoiced_is_noise_only(golden_dir):
    """On the golden f0 (unvoiced) our source is exactly tanh(l_linear(alpha/3 * noise))."""
    gold = _golden(golden_dir)
    model = _model(golden_dir)
    cfg = model.cfg
    if bool((gold["f0"] > cfg.nsf_voiced_threshold).any()):
        pytest.skip("this golden has voiced frames")
    noise = torch.from_numpy(draw_sine_noise(np.random.default_rng(1), gold["f0"].shape[-1]))
    with torch.no_grad():
        source = model.source_stage()(gold["f0"], noise)
        want = torch.tanh(model.m_source.l_linear((noise * (cfg.nsf_alpha / 3)).transpose(1, 2)))
    assert source.shape == gold["source"].shape
    assert (source - want.transpose(1, 2)).abs().max().item() <= 1e-6


def _f0_track(n_frames: int) -> torch.Tensor:
    """A voiced-then-unvoiced-then-voiced f0 contour (Hz) [1, T]."""
    t = torch.arange(n_frames, dtype=torch.float32)
    f0 = 180 + 60 * torch.sin(t / 5)
    f0[n_frames // 3: n_frames // 3 + 4] = 3.0  # below the 10 Hz threshold
    return f0.unsqueeze(0)


def _sheet_samplewise_sines(f0: torch.Tensor, cfg: HiFTConfig, seed: int) -> torch.Tensor:
    """Sheet §6.2 as written, in float32 at the SAMPLE rate: per-sample rad, a random initial
    phase added at sample 0 (harmonic 1 excluded), linear interpolation down by 1/hop, cumsum,
    linear interpolation of hop*phase up by hop; returns 0.1 sin(phase) [1, H, hop T]."""
    hop = cfg.hop_length
    f0_up = f0.repeat_interleave(hop, dim=-1).unsqueeze(-1)            # [1, L, 1]
    harm = torch.arange(1, cfg.nb_harmonics + 2, dtype=torch.float32)
    rad = (f0_up * harm / cfg.sampling_rate) % 1                       # [1, L, H]
    init = torch.rand(1, harm.numel(), generator=torch.Generator().manual_seed(seed))
    init[:, 0] = 0
    rad[:, 0, :] = rad[:, 0, :] + init
    radf = F.interpolate(rad.transpose(1, 2), scale_factor=1 / hop, mode="linear")
    phase = torch.cumsum(radf.transpose(1, 2), dim=1) * 2 * math.pi
    phase = F.interpolate(phase.transpose(1, 2) * hop, scale_factor=hop, mode="linear")
    return torch.sin(phase) * cfg.nsf_alpha


def _source_of_sines(model, sines, f0):
    cfg = model.cfg
    uv = (f0 > cfg.nsf_voiced_threshold).float().repeat_interleave(cfg.hop_length, -1)
    with torch.no_grad():
        x = model.m_source.l_linear((sines * uv.unsqueeze(1)).transpose(1, 2))
    return torch.tanh(x).transpose(1, 2)


def test_source_voiced_matches_sheet_samplewise_formula(golden_dir):
    """With zero noise our frame-rate source equals the sheet's sample-rate formulation, for two
    different random initial phases (which therefore do not matter)."""
    model = _model(golden_dir)
    f0 = _f0_track(30)
    with torch.no_grad():
        ours = model.source_stage()(f0, torch.zeros(1, 9, 30 * 480))
    for seed in (0, 1):
        want = _source_of_sines(model, _sheet_samplewise_sines(f0, model.cfg, seed), f0)
        assert (ours - want).abs().max().item() <= 1e-6


def test_source_voiced_close_to_float64_closed_form(golden_dir):
    """Against the exact (float64) closed form: phase_k = 2 pi sum_{i<=k} frac(n f0_i / sr),
    interpolated to samples at (j + 0.5)/hop - 0.5 (clamped). float32 rounding of hop*phase
    (~2e5 rad here) bounds the difference: ulp(2e5)/2 ~ 8e-3 rad -> 0.1 * 8e-3 per sine."""
    model = _model(golden_dir)
    cfg = model.cfg
    hop, n_frames = cfg.hop_length, 60
    f0 = _f0_track(n_frames)
    f = f0.double()[0].numpy()
    harm = np.arange(1, cfg.nb_harmonics + 2, dtype=np.float64)
    phase_k = 2 * np.pi * np.cumsum(np.mod(f[:, None] * harm / cfg.sampling_rate, 1), axis=0)
    pos = np.clip((np.arange(hop * n_frames) + 0.5) / hop - 0.5, 0, n_frames - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, n_frames - 1)
    lam = (pos - lo)[:, None]
    phase = hop * ((1 - lam) * phase_k[lo] + lam * phase_k[hi])           # [L, H]
    sines = torch.from_numpy((cfg.nsf_alpha * np.sin(phase)).T[None].astype(np.float32))
    want = _source_of_sines(model, sines, f0)
    with torch.no_grad():
        ours = model.source_stage()(f0, torch.zeros(1, 9, hop * n_frames))
    w, b = _l_linear(model)
    bound = cfg.nsf_alpha * 8e-3 * w.abs().sum().item() + 1e-6
    err = (ours - want).abs().max().item()
    assert err <= bound, (err, bound)
    # the sines are really there (the source is not just tanh(bias))
    assert (ours.double() - torch.tanh(b)).abs().max().item() > 0.1 * cfg.nsf_alpha * w.norm()


def test_source_noise_scales(golden_dir):
    """Voiced samples get nsf_sigma noise, unvoiced ones nsf_alpha/3 (before l_linear)."""
    model = _model(golden_dir)
    cfg = model.cfg
    f0 = _f0_track(30)
    noise = torch.from_numpy(draw_sine_noise(np.random.default_rng(2), 30))
    with torch.no_grad():
        quiet = model.source_stage()(f0, torch.zeros_like(noise))
        noisy = model.source_stage()(f0, noise)
    lin = torch.atanh(noisy.double()) - torch.atanh(quiet.double())
    w, _ = _l_linear(model)
    proj = torch.einsum("h,bhl->bl", w, noise.double()).unsqueeze(1)
    uv = (f0 > cfg.nsf_voiced_threshold).double().repeat_interleave(480, -1).unsqueeze(1)
    amp = uv * cfg.nsf_sigma + (1 - uv) * cfg.nsf_alpha / 3
    assert (lin - amp * proj).abs().max().item() <= 1e-4


def test_draw_sine_noise():
    a = draw_sine_noise(np.random.default_rng(5), 3)
    assert a.shape == (1, 9, 1440) and a.dtype == np.float32
    assert np.array_equal(a, draw_sine_noise(np.random.default_rng(5), 3))
    assert draw_sine_noise(np.random.default_rng(5), 0).shape == (1, 9, 0)
    with pytest.raises(ValueError):
        draw_sine_noise(np.random.default_rng(5), -1)


def test_source_stage_is_a_module_of_the_generator(golden_dir):
    stage = _model(golden_dir).source_stage()
    assert isinstance(stage, SineGen2SourceStage)
    assert stage.m_source is _model(golden_dir).m_source


# ---------------------------------------------------------------- export friendliness


def test_stages_export_for_two_lengths(golden_dir):
    """Each v2 stage exports with a dynamic frame count T (torch.export); the program traced
    at T=12 reproduces eager outputs at T=12 and T=29 (voiced f0, so the sines are exercised)."""
    from torch.export import Dim, export

    model = _model(golden_dir)
    hop = model.cfg.hop_length
    gen = torch.Generator().manual_seed(5)
    T = Dim("T", min=2, max=1 << 14)
    mels = [torch.randn(1, 80, t, generator=gen) for t in (12, 29)]
    srcs = [torch.rand(1, 1, hop * t, generator=gen) * 0.6 - 0.3 for t in (12, 29)]
    noises = [torch.from_numpy(draw_sine_noise(np.random.default_rng(t), t)) for t in (12, 29)]
    f0s = [torch.rand(1, t, generator=gen) * 300.0 for t in (12, 29)]
    with torch.no_grad():
        f0_stage = model.f0_stage().eval()
        dec_stage = model.decode_stage().eval()
        src_stage = model.source_stage().eval()
        f0_ep = export(f0_stage, (mels[0],), dynamic_shapes=({2: T},)).module()
        dec_ep = export(dec_stage, (mels[0], srcs[0]),
                        dynamic_shapes=({2: T}, {2: hop * T})).module()
        src_ep = export(src_stage, (f0s[0], noises[0]),
                        dynamic_shapes=({1: T}, {2: hop * T})).module()
        for mel, src, noise, f0 in zip(mels, srcs, noises, f0s):
            assert torch.allclose(f0_ep(mel), f0_stage(mel), atol=1e-6)
            out = dec_ep(mel, src)
            assert out.shape == (1, src.shape[-1])
            assert torch.allclose(out, dec_stage(mel, src), atol=1e-6)
            assert torch.allclose(src_ep(f0, noise), src_stage(f0, noise), atol=1e-6)
