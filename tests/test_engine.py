"""The engine (issue 13): requests, indexed random draws, programs stepped whole / streamed /
scheduled giving the same audio for a seed, cancellation between steps, families by hook."""

from __future__ import annotations

import threading

import numpy as np
import pytest

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
    modes, voices = tts.family.modes, tts.engine.voices
    ok = SynthesisRequest("你好", tts.speakers[0]).validated(modes=modes, voices=voices)
    assert isinstance(ok.voice, Voice) and ok.voice.builtin and isinstance(ok.seed, int)
    with pytest.raises(UnknownSpeakerError):
        SynthesisRequest("你好", "nobody").validated(modes=modes, voices=voices)
    with pytest.raises(InputError, match="mode 'zero_shot' is not supported"):
        SynthesisRequest("你好", tts.speakers[0], mode="zero_shot").validated(
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
def test_same_seed_same_audio_whole_streamed_engine_and_scheduled(tts):
    spk = tts.speakers[0]
    whole = tts.synthesize(TEXT, spk, seed=21)
    assert whole.stats["segments"] == 3 and whole.stats["seed"] == 21
    streamed = list(tts.stream(TEXT, spk, seed=21))
    np.testing.assert_array_equal(np.concatenate([c.samples for c in streamed]), whole.samples)
    # stepping the program by hand through the engine
    state = tts.engine.start(SynthesisRequest(TEXT, spk, seed=21))
    phases, chunks = set(), []
    while not state.done:
        phases.add(state.program.phase)
        chunks += tts.engine.step(state)
    assert {Phase.PREFILL, Phase.DECODE, Phase.FLOW, Phase.VOCODER} <= phases
    np.testing.assert_array_equal(np.concatenate([c.samples for c in chunks]), whole.samples)
    # interleaved with another request on the scheduler (steps alternate between them)
    h1 = tts.submit(SynthesisRequest(TEXT, spk, seed=21))
    h2 = tts.submit(SynthesisRequest("再见。", tts.speakers[2], seed=5))
    got1, got2 = list(h1), list(h2)
    np.testing.assert_array_equal(np.concatenate([c.samples for c in got1]), whole.samples)
    np.testing.assert_array_equal(got2[0].samples,
                                  tts.synthesize("再见。", tts.speakers[2], seed=5).samples)
    assert h1.total == whole.stats["segments"]


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
    assert [t.name for t in llm.data_inputs] == ["inputs_embeds"]
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
