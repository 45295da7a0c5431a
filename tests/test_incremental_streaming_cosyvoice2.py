"""The incremental CosyVoice2 flow wired into streaming (issue 36 item 1), on tiny-c through the
public API: ``Synthesizer.stream(..., flow_streaming=..., final_hop=...)`` on the torch backend.

Reference: the same request with ``flow_streaming="official"`` (every hop re-runs the flow over
all tokens so far; itself checked against stream.pt in test_cosyvoice2_family.py). Per hop the
incremental flow's mel equals the re-run's within 1e-4 (checked here at the hop level on the
stages, FlowHops with and without the stream); the waveform within the HiFT-amplified 1e-3 of
test_cosyvoice2_family.py. With ``final_hop="official"`` the last hop IS the re-run; with
``"incremental"`` only the last chunk may differ. Also: the ``segment`` schedule and one-hop
segments stay the non-streaming computation, concurrent streams equal alone (one chunk state
per request), chunk stats, typed errors for bad options, and cancellation between ODE steps.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_C

from cosyvino import Synthesizer
from cosyvino.errors import InputError, SynthesisCancelled
from cosyvino.families.cosyvoice2.streaming import policy
from cosyvino.families.cosyvoice2.token2wav import Token2Wav
from cosyvino.plugins import get_backend

TEXT = "Hello world, this is a test."
#: mel of a hop: the parity tests' tolerance (tests/test_incremental_flow_cosyvoice2.py)
MEL_TOL = 1e-4
#: waveform: HiFT amplifies a 1e-6 mel change to ~1e-4 samples (test_cosyvoice2_family.py)
WAV_TOL = 1e-3
#: forced tokens per segment: hops 25 + pad, 50, 100 and a final one
N_TOKENS = 260


@pytest.fixture(scope="module")
def tts():
    t = Synthesizer(TINY_C, backend="torch", voices_dir=False)
    yield t
    t.close()


@pytest.fixture(scope="module")
def stages():
    st = get_backend("torch").load(str(TINY_C))
    yield st
    st.close()


def _stream(tts, voice, **kw):
    kw.setdefault("hop_schedule", "official")
    return list(tts.stream(TEXT, voice, seed=3, num_speech_tokens=N_TOKENS, **kw))


def _maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.fixture(scope="module")
def official(tts):
    return {v: _stream(tts, v, flow_streaming="official") for v in ("中文女", "alice")}


@pytest.mark.parametrize("voice", ["中文女", "alice"])  # no prompt; a 20-token prompt
def test_streamed_incremental_chunks_equal_official(tts, official, voice):
    want = official[voice]
    got = _stream(tts, voice, flow_streaming="incremental")
    assert len(got) == len(want) >= 4
    assert [c.stats["flow_streaming"] for c in want] == ["official"] * len(want)
    assert [c.stats["flow_streaming"] for c in got] == \
        ["incremental"] * (len(got) - 1) + ["official"]  # final_hop="official": the re-run
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.speech_tokens, w.speech_tokens)
        assert g.samples.shape == w.samples.shape
        assert _maxabs(g.samples, w.samples) < WAV_TOL
        assert "streaming_fallback" not in g.stats
    # the first hop computes the same tokens the same way: bit-equal
    np.testing.assert_array_equal(got[0].samples, want[0].samples)


def test_auto_is_incremental_on_torch_and_latency_schedule(tts, official):
    got = _stream(tts, "alice", hop_schedule="latency")  # defaults: auto, final official
    assert [c.stats["flow_streaming"] for c in got] == \
        ["incremental"] * (len(got) - 1) + ["official"]
    want = official["alice"]
    assert [c.samples.size for c in got] == [c.samples.size for c in want]
    assert max(_maxabs(g.samples, w.samples) for g, w in zip(got, want)) < WAV_TOL


def test_final_hop_incremental_changes_only_the_last_chunk(tts, official):
    want = official["alice"]
    got = _stream(tts, "alice", flow_streaming="incremental", final_hop="incremental")
    assert [c.stats["flow_streaming"] for c in got] == ["incremental"] * len(got)
    assert [c.samples.size for c in got] == [c.samples.size for c in want]
    for g, w in zip(got[:-1], want[:-1]):
        assert _maxabs(g.samples, w.samples) < WAV_TOL
    # chunk-causal instead of full attention: a real (documented) difference in the last one
    assert _maxabs(got[-1].samples, want[-1].samples) > 10 * WAV_TOL


@pytest.mark.parametrize("voice", ["中文女", "alice"])
def test_each_hop_mel_equals_the_rerun(stages, voice):
    """FlowHops with the incremental stream vs without, hop by hop on the same stages: the new
    frames within 1e-4; final_hop="official" is the re-run itself (bit-equal); "incremental"
    differs by the documented final-hop distance (docs/performance.md)."""
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, stages.config.flow.vocab_size, 230)
    if voice == "alice":
        v = stages.prompt_voices["alice"]
        n = min(v.prompt_mel.shape[0] // 2, v.prompt_speech_tokens.size)
        prompt = {"prompt_token": v.prompt_speech_tokens[:n], "prompt_feat": v.prompt_mel[:2 * n]}
        emb = v.embedding
    else:
        prompt, emb = {}, stages.speakers["中文女"]
    p = len(prompt.get("prompt_token", ()))
    hops = policy("official", p).due(tokens.size, finished=True)
    assert len(hops) >= 4
    ref = Token2Wav(stages, emb, **prompt)
    for final_hop in ("official", "incremental"):
        inc = Token2Wav(stages, emb, **prompt, final_hop=final_hop,
                        flow_stream=stages.new_flow_stream(emb, prompt.get("prompt_token"),
                                                           prompt.get("prompt_feat"), None))
        for hop in hops:
            got = inc.flow(tokens[:hop.stop], hop.start, hop.finalize)
            want = ref.flow(tokens[:hop.stop], hop.start, hop.finalize)  # stateless re-run
            assert got.shape == want.shape
            err = _maxabs(got, want)
            if not hop.finalize:
                assert inc.last_flow_mode == "incremental" and err < MEL_TOL, (hop, err)
            elif final_hop == "official":
                assert inc.last_flow_mode == "official" and err == 0.0
            else:
                assert inc.last_flow_mode == "incremental" and 1e-3 < err < 1.0
        assert inc.flow_stream is None  # chunk state dropped with the segment's last hop


def test_state_cap_hands_the_rest_of_the_segment_to_the_rerun(stages):
    """Past ``max_state_bytes`` the stream is dropped: later hops re-run officially (the same
    frames), so memory stays bounded and the mel does not change."""
    emb = stages.speakers["中文女"]
    tokens = np.random.default_rng(1).integers(0, stages.config.flow.vocab_size, 230)
    hops = policy("official", 0).due(tokens.size, finished=True)
    ref = Token2Wav(stages, emb)
    capped = Token2Wav(stages, emb, flow_stream=stages.new_flow_stream(emb, None, None, None),
                       final_hop="incremental", max_state_bytes=1)
    modes = []
    for hop in hops:
        got = capped.flow(tokens[:hop.stop], hop.start, hop.finalize)
        modes.append(capped.last_flow_mode)
        assert _maxabs(got, ref.flow(tokens[:hop.stop], hop.start, hop.finalize)) < MEL_TOL
    assert modes == ["incremental"] + ["official"] * (len(hops) - 1)
    assert capped.flow_stream is None


def test_one_hop_segments_and_the_segment_schedule_stay_official(tts):
    """A segment shorter than the first hop has one (final) hop: the non-streaming
    computation, whatever the options; the segment schedule too."""
    whole = tts.synthesize(TEXT, "alice", seed=4, num_speech_tokens=20)
    for schedule in ("official", "segment"):
        chunks = list(tts.stream(TEXT, "alice", seed=4, num_speech_tokens=20,
                                 hop_schedule=schedule, flow_streaming="incremental",
                                 final_hop="incremental"))
        assert len(chunks) == 1 and chunks[0].stats["flow_streaming"] == "official"
        np.testing.assert_array_equal(chunks[0].samples, whole.samples)


def test_concurrent_incremental_streams_equal_alone(official):
    """Two requests interleaved on two workers each keep their own chunk state."""
    t = Synthesizer(TINY_C, backend="torch", voices_dir=False, max_parallel=2)
    try:
        reqs = [t.request(TEXT, v, seed=3, num_speech_tokens=N_TOKENS, hop_schedule="official",
                          flow_streaming="incremental") for v in ("中文女", "alice")]
        handles = [t.submit(r) for r in reqs]
        got = [list(h) for h in handles]
    finally:
        t.close()
    for chunks, voice in zip(got, ("中文女", "alice")):
        want = official[voice]
        assert [c.stats["flow_streaming"] for c in chunks][:-1] == \
            ["incremental"] * (len(chunks) - 1)
        assert [c.samples.size for c in chunks] == [c.samples.size for c in want]
        assert max(_maxabs(g.samples, w.samples) for g, w in zip(chunks, want)) < WAV_TOL


@pytest.mark.parametrize("field, value", [("flow_streaming", "fast"), ("final_hop", "auto"),
                                          ("vocoder_streaming", 1)])
def test_bad_options_are_input_errors(tts, field, value):
    with pytest.raises(InputError, match=f"streaming.{field} must be one of"):
        tts.stream(TEXT, "alice", seed=1, **{field: value})


def test_cancel_stops_an_incremental_hop_between_ode_steps(tts):
    cancel = threading.Event()
    stream = tts.stream(TEXT, "alice", seed=3, num_speech_tokens=N_TOKENS,
                        hop_schedule="official", flow_streaming="incremental", cancel=cancel)
    first = next(stream)
    assert first.stats["flow_streaming"] == "incremental"
    cancel.set()
    with pytest.raises(SynthesisCancelled):
        list(stream)
