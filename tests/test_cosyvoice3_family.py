"""The CosyVoice3 family end to end on tiny-e (tests/fixtures/tiny-e, official goldens): family
detection and registration, the graph table's torch modules against the parts and the golden
tensors, synthesis through the engine on the torch backend (24 kHz, 2 mel frames per token, 480
samples per frame), determinism per seed, the v3 LLM text convention and silent-token filter,
the official v3 streaming against stream.pt, the table converted to ONNX run on ONNX Runtime
against torch, and ``cosyvino info`` / the HTTP server on the dir."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import TINY_A, TINY_C, TINY_E

from cosyvino import Synthesizer
from cosyvino.audio import join_chunks
from cosyvino.errors import InputError
from cosyvino.families import detect_family, get_family
from cosyvino.plugins import get_backend
from cosyvino.request import StreamingOptions, SynthesisRequest

TEXT = "Hello world, this is a test."
#: samples per speech token at 24 kHz: 2 mel frames x 480 samples (sheet v3 §2)
SAMPLES_PER_TOKEN = 960
#: fp32 tolerance of tensors vs the official goldens; the waveform's (HiFT amplifies)
ATOL, WAV_ATOL = 1e-4, 1e-3


def _golden(name):
    return torch.load(os.path.join(TINY_E, name), weights_only=False)


@pytest.fixture(scope="module")
def stages():
    st = get_backend("torch").load(str(TINY_E))
    yield st
    st.close()


@pytest.fixture(scope="module")
def tts():
    t = Synthesizer(str(TINY_E), backend="torch", voices_dir=False)
    yield t
    t.close()


def _maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


# ---- the family -------------------------------------------------------------------------------

def test_detected_and_registered_next_to_v1_and_v2():
    family = detect_family(TINY_E)
    assert family is get_family("cosyvoice3") and family.name == "cosyvoice3"
    assert detect_family(TINY_A).name == "cosyvoice1"
    assert detect_family(TINY_C).name == "cosyvoice2"
    cfg = family.read_config(str(TINY_E))
    assert cfg.sample_rate == 24000 and cfg.samples_per_frame == 480
    assert cfg.frames_per_token == 2 and cfg.llm.vocab_out == 6761
    table = family.graphs(cfg)
    assert list(table) == ["text_embedding", "speech_embedding", "llm", "flow_encoder",
                           "estimator", "hift_f0", "hift_source", "hift_decode"]
    assert table.components == ["llm", "flow", "vocoder"]
    assert family.speech_vocab(cfg) == 6561
    assert family.speakers(str(TINY_E)) == ["中文女"]


def test_decode_profile_of_the_full_size_llm():
    """Sheet v3 §8: 363.96 M weights per decode step (24 layers x 14,912,384 + final norm 896 +
    llm_decoder 6761 x 896 without bias); 6144 fp32 K/V values per position."""
    from types import SimpleNamespace

    from cosyvino.families.cosyvoice3.config import CosyVoice3LLMConfig
    from cosyvino.families.cosyvoice23.qwen2_config import Qwen2Config

    qwen = Qwen2Config(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                       num_key_value_heads=2, intermediate_size=4864, vocab_size=151936)
    llm = CosyVoice3LLMConfig(llm_input_size=896, llm_output_size=896, speech_token_size=6561,
                              qwen=qwen)
    profile = get_family("cosyvoice3").decode_profile(SimpleNamespace(llm=llm))
    assert profile.params == 24 * 14_912_384 + 896 + 6761 * 896 == 363_955_968
    assert profile.kv_bytes_per_position == 6144 * 4


# ---- graph modules vs the parts and the goldens -----------------------------------------------

def test_flow_graphs_equal_the_parts_calls(stages):
    """The tensor-input flow encoder (look-ahead scale) and DiT (chunk) give bit for bit what the
    parts' Python flags give, final and not, full and chunk attention."""
    from cosyvino.families.cosyvoice3.torch.graphs import (
        EstimatorGraph,
        FlowEncoderGraph,
    )
    from cosyvino.families.cosyvoice23.graph_specs import FULL_ATTENTION

    flow = stages.runner.model.flow
    g = _golden("golden.pt")["flow"]
    tokens, emb = g["speech_token"].long(), g["embedding"]
    enc = FlowEncoderGraph(flow)
    with torch.inference_mode():
        for finalize in (True, False):
            want = (flow.encode(tokens, None) if finalize else
                    flow.encode(tokens[:, :-3], tokens[:, -3:]))
            body, ctx = (tokens, torch.zeros(1, 3, dtype=torch.long)) if finalize else \
                (tokens[:, :-3], tokens[:, -3:])
            mu, spks = enc(body, ctx, torch.tensor([0.0 if finalize else 1.0]), emb)
            assert torch.equal(mu, want.transpose(1, 2)), finalize
            assert torch.equal(spks, flow.speaker(emb))
        est = EstimatorGraph(flow.decoder.estimator)
        ins = [g["estimator_in"][k] for k in ("x", "mask", "mu", "t", "spks", "cond")]
        for streaming in (False, True):
            chunk = flow.cfg.estimator.static_chunk_size if streaming else FULL_ATTENTION
            want = flow.decoder.estimator(*ins, streaming=streaming)
            assert torch.equal(est(*ins, torch.tensor([chunk])), want), streaming


def test_vocoder_stage_equals_the_generator_and_the_golden(stages):
    """The three vocoder graphs (f0 with zero look-ahead, source from the fixed table, decode
    with conv_pre's look-ahead as an input) give upstream's ``inference(mel, finalize)``."""
    h = _golden("golden.pt")["hift"]
    mel = h["mel"].numpy()
    hift, table = stages.runner.model.hift, stages.sine_waves()
    for finalize, key in ((True, "wav"), (False, "wav_not_final")):
        got = stages.vocoder(mel, finalize)
        want, _ = hift.inference(torch.from_numpy(mel), table, finalize)
        assert got.shape == tuple(want.shape) == tuple(h[key].shape)
        assert _maxabs(got, want) < 1e-6, finalize
        assert _maxabs(got, h[key]) < WAV_ATOL, finalize
    np.testing.assert_array_equal(table[:, :57600], h["sine_waves_head"].numpy())
    with pytest.raises(InputError, match="T >= 9"):
        stages.vocoder(mel[:, :, :8], False)


def test_stages_reproduce_the_flow_goldens(stages):
    from cosyvino.families.cosyvoice23.token2wav import FlowHops

    f = {k: v.numpy() for k, v in _golden("golden.pt")["flow"].items() if hasattr(v, "numpy")}
    assert np.array_equal(stages.cfm_noise()[:, :, :160], f["noise"])  # the fixed seed-0 draw
    tokens = f["speech_token"][0].astype(np.int64)
    mu, spks = stages.flow_encode(tokens[None], f["embedding"], finalize=True, streaming=False)
    assert _maxabs(mu[0].T[::2], f["pre_lookahead_out"][0]) < ATOL
    assert _maxabs(spks, f["spk_proj"]) < ATOL
    ins = [_golden("golden.pt")["flow"]["estimator_in"][k].numpy()
           for k in ("x", "mask", "mu", "t", "spks", "cond")]
    assert _maxabs(stages.estimate(*ins, streaming=False), f["estimator_out"]) < ATOL
    assert _maxabs(stages.estimate(*ins, streaming=True), f["estimator_out_streaming"]) < ATOL
    assert _maxabs(FlowHops(stages, f["embedding"]).flow(tokens, 0, True), f["mel"]) < ATOL
    not_final = FlowHops(stages, f["embedding"]).flow(tokens, 0, False)
    assert not_final.shape == (1, 80, 114) and _maxabs(not_final, f["mel_not_final"]) < ATOL
    prompted = FlowHops(stages, f["embedding"], prompt_token=f["prompt_speech_token"][0],
                        prompt_feat=f["prompt_feat"][0]).flow(tokens, 0, True)
    assert _maxabs(prompted, f["mel_with_prompt"]) < ATOL


# ---- official streaming vs stream.pt ----------------------------------------------------------

@pytest.mark.parametrize("case", ["plain", "prompt"])
def test_official_streaming_matches_stream_golden(stages, case):
    """The v2 hop schedule (25 + pad, 50, 100 tokens + 3 look-ahead; full attention last), the
    flow with the fixed noise and the causal vocoder re-run over the mel so far give the
    official chunks for the same tokens. The flow's fp32 rounding (~4e-6 on the mel) comes out
    of the HiFT up to ~1.2e-3 on a handful of samples: max 1.5e-3, and at most 0.1 % of the
    samples beyond 1e-3."""
    from cosyvino.families.cosyvoice2.streaming import policy
    from cosyvino.families.cosyvoice3.token2wav import Token2Wav3

    s = _golden("stream.pt")
    data = s if case == "plain" else s["prompt"]
    tokens = data["speech_tokens"].numpy()
    prompt = {} if case == "plain" else {
        "prompt_token": data["prompt_speech_token"].numpy()[0],
        "prompt_feat": data["prompt_feat"].numpy()[0]}
    hops = policy("official", len(prompt.get("prompt_token", ()))).due(len(tokens), True)
    assert [(h.start, h.stop, h.finalize) for h in hops] == \
        [(c["token_offset"], c["n_tokens"], c["finalize"]) for c in data["chunks"]]
    t2w = Token2Wav3(stages, s["embedding"].numpy(), **prompt)
    for hop, chunk in zip(hops, data["chunks"]):
        wav = t2w.vocoder(t2w.flow(tokens[:hop.stop], hop.start, hop.finalize), hop.finalize)
        want = chunk["speech"].numpy()[0]
        assert wav.shape == want.shape
        err = np.abs(wav.astype(np.float64) - want)
        assert err.max() < 1.5e-3 and np.mean(err > WAV_ATOL) < 1e-3, (hop, err.max())


# ---- the LLM text convention and the silent-token filter --------------------------------------

def test_system_prefix_goes_in_front_when_no_side_has_the_marker(tts):
    from cosyvino.families.cosyvoice3.modes import default_prefix_ids, segment_llm_text
    from cosyvino.families.cosyvoice23.tokenizer import END_OF_PROMPT_ID

    tok = tts.frontend.tokenize
    prefix = default_prefix_ids(tok)
    assert prefix[-1] == END_OF_PROMPT_ID  # "You are a helpful assistant.<|endofprompt|>"
    text = np.asarray([tok("Hello.")], np.int64)
    before = np.asarray([tok("A transcript.")], np.int64)
    got = segment_llm_text(text, before, prefix)[0].tolist()
    assert got == prefix.tolist() + before[0].tolist() + text[0].tolist()
    assert segment_llm_text(text, None, prefix)[0].tolist() == prefix.tolist() + text[0].tolist()
    marked = np.asarray([tok("You are a helpful assistant.<|endofprompt|>Hello.")], np.int64)
    assert segment_llm_text(marked, None, prefix)[0].tolist() == marked[0].tolist()
    instr = np.asarray([tok("You are a helpful assistant. Speak slowly.<|endofprompt|>")],
                       np.int64)
    assert segment_llm_text(text, instr, prefix)[0].tolist() == \
        instr[0].tolist() + text[0].tolist()


def test_silent_token_filter():
    from cosyvino.families.cosyvoice3.silence import SILENT_TOKENS, filter_silent_tokens

    assert SILENT_TOKENS == {1, 2, 28, 29, 55, 248, 494, 2241, 2242, 2322, 2323}
    run = [1, 2, 28, 29, 55, 248, 494]  # 7 silent in a row: the last 2 dropped
    assert filter_silent_tokens([7, *run, 9, 1, 2]) == [7, 1, 2, 28, 29, 55, 9, 1, 2]
    assert filter_silent_tokens([3, 4, 5]) == [3, 4, 5]


def test_program_gives_the_flow_the_filtered_tokens(tts, monkeypatch):
    """A segment whose LLM draws 8 silent tokens in a row: the flow (and the audio) get 5 of
    them; the LLM's history keeps all 8."""
    from cosyvino.families.cosyvoice3 import program as v3_program

    draws = iter([1] * 8 + [100, 101])
    seen = {}

    def fake_sample(self):
        try:
            token = next(draws)
        except StopIteration:
            token = self.config.llm.eos_token
        seen["llm"] = list(self.tokens)
        return token

    monkeypatch.setattr(v3_program.CosyVoice3Program, "_sample", fake_sample)
    a = tts.synthesize(TEXT, "中文女", seed=1)
    np.testing.assert_array_equal(a.speech_tokens, [1] * 5 + [100, 101])
    assert seen["llm"] == [1] * 8 + [100, 101]
    assert a.samples.size == SAMPLES_PER_TOKEN * 7


# ---- synthesis through the engine -------------------------------------------------------------

def test_sft_synthesis_at_24khz(tts):
    assert tts.family.name == "cosyvoice3" and tts.sample_rate == 24000
    assert tts.speakers == ["中文女"]
    assert tts.modes == ["zero_shot", "cross_lingual", "vc", "instruct2", "sft"]
    a = tts.synthesize(TEXT, "中文女", seed=3)
    assert a.sample_rate == 24000 and a.samples.dtype == np.float32
    assert a.samples.size == SAMPLES_PER_TOKEN * a.speech_tokens.size > 0
    assert np.all(np.abs(a.samples) <= 0.99 + 1e-6) and np.std(a.samples) > 1e-4
    assert a.speech_tokens.max() < 6561
    assert set(a.stats["stages"]) >= {"llm_prefill", "llm_decode", "flow_encoder",
                                      "flow_estimator", "vocoder"}


def test_same_seed_same_audio_whole_and_streamed(tts):
    a = tts.synthesize(TEXT, "alice", seed=5)
    b = tts.synthesize(TEXT, "alice", seed=5)
    np.testing.assert_array_equal(a.speech_tokens, b.speech_tokens)
    np.testing.assert_array_equal(a.samples, b.samples)
    chunks = list(tts.stream(TEXT, "alice", seed=5, hop_schedule="segment"))
    np.testing.assert_array_equal(join_chunks(chunks, tts.sample_rate), a.samples)
    c = tts.synthesize(TEXT, "alice", seed=6)
    assert not np.array_equal(a.speech_tokens, c.speech_tokens)


def test_zero_shot_with_a_spk2info_voice(tts):
    """alice is an official zero-shot bundle of tiny-e's spk2info.pt: a request naming it runs
    zero_shot without prompt models."""
    voice = tts.voice("alice")
    assert voice.has_prompt and voice.prompt_text and voice.prompt_speech_tokens.size == 20
    req = SynthesisRequest(text=TEXT, voice="alice", seed=2,
                           streaming=StreamingOptions("segment"))
    chunks = list(tts.stream(req))
    assert chunks[0].stats["mode"] == "zero_shot" and chunks[0].sample_rate == 24000
    tokens = np.concatenate([c.speech_tokens for c in chunks])
    assert sum(c.samples.size for c in chunks) == SAMPLES_PER_TOKEN * tokens.size > 0


@pytest.mark.parametrize("mode, extra", [("cross_lingual", {}),
                                         ("instruct2", {"instruction": "Speak slowly."})])
def test_other_prompt_modes_with_a_stored_voice(tts, mode, extra):
    a = tts.synthesize(TEXT, "bob", seed=4, mode=mode, **extra)
    assert a.samples.size == SAMPLES_PER_TOKEN * a.speech_tokens.size > 0


def test_vc_vocodes_given_tokens_in_the_prompt_voice(tts):
    """Given speech tokens bypass the LLM and the silent-token filter."""
    tokens = np.concatenate([np.ones(8, np.int64), np.arange(32, dtype=np.int64) * 37 % 6561])
    req = SynthesisRequest(voice="alice", mode="vc", speech_tokens=tokens, seed=1,
                           streaming=StreamingOptions("segment"))
    chunks = list(tts.stream(req))
    assert len(chunks) == 1 and chunks[0].samples.size == SAMPLES_PER_TOKEN * 40


def test_prompt_recordings_are_refused_with_the_reason(tts):
    wav = np.zeros(16000, np.float32), 16000
    with pytest.raises(InputError, match="speech_tokenizer_v3.onnx"):
        tts.synthesize(TEXT, prompt_audio=wav, prompt_text="hi", seed=1)
    with pytest.raises(InputError, match="mode 'instruct' is not supported.*instruct2"):
        tts.synthesize(TEXT, "alice", seed=1, mode="instruct")  # v1's mode name


def test_official_stream_through_the_engine(tts):
    """Streamed with the official schedule: chunk i carries the hop's new tokens (25 + pad, 50,
    100, ..., rest); the re-run vocoder holds back 8 frames (3840 samples) per non-final chunk
    and the last gives out the rest (sheet v3 §7)."""
    whole = tts.synthesize(TEXT, "alice", seed=8)
    chunks = list(tts.stream(TEXT, "alice", seed=8, hop_schedule="official"))
    tokens = np.concatenate([c.speech_tokens for c in chunks])
    np.testing.assert_array_equal(tokens, whole.speech_tokens)
    counts = [c.speech_tokens.size for c in chunks]
    pad = 25 - 20 % 25  # alice: 20 prompt tokens
    expected, hop = [], 25 + pad
    while tokens.size - sum(expected) >= hop + 3:
        expected.append(hop)
        hop = 50 if not expected[1:] else 100
    expected.append(tokens.size - sum(expected))
    assert counts == expected
    sizes = [c.samples.size for c in chunks]
    assert sum(sizes) == SAMPLES_PER_TOKEN * tokens.size
    if len(chunks) > 1:
        assert sizes[0] == SAMPLES_PER_TOKEN * counts[0] - 3840
    assert [c.stats["is_last_in_segment"] for c in chunks] == [False] * (len(chunks) - 1) + [True]


#: incremental vs re-run vocoder samples (tests/test_incremental_hift_cosyvoice3.py)
INC_VOCODER_ATOL = 1e-3


def test_incremental_vocoder_stream_equals_the_rerun(tts):
    """vocoder_streaming="incremental" (and "auto" on torch): each hop decodes a window, the
    chunks are the re-run's (equal lengths, samples within float32 rounding)."""
    kw = dict(seed=3, num_speech_tokens=200, hop_schedule="official")
    want = list(tts.stream(TEXT, "alice", vocoder_streaming="official", **kw))
    assert len(want) >= 4
    for option in ("incremental", "auto"):
        got = list(tts.stream(TEXT, "alice", vocoder_streaming=option, **kw))
        assert [c.stats["vocoder_streaming"] for c in got] == ["incremental"] * len(got)
        assert [c.stats["vocoder_streaming"] for c in want] == ["official"] * len(want)
        assert [c.samples.size for c in got] == [c.samples.size for c in want]
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.speech_tokens, w.speech_tokens)
            assert _maxabs(g.samples, w.samples) < INC_VOCODER_ATOL


def test_incremental_flow_is_refused_with_a_logged_reason(tts, caplog):
    """v3's DiT flow has no incremental form yet: flow_streaming="incremental" runs the
    official re-runs, says why in the chunk stats and logs it (once)."""
    import logging

    from cosyvino.families.cosyvoice23 import program

    program._LOGGED_FALLBACKS.clear()
    with caplog.at_level(logging.WARNING, logger=program.__name__):
        chunks = list(tts.stream(TEXT, "alice", seed=3, num_speech_tokens=80,
                                 hop_schedule="official", flow_streaming="incremental"))
    assert {c.stats["flow_streaming"] for c in chunks} == {"official"}
    why = chunks[0].stats["streaming_fallback"]["flow"]
    assert "no incremental form" in why
    assert [r.getMessage() for r in caplog.records if why in r.getMessage()]


# ---- ONNX: the generic exporter and ONNX Runtime ---------------------------------------------

#: a whole synthesis, ONNX Runtime vs torch: fp32 rounding amplified by the HiFT decode, and the
#: f0 predictor computed in float32 in ONNX (float64 in torch; ORT has no float64 Conv)
SYNTH_ATOL = 5e-3
#: the f0 graph in float32 vs float64 (Hz)
F0_ATOL = 1e-3


@pytest.fixture(scope="module")
def onnx_dir(tmp_path_factory):
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from cosyvino.export.onnx.convert import convert_model_dir

    return convert_model_dir(str(TINY_E), str(tmp_path_factory.mktemp("tiny-e") / "onnx"))


@pytest.fixture(scope="module")
def ort_tts(onnx_dir):
    t = Synthesizer(onnx_dir, backend="onnxruntime", voices_dir=False)
    yield t
    t.close()


def test_converted_dir_is_self_contained(onnx_dir):
    with open(os.path.join(onnx_dir, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["family"] == "cosyvoice3" and manifest["runtime"] == "onnxruntime"
    fam = get_family("cosyvoice3")
    assert set(manifest["graphs"]) == set(fam.graphs(fam.read_config(str(TINY_E))))
    assert {"cosyvoice3.yaml", "CosyVoice-BlankEN/config.json", "CosyVoice-BlankEN/vocab.json",
            "cfm_noise.npy", "nsf_sine_waves.npy", "voices.json",
            "voices.npz"} <= set(manifest["files"])
    assert detect_family(onnx_dir).name == "cosyvoice3"


def test_each_onnx_graph_equals_torch(onnx_dir, stages):
    ort = get_backend("onnxruntime").load(onnx_dir)
    try:
        for name, spec in stages.runner.table.items():
            for seed in (1, 2):
                ins = spec.example_inputs(seed=seed)
                if seed == 2:  # other lengths than the traced example: dims are symbolic
                    ins = _longer(name, ins)
                got, want = ort.runner.run(name, ins), stages.runner.run(name, ins)
                tol = {"hift_decode": WAV_ATOL, "hift_f0": F0_ATOL}.get(name, ATOL)
                for g, w in zip(got, want):
                    assert g.shape == w.shape and _maxabs(g, w) < tol, (name, seed)
        assert list(ort.prompt_voices) == ["alice", "bob"] and ort.speakers.keys() == {"中文女"}
        for name, voice in ort.prompt_voices.items():
            assert voice.digest() == stages.prompt_voices[name].digest()
        np.testing.assert_array_equal(ort.cfm_noise(), stages.cfm_noise())
        np.testing.assert_array_equal(ort.sine_waves()[:, :100000], stages.sine_waves()[:, :100000])
        mel = _golden("golden.pt")["hift"]["mel"].numpy()
        for finalize in (True, False):
            assert _maxabs(ort.vocoder(mel, finalize), stages.vocoder(mel, finalize)) < WAV_ATOL
    finally:
        ort.close()


def _longer(name, ins):
    """Example inputs of graph ``name`` made longer along their dynamic time axis."""
    rng = np.random.default_rng(3)
    if name in ("estimator",):
        t, spks = ins[3], ins[4]
        k = 41
        return [rng.standard_normal((2, 80, k)).astype(np.float32), np.ones((2, 1, k), np.float32),
                rng.standard_normal((2, 80, k)).astype(np.float32), t, spks,
                rng.standard_normal((2, 80, k)).astype(np.float32), np.array([50], np.int64)]
    if name == "hift_f0":
        return [rng.standard_normal((1, 80, 33)).astype(np.float32)]
    if name == "hift_source":
        f0 = rng.uniform(80, 400, (1, 33)).astype(np.float32)
        return [f0, rng.random((1, 480 * 33, 9)).astype(np.float32)]
    if name == "hift_decode":
        return [rng.standard_normal((1, 80, 29)).astype(np.float32),
                rng.standard_normal((1, 80, 4)).astype(np.float32),
                0.1 * rng.standard_normal((1, 1, 480 * 33)).astype(np.float32)]
    return ins


def test_onnxruntime_synthesizes_like_torch(ort_tts, tts):
    for voice, seed in (("中文女", 3), ("alice", 2)):
        got, want = ort_tts.synthesize(TEXT, voice, seed=seed), tts.synthesize(TEXT, voice,
                                                                               seed=seed)
        np.testing.assert_array_equal(got.speech_tokens, want.speech_tokens)
        assert got.samples.shape == want.samples.shape
        assert _maxabs(got.samples, want.samples) < SYNTH_ATOL


def test_onnxruntime_vocoder_streaming_falls_back_to_the_rerun(ort_tts, tts):
    """ONNX graphs have no incremental vocoder yet: asked for, it runs the re-run, says why;
    the chunks match torch's within the ONNX tolerance."""
    kw = dict(seed=3, num_speech_tokens=120, hop_schedule="official")
    got = list(ort_tts.stream(TEXT, "alice", vocoder_streaming="incremental", **kw))
    want = list(tts.stream(TEXT, "alice", vocoder_streaming="official", **kw))
    assert {c.stats["vocoder_streaming"] for c in got} == {"official"}
    assert "issue 36" in got[0].stats["streaming_fallback"]["vocoder"]
    assert [c.samples.size for c in got] == [c.samples.size for c in want]
    assert max(_maxabs(g.samples, w.samples) for g, w in zip(got, want)) < SYNTH_ATOL


# ---- cosyvino info and the HTTP server -------------------------------------------------------

def test_info_says_servable():
    from click.testing import CliRunner

    from cosyvino.cli.main import main

    res = CliRunner().invoke(main, ["info", "--model-dir", str(TINY_E), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["family"] == "cosyvoice3" and data["servable"].startswith("yes")


def test_server_speech_endpoint_returns_24khz_wav(tts):
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    sf = pytest.importorskip("soundfile")
    from server_harness import RunningServer

    from cosyvino.server import ServerConfig

    server = RunningServer(ServerConfig(num_speech_tokens=8, request_timeout=120,
                                        cache_memory_mb=0), [tts])
    try:
        r = httpx.post(server.url + "/v1/audio/speech",
                       json={"input": "Hello world.", "voice": "中文女",
                             "response_format": "wav"}, timeout=120)
        assert r.status_code == 200, r.text
        assert r.headers["x-sample-rate"] == "24000"
        samples, rate = sf.read(io.BytesIO(r.content), dtype="int16")
        assert rate == 24000 and samples.size == SAMPLES_PER_TOKEN * 8
        models = httpx.get(server.url + "/v1/models", timeout=30).json()
        assert "cosyvoice3" in json.dumps(models)
    finally:
        server.stop()
