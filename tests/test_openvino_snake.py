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
from conftest import TINY_A  # noqa: E402
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


def test_backend_rewrites_the_vocoder_only_when_it_runs_in_bf16(converted_dir, monkeypatch):
    import cosyvino_openvino.stages as stages_mod

    def synth(**options):
        tts = Synthesizer(converted_dir(TINY_A), backend="openvino", **options, **F32)
        audio = tts.synthesize("你好。", tts.speakers[0], seed=0, num_speech_tokens=10)
        return tts.stages.load_rewrites, audio.samples

    plain_rewrites, f32 = synth()
    assert plain_rewrites["hift_decode.xml"]["sin_squares"] == 0
    rewrites, poly = synth(stage_precision={"hift_decode": "bf16"})
    assert rewrites["hift_decode.xml"]["sin_squares"] > 0  # every resblock Snake
    assert rewrites["estimator.xml"]["sin_squares"] == 0
    monkeypatch.setattr(stages_mod, "polynomial_sin_squares", lambda model: 0)
    _, ref_sin = synth(stage_precision={"hift_decode": "bf16"})
    assert f32.shape == poly.shape == ref_sin.shape and np.isfinite(poly).all()
    # bf16 costs the tiny random model ~11 dB against f32 either way; the polynomial must not
    # add to it (a wrong range reduction or coefficient costs far more than 1.5 dB)
    assert abs(snr_db(f32, poly) - snr_db(f32, ref_sin)) < 1.5
