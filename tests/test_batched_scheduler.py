"""Batched LLM decode in the scheduler (issue 17, engine part): concurrent requests whose decode
steps run as rows of one LLMBatch give exactly the tokens and audio each gives alone (same
seed), whether they join together or mid-decode, leave at segment ends and rejoin, or another
row is cancelled; a lone request keeps its own session; occupancy is counted. Tiny model, every
built-in backend (torch, OpenVINO, ONNX Runtime)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from conftest import TINY_A
from cosyvino.engine import Scheduler
from cosyvino.errors import InputError, SynthesisCancelled
from cosyvino.request import StreamingOptions, SynthesisRequest

SEGMENT = StreamingOptions("segment")
TWO_SEGMENTS = "今天天气很好，我们一起去公园散步吧。" * 3 + "Hello there, how are you today? " * 4


@pytest.fixture(scope="module", params=["torch", "openvino", "onnxruntime"])
def tts(request, converted_dir, onnx_dir):
    from cosyvino import Synthesizer

    if request.param == "torch":
        s = Synthesizer(str(TINY_A), backend="torch", voices_dir=False)
    elif request.param == "openvino":
        pytest.importorskip("openvino")
        s = Synthesizer(converted_dir(TINY_A), backend="openvino", voices_dir=False,
                        precision="f32", kv_cache_precision="f32")
    else:
        pytest.importorskip("onnxruntime")
        s = Synthesizer(onnx_dir(TINY_A), backend="onnxruntime", voices_dir=False)
    yield s
    s.close()


def _requests(tts):
    spk = tts.speakers
    return [
        SynthesisRequest("你好，世界。", spk[0], seed=1, num_speech_tokens=40, streaming=SEGMENT),
        SynthesisRequest("今天天气很好。", spk[1 % len(spk)], seed=2, num_speech_tokens=75,
                         streaming=SEGMENT),
        SynthesisRequest(TWO_SEGMENTS, spk[2 % len(spk)], seed=3, num_speech_tokens=55,
                         streaming=StreamingOptions("latency")),
        SynthesisRequest("Hello there.", spk[0], seed=4, streaming=SEGMENT),  # EOS-ended
    ]


def _alone(tts, req):
    """(tokens, samples) of ``req`` stepped alone in this thread (its own session)."""
    chunks = list(tts.stream(req))
    return (np.concatenate([c.speech_tokens for c in chunks]),
            np.concatenate([c.samples for c in chunks]))


def _collect(handle):
    chunks = list(handle)
    return (np.concatenate([c.speech_tokens for c in chunks]),
            np.concatenate([c.samples for c in chunks]))


def _assert_same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_concurrent_requests_batched_equal_each_alone(tts):
    reqs = _requests(tts)
    alone = [_alone(tts, r) for r in reqs]
    assert len({a[0].size for a in alone}) == len(reqs), "rows leave at different steps"
    sched = Scheduler([tts.engine] * 2, llm_batch=4)
    try:
        handles = [sched.submit(r) for r in reqs]
        got = [_collect(h) for h in handles]
        stats = sched.batch_stats[0]
    finally:
        sched.close()
    for g, a in zip(got, alone):
        _assert_same(g, a)
    assert stats["max_rows"] >= 3, stats
    assert stats["steps"] > 0 and stats["rows"] == 0
    assert stats["row_steps"] == sum(n * k for n, k in stats["occupancy"].items())
    # every batched row-step is a decoded token of some request (the rest ran alone)
    assert stats["row_steps"] <= sum(a[0].size for a in alone)
    assert set(stats["occupancy"]) <= {1, 2, 3, 4}


def test_cap_limits_the_rows_and_the_rest_decode_alone(tts):
    reqs = _requests(tts)
    alone = [_alone(tts, r) for r in reqs]
    sched = Scheduler([tts.engine] * 2, llm_batch=2)
    try:
        got = [_collect(h) for h in [sched.submit(r) for r in reqs]]
        stats = sched.batch_stats[0]
    finally:
        sched.close()
    for g, a in zip(got, alone):
        _assert_same(g, a)
    assert stats["max_rows"] == 2 and set(stats["occupancy"]) <= {1, 2}


def test_requests_join_mid_decode(tts):
    """B and C arrive while A is decoding (A's cache is then longer than theirs)."""
    spk = tts.speakers
    a = SynthesisRequest(TWO_SEGMENTS, spk[0], seed=7, num_speech_tokens=120,
                         streaming=StreamingOptions("latency"))
    b = SynthesisRequest("再见。", spk[1 % len(spk)], seed=8, num_speech_tokens=30,
                         streaming=SEGMENT)
    c = SynthesisRequest("你好。", spk[2 % len(spk)], seed=9, num_speech_tokens=50,
                         streaming=SEGMENT)
    alone = [_alone(tts, r) for r in (a, b, c)]
    sched = Scheduler([tts.engine] * 2, llm_batch=4)
    first = threading.Event()
    chunks_a, done_a = [], threading.Event()

    def on_a(kind, value):
        if kind == "chunk":
            chunks_a.append(value)
            first.set()
        else:
            done_a.set()

    try:
        sched.submit(a, callback=on_a)
        assert first.wait(120)
        hb, hc = sched.submit(b), sched.submit(c)
        got_b, got_c = _collect(hb), _collect(hc)
        assert done_a.wait(120)
        stats = sched.batch_stats[0]
    finally:
        sched.close()
    got_a = (np.concatenate([x.speech_tokens for x in chunks_a]),
             np.concatenate([x.samples for x in chunks_a]))
    for g, want in zip((got_a, got_b, got_c), alone):
        _assert_same(g, want)
    assert stats["max_rows"] >= 2, stats


def test_a_streamed_row_gets_its_chunks_while_it_decodes(tts):
    """A batch row's due hops run while the batch goes on decoding: two streamed 300-token
    requests decoding together deliver their first chunks well before their decoding ends
    (not all at once after it, as rows did before), and the audio is the same as alone."""
    spk = tts.speakers
    reqs = [SynthesisRequest("你好，世界。", spk[i % len(spk)], seed=20 + i,
                             num_speech_tokens=300, streaming=StreamingOptions("latency"))
            for i in range(2)]
    alone = [_alone(tts, r) for r in reqs]
    decoded_at_first_chunk = {}
    handles = {}
    ready = threading.Event()

    def on(i, out, done):
        def callback(kind, value):
            if kind == "chunk":
                ready.wait(60)
                if i not in decoded_at_first_chunk:
                    decoded_at_first_chunk[i] = len(handles[i].state.program.tokens)
                out.append(value)
            else:
                done.set()
        return callback

    sched = Scheduler([tts.engine] * 2, llm_batch=2)
    outs, dones = [[], []], [threading.Event(), threading.Event()]
    try:
        for i, r in enumerate(reqs):
            handles[i] = sched.submit(r, callback=on(i, outs[i], dones[i]))
        ready.set()
        assert all(d.wait(120) for d in dones)
        stats = sched.batch_stats[0]
    finally:
        sched.close()
    assert stats["max_rows"] == 2, stats
    for i in range(2):
        # a row whose hops waited for its decoding to end would read 300 here; the first hop
        # is due at 14 tokens, the rest is how far the batch decodes while the hop runs
        assert decoded_at_first_chunk[i] < 250, decoded_at_first_chunk
        _assert_same((np.concatenate([c.speech_tokens for c in outs[i]]),
                      np.concatenate([c.samples for c in outs[i]])), alone[i])


def test_a_request_making_its_first_chunk_joins_no_streaming_rows(tts):
    """First-chunk hold: a request without a chunk yet decodes alone rather than beside rows of
    streaming requests (they are held meanwhile), batches with another such request, and joins
    streaming rows once its hold is over or when the hold is off."""
    from types import SimpleNamespace

    from cosyvino.engine import RequestHandle

    def handle(chunks):
        program = SimpleNamespace(decode_ready=lambda lane: lane == "llm")
        h = RequestHandle(SimpleNamespace(program=program, cancel=threading.Event(),
                                          total_segments=1))
        h.chunks = chunks
        return h

    sched = Scheduler([tts.engine] * 2, llm_batch=4)
    group = next(iter(sched._groups.values()))
    streaming, new, other_new = handle(3), handle(0), handle(0)
    try:
        with sched._cond:
            group.batch._rows[streaming] = 0
            assert not sched._joins_batch(group, new, "llm")
            sched.first_chunk_hold = False
            assert sched._joins_batch(group, new, "llm")
            sched.first_chunk_hold = True
            new.submitted -= sched.max_hold_s + 1  # its hold is over
            assert sched._joins_batch(group, new, "llm")
            new.submitted += sched.max_hold_s + 1
            group.batch._rows.clear()
            group.running[other_new] = set()
            assert sched._joins_batch(group, new, "llm")  # another new request decodes
            group.joining.append(other_new)
            assert sched._joins_batch(group, new, "llm")
            del group.running[other_new]
            group.joining.clear()
            assert not sched._joins_batch(group, new, "llm")  # alone: its own session
    finally:
        sched.close()


def test_cancelling_one_row_leaves_the_others_alone(tts):
    reqs = _requests(tts)[:3]
    victim = SynthesisRequest(TWO_SEGMENTS, tts.speakers[0], seed=11, num_speech_tokens=150,
                              streaming=StreamingOptions("latency"))
    alone = [_alone(tts, r) for r in reqs]
    sched = Scheduler([tts.engine] * 2, llm_batch=4)
    got_chunk = threading.Event()
    events = []

    def on_victim(kind, value):
        events.append((kind, value))
        if kind == "chunk":
            got_chunk.set()

    try:
        cancel = threading.Event()
        hv = sched.submit(victim, cancel=cancel, callback=on_victim)
        handles = [sched.submit(r) for r in reqs]
        assert got_chunk.wait(120)
        hv.cancel()
        got = [_collect(h) for h in handles]
        stats = sched.batch_stats[0]
    finally:
        sched.close()
    for g, a in zip(got, alone):
        _assert_same(g, a)
    kind, value = events[-1]
    assert kind == "error" and isinstance(value, SynthesisCancelled)
    assert stats["max_rows"] >= 2 and stats["rows"] == 0


def test_lone_request_keeps_its_own_session(tts):
    req = _requests(tts)[1]
    sched = Scheduler([tts.engine] * 2, llm_batch=4)
    try:
        got = _collect(sched.submit(req))
        stats = sched.batch_stats[0]
    finally:
        sched.close()
    _assert_same(got, _alone(tts, req))
    assert stats["steps"] == 0 and stats["occupancy"] == {}


def test_batching_is_off_unless_asked(tts):
    sched = Scheduler([tts.engine])
    try:
        assert sched.batch_stats == [None]
    finally:
        sched.close()
    with pytest.raises(ValueError):
        Scheduler([tts.engine], llm_batch=0)


def test_synthesizer_llm_batch_option(tts):
    from cosyvino import Synthesizer

    with pytest.raises(InputError):
        Synthesizer.from_stages(tts.stages, llm_batch=0)
    s = Synthesizer.from_stages(tts.stages, llm_batch=4)
    assert s.llm_batch == 4 and s.llm_batch_stats == []
    reqs = _requests(tts)[:2]
    got = [_collect(h) for h in [s.submit(r) for r in reqs]]
    for g, r in zip(got, reqs):
        _assert_same(g, _alone(tts, r))
    (stats,) = s.llm_batch_stats
    assert stats["steps"] > 0
    assert tts.llm_batch == 1


def test_failing_batch_step_fails_its_rows_and_the_scheduler_goes_on(tts, monkeypatch):
    from cosyvino.errors import BackendError

    real = tts.stages.new_llm_batch

    class Failing:
        """A backend batch whose third step raises."""

        def __init__(self):
            self.inner, self.n = real(), 0

        def __getattr__(self, name):
            return getattr(self.inner, name)

        def __len__(self):
            return len(self.inner)

        def step(self, x):
            self.n += 1
            if self.n == 3:
                raise BackendError("boom")
            return self.inner.step(x)

    monkeypatch.setattr(tts.stages, "new_llm_batch", Failing)
    reqs = _requests(tts)[:3]
    sched = Scheduler([tts.engine] * 2, llm_batch=4)
    try:
        handles = [sched.submit(r) for r in reqs]
        failed = 0
        for h in handles:
            try:
                list(h)
            except BackendError as e:
                assert "boom" in str(e)
                failed += 1
        assert failed >= 2  # every row of the failing step
        monkeypatch.setattr(tts.stages, "new_llm_batch", real)
        _assert_same(_collect(sched.submit(reqs[1])), _alone(tts, reqs[1]))
    finally:
        sched.close()
