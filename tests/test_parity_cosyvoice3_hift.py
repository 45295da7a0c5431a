"""CosyVoice3 vocoder (CausalHiFTGenerator, float64 f0 predictor, fixed NSF tables) against the
official code.

Golden dirs: ``golden_dirs_of("cosyvoice3")`` (tests/fixtures/tiny-e plus the v3 entries of
COSYVINO_GOLDEN_DIRS); sizes come from each dir's ``cosyvoice3.yaml``. ``golden.pt['hift']``:
``mel`` [1,80,T], ``f0`` [1,T], ``wav`` / ``wav_not_final`` from upstream's
``inference(mel, finalize)`` with their ``source`` / ``source_not_final``, and the slices of the
fixed tables this mel used (``rand_ini``, ``sine_waves_head``, ``uv_head``). Tolerances (fp32, max
abs): f0 1e-4, waveform 1e-3 (shared/reference README). The source is deterministic here (fixed
tables), so it is compared directly.

Full-size facts: ``tests/fixtures/cosyvoice3-fixed-tables.npz`` (rand_ini, the first 4800 rows of
``sine_waves`` / ``uv``, the whole tables' shapes and float64 sums, copied from the reference
fixed-buffer fingerprints) and ``tests/fixtures/cosyvoice3-0.5b-hift-keys.json`` (every key and
shape of the released ``hift.pt``; sheet §6.4).
"""

from __future__ import annotations

import copy
import functools
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import FIXTURES, TINY_C, golden_dirs_of

from cosyvino.errors import CheckpointError, ConfigError, InputError
from cosyvino.families.cosyvoice1.yaml_config import Tagged, load_inert_yaml
from cosyvino.families.cosyvoice3.fixed_tables import (
    TABLE_SAMPLES,
    TableRecipe,
    make_fixed_tables,
    read_table_recipe,
    sine_wave_rows,
    table_recipe_from_data,
)
from cosyvino.families.cosyvoice3.hift_config import (
    CausalHiFTConfig,
    hift_config_from_data,
    read_hift_config,
)
from cosyvino.families.cosyvoice3.torch.hift import (
    CausalHiFTGenerator,
    hift_checkpoint_shapes,
    load_hift,
)

GOLDEN_DIRS = golden_dirs_of("cosyvoice3")
FULL_TABLES = FIXTURES / "cosyvoice3-fixed-tables.npz"
FULL_KEYS = FIXTURES / "cosyvoice3-0.5b-hift-keys.json"
_PG, _PV = ".parametrizations.weight.original0", ".parametrizations.weight.original1"


@pytest.fixture(params=GOLDEN_DIRS, ids=[d.name for d in GOLDEN_DIRS])
def golden_dir(request) -> Path:
    return request.param


@functools.cache
def _golden(model_dir: Path) -> dict:
    golden = torch.load(model_dir / "golden.pt", map_location="cpu", weights_only=False)
    if "hift" not in golden:
        pytest.skip(f"{model_dir}/golden.pt has no 'hift' entry")
    return golden["hift"]


@functools.cache
def _model(model_dir: Path) -> CausalHiFTGenerator:
    return load_hift(model_dir)


@functools.lru_cache(maxsize=2)
def _tables(recipe: TableRecipe):
    return make_fixed_tables(recipe)


def _max_abs(a, b) -> float:
    return float((torch.as_tensor(a).double() - torch.as_tensor(b).double()).abs().max())


# ---------------------------------------------------------------- config


def test_config_from_yaml(golden_dir):
    cfg = read_hift_config(golden_dir)
    raw = load_inert_yaml(golden_dir / "cosyvoice3.yaml")["hift"].args
    assert cfg.base_channels == raw["base_channels"]
    assert cfg.upsample_rates == tuple(raw["upsample_rates"])
    assert cfg.conv_pre_look_right == raw.get("conv_pre_look_right", 4)
    assert cfg.f0_cond_channels == raw["f0_predictor"].args["cond_channels"]
    assert cfg.hop_length == 480 and cfg.frames_held_back == 8
    assert cfg.output_samples(60, True) == 28_800 and cfg.output_samples(30, False) == 10_560


def test_config_rejects_v2_vocoder_and_other_harmonics(tmp_path):
    v2 = load_inert_yaml(TINY_C / "cosyvoice2.yaml")
    with pytest.raises(ConfigError, match="CausalHiFTGenerator"):
        hift_config_from_data(v2, "cosyvoice2.yaml")
    with pytest.raises(ConfigError, match="nb_harmonics must be 8"):
        CausalHiFTConfig(nb_harmonics=7)
    with pytest.raises(ConfigError, match="conv_pre_look_right"):
        CausalHiFTConfig(conv_pre_look_right=-1)
    data = load_inert_yaml(FIXTURES / "tiny-e" / "cosyvoice3.yaml")
    data["hift"].args["f0_predictor"] = Tagged("new", "x.ConvRNNF0Predictor", {})
    with pytest.raises(ConfigError, match="CausalConvRNNF0Predictor"):
        hift_config_from_data(data, "y.yaml")


# ---------------------------------------------------------------- checkpoint layout


def test_full_size_layout_matches_the_released_hift_keys():
    manifest = json.loads(FULL_KEYS.read_text())
    hift = CausalHiFTGenerator(CausalHiFTConfig())
    shapes = hift_checkpoint_shapes(hift)
    want = {k: tuple(v) for k, v in manifest["hift.pt"].items()}
    assert shapes == want
    assert sum(math.prod(s) for s in shapes.values()) == manifest["hift.pt:params"]


def test_loader_upcasts_and_folds_f0_predictor_in_float64(golden_dir):
    hift = _model(golden_dir)
    raw = torch.load(golden_dir / "hift.pt", weights_only=True)
    for name in ("conv_pre", "ups.0", "f0_predictor.condnet.0"):
        f64 = name.startswith("f0_")
        dtype = torch.float64 if f64 else torch.float32
        want = torch._weight_norm(raw[name + _PV].to(dtype), raw[name + _PG].to(dtype), 0)
        got = hift.get_submodule(name).weight
        assert got.dtype == dtype
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12 if f64 else 1e-6)
    assert hift.conv_pre.weight.dtype == torch.float32


@pytest.fixture
def hift_copy(tmp_path) -> Path:
    shutil.copy(FIXTURES / "tiny-e" / "cosyvoice3.yaml", tmp_path / "cosyvoice3.yaml")
    shutil.copy(FIXTURES / "tiny-e" / "hift.pt", tmp_path / "hift.pt")
    return tmp_path


def _edit(path: Path, fn) -> None:
    sd = torch.load(path, weights_only=True)
    fn(sd)
    torch.save(sd, path)


def test_loader_is_strict(hift_copy):
    _edit(hift_copy / "hift.pt", lambda sd: sd.pop("conv_post.bias"))
    with pytest.raises(CheckpointError, match="conv_post.bias"):
        load_hift(hift_copy)


def test_loader_names_a_v2_shaped_conv_pre(hift_copy):
    # v2's conv_pre has kernel 7; v3's has conv_pre_look_right + 1 = 5 (sheet §6.4)
    _edit(hift_copy / "hift.pt",
          lambda sd: sd.__setitem__("conv_pre" + _PV, torch.zeros(32, 80, 7)))
    with pytest.raises(CheckpointError, match=r"conv_pre.parametrizations.weight.original1"):
        load_hift(hift_copy)


def test_loader_accepts_generator_prefix(hift_copy, golden_dir):
    _edit(hift_copy / "hift.pt",
          lambda sd: [sd.__setitem__("generator." + k, sd.pop(k)) for k in list(sd)])
    got = load_hift(hift_copy).state_dict()
    for k, v in _model(FIXTURES / "tiny-e").state_dict().items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=0)


def test_load_file_needs_config(hift_copy):
    with pytest.raises(InputError, match="needs cfg"):
        load_hift(hift_copy / "hift.pt")


# ---------------------------------------------------------------- fixed tables


def test_tables_equal_the_golden_slices(golden_dir):
    g = _golden(golden_dir)
    tables = _tables(read_table_recipe(golden_dir))
    n = g["sine_waves_head"].shape[1]
    np.testing.assert_array_equal(tables.rand_ini, g["rand_ini"].numpy())
    np.testing.assert_array_equal(tables.sine_waves[:, :n], g["sine_waves_head"].numpy())
    np.testing.assert_array_equal(tables.uv[:, :n], g["uv_head"].numpy())


def test_full_size_tables_equal_the_fingerprints():
    """The whole 300-s tables (~3 s to draw on one core): shapes, float64 sums and heads of the
    official full-size construction; the caller's global RNG is left alone."""
    want = np.load(FULL_TABLES)
    torch.manual_seed(123)
    expected_draw = torch.rand(4)
    torch.manual_seed(123)
    tables = make_fixed_tables(TableRecipe())
    assert torch.equal(torch.rand(4), expected_draw)
    assert tables.sine_waves.shape == tuple(want["sine_waves_shape"]) == (1, TABLE_SAMPLES, 9)
    assert tables.uv.shape == tuple(want["uv_shape"]) == (1, TABLE_SAMPLES, 1)
    assert tables.sine_waves.dtype == np.float32
    np.testing.assert_array_equal(tables.rand_ini, want["rand_ini"])
    n = want["sine_waves_head"].shape[1]
    np.testing.assert_array_equal(tables.sine_waves[:, :n], want["sine_waves_head"])
    np.testing.assert_array_equal(tables.uv[:, :n], want["uv_head"])
    assert tables.sine_waves.sum(dtype=np.float64) == pytest.approx(
        float(want["sine_waves_sum"]), rel=1e-12)
    assert tables.uv.sum(dtype=np.float64) == pytest.approx(float(want["uv_sum"]), rel=1e-12)


def test_recipe_refuses_a_changed_construction_order():
    data = load_inert_yaml(FIXTURES / "tiny-e" / "cosyvoice3.yaml")
    assert table_recipe_from_data(data, "x.yaml") == read_table_recipe(FIXTURES / "tiny-e")
    moved = dict(data)
    extra = {k: v for k, v in moved.items() if k != "hift"}
    keys = list(extra)
    at = keys.index("flow") + 1
    reordered = {k: extra[k] for k in keys[:at]}
    reordered["speaker_net"] = Tagged("new", "torch.nn.Linear", {"in_features": 4})
    reordered.update({k: extra[k] for k in keys[at:]})
    reordered["hift"] = data["hift"]
    with pytest.raises(ConfigError, match="speaker_net"):
        table_recipe_from_data(reordered, "x.yaml")
    flow = copy.deepcopy(data["flow"])
    flow.args["extra_layer"] = Tagged("new", "torch.nn.Linear", {})
    with pytest.raises(ConfigError, match="extra_layer"):
        table_recipe_from_data({**data, "flow": flow}, "x.yaml")


def test_sine_wave_rows_bounds():
    table = np.zeros((1, 100, 9), np.float32)
    assert sine_wave_rows(table, 100).shape == (1, 100, 9)
    for bad in (0, 101):
        with pytest.raises(InputError, match="samples per call"):
            sine_wave_rows(table, bad)


# ---------------------------------------------------------------- inference parity


def test_f0_parity(golden_dir):
    g = _golden(golden_dir)
    f0 = _model(golden_dir).f0_stage(True)(g["mel"])
    assert f0.dtype == torch.float32 and f0.shape == g["f0"].shape
    assert _max_abs(f0, g["f0"]) < 1e-4
    # not final: the last 3 frames are look-ahead context, the rest as when finalizing
    f0_nf = _model(golden_dir).f0_stage(False)(g["mel"])
    assert f0_nf.shape[-1] == g["mel"].shape[-1] - 3
    torch.testing.assert_close(f0_nf, f0[:, :-3], rtol=0, atol=1e-6)


@pytest.mark.parametrize("finalize", [True, False], ids=["final", "not_final"])
def test_wav_parity(golden_dir, finalize):
    g = _golden(golden_dir)
    tables = _tables(read_table_recipe(golden_dir))
    wav, source = _model(golden_dir).inference(g["mel"], tables.sine_waves, finalize)
    suffix = "" if finalize else "_not_final"
    want_wav, want_src = g["wav" + suffix], g["source" + suffix]
    assert wav.shape == want_wav.shape and source.shape == want_src.shape
    assert _max_abs(source, want_src) < 1e-5
    assert _max_abs(wav, want_wav) < 1e-3
    t = g["mel"].shape[-1]
    assert wav.shape[-1] == 480 * (t if finalize else t - 8)


def test_not_final_is_a_prefix_of_final(golden_dir):
    """Sheet §6.3: a non-final run equals the first samples of a final run over more mel (upstream
    bit for bit; here up to float32 convolution rounding, which differs with the input length in
    the CPU kernels and which tiny-e's random weights amplify like any other input change)."""
    g = _golden(golden_dir)
    tables = _tables(read_table_recipe(golden_dir))
    hift = _model(golden_dir)
    mel = g["mel"]
    final, _ = hift.inference(mel, tables.sine_waves, True)
    part, _ = hift.inference(mel[:, :, :40], tables.sine_waves, False)
    assert part.shape[-1] == 480 * 32
    torch.testing.assert_close(part, final[:, :part.shape[-1]], rtol=0, atol=1e-3)


def test_voiced_sines_follow_the_closed_form():
    """f0 above the voiced threshold (tiny-e's random weights never get there): the source before
    l_linear is ``0.1 sin(φ_k) + 0.003 u`` with φ_k = 2π·480·Σ_{j<=k} frac(n f0_j / 24000)
    held for the 480 samples of frame k (sheet §6.2), u the table rows."""
    hift = _model(FIXTURES / "tiny-e")
    stage = hift.source_stage()
    f0 = torch.tensor([[120.0, 180.5, 0.0, 240.25, 95.0]])
    noise = torch.rand(1, 480 * 5, 9, generator=torch.Generator().manual_seed(1))
    lin = hift.m_source.l_linear
    with torch.no_grad():
        got = torch.atanh(stage(f0, noise)[0, 0].double())
    n = np.arange(1, 10)
    frac = np.mod(f0.double().numpy()[0, :, None] * n / 24000.0, 1.0)
    phi = 2 * np.pi * 480 * np.cumsum(frac, axis=0)                       # [T, 9]
    uv = (f0.numpy()[0] > 10).astype(np.float64)[:, None]
    amp = uv * 0.003 + (1 - uv) * 0.1 / 3
    exc = np.repeat(0.1 * np.sin(phi) * uv, 480, axis=0) + np.repeat(amp, 480, axis=0) * \
        noise[0].double().numpy()
    want = exc @ lin.weight.double().numpy()[0] + float(lin.bias)
    # measured ~1e-6 (float32 phases); a phase one frame late or interpolated is off by ~0.1
    assert np.max(np.abs(got.numpy() - want)) < 1e-5


def test_inference_input_errors(golden_dir):
    g = _golden(golden_dir)
    hift = _model(golden_dir)
    with pytest.raises(InputError, match="T >= 9"):
        hift.inference(g["mel"][:, :, :8], g["sine_waves_head"], False)
    with pytest.raises(InputError, match="fixed noise table"):
        hift.inference(g["mel"], g["sine_waves_head"][:, :100], True)


def test_config_tables_and_stream_modules_do_not_import_torch():
    """Serving reads the config, slices the tables and runs the stream logic without torch; only
    make_fixed_tables (conversion) imports it, lazily."""
    import subprocess
    import sys

    code = ("import sys\n"
            "import numpy as np\n"
            "from cosyvino.families.cosyvoice3 import hift_config, fixed_tables, official_stream\n"
            f"hift_config.read_hift_config({str(FIXTURES / 'tiny-e')!r})\n"
            f"fixed_tables.read_table_recipe({str(FIXTURES / 'tiny-e')!r})\n"
            "fixed_tables.sine_wave_rows(np.zeros((1, 10, 9), np.float32), 5)\n"
            "official_stream.emitted_samples(official_stream.hop_schedule(100))\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
