"""The engine (issue 13): requests, indexed random draws, programs stepped whole / streamed /
scheduled giving the same audio for a seed, cancellation between steps, families by hook."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cosyvino.audio import join_chunks
from cosyvino.engine import Phase, RandomDraws, Scheduler
from cosyvino.errors import (
    EmptyTextError,
    InputError,
    ModelDirError,
    SynthesisCancelled,
    UnknownSpeakerError,
)
from cosyvino.families import detect_family, family_classes, get_family
from cosyvino.request import StreamingOptions, SynthesisRequest
from cosyvino.voices import Voice

TEXT = ("今天天气很好，我们一起去公园散步吧。" * 3
        + "Hello there, how are you today? I hope everything is going well with you and your "
          "family. " * 2)  # three text segments


@pytest.fixture(scope="module")
def tts(tiny_model_dir):
    from cosyvino import Synthesizer

    return Synthesizer(str(tiny_model_dir), backend="torch")


# ---- random draws ---------------------------------------------------------------------------
def test_draws_do_not_depend_on_chunking():
    d = RandomDraws(11)
    whole = d.flow_noise(0, 80, 700)
    parts = np.concatenate([d.flow_noise(0, 80, 100, start=0), d.flow_noise(0, 80, 300, 100),
                            d.flow_noise(0, 80, 300, 400)], axis=2)
    assert whole.shape == (1, 80, 700) and whole.dtype == np.float32
    np.testing.assert_array_equal(whole, parts)
    phase, noise = d.nsf(2, 9, 40000)
    phase2, tail = d.nsf(2, 9, 10000, start=30000)
    np.testing.assert_array_equal(phase, phase2)
    np.testing.assert_array_equal(noise[..., 30000:], tail)
    assert phase[0, 0] == 0.0 and np.all(np.abs(phase) <= np.pi)


def test_draws_are_indexed_by_seed_segment_and_position():
    a, b = RandomDraws(1), RandomDraws(2)
    assert not np.array_equal(a.flow_noise(0, 80, 10), b.flow_noise(0, 80, 10))
    assert not np.array_equal(a.flow_noise(0, 80, 10), a.flow_noise(1, 80, 10))
    # the sampling generator of token i does not depend on draws made for token i-1
    g1 = a.sampling(0, 5).random(3)
    a.sampling(0, 4).random(100)
    np.testing.assert_array_equal(g1, a.sampling(0, 5).random(3))
    with pytest.raises(ValueError):
        RandomDraws(-1)


# ---- requests -------------------------------------------------------------------------------
def test_request_validation(tts):
    modes, voices = tts.engine.modes, tts.engine.voices
    ok = SynthesisRequest("你好", tts.speakers[0]).validated(modes=modes, voices=voices)
    assert isinstance(ok.voice, Voice) and ok.voice.builtin and isinstance(ok.seed, int)
    with pytest.raises(UnknownSpeakerError):
        SynthesisRequest("你好", "nobody").validated(modes=modes, voices=voices)
    with pytest.raises(InputError, match="mode 'instruct' is not supported"):
        SynthesisRequest("你好", tts.speakers[0], mode="instruct", instruction="x").validated(
            modes=modes, voices=voices)
    with pytest.raises(InputError, match="instruction is not used by mode 'sft'"):
        SynthesisRequest("你好", tts.speakers[0], instruction="slowly").validated(
            modes=modes, voices=voices)
    with pytest.raises(InputError, match="speed"):
        SynthesisRequest("你好", tts.speakers[0], speed=9).validated(modes=modes, voices=voices)
    with pytest.raises(InputError, match="seed"):
        SynthesisRequest("你好", tts.speakers[0], seed=-3).validated(modes=modes, voices=voices)
    with pytest.raises(InputError, match="hop_schedule"):
        SynthesisRequest("你好", tts.speakers[0],
                         streaming=StreamingOptions("tokens")).validated(modes=modes,
                                                                          voices=voices)
    with pytest.raises(EmptyTextError):
        tts.engine.start(SynthesisRequest("   ", tts.speakers[0]))


def test_voice_object_equals_builtin_speaker(tts):
    spk = tts.speakers[1]
    v = Voice("mine", tts.stages.speakers[spk])
    a = tts.synthesize("你好。", v, seed=4)
    b = tts.synthesize("你好。", spk, seed=4)
    np.testing.assert_array_equal(a.samples, b.samples)


# ---- one seed, one audio ----------------------------------------------------------------------
SEGMENT = StreamingOptions("segment")


def _by_hand(tts, request):
    """The request's chunks stepping its program in this thread (lane by lane, no scheduler)."""
    state = tts.engine.start(request)
    phases, chunks = set(), []
    while not state.done:
        phases.add(state.program.phase)
        chunks += tts.engine.step(state)
    return phases, chunks


def test_same_seed_same_audio_whole_streamed_engine_and_scheduled(tts):
    spk = tts.speakers[0]
    whole = tts.synthesize(TEXT, spk, seed=21)
    assert whole.stats["segments"] == 3 and whole.stats["seed"] == 21
    streamed = list(tts.stream(TEXT, spk, seed=21, hop_schedule="segment"))
    np.testing.assert_array_equal(join_chunks(streamed, tts.sample_rate), whole.samples)
    phases, chunks = _by_hand(tts, SynthesisRequest(TEXT, spk, seed=21, streaming=SEGMENT))
    assert {Phase.PREFILL, Phase.DECODE, Phase.FLOW, Phase.VOCODER} <= phases
    np.testing.assert_array_equal(join_chunks(chunks, tts.sample_rate), whole.samples)
    # interleaved with another request on the scheduler (steps alternate between them)
    h1 = tts.submit(SynthesisRequest(TEXT, spk, seed=21, streaming=SEGMENT))
    h2 = tts.submit(SynthesisRequest("再见。", tts.speakers[2], seed=5, streaming=SEGMENT))
    got1, got2 = list(h1), list(h2)
    np.testing.assert_array_equal(join_chunks(got1, tts.sample_rate), whole.samples)
    np.testing.assert_array_equal(got2[0].samples,
                                  tts.synthesize("再见。", tts.speakers[2], seed=5).samples)
    assert h1.total == whole.stats["segments"]


@pytest.mark.parametrize("schedule", ["latency", "official"])
def test_token_hops_same_audio_however_stepped(tts, schedule):
    """A token-hop stream: several chunks per segment, the same samples and tokens whether the
    lanes overlap on worker threads, run by hand in one thread, or interleave with another
    request; the tokens equal the whole-segment run's (the LLM does not depend on hops)."""
    spk = tts.speakers[0]
    n = 130  # forced tokens per segment: several hops of either schedule
    req = SynthesisRequest(TEXT, spk, seed=3, num_speech_tokens=n,
                           streaming=StreamingOptions(schedule))
    streamed = list(tts.stream(req))
    _, by_hand = _by_hand(tts, req)
    other = tts.submit(SynthesisRequest("再见。", tts.speakers[2], seed=5))
    mixed = list(tts.submit(req))
    list(other)
    for got in (by_hand, mixed):
        assert len(got) == len(streamed)
        for x, y in zip(streamed, got):
            np.testing.assert_array_equal(x.samples, y.samples)
    segs = [c.stats["segment"] for c in streamed]
    assert segs == sorted(segs) and set(segs) == {0, 1, 2}
    for s in range(3):
        mine = [c for c in streamed if c.stats["segment"] == s]
        assert len(mine) >= 2, "a 130-token segment is several hops"
        assert [c.stats["chunk"] for c in mine] == list(range(len(mine)))
        assert [c.stats["is_last_in_segment"] for c in mine] == [False] * (len(mine) - 1) + [True]
        assert sum(c.speech_tokens.size for c in mine) == n
    whole = tts.synthesize(req.text, spk, seed=3, num_speech_tokens=n)
    np.testing.assert_array_equal(np.concatenate([c.speech_tokens for c in streamed]),
                                  whole.speech_tokens)
    # same length of audio as the whole-segment run, up to the hops' frame rounding
    total = sum(c.samples.size for c in streamed)
    assert abs(total - whole.samples.size) <= 256 * 3 * 4


def test_latency_schedule_first_chunk_after_few_tokens(tts):
    """The first chunk of the latency schedule is emitted once 14 tokens are decoded (hop 10 +
    overlap 4), while the LLM still has the rest of the segment to decode."""
    req = SynthesisRequest("你好，世界。", tts.speakers[0], seed=1, num_speech_tokens=100)
    state = tts.engine.start(req)
    while True:
        out = tts.engine.step(state)
        if out:
            break
    assert len(state.program.tokens) == 14
    assert out[0].speech_tokens.size == 10 and out[0].stats["chunk"] == 0
    state.cancel.set()
    with pytest.raises(SynthesisCancelled):
        tts.engine.step(state)


def test_cancel_stops_a_flow_hop_between_estimator_calls(tts):
    """Cancellation reaches the flow within one estimator call (not after the whole ODE)."""
    req = SynthesisRequest(speech_tokens=np.arange(60), voice=tts.speakers[0], seed=0,
                           streaming=SEGMENT)
    state = tts.engine.start(req)
    calls = []
    real = tts.stages.estimate

    def estimate(*a):
        calls.append(1)
        if len(calls) == 2:
            state.cancel.set()
        return real(*a)

    tts.stages.estimate = estimate
    try:
        with pytest.raises(SynthesisCancelled):
            while not state.done:
                tts.engine.step(state)
    finally:
        del tts.stages.estimate
    assert len(calls) == 2


def test_unseeded_request_records_its_seed_and_replays(tts):
    a = tts.synthesize("你好。", tts.speakers[0])
    b = tts.synthesize("你好。", tts.speakers[0], seed=a.stats["seed"])
    np.testing.assert_array_equal(a.samples, b.samples)


def test_scheduler_on_two_engines_matches_one(tts):
    sched = Scheduler([tts.engine, tts.engine])
    try:
        handles = [sched.submit(SynthesisRequest("你好，世界。", tts.speakers[i], seed=i))
                   for i in range(3)]
        outs = [np.concatenate([c.samples for c in h]) for h in handles]
    finally:
        sched.close()
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(
            out, tts.synthesize("你好，世界。", tts.speakers[i], seed=i).samples)


def _a_then_b(sched, a_request, b_request, on_chunk=None):
    """Submit A to ``sched``; when A delivers its first chunk, submit B. Waits for both to end
    and closes ``sched``. ``on_chunk(name)`` runs at every chunk before B is submitted.
    Returns (events [(name, kind)], samples per name)."""
    events, out, done = [], {"A": [], "B": []}, threading.Event()

    def on(name):
        def callback(kind, value):
            events.append((name, kind))
            if kind == "chunk":
                out[name].append(value.samples)
                if on_chunk is not None:
                    on_chunk(name)
                if name == "A" and len(out["A"]) == 1:
                    sched.submit(b_request, callback=on("B"))
            elif sum(k != "chunk" for _, k in events) == 2:
                done.set()
        return callback

    try:
        sched.submit(a_request, callback=on("A"))
        assert done.wait(300)
    finally:
        sched.close()
    assert ("A", "error") not in events and ("B", "error") not in events
    return events, out


@pytest.mark.parametrize("priority", [True, False])
def test_first_chunk_priority_serves_a_new_request_before_a_streaming_one(tts, priority):
    """One worker; B arrives when A (three segments, streamed by the latency schedule) has
    delivered its first chunk. With first-chunk priority every step of B runs before A's next
    chunk; first come, first served interleaves them, so A delivers more chunks first. The
    audio of both is the same either way."""
    # B's one chunk needs 80 decode steps: long enough for A's next hops when they alternate
    b_request = SynthesisRequest("你好，世界。", tts.speakers[1], seed=2, num_speech_tokens=80,
                                 streaming=StreamingOptions("segment"))
    sched = Scheduler([tts.engine], lane_workers=0, first_chunk_priority=priority,
                      first_chunk_hold=False)
    events, out = _a_then_b(sched, SynthesisRequest(TEXT, tts.speakers[0], seed=1,
                                                    streaming=StreamingOptions("latency")),
                            b_request)
    a_chunks_before_b = [e for e in events[:events.index(("B", "chunk"))] if e == ("A", "chunk")]
    if priority:
        assert len(a_chunks_before_b) == 1
    else:
        assert len(a_chunks_before_b) > 1
    np.testing.assert_array_equal(np.concatenate(out["B"]),
                                  tts.synthesize(b_request).samples)
    assert len(out["A"]) > 3


class _CountingEngine:
    """An engine that records which request each finished step belonged to."""

    def __init__(self, engine):
        self._engine, self.ended = engine, []

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def step(self, state, lane=None, **kw):
        out = self._engine.step(state, lane, **kw)
        self.ended.append(state.request.seed)
        return out


@pytest.mark.parametrize("hold", [True, False])
def test_first_chunk_hold_stops_streaming_steps_while_a_new_request_starts(tts, hold):
    """Two workers, so A (streaming, seed 1) and B (new, seed 2) step at once. B arrives when A
    has delivered its first chunk. With the first-chunk hold A's steps wait while B makes its
    chunk: at most the step A was in when B arrived ends first. Without it A keeps stepping
    beside B. The audio of both is the same either way."""
    b_request = SynthesisRequest("你好，世界。", tts.speakers[1], seed=2, num_speech_tokens=80,
                                 streaming=StreamingOptions("segment"))
    a_request = SynthesisRequest(TEXT, tts.speakers[0], seed=1,
                                 streaming=StreamingOptions("latency"))
    engine = _CountingEngine(tts.engine)
    marks = {}

    def on_chunk(name):
        if name == "A" and "b_submitted" not in marks:
            marks["b_submitted"] = len(engine.ended)
        if name == "B":
            marks["b_chunk"] = len(engine.ended)

    sched = Scheduler([engine, engine], lane_workers=0, first_chunk_hold=hold, max_hold_s=60.0)
    _, out = _a_then_b(sched, a_request, b_request, on_chunk)
    stats = sched.hold_stats
    a_steps_beside_b = engine.ended[marks["b_submitted"]:marks["b_chunk"]].count(1)
    b_steps = engine.ended[marks["b_submitted"]:marks["b_chunk"]].count(2)
    assert b_steps > 80  # prefill, 80 decode steps, flow, vocoder (the chunk's step ends after)
    if hold:
        assert a_steps_beside_b <= 1
        assert stats["held_now"] == 0
    else:
        assert a_steps_beside_b > 10
        assert stats == {"holds": 0, "held_seconds": 0.0, "held_now": 0}
    np.testing.assert_array_equal(np.concatenate(out["B"]), tts.synthesize(b_request).samples)
    np.testing.assert_array_equal(np.concatenate(out["A"]),
                                  np.concatenate([c.samples for c in tts.stream(a_request)]))


def test_a_held_step_reaches_its_cancellation(tts):
    """A step held for a new request still stops when its request is cancelled (the hold
    looks at the cancel event while it waits)."""
    from cosyvino.engine.scheduler import _StepHold

    sched = Scheduler([tts.engine], lane_workers=0, first_chunk_hold=True, max_hold_s=60.0)
    try:
        holder = sched.submit(SynthesisRequest("你好，世界。", tts.speakers[1], seed=2,
                                               num_speech_tokens=400,
                                               streaming=StreamingOptions("segment")))
        state = tts.engine.start(SynthesisRequest("你好。", tts.speakers[0], seed=1))
        held = type(holder)(state)
        held.chunks = 1
        group = next(iter(sched._groups.values()))
        hold = _StepHold(sched, group, held)
        assert hold.needed()  # the holder has a step running or queued
        threading.Timer(0.2, held.cancel).start()
        with pytest.raises(SynthesisCancelled):
            tts.engine.step(state, hold=hold)
        holder.cancel()
    finally:
        sched.close()
    assert sched.hold_stats["holds"] == 1


def test_scheduler_rejects_bad_hold_settings(tts):
    for bad in (0, -1, float("nan"), "2", True):
        with pytest.raises(ValueError, match="max_hold_s"):
            Scheduler([tts.engine], max_hold_s=bad)
    with pytest.raises(ValueError, match="first_chunk_hold must be True or False"):
        Scheduler([tts.engine], first_chunk_hold="no")
    with pytest.raises(ValueError, match="first_chunk_priority"):
        Scheduler([tts.engine], first_chunk_priority=None)


def test_synthesizer_first_chunk_hold_option(tts):
    from cosyvino import Synthesizer

    with pytest.raises(InputError, match="first_chunk_hold"):
        Synthesizer.from_stages(tts.stages, first_chunk_hold="no")
    s = Synthesizer.from_stages(tts.stages, max_parallel=2, first_chunk_hold=False)
    assert s.hold_stats == {"holds": 0, "held_seconds": 0.0, "held_now": 0}
    list(s.submit(SynthesisRequest("你好。", tts.speakers[0], seed=1)))
    assert s._scheduler.first_chunk_hold is False and s.hold_stats["held_now"] == 0
    assert tts.first_chunk_hold is True  # the default


# ---- cancellation ----------------------------------------------------------------------------
def test_cancel_stops_between_steps_and_closes_the_session(tts):
    cancel = threading.Event()
    state = tts.engine.start(SynthesisRequest(TEXT, tts.speakers[0], seed=1), cancel)
    tts.engine.step(state)  # prefill
    assert state.program.phase is Phase.DECODE and state.program._session is not None
    cancel.set()
    with pytest.raises(SynthesisCancelled):
        tts.engine.step(state)
    assert state.program._session is None


def test_cancelled_scheduled_request_reports_cancelled(tts):
    cancel = threading.Event()
    cancel.set()
    h = tts.submit(SynthesisRequest(TEXT, tts.speakers[0], seed=1), cancel=cancel)
    with pytest.raises(SynthesisCancelled):
        list(h)


def test_bad_request_raises_at_submit(tts):
    with pytest.raises(UnknownSpeakerError):
        tts.submit(SynthesisRequest("你好", "nobody"))


# ---- families --------------------------------------------------------------------------------
def test_builtin_family_registered_through_the_hook(tiny_model_dir):
    assert "cosyvoice1" in family_classes()
    fam = detect_family(tiny_model_dir)
    assert fam is get_family("cosyvoice1")
    table = fam.graphs(fam.read_config(str(tiny_model_dir)))
    assert list(table) == ["text_encoder", "llm", "flow_encoder", "length_regulator",
                           "estimator", "hift_f0", "hift_source", "hift_decode"]
    assert table.components == ["llm", "flow", "vocoder"]
    llm = table["llm"]
    layers = fam.read_config(str(tiny_model_dir)).llm.llm.num_blocks
    assert [t.name for t in llm.data_inputs] == ["inputs_embeds", "attention_mask", "pos_offset",
                                                 *(f"pos_keys.{i}" for i in range(layers))]
    assert len(llm.state) == 2 * fam.read_config(str(tiny_model_dir)).llm.llm.num_blocks
    with pytest.raises(ModelDirError, match="unknown model family"):
        get_family("nope")


def test_synthesizer_without_model_dir_does_not_write_a_default(tmp_path, monkeypatch):
    from cosyvino import Synthesizer

    target = tmp_path / "default"
    monkeypatch.setenv("COSYVINO_MODEL_DIR", str(target))
    with pytest.raises(ModelDirError, match="make-model"):
        Synthesizer()
    assert not target.exists()


def test_mode_inputs_reach_the_mode_builders(tts, monkeypatch):
    """A mode's builders get the validated request (its mode inputs) and the tokenizer: what a
    new mode needs (docs/architecture.md, "Where things go")."""
    from cosyvino.families.base import Mode
    from cosyvino.families.cosyvoice1 import modes as v1_modes

    seen = {}

    def prefix(request, tokenize):
        seen["instruction"] = request.instruction
        seen["tokens"] = tokenize(request.instruction)
        return v1_modes.LLMPrefix(embedding=None,
                                  prompt_text_token=np.asarray([seen["tokens"]], np.int64))

    monkeypatch.setitem(v1_modes.MODES, "say", Mode("say", needs_instruction=True))
    monkeypatch.setitem(v1_modes.BUILDERS, "say", (prefix, v1_modes.BUILDERS["sft"][1]))
    assert "say" in tts.modes
    with pytest.raises(InputError, match="mode 'say' needs instruction"):
        tts.synthesize("你好。", tts.speakers[0], mode="say")
    a = tts.synthesize("你好。", tts.speakers[0], mode="say", instruction="calm", seed=2)
    b = tts.synthesize("你好。", tts.speakers[0], mode="say", instruction="loud", seed=2)
    assert seen["instruction"] == "loud" and seen["tokens"] == tts.frontend.tokenize("loud")
    assert a.samples.size and not np.array_equal(a.samples, b.samples)
    with pytest.raises(TypeError):
        tts.synthesize("你好。", tts.speakers[0], style="x")


def test_official_hops_on_a_short_segment_equal_the_whole_segment(tts):
    """Fewer tokens than one official hop + overlap (120): the official streaming runs one
    final hop, which is the whole-segment computation: same draws, same audio."""
    spk = tts.speakers[1]
    a = tts.synthesize("你好。", spk, seed=8, num_speech_tokens=90, hop_schedule="official")
    b = tts.synthesize("你好。", spk, seed=8, num_speech_tokens=90)
    assert a.stats["chunks"] == 1
    np.testing.assert_allclose(a.samples, b.samples, atol=1e-6)


def test_engine_official_hops_replay_the_algorithm(tts):
    """The engine's official schedule is OfficialTokenHopStream fed the request's draws:
    replaying the same noise/source through the algorithm gives the same chunks."""
    from cosyvino.families.cosyvoice1.length_regulation import mel_frames_for_tokens
    from cosyvino.families.cosyvoice1.official_stream import (OfficialTokenHopStream,
                                                              StreamConstants, hop_windows)

    spk = tts.speakers[0]
    tokens = np.random.default_rng(0).integers(0, 4096, 250)
    req = SynthesisRequest(speech_tokens=tokens, voice=spk, seed=6,
                           streaming=StreamingOptions("official"))
    chunks = list(tts.submit(req))
    draws, cfg = RandomDraws(6), tts.config
    st = OfficialTokenHopStream(tts.stages, tts.stages.speakers[spk])
    frames = lambda n: mel_frames_for_tokens(n, token_rate=cfg.flow.input_frame_rate,  # noqa
                                             sample_rate=cfg.sample_rate,
                                             hop=cfg.hift.hop_length)
    pos, h = 0, cfg.hift
    windows = hop_windows(tokens.size, StreamConstants())
    assert len(windows) == len(chunks) == 3
    for (a, b, fin), chunk in zip(windows, chunks):
        noise = draws.flow_noise(0, 80, frames(b - a), start=frames(a))
        mel = st.flow_hop(tokens[a:b], fin, noise=noise)
        phase, nsf = draws.nsf(0, h.nb_harmonics + 1, h.hop_length * mel.shape[-1],
                               start=pos * h.hop_length)
        source = tts.stages.vocoder_source(tts.stages.vocoder_f0(mel), phase, nsf)
        np.testing.assert_array_equal(st.vocoder_hop(source), chunk.samples)
        pos += mel.shape[-1] - StreamConstants().mel_cache_len


@pytest.mark.parametrize("n", [1, 50, 119, 120, 121, 220, 250, 301, 777])
def test_token_hop_policy_matches_the_official_windows_token_by_token(n):
    """Asking the policy after every token (as the LLM lane does) gives the official windows of
    the whole utterance (upstream CosyVoiceModel.tts), each hop once, in order."""
    from cosyvino.families.cosyvoice1.official_stream import StreamConstants, hop_windows
    from cosyvino.families.cosyvoice1.streaming import LATENCY, policy

    for name, constants in (("official", StreamConstants()), ("latency", LATENCY)):
        p = policy(name)
        got = []
        for i in range(1, n + 1):
            got += p.due(i, finished=False)
        got += p.due(n, finished=True)
        assert p.due(n, finished=True) == []
        assert [(h.start, h.stop, h.finalize) for h in got] == hop_windows(n, constants)
    # the latency schedule: first hop 10 (+4 overlap), then doubling up to 200
    assert hop_windows(500, LATENCY) == [
        (0, 14, False), (10, 34, False), (30, 74, False), (70, 154, False), (150, 314, False),
        (310, 500, True)]


def test_first_chunk_gets_the_cores_then_the_lanes_overlap(tts):
    """Until the first chunk is out, a due hop holds the LLM lane back (time to first audio);
    afterwards both lanes are offered together (overlap)."""
    state = tts.engine.start(SynthesisRequest("你好，世界。", tts.speakers[0], seed=2,
                                              num_speech_tokens=100))
    prog = state.program
    assert prog.ready_lanes() == ("llm",)
    while prog.ready_lanes() == ("llm",):
        tts.engine.step(state, "llm")
    assert prog.ready_lanes() == ("audio",) and len(prog.tokens) == 14  # hop 10 + overlap 4
    out = []
    while not out:
        out = tts.engine.step(state, "audio")
    assert prog.ready_lanes() == ("llm",)  # nothing due yet, the LLM goes on
    while prog.ready_lanes() == ("llm",):
        tts.engine.step(state, "llm")
    assert prog.ready_lanes() == ("audio", "llm")  # the second hop overlaps decoding
    state.cancel.set()
    prog.close()


def test_chunks_say_which_mode_and_schedule_ran(tts):
    chunk = next(iter(tts.stream("你好。", tts.speakers[0], seed=1, num_speech_tokens=10)))
    assert chunk.stats["mode"] == "sft" and chunk.stats["hop_schedule"] == "latency"


def test_voice_keyword_is_another_name_of_speaker(tts):
    a = tts.synthesize("你好。", tts.speakers[0], seed=3, num_speech_tokens=10)
    b = tts.synthesize("你好。", voice=tts.speakers[0], seed=3, num_speech_tokens=10)
    np.testing.assert_array_equal(a.samples, b.samples)
    with pytest.raises(TypeError, match="not both"):
        tts.request("你好。", tts.speakers[0], voice=tts.speakers[1])


def test_stage_stats_count_estimator_calls_in_every_schedule(tts):
    """``flow_estimator`` calls are estimator calls (Euler steps), streamed or not, and a
    streamed hop reports its flow encoder apart: the latency schedule's first hop solves in
    its 3 steps, later hops in the model's 10."""
    spk = tts.speakers[0]
    whole = tts.synthesize("你好，世界。", spk, seed=1, num_speech_tokens=40)
    st = whole.stats["stages"]
    assert st["flow_estimator"]["calls"] == 10 and st["flow_encoder"]["calls"] == 1
    with tts.stream("你好，世界。", spk, seed=1, num_speech_tokens=40) as s:
        chunks = list(s)
    assert len(chunks) >= 2
    first, second = chunks[0].stats["stages"], chunks[1].stats["stages"]
    assert first["flow_estimator"]["calls"] == 3 and first["flow_encoder"]["calls"] == 1
    assert second["flow_estimator"]["calls"] == 10 and second["flow_encoder"]["calls"] == 1
