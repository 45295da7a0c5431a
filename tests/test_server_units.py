"""Server building blocks without HTTP: joins, encoders, result cache, Synthesizer cancel."""

from __future__ import annotations

import io
import os
import threading
import wave

import numpy as np
import pytest

from cosyvino.errors import InputError, SynthesisCancelled
from cosyvino.server.cache import ResultCache, cache_key, model_fingerprint
from cosyvino.server.encoding import join_segments, make_encoder, smooth_join, wav_stream_header


def _tone(n, offset=0.5):
    return (offset + 0.3 * np.sin(np.arange(n) / 7.0)).astype(np.float32)


def test_single_segment_is_untouched():
    x = _tone(5000)
    assert smooth_join(x, 0, 1, 22050) is x


def test_joins_fade_to_zero_without_jumps():
    a, b = _tone(4000, 0.6), _tone(4000, -0.6)
    raw = np.concatenate([a, b])
    joined = join_segments([a, b], 22050)
    assert joined.shape == raw.shape
    assert np.abs(np.diff(raw)).max() > 1.0          # the raw join jumps by ~1.2
    assert np.abs(np.diff(joined)).max() < 0.05      # smoothed: no pop
    np.testing.assert_array_equal(joined[:1000], a[:1000])   # starts/ends untouched
    np.testing.assert_array_equal(joined[-1000:], b[-1000:])


def test_wav_stream_header_is_readable():
    x = _tone(2205, 0.0)
    enc = make_encoder("wav", 22050)
    data = enc.feed(x[:1000], False) + enc.feed(x[1000:], True) + enc.finish()
    assert data[:44] == wav_stream_header(22050) and data.count(b"RIFF") == 1
    import soundfile as sf

    samples, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == 22050 and samples.shape == (2205,)
    with wave.open(io.BytesIO(data)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (22050, 1, 2)


def test_pcm_stream_resampling_matches_one_shot():
    pytest.importorskip("soxr")
    x = _tone(22050, 0.0)
    enc = make_encoder("pcm", 22050)
    parts = [enc.feed(x[i:i + 5000], i + 5000 >= x.size) for i in range(0, x.size, 5000)]
    stream = np.frombuffer(b"".join(parts) + enc.finish(), "<i2")
    enc2 = make_encoder("pcm", 22050)
    whole = np.frombuffer(enc2.feed(x, True) + enc2.finish(), "<i2")
    assert abs(stream.size - 24000) <= 2 and abs(whole.size - 24000) <= 2
    n = min(stream.size, whole.size)
    assert np.abs(stream[:n].astype(int) - whole[:n]).max() <= 2  # no seams at chunk edges


def test_cache_memory_and_disk(tmp_path):
    c = ResultCache(str(tmp_path), memory_bytes=100, disk_bytes=10_000)
    c.put("a" * 64, b"x" * 60)
    c.put("b" * 64, b"y" * 60)  # evicts "a" from memory (cap 100 bytes)
    assert len(c._mem) == 1
    assert c.get("a" * 64) == b"x" * 60  # from disk
    assert c.get("c" * 64) is None
    leftovers = [f for _, _, fs in os.walk(tmp_path) for f in fs if f.startswith(".tmp-")]
    assert not leftovers


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "garbage"])
def test_corrupt_cache_file_is_ignored_and_rewritten(tmp_path, damage):
    key = "d" * 64
    c = ResultCache(str(tmp_path), memory_bytes=0)
    c.put(key, b"payload" * 100)
    path = c.path(key)
    blob = open(path, "rb").read()
    bad = {"flip": blob[:50] + bytes([blob[50] ^ 0xFF]) + blob[51:],
           "truncate": blob[:-10], "empty": b"", "garbage": b"not a cache file"}[damage]
    with open(path, "wb") as f:
        f.write(bad)
    assert c.get(key) is None and not os.path.exists(path)
    assert c.corrupt_recovered == 1
    c.put(key, b"payload" * 100)
    assert ResultCache(str(tmp_path), memory_bytes=0).get(key) == b"payload" * 100


def test_disk_cap_evicts_oldest(tmp_path):
    c = ResultCache(str(tmp_path), memory_bytes=0, disk_bytes=5000)
    keys = [f"{i:064x}" for i in range(10)]
    for i, k in enumerate(keys):
        c.put(k, bytes([i]) * 1000)
        os.utime(c.path(k), (1000 + i, 1000 + i))
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path)
                for f in fs)
    assert total <= 5000
    assert c.get(keys[-1]) == bytes([9]) * 1000 and c.get(keys[0]) is None


def test_cache_key_and_fingerprint(tmp_path):
    k = cache_key(model="m", text="t", voice="v", speed=1.0, format="wav", seed=1)
    assert len(k) == 64 and k == cache_key(seed=1, format="wav", speed=1.0, voice="v", text="t",
                                           model="m")
    assert k != cache_key(model="m", text="t", voice="v", speed=1.0, format="wav", seed=2)
    (tmp_path / "llm.pt").write_bytes(b"1")
    a = model_fingerprint(str(tmp_path), "torch")
    assert a != model_fingerprint(str(tmp_path), "openvino")
    (tmp_path / "llm.pt").write_bytes(b"22")
    assert a != model_fingerprint(str(tmp_path), "torch")


def test_synthesizer_cancel_and_max_parallel(tiny_model_dir):
    from cosyvino import Synthesizer

    tts = Synthesizer(tiny_model_dir, num_threads=1)
    text = "第一句话说完了。" * 12 + "Then an English sentence follows here."
    cancel = threading.Event()
    stream = tts.stream(text, "中文女", seed=0, num_speech_tokens=5, cancel=cancel)
    first = next(stream)
    assert first.samples.size
    cancel.set()
    with pytest.raises(SynthesisCancelled):
        next(stream)
    # an unset event changes nothing
    a = tts.synthesize(text, "中文女", seed=0, num_speech_tokens=5)
    b = join_segments(list(tts.stream(text, "中文女", seed=0, num_speech_tokens=5,
                                      cancel=threading.Event())), tts.sample_rate)
    np.testing.assert_array_equal(a.samples, b)
    with pytest.raises(InputError):
        tts.set_max_parallel(0)
    tts.set_max_parallel(3)  # torch stages are thread-safe per call
    assert tts.max_parallel == 3


# ---- the pool over the engine's scheduler (no HTTP) ------------------------------------------
@pytest.fixture(scope="module")
def shared_synth(tiny_model_dir):
    from cosyvino import Synthesizer

    return Synthesizer(tiny_model_dir, num_threads=1, max_parallel=2)


def _gated(engine):
    """Make ``engine.step`` wait for the returned event (set it to let steps run); undo with
    ``del engine.step``."""
    gate = threading.Event()
    real = type(engine).step

    def step(state, *args, **kwargs):
        assert gate.wait(30), "test gate never opened"
        return real(engine, state, *args, **kwargs)

    engine.step = step
    return gate


async def _drain(job, stop):
    """Every event of ``job`` up to its last: (segments, final kind)."""
    segments = []
    while True:
        kind, value = await job.next(30, stop)
        if kind != "segment":
            return segments, kind
        segments.append(value)


async def _eventually(condition, timeout: float = 10.0) -> None:
    import asyncio

    for _ in range(int(timeout / 0.01)):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not met in time")


def test_pool_admits_and_runs_requests_on_one_scheduler(shared_synth):
    import asyncio

    from cosyvino.server.config import ServerConfig
    from cosyvino.server.metrics import Metrics
    from cosyvino.server.pool import Busy, SynthesisPool

    metrics = Metrics()
    gauge = metrics.registry.get_sample_value
    pool = SynthesisPool(ServerConfig(max_sessions=2, queue_size=1, warmup=False),
                         [shared_synth], metrics)
    pool.load()
    assert pool.ready.is_set() and pool.shared
    # one scheduler, both workers on the one loaded model
    assert pool.engines() == [shared_synth.engine] * 2
    assert pool.scheduler.engines == [shared_synth.engine]
    texts = [("Hello world.", 1), ("Good morning.", 2), ("Nice to meet you.", 3)]
    requests = [pool.prepare(shared_synth.request(t, "英文女", seed=s, num_speech_tokens=5))
                for t, s in texts]
    with pytest.raises(InputError):  # validation needs no place
        pool.prepare(shared_synth.request("hi", "nobody"))
    gate = _gated(shared_synth.engine)

    async def scenario():
        stop = asyncio.Event()
        for _ in range(3):  # 2 running + 1 queued ...
            pool.enter()
        with pytest.raises(Busy) as busy:  # ... and no more
            pool.enter()
        assert busy.value.retry_after >= 1
        assert await pool.acquire(5, stop) and await pool.acquire(5, stop)
        a = await pool.start(requests[0], threading.Event())
        b = await pool.start(requests[1], threading.Event())
        assert (a.total, b.total) == (1, 1)
        assert pool.running == 2 and pool.scheduler.active == 2
        assert gauge("cosyvino_in_flight") == 2
        waiting = asyncio.ensure_future(pool.acquire(30, stop))  # the third waits for a slot
        await asyncio.sleep(0.2)
        assert not waiting.done() and gauge("cosyvino_queue_depth") == 1
        a.cancel.set()  # cancelled while its first step is pending
        gate.set()
        assert await _drain(a, stop) == ([], "cancelled")
        # the slot is freed once the worker has reported the cancelled request finished
        assert await asyncio.wait_for(waiting, 30) is True
        assert a.finished.is_set() and gauge("cosyvino_queue_depth") == 0
        c = await pool.start(requests[2], threading.Event())
        (b_segments, b_end), (c_segments, c_end) = await asyncio.gather(_drain(b, stop),
                                                                        _drain(c, stop))
        assert b_end == c_end == "end"
        # the last slot goes back on the loop, after the event
        await _eventually(lambda: pool._admitted == 0 and pool.scheduler.active == 0)
        return b_segments, c_segments

    try:
        b_segments, c_segments = asyncio.run(scenario())
    finally:
        del shared_synth.engine.step
    assert pool.running == 0 and pool._admitted == 0 and pool.scheduler.active == 0
    assert gauge("cosyvino_in_flight") == 0
    assert gauge("cosyvino_stopped_early_total") == 1
    for (text, seed), segments in zip(texts[1:], (b_segments, c_segments)):
        direct = shared_synth.synthesize(text, "英文女", seed=seed, num_speech_tokens=5)
        assert len(segments) == 1
        np.testing.assert_array_equal(segments[0].samples, direct.samples)
    threads = pool.scheduler._threads
    pool.shutdown()
    assert not any(t.is_alive() for t in threads)


def test_pool_gives_back_places_that_never_reach_the_scheduler(shared_synth):
    import asyncio

    from cosyvino.server.config import ServerConfig
    from cosyvino.server.pool import Busy, SynthesisPool

    pool = SynthesisPool(ServerConfig(max_sessions=1, queue_size=2, warmup=False),
                         [shared_synth])
    pool.load()
    request = pool.prepare(shared_synth.request("Hello world.", "英文女", seed=1,
                                                num_speech_tokens=3))

    async def scenario():
        stop = asyncio.Event()
        pool.enter()
        assert await pool.acquire(5, stop)
        job = await pool.start(request, threading.Event())
        pool.enter()  # client gone while queued: the place is given back, nothing submitted
        gone = asyncio.Event()
        gone.set()
        assert await pool.acquire(5, gone) is False
        pool.enter()  # no slot within the timeout: 503
        with pytest.raises(Busy):
            await pool.acquire(0.05, stop)
        assert pool._admitted == 1 and pool.running == 1
        _, end = await _drain(job, stop)
        assert end == "end"
        await _eventually(lambda: pool._admitted == 0 and pool.scheduler.active == 0)

    asyncio.run(scenario())
    assert pool._admitted == 0 and pool.running == 0 and pool.scheduler.active == 0
    pool.shutdown()


def test_pool_schedules_one_engine_per_loaded_model():
    """Backends that are not thread-safe: one worker per loaded model, each on its own
    engine (the scheduler binds each request to the least busy one)."""
    from types import SimpleNamespace

    from cosyvino.server.config import ServerConfig
    from cosyvino.server.pool import SynthesisPool

    synths = [SimpleNamespace(engine=SimpleNamespace(lane_locks=())) for _ in range(3)]
    pool = SynthesisPool(ServerConfig(max_sessions=3, warmup=False), synths)
    pool.load()
    try:
        assert not pool.shared and pool.ready.is_set()
        assert pool.engines() == [s.engine for s in synths]
        assert pool.scheduler.engines == [s.engine for s in synths]
        names = [t.name for t in pool.scheduler._threads]
        # one worker per model, and as many spares (they step only while steps are held)
        assert sum("spare" not in n for n in names) == 3
        assert sum("spare" in n for n in names) == 3
    finally:
        pool.shutdown()


# ---- admission: work estimates, deadlines, Retry-After (issue 19, items 2, 3, 5, 10) ---------
class FakeClock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _bare_pool(sessions=1, queue=8, timeout=120.0, clock=None):
    """A pool that admits without a model (no scheduler): enter/acquire/leave only."""
    from cosyvino.server.config import ServerConfig
    from cosyvino.server.pool import SynthesisPool

    pool = SynthesisPool(ServerConfig(max_sessions=sessions, queue_size=queue,
                                      request_timeout=timeout, warmup=False),
                         clock=clock or FakeClock())
    pool.ready.set()
    return pool


def _forced(seconds: float):
    """A request of exactly ``seconds`` of speech (forced 50 tokens/s, one segment)."""
    from cosyvino.request import SynthesisRequest

    return SynthesisRequest(text="x", num_speech_tokens=int(round(seconds * 50)))


def _measured(pool, rtf: float, seconds: float = 20.0) -> None:
    """Make the estimator have measured ``seconds`` of speech at ``rtf``, alone (so the rate
    is both the current and the quiet one)."""
    pool.estimator.observe_chunk(rtf * seconds, seconds, alone=True)


def _run_one(pool, seconds: float):
    """Admit a request of ``seconds`` and give it a slot (it is then 'running')."""
    import asyncio

    ticket = pool.enter(_forced(seconds))
    assert asyncio.run(pool.acquire(5, asyncio.Event(), ticket=ticket))
    return ticket


def test_text_units_weigh_scripts_by_speaking_time():
    from cosyvino.server.pool import LETTER_UNITS, text_units

    assert text_units("你好，世界。") == 4.0
    assert text_units("こんにちは") == 5.0 and text_units("안녕") == 2.0
    assert text_units("Hello, world!") == pytest.approx(10 * LETTER_UNITS)
    assert text_units(" ,.!?\n") == 0.0


def test_estimator_follows_recent_requests_not_old_long_ones():
    from cosyvino.server.pool import PRIOR_RTF, WorkEstimator

    clock = FakeClock()
    est = WorkEstimator(clock)
    assert est.rtf == pytest.approx(PRIOR_RTF) and not est.confident
    for _ in range(30):  # one long, slow request: 60 s of speech at 5x
        est.observe_chunk(10.0, 2.0)
        clock.t += 10
    assert est.rtf == pytest.approx(5.0, rel=0.05) and est.confident
    clock.t += 3600  # idle time alone changes nothing
    assert est.rtf == pytest.approx(5.0, rel=0.05)
    for _ in range(40):  # then short requests at 1x, 4 s each
        est.observe_chunk(4.0, 4.0)
        clock.t += 4
    assert est.rtf == pytest.approx(1.0, rel=0.2)  # the old long request no longer dominates
    est.observe_request(100.0, 30.0)
    assert 0.22 < est.speech_per_unit < 0.3


def _prompted(seconds: float):
    """Like :func:`_forced`, with a registered-voice prompt bundle (kind "prompt")."""
    import numpy as np

    from cosyvino.request import SynthesisRequest
    from cosyvino.voices import Voice

    voice = Voice("v", np.zeros((1, 192), np.float32), np.zeros(50, np.int64),
                  np.zeros((86, 80), np.float32), "prompt text")
    return SynthesisRequest(text="x", voice=voice, num_speech_tokens=int(round(seconds * 50)))


def test_prompt_voice_requests_are_estimated_at_their_own_rate():
    """The soak (docs/reliability.md) cut 3 zero-shot streams admitted at the plain requests'
    rate: prompt requests cost more per speech second. They learn their own rate, starting
    from PROMPT_PRIOR_FACTOR x the plain one; plain requests do not move it."""
    from cosyvino.server.pool import PROMPT_PRIOR_FACTOR, Busy, TooLong, WorkEstimator

    est = WorkEstimator(FakeClock())
    assert est.kind(_forced(1.0)) == "plain" and est.kind(_prompted(1.0)) == "prompt"
    est.observe_chunk(20.0, 20.0)                  # plain at 1x
    assert est.rtf_of("prompt") == pytest.approx(PROMPT_PRIOR_FACTOR * est.rtf)
    for _ in range(20):
        est.observe_chunk(12.0, 4.0, "prompt")     # prompt requests at 3x
    assert est.rtf_of("prompt") == pytest.approx(3.0, rel=0.05)
    for _ in range(5):
        est.observe_chunk(4.0, 4.0)                # more plain work changes only plain's
    assert est.rtf_of("prompt") == pytest.approx(3.0, rel=0.05)
    assert est.rtf == pytest.approx(1.0, rel=0.05)
    with pytest.raises(KeyError):
        est.rtf_of("sing")
    # admission, 30 s timeout, plain at 1x, prompt at 3x (x 1.25 margin)
    pool = _bare_pool(sessions=1, queue=8, timeout=30.0)
    _measured(pool, 1.0)
    for _ in range(20):
        pool.estimator.observe_chunk(12.0, 4.0, "prompt", alone=True)
    pool.leave(pool.enter(_forced(9.0)))           # 11.25 s: fits
    pool.leave(pool.enter(_prompted(9.0)))         # 27 s alone: fits
    with pytest.raises(TooLong):                   # 48 s alone > 1.5 x 30 s: never fits
        pool.enter(_prompted(16.0))
    _run_one(pool, 10.0)                           # 10 s of work ahead
    pool.leave(pool.enter(_forced(6.0)))           # 10 + 7.5 s: fits
    with pytest.raises(Busy) as busy:              # 10 + 22.5 s: late
        pool.enter(_prompted(6.0))
    assert busy.value.reason == "deadline"


def test_retry_after_is_the_time_until_a_slot_frees():
    """Issue 19 item 3: 'retry-after: 35' while requests took ~4 s each. A full queue frees a
    place when the running request ends: Retry-After is that, not the whole queue."""
    from cosyvino.server.pool import Busy

    clock = FakeClock()
    pool = _bare_pool(sessions=1, queue=8, clock=clock)
    _measured(pool, 1.0)
    running = _run_one(pool, 4.0)
    for _ in range(8):
        pool.enter(_forced(4.0))
    clock.t += 1.0
    pool.estimator.observe_chunk(1.0, 1.0)  # 1 s of its 4 s delivered
    running.done = 1.0
    with pytest.raises(Busy) as busy:
        pool.enter(_forced(4.0))
    assert busy.value.reason == "queue_full"
    assert busy.value.retry_after == 3  # 3 s of speech left at 1x
    assert pool.retry_after() == 3


def test_admission_counts_the_work_already_queued():
    """Issue 19 items 2/10: a request that would finish after its deadline behind the work
    already admitted is refused up front (503 + Retry-After), not admitted to time out."""
    from cosyvino.server.pool import MARGIN, Busy

    pool = _bare_pool(sessions=1, queue=8, timeout=30.0)
    _measured(pool, 1.0)
    _run_one(pool, 10.0)
    admitted = 0
    with pytest.raises(Busy) as busy:
        for _ in range(8):
            pool.enter(_forced(5.0))
            admitted += 1
    # waits 10, 15, 20 s fit (+ 5 s x margin <= 30 s); 25 s does not
    assert admitted == 3 and busy.value.reason == "deadline"
    assert busy.value.retry_after == int(-(-(25 + 5 * MARGIN - 30) // 1))
    assert "30 s request timeout" in str(busy.value)
    assert pool._admitted == 4
    # a shorter request still fits behind them
    pool.enter(_forced(1.0))
    assert pool.estimates()["backlog_seconds"] == pytest.approx(26.0, rel=0.01)


def test_a_request_that_can_never_fit_the_timeout_is_a_400(tiny_model_dir):
    from cosyvino.server.pool import TOO_LONG_FACTOR, TooLong

    pool = _bare_pool(sessions=1, queue=8, timeout=30.0)
    pool.enter(_forced(50.0))  # nothing measured yet: an idle server does not guess
    pool.leave()
    _measured(pool, 1.0)
    with pytest.raises(TooLong) as e:
        pool.enter(_forced(50.0))                   # 50 s alone > 1.5 x 30 s
    assert e.value.limit == 30.0 and e.value.speech_seconds == pytest.approx(50.0)
    assert e.value.seconds == pytest.approx(50.0)
    msg = str(e.value)
    assert f"more than {TOO_LONG_FACTOR:g} x the request timeout of 30 s" in msg
    assert "allows about 30 s of speech" in msg
    assert pool._admitted == 0


def test_a_400_needs_a_clear_margin_over_the_timeout():
    """Issue 33 (trial 2, item 3): a 1,008-character text finished alone in 105.7 s, then the
    same text on the idle server got 400 input_too_long at an estimate of 121 s (margin
    included) vs the 120 s timeout. Near the timeout the estimate is noise: such work is
    admitted (the timeout bounds it); only more than TOO_LONG_FACTOR x the timeout alone is a
    400."""
    from cosyvino.server.pool import TOO_LONG_FACTOR, TooLong

    pool = _bare_pool(sessions=1, queue=8, timeout=120.0)
    _measured(pool, 105.7 / 48.5, seconds=48.5)   # that text alone: 48.5 s of speech
    for seconds in (48.5, 55.0, 120.0 * TOO_LONG_FACTOR / (105.7 / 48.5) - 0.5):
        pool.leave(pool.enter(_forced(seconds)))  # up to 1.5 x 120 s alone: admitted
    with pytest.raises(TooLong) as e:
        pool.enter(_forced(120.0 * TOO_LONG_FACTOR / (105.7 / 48.5) + 0.5))
    assert e.value.seconds > TOO_LONG_FACTOR * 120.0


class _FakeJob:
    """What :meth:`SynthesisPool._on_event` needs of a job: its ticket, emit, a loop."""

    def __init__(self, ticket):
        self.ticket, self.completed, self.cancel = ticket, False, threading.Event()
        self.released = self.detached = False
        self.finished = threading.Event()
        self.loop = self  # call_soon_threadsafe runs at once

    def call_soon_threadsafe(self, fn, *args):
        fn(*args)

    def emit(self, kind, value):
        pass


def _vc(seconds: float, forced: int | None = None):
    """A voice-conversion request: ``seconds`` of source speech tokens (50 per s); ``forced``:
    the token count a server with --num-speech-tokens sets (vc runs no LLM)."""
    from cosyvino.request import SynthesisRequest

    return SynthesisRequest(voice=_prompted(1.0).voice, num_speech_tokens=forced,
                            speech_tokens=np.zeros(int(round(seconds * 50)), np.int64))


def _deliver(pool, ticket, seconds: float, rtf: float, clock, cpu, cpu_use: float = 2.0,
             hop: float = 2.0) -> None:
    """The running ``ticket`` delivers ``seconds`` of audio in hops of ``hop`` s, each taking
    ``rtf`` x its length in wall time and ``cpu_use`` CPU s per wall s of the process."""
    from cosyvino.audio import Audio
    from cosyvino.engine.scheduler import CHUNK

    done = 0.0
    while done < seconds - 1e-9:
        d = min(hop, seconds - done)
        clock.t += rtf * d
        cpu.t += cpu_use * rtf * d
        pool._on_event(_FakeJob(ticket), CHUNK, Audio(np.zeros(int(d * 1000), np.float32),
                                                      1000))
        done += d


def _end(pool, ticket) -> None:
    """The running ``ticket`` leaves the scheduler (as the worker's DONE does)."""
    pool._running += 1  # _finish undoes what start() did
    job = _FakeJob(ticket)
    job.completed = True
    pool._finish(job)


def test_load_cannot_turn_work_that_fits_alone_into_a_400():
    """Issue 33 defect 1: after load, the learned rate rose (RTF 19-30, prompt 92.8 on 2
    shared cores) and an idle server refused with 400 input_too_long the README's vc example
    (13.8 s of audio, 70 s alone under the 120 s timeout). "Never fits" is decided on the
    cost alone: load gives 503 + Retry-After, the idle server admits it."""
    from cosyvino.server.pool import Busy, TooLong

    clock, cpu = FakeClock(), FakeClock(0.0)
    pool = _bare_pool(sessions=2, queue=8, timeout=120.0, clock=clock)
    pool.cpu_clock = cpu
    est = pool.estimator
    # the README's vc example alone: 13.8 s of source in 69 s (5 s per s), 2 cores busy
    vc = est.kind(_vc(1.0))
    alone = _run_one(pool, 1.0)
    alone.kind = vc
    _deliver(pool, alone, 13.8, 5.0, clock, cpu)
    _end(pool, alone)
    # then load: two conversions side by side, each at 30 s per s of speech ...
    a, b = _run_one(pool, 1.0), _run_one(pool, 1.0)
    a.kind = b.kind = vc
    for _ in range(10):
        _deliver(pool, a, 2.0, 30.0, clock, cpu, hop=2.0)
        _deliver(pool, b, 2.0, 30.0, clock, cpu, hop=2.0)
    _end(pool, a)
    # ... and one alone while another process took the cores: 8x the wall time, the same
    # CPU seconds per second of speech (10), at an eighth of the CPU share (0.25 of 2 cores)
    _deliver(pool, b, 10.0, 40.0, clock, cpu, cpu_use=0.25)
    _end(pool, b)
    # idle: admitted (69 s alone), where the current rate says 13.8 x 20 x 1.25
    assert not pool._started and pool._admitted == 0
    pool.leave(pool.enter(_vc(13.8)))
    assert est.rtf_of("vc") > 20.0                      # the load is in the current rate
    assert est.quiet_rtf_of("vc") == pytest.approx(5.0)  # not in the quiet one (CPU time)
    assert est.quiet_rtf_of("plain") is None and not est.knows_quiet("plain")
    # busy: the load is answered with 503 + Retry-After, never 400
    running = _run_one(pool, 20.0)  # 20 s of plain speech ahead, at the loaded plain rate
    with pytest.raises(Busy) as busy:
        pool.enter(_vc(13.8))
    assert busy.value.reason == "deadline"
    drained = 20.0 * est.rtf_of("plain")
    assert 1 <= busy.value.retry_after <= max(1, int(-(-drained // 1)))
    _end(pool, running)
    # what cannot fit even alone is still a 400, naming the source audio (vc has no text)
    pool.leave(pool.enter(_vc(30.0)))                   # 30 x 5 = 150 s <= 1.5 x 120 s
    with pytest.raises(TooLong) as e:
        pool.enter(_vc(40.0))                           # 40 x 5 = 200 s > 180 s
    assert e.value.source == "source audio"
    assert e.value.seconds == pytest.approx(40.0 * 5.0)
    msg = str(e.value)
    assert "source audio is 40.0 s long" in msg and "text" not in msg
    assert "about 24 s of source audio" in msg          # 120 s / 5
    assert pool._admitted == 0


def test_a_request_is_alone_only_without_running_or_validating_company():
    """The quiet rate takes a chunk only if no other request was in the pool over all of it:
    not another running one (even one that finished mid-chunk), not a validation (the prompt
    models run there)."""
    clock, cpu = FakeClock(), FakeClock(0.0)
    pool = _bare_pool(sessions=2, queue=8, timeout=120.0, clock=clock)
    pool.cpu_clock = cpu
    est = pool.estimator
    a = _run_one(pool, 10.0)
    _deliver(pool, a, 2.0, 1.0, clock, cpu)              # alone: quiet 1.0
    b = _run_one(pool, 10.0)
    _end(pool, b)                                        # came and went during a's chunk
    _deliver(pool, a, 2.0, 9.0, clock, cpu)              # shared: not quiet
    assert est.quiet_rtf_of("plain") == pytest.approx(1.0)
    _deliver(pool, a, 2.0, 2.0, clock, cpu)              # alone again (1.0 has decayed)
    quiet = est.quiet_rtf_of("plain")
    assert 1.5 < quiet < 2.0
    with pool._lock:
        pool._validating += 1                            # as validate() does
        pool._mark_shared()
    _deliver(pool, a, 2.0, 9.0, clock, cpu)
    assert est.quiet_rtf_of("plain") == quiet
    assert est.rtf > 2.0  # all of it counts in the current rate


def test_a_detached_request_frees_its_slot_at_once_and_is_accounted_when_it_stops():
    """Issue 33 (trial 3, item 1): a response that stops waiting (a cut at the timeout) gives
    the slot back at that moment, not when the worker leaves its stage call: the next request
    is admitted and starts at once; the detached one counts as stopping, not running, until
    its worker reports it; neither its last chunk nor the new request's chunks meanwhile feed
    the quiet rate; its end releases nothing twice."""
    from cosyvino.server.pool import Busy

    clock, cpu = FakeClock(), FakeClock(0.0)
    pool = _bare_pool(sessions=1, queue=0, timeout=120.0, clock=clock)
    pool.cpu_clock = cpu
    est = pool.estimator
    a = _run_one(pool, 60.0)
    job = _FakeJob(a)
    pool._running += 1  # as start() does
    _deliver(pool, job.ticket, 2.0, 1.0, clock, cpu)      # alone: quiet 1.0
    assert est.quiet_rtf_of("plain") == pytest.approx(1.0)
    with pytest.raises(Busy):                             # the one session is taken
        pool.enter(_forced(1.0))
    assert pool.detach(job) and job.cancel.is_set()
    assert (pool.running, pool.stopping, pool.admitted) == (0, 1, 0)
    assert pool.estimates()["backlog_seconds"] == 0      # its 58 s left are not ahead
    assert not pool.detach(job)                          # once
    b = _run_one(pool, 1.0)                              # admitted, a slot at once
    assert b.shared and pool.running == 0                # (b is not start()ed here)
    pool._on_event(job, "chunk", _audio(2.0))            # a's last stage call ends
    _deliver(pool, b, 1.0, 9.0, clock, cpu)
    assert est.quiet_rtf_of("plain") == pytest.approx(1.0)  # neither was alone
    pool._finish(job)                                    # a's worker: cancelled, stopped
    assert (pool.running, pool.stopping, pool.admitted) == (0, 0, 1)
    assert job.finished.is_set() and pool._sem._value == 0  # b still holds the one slot
    _deliver(pool, b, 1.0, 1.0, clock, cpu)              # b's chunk before a stopped:
    assert est.quiet_rtf_of("plain") == pytest.approx(1.0)  # still shared
    with pytest.raises(Busy):                             # b has the session now
        pool.enter(_forced(1.0))


def _audio(seconds: float):
    from cosyvino.audio import Audio

    return Audio(np.zeros(int(seconds * 1000), np.float32), 1000)


def test_only_a_deliberate_cut_mutes_uvicorns_incomplete_response_error():
    """Issue 33 (trial 3, item 2): uvicorn logs every app return with an unfinished body as
    ERROR "ASGI callable returned without completing response." (operators read it as a
    crash). The filter drops it only for a response that marked itself cut; the same message
    for any other response, and every other record, go through."""
    import contextvars
    import logging

    from cosyvino.server import logs

    def record(msg):
        return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, None, None)

    f = logs.DeliberateCutFilter()

    def in_request(cut: bool, msg: str) -> bool:
        logs.response_notes.set({})                      # as RequestIdMiddleware does
        if cut:
            logs.mark_deliberate_cut("timeout")
        return f.filter(record(msg))

    ctx = contextvars.copy_context
    assert ctx().run(in_request, True, logs.INCOMPLETE_RESPONSE) is False
    assert ctx().run(in_request, False, logs.INCOMPLETE_RESPONSE) is True
    assert ctx().run(in_request, True, "Exception in ASGI application\n") is True
    assert ctx().run(lambda: f.filter(record(logs.INCOMPLETE_RESPONSE))) is True  # no request
    logs.install_cut_filter()
    logs.install_cut_filter()
    assert sum(isinstance(x, logs.DeliberateCutFilter)
               for x in logging.getLogger("uvicorn.error").filters) == 1


def test_an_idle_server_never_answers_503():
    """Issue 33 (trial 2, item 1): after one vc request was cut at the timeout, every further
    vc request on the IDLE server got 503 + Retry-After: 1 ("about 0 s of work is ahead of
    this request, which needs about 806 s"), for ever: under 5 s of vc had been measured
    alone, so no 400 either, and nothing more could be measured while every one was refused.
    Nothing ahead: admit (the timeout bounds it), or 400 once the quiet estimate says it can
    never fit."""
    from cosyvino.server.pool import Busy, TooLong

    clock, cpu = FakeClock(), FakeClock(0.0)
    pool = _bare_pool(sessions=1, queue=8, timeout=120.0, clock=clock)
    pool.cpu_clock = cpu
    est = pool.estimator
    _measured(pool, 1.0)                                  # confident (plain measured)
    # the cut request: 1.32 s of vc in 120 s alone, CPU busy (2 cores) all along
    cut = _run_one(pool, 1.0)
    cut.kind = "vc"
    _deliver(pool, cut, 1.32, 120.0 / 1.32, clock, cpu, hop=1.32)
    _end(pool, cut)
    assert not est.knows_quiet("vc") and est.quiet_rtf_of("vc") > 40
    assert pool.estimates()["backlog_seconds"] == 0
    for _ in range(3):  # retried: admitted every time, never 503
        pool.leave(pool.enter(_vc(13.75)))
    # once 5 s of vc is measured alone at that speed, the request is a 400, still not a 503
    again = _run_one(pool, 1.0)
    again.kind = "vc"
    _deliver(pool, again, 5.0, 120.0 / 1.32, clock, cpu)
    _end(pool, again)
    assert est.knows_quiet("vc")
    with pytest.raises(TooLong):
        pool.enter(_vc(13.75))
    # with work ahead, the same request is a 503 whose Retry-After is bounded by that work
    running = _run_one(pool, 2.0)
    with pytest.raises(Busy) as busy:                    # 1.2 x 91 x 1.25 s > 120 s
        pool.enter(_vc(1.2))
    assert busy.value.reason == "deadline"
    assert busy.value.retry_after <= max(1, int(-(-2.0 * est.rtf_of("plain") // 1)))
    assert "1 request(s) running and 0 queued" in str(busy.value)
    _end(pool, running)


def test_cpu_starvation_does_not_inflate_the_quiet_rate():
    """A box loaded by other processes (the trial: load average 9-13 on 2 cores) slows a
    request that runs alone in wall time, not in CPU time: alone chunks are costed at
    min(wall, CPU / best utilization), so even a server never seen un-starved counts at most
    the CPU seconds (what the work takes with one core to itself)."""
    from cosyvino.server.pool import WorkEstimator

    est = WorkEstimator(FakeClock())
    # never un-starved: 0.3 CPU s per wall s, 40 wall s per s of speech -> 12 CPU s per s
    for _ in range(5):
        est.observe_chunk(80.0, 2.0, "plain", alone=True, cpu=24.0)
    assert est.quiet_rtf_of("plain") == pytest.approx(12.0)
    assert est.rtf_of("plain") > 30.0                    # the current rate keeps the load
    # once a chunk ran with the CPU to itself (2 cores), starved chunks count at CPU / 2
    est.observe_chunk(6.0, 1.0, "plain", alone=True, cpu=12.0)
    assert est.best_cpu_use == pytest.approx(2.0)
    est.observe_chunk(80.0, 2.0, "plain", alone=True, cpu=24.0)
    before = est.quiet_rtf_of("plain")
    est2 = WorkEstimator(FakeClock())
    est2.observe_chunk(6.0, 1.0, "plain", alone=True, cpu=12.0)
    for _ in range(3):
        est2.observe_chunk(80.0, 2.0, "plain", alone=True, cpu=24.0)
    assert est2.quiet_rtf_of("plain") == pytest.approx(6.0)
    assert before < 12.0
    # without a CPU reading, the wall time is the cost
    est.observe_chunk(10.0, 1.0, "vc", alone=True)
    assert est.quiet_rtf_of("vc") == pytest.approx(10.0)


def test_vc_work_is_the_source_length_and_has_its_own_rate():
    """A vc request's work is its source's tokens even when the server forces a token count
    (that count is for the LLM, which vc does not run); its rate is not the prompt TTS one."""
    from cosyvino.server.pool import WorkEstimator

    est = WorkEstimator(FakeClock())
    assert est.kind(_vc(13.8)) == "vc" and est.kind(_prompted(1.0)) == "prompt"
    assert est.speech_seconds(_vc(13.8, forced=8), segments=1) == pytest.approx(13.8)
    est.observe_chunk(60.0, 4.0, "prompt", alone=True)
    assert est.quiet_rtf_of("vc") is None and est.rtf_of("vc") == pytest.approx(est.rtf)


def test_a_queued_request_leaves_with_503_once_its_deadline_is_unreachable():
    """Issue 19 item 5: an admitted request must finish or be refused early; it must not wait
    in the queue past the point where it could still finish, then time out."""
    import asyncio

    from cosyvino.server.pool import Busy

    clock = FakeClock()
    pool = _bare_pool(sessions=1, queue=8, timeout=30.0, clock=clock)
    _measured(pool, 1.0)
    _run_one(pool, 10.0)  # holds the only slot
    queued = pool.enter(_forced(5.0))

    async def scenario():
        waiting = asyncio.ensure_future(pool.acquire(30.0, asyncio.Event(), ticket=queued))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        # the running request turns out slower: the queued one can no longer make it
        clock.t += 20.0
        pool.estimator.observe_chunk(40.0, 2.0)
        with pytest.raises(Busy) as busy:
            await asyncio.wait_for(waiting, 10)
        return busy.value

    busy = asyncio.run(scenario())
    assert busy.reason == "deadline" and busy.retry_after >= 1
    assert pool._admitted == 1 and queued not in pool._queued
