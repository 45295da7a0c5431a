"""The bf16 vocoder's Snake ``sin^2`` rewrite (plugins/cosyvino_openvino/snake.py)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

pytest.importorskip("openvino")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "plugins"))

import openvino as ov  # noqa: E402
from openvino import opset13  # noqa: E402

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.quantize.metrics import snr_db  # noqa: E402
from conftest import TINY_A, cpu_has_native_bf16  # noqa: E402
from cosyvino_openvino.snake import polynomial_sin_squares, sin_squared  # noqa: E402

F32 = {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}


def _run(model: ov.Model, feed: dict) -> np.ndarray:
    compiled = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    return compiled(feed)[0]


def test_sin_squared_matches_numpy_over_a_wide_range():
    y = np.linspace(-60.0, 60.0, 400_001, dtype=np.float32)
    y = np.concatenate([y, np.float32([0.0, np.pi / 2, -np.pi / 2, 1e-7, 2000.5])])
    p = opset13.parameter([y.size], np.float32, name="y")
    got = _run(ov.Model([sin_squared(p.output(0))], [p]), {"y": y})
    want = np.sin(y.astype(np.float64)) ** 2
    assert got.shape == y.shape
    assert np.abs(got - want).max() < 4e-6


def test_rewrite_replaces_only_squared_sines_and_keeps_values():
    x = opset13.parameter([2, 3, 50], np.float32, name="x")
    snake = opset13.power(opset13.sin(x), opset13.constant(np.float32(2.0)))  # rewritten
    cube = opset13.power(opset13.sin(x), opset13.constant(np.float32(3.0)))  # not a square
    # as in IRs saved with fp16 constants: the exponent comes through a Convert
    half = opset13.convert(opset13.constant(np.float16(2.0)), "f32")
    snake16 = opset13.power(opset13.sin(opset13.multiply(x, opset13.constant(np.float32(0.5)))),
                            half)
    plain = opset13.cos(opset13.sin(x))  # sin used otherwise: left alone
    model = ov.Model([snake, cube, plain, snake16], [x])
    feed = {"x": np.random.default_rng(0).normal(0, 5, (2, 3, 50)).astype(np.float32)}
    before = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(feed)
    assert polynomial_sin_squares(model) == 2
    kinds = [op.get_type_name() for op in model.get_ops()]
    assert kinds.count("Sin") == 2 and "Round" in kinds
    after = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})(feed)
    for i in (0, 3):
        assert np.abs(after[i] - before[i]).max() < 4e-6
    assert np.array_equal(after[1], before[1]) and np.array_equal(after[2], before[2])


def _snake_runs(converted_dir, monkeypatch):
    """f32 audio, bf16-vocoder audio with the polynomial and with the plain sine, the rewrite
    counts, and the precision the runtime reports for the bf16-requested vocoder stage."""
    import cosyvino_openvino.stages as stages_mod

    def synth(**options):
        tts = Synthesizer(converted_dir(TINY_A), backend="openvino", **options, **F32)
        audio = tts.synthesize("你好。", tts.speakers[0], seed=0, num_speech_tokens=10)
        return tts, audio.samples

    plain, f32 = synth()
    bf16, poly = synth(stage_precision={"hift_decode": "bf16"})
    with monkeypatch.context() as m:
        m.setattr(stages_mod, "polynomial_sin_squares", lambda model: 0)
        _, ref_sin = synth(stage_precision={"hift_decode": "bf16"})
    ran_in = bf16.stages.compile_info["hift_decode"]["INFERENCE_PRECISION_HINT"]
    return plain.stages.load_rewrites, bf16.stages.load_rewrites, f32, poly, ref_sin, ran_in


def _check_snake_runs(runs, *, native_bf16: bool) -> None:
    plain_rewrites, rewrites, f32, poly, ref_sin, ran_in = runs
    assert plain_rewrites["hift_decode.xml"]["sin_squares"] == 0
    assert rewrites["hift_decode.xml"]["sin_squares"] > 0  # every resblock Snake
    assert rewrites["estimator.xml"]["sin_squares"] == 0
    assert f32.shape == poly.shape == ref_sin.shape and np.isfinite(poly).all()
    # the runtime runs a bf16 hint in bf16 only where bf16 is native (AVX512_BF16 / AMX)
    assert ran_in == ("bf16" if native_bf16 else "f32")
    if native_bf16:
        # bf16 costs the tiny random model ~11 dB against f32 either way; the polynomial must
        # not add to it (a wrong range reduction or coefficient costs far more than 1.5 dB)
        assert abs(snr_db(f32, poly) - snr_db(f32, ref_sin)) < 1.5
    else:
        # f32 fallback (e.g. an AVX2-only CPU): the plain sine is the f32 graph itself, and the
        # polynomial costs only its own error (< 4e-6 per sin^2, ~99 dB measured on the tiny
        # model); a wrong coefficient would cost tens of dB
        assert snr_db(f32, ref_sin) > 150
        assert snr_db(f32, poly) > 70


def test_backend_rewrites_the_vocoder_when_bf16_is_asked(converted_dir, monkeypatch):
    """On this CPU, whichever ISA it has (issue 19 item 1: an AVX2-only EPYC has no bf16)."""
    _check_snake_runs(_snake_runs(converted_dir, monkeypatch), native_bf16=cpu_has_native_bf16())


def test_snake_check_holds_where_bf16_falls_back_to_f32(converted_dir, monkeypatch):
    """An AVX2-only CPU simulated here: the runtime compiles the bf16-hinted stage in f32 (as
    OpenVINO does where bf16 is not native). The bf16-cost comparison would fail there (the
    trial's ``100.86 < 1.5``); the check for the fallback holds."""
    import cosyvino_openvino.stages as stages_mod

    class NoBf16Core(ov.Core):
        def compile_model(self, model, device=None, config=None):
            if (config or {}).get("INFERENCE_PRECISION_HINT") == "bf16":
                config = dict(config, INFERENCE_PRECISION_HINT="f32")
            return super().compile_model(model, device, config)

    monkeypatch.setattr(stages_mod.ov, "Core", NoBf16Core)
    runs = _snake_runs(converted_dir, monkeypatch)
    _, _, f32, poly, ref_sin, _ = runs
    assert not abs(snr_db(f32, poly) - snr_db(f32, ref_sin)) < 1.5  # the trial's failure
    _check_snake_runs(runs, native_bf16=False)


def test_native_bf16_helper_follows_the_runtime(monkeypatch):
    """tests/conftest.py's cpu_has_native_bf16: BF16 in OpenVINO's capabilities; without
    openvino, the CPU flags the planner reads."""
    import cosyvino.planner.topology as topology

    check = cpu_has_native_bf16.__wrapped__

    class Caps:
        caps: list = []

        def get_property(self, device, name):
            assert (device, name) == ("CPU", "OPTIMIZATION_CAPABILITIES")
            return list(self.caps)

    monkeypatch.setattr(ov, "Core", Caps)
    Caps.caps = ["WINOGRAD", "FP32", "INT8", "BIN", "EXPORT_IMPORT"]  # an AVX2-only EPYC
    assert check() is False
    Caps.caps = ["BF16", "FP32", "INT8"]
    assert check() is True
    monkeypatch.setitem(sys.modules, "openvino", None)  # no openvino: the flags decide

    class Probe:
        bf16 = False

    monkeypatch.setattr(topology, "probe_topology", lambda *a, **k: Probe())
    assert check() is False
    Probe.bf16 = True
    assert check() is True
