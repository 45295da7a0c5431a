"""Batched estimator calls across requests (issue 17 item 2): concurrent requests whose flow
solves have equal shapes share estimator calls (batch 4) and each gets the tokens it gets alone
and its audio within the suite's waveform tolerance (1e-3: torch's batched GEMMs round the
velocity differently by ~1e-6, which the tiny random vocoder amplifies to ~1e-4; the estimator
rows themselves are held to 1e-4 by the conformance suite); a lone request and unequal shapes
run alone; the option is off unless asked and needs parallel requests. Tiny model, torch and OpenVINO."""

from __future__ import annotations

import time

import numpy as np
import pytest

from conftest import TINY_A
from cosyvino.errors import InputError
from cosyvino.request import StreamingOptions, SynthesisRequest

WAV_ATOL = 1e-3  # cosyvino.testing.BackendConformance.wav_atol


class SlowEstimator:
    """The stages with every estimator call ``delay`` s longer, so two requests' flow solves
    certainly overlap in time (the tiny model's calls take ~1 ms)."""

    def __init__(self, stages, delay: float = 0.03):
        self._stages, self._delay = stages, delay

    def __getattr__(self, name):
        return getattr(self._stages, name)

    def estimate(self, *args):
        time.sleep(self._delay)
        return self._stages.estimate(*args)


@pytest.fixture(scope="module", params=["torch", "openvino"])
def stages(request, converted_dir):
    from cosyvino.plugins import get_backend

    if request.param == "torch":
        s = get_backend("torch").load(str(TINY_A))
    else:
        pytest.importorskip("openvino")
        s = get_backend("openvino").load(converted_dir(TINY_A), precision="f32",
                                         kv_cache_precision="f32")
    yield s
    s.close()


def _synth(stages, **kw):
    from cosyvino import Synthesizer

    return Synthesizer.from_stages(SlowEstimator(stages), model_dir=str(TINY_A),
                                   voices_dir=False, **kw)


def _requests(speakers, schedule="segment", tokens=(30, 30)):
    return [SynthesisRequest("你好，世界。", speakers[i % len(speakers)], seed=11 + i,
                             num_speech_tokens=n, streaming=StreamingOptions(schedule))
            for i, n in enumerate(tokens)]


def _audio(chunks):
    return (np.concatenate([c.speech_tokens for c in chunks]),
            np.concatenate([c.samples for c in chunks]))


def _together(tts, reqs):
    handles = [tts.submit(r) for r in reqs]
    return [_audio(list(h)) for h in handles]


@pytest.mark.parametrize("schedule", ["segment", "latency"])
def test_concurrent_equal_shapes_share_calls_and_equal_each_alone(stages, schedule):
    alone_tts = _synth(stages)
    tts = _synth(stages, max_parallel=2, estimator_batch=2)
    try:
        reqs = _requests(alone_tts.speakers, schedule)
        alone = [_audio(list(alone_tts.stream(r))) for r in reqs]
        got = _together(tts, reqs)
        stats = tts.estimator_batch_stats
    finally:
        tts.close()
        alone_tts.close()
    for (tok, wav), (tok_a, wav_a) in zip(got, alone):
        np.testing.assert_array_equal(tok, tok_a)
        assert wav.shape == wav_a.shape
        assert float(np.max(np.abs(wav - wav_a))) <= WAV_ATOL
    assert stats["max_members"] == 2, stats
    assert stats["member_calls"] > stats["calls"], stats  # some calls served both requests


def test_unequal_shapes_do_not_combine(stages):
    tts = _synth(stages, max_parallel=2, estimator_batch=2)
    try:
        reqs = _requests(tts.speakers, "segment", tokens=(30, 45))
        alone = [_audio(list(tts.stream(r))) for r in reqs]
        got = _together(tts, reqs)
        stats = tts.estimator_batch_stats
    finally:
        tts.close()
    for g, a in zip(got, alone):
        np.testing.assert_array_equal(g[0], a[0])
        assert float(np.max(np.abs(g[1] - a[1]))) <= WAV_ATOL
    assert stats["max_members"] == 1 and stats["calls"] == stats["member_calls"], stats


def test_off_unless_asked_and_needs_parallel_requests(stages):
    for kw in ({}, {"max_parallel": 2}, {"estimator_batch": 2}):
        tts = _synth(stages, **kw)
        try:
            assert tts.estimator_batch_stats is None, kw
        finally:
            tts.close()
    tts = _synth(stages, max_parallel=2, estimator_batch=8)
    try:  # capped at what the stages can hold
        assert tts.engine.batchers["estimator"].cap == stages.max_estimator_batch
    finally:
        tts.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_bad_estimator_batch_is_refused(stages, bad):
    with pytest.raises(InputError, match="estimator_batch"):
        _synth(stages, estimator_batch=bad)
