"""`cosyvino serve --llm-batch N`: concurrent requests decode in one batched LLM step and each
gets exactly the audio it gets alone; `--estimator-batch N`: their equal-length flow hops share
estimator calls, audio within the waveform tolerance; the batch gauges on /metrics."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
sf = pytest.importorskip("soundfile")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.errors import InputError  # noqa: E402
from cosyvino.server import ServerConfig  # noqa: E402
from server_harness import RunningServer, metric  # noqa: E402

TOKENS = 40
TEXTS = ["你好，世界。", "Hello world, this is a test.", "今天天气很好。"]


@pytest.fixture(scope="module")
def synth(tiny_model_dir):
    return Synthesizer(tiny_model_dir, backend="torch", num_threads=1, max_parallel=3)


def test_batched_server_gives_each_request_its_own_audio(synth):
    alone = [synth.synthesize(t, "中文女", seed=10 + i, num_speech_tokens=TOKENS).to_int16()
             for i, t in enumerate(TEXTS)]
    cfg = ServerConfig(max_sessions=3, queue_size=4, num_speech_tokens=TOKENS, llm_batch=3,
                       cache_memory_mb=0, request_timeout=120)
    server = RunningServer(cfg, [synth])
    try:
        def post(i):
            r = httpx.post(server.url + "/v1/audio/speech", timeout=120, json={
                "input": TEXTS[i], "voice": "中文女", "seed": 10 + i, "response_format": "wav",
                "hop_schedule": "segment"})
            assert r.status_code == 200, r.text
            return r.content

        for _ in range(3):  # concurrency is up to the threads: retry until a batch ran
            with ThreadPoolExecutor(3) as ex:
                bodies = list(ex.map(post, range(3)))
            if metric(server.url, "cosyvino_llm_batch_mean_rows") > 1:
                break
        assert metric(server.url, "cosyvino_llm_batch_steps") > 0
        # rows >= 1 in every step, so a mean above 1 means some step decoded several requests
        # together (how many steps had company depends on when the threads arrived)
        assert metric(server.url, "cosyvino_llm_batch_mean_rows") > 1
        assert metric(server.url, "cosyvino_llm_batch_rows") == 0  # nothing decoding now
        for body, want in zip(bodies, alone):  # one segment each: no join fades
            got, rate = sf.read(io.BytesIO(body), dtype="int16")
            assert rate == synth.sample_rate
            np.testing.assert_array_equal(got, want)
    finally:
        server.stop()


def test_llm_batch_is_validated():
    with pytest.raises(InputError):
        ServerConfig(llm_batch=0).validate()
    for bad in (0, True, 1.5):
        with pytest.raises(InputError, match="estimator batch"):
            ServerConfig(estimator_batch=bad).validate()


def test_estimator_batched_server_gauges_and_audio(tiny_model_dir):
    synth = Synthesizer(tiny_model_dir, backend="torch", num_threads=1, max_parallel=3,
                        estimator_batch=3)
    alone = [synth.synthesize(t, "中文女", seed=20 + i, num_speech_tokens=TOKENS).to_int16()
             for i, t in enumerate(TEXTS)]
    cfg = ServerConfig(max_sessions=3, queue_size=4, num_speech_tokens=TOKENS,
                       estimator_batch=3, cache_memory_mb=0, request_timeout=120)
    server = RunningServer(cfg, [synth])
    try:
        assert httpx.get(server.url + "/ready").json()["estimator_batch"] == 3

        def post(i):
            r = httpx.post(server.url + "/v1/audio/speech", timeout=120, json={
                "input": TEXTS[i], "voice": "中文女", "seed": 20 + i, "response_format": "wav",
                "hop_schedule": "segment"})
            assert r.status_code == 200, r.text
            return r.content

        for _ in range(5):  # the solves overlap only when the threads arrive together
            with ThreadPoolExecutor(3) as ex:
                bodies = list(ex.map(post, range(3)))
            if metric(server.url, "cosyvino_estimator_batch_mean_requests") > 1:
                break
        assert metric(server.url, "cosyvino_estimator_batch_calls") > 0
        assert metric(server.url, "cosyvino_estimator_batch_mean_requests") > 1
        assert metric(server.url, "cosyvino_estimator_batch_members") == 0
        for body, want in zip(bodies, alone):
            got, rate = sf.read(io.BytesIO(body), dtype="int16")
            assert rate == synth.sample_rate and got.shape == want.shape
            # 1e-3 of full scale (the waveform tolerance): torch's batched GEMMs round apart
            assert int(np.max(np.abs(got.astype(np.int32) - want))) <= 33
    finally:
        server.stop()
        synth.close()


def test_pool_reports_the_estimator_batch_that_applies(tiny_model_dir):
    from cosyvino.server.metrics import Metrics
    from cosyvino.server.pool import SynthesisPool

    cfg = ServerConfig(max_sessions=2, estimator_batch=8).validate()
    assert SynthesisPool(cfg, None, Metrics()).estimator_batch == 8  # not loaded: as asked
    synth = Synthesizer(tiny_model_dir, backend="torch", num_threads=1, max_parallel=2,
                        estimator_batch=8)
    try:  # torch holds 4 requests per estimator call
        assert SynthesisPool(cfg, [synth], Metrics()).estimator_batch == 4
        synth.set_max_parallel(1)  # no concurrency: no rendezvous
        assert SynthesisPool(cfg, [synth], Metrics()).estimator_batch == 1
    finally:
        synth.close()
