"""Every CosyVoice v1 mode (issue 15): which modes a checkpoint offers, how a request without a
mode picks one, the LLM prefix / flow conditioning of each mode against the golden tensors
(sheet 3.8), end to end on the tiny model with the synthetic prompt models (shapes, audio
length vs tokens, determinism per seed, streamed vs whole), prompt processing once per
request, and bad prompt audio through the public calls."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest
import torch

from cosyvino import Synthesizer
from cosyvino.errors import InputError, UnknownSpeakerError
from cosyvino.families.cosyvoice1 import modes as v1_modes
from cosyvino.families.cosyvoice1.length_regulation import mel_frames_for_tokens
from cosyvino.prompt_audio import (
    AudioTooLongError,
    AudioTooShortError,
    EmptyAudioError,
    InvalidAudioError,
    NotAudioError,
    SilentAudioError,
)
from cosyvino.request import StreamingOptions, SynthesisRequest
from cosyvino.voices import Voice

from conftest import FIXTURES, TINY_A

pytest.importorskip("onnx")
PROMPT = FIXTURES / "zero_shot_prompt.wav"          # 3.48 s, zh
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"
OTHER_PROMPT = FIXTURES / "cross_lingual_prompt.wav"
TEXT = "你好，世界。"
ATOL = 1e-4


def _synth(model_dir, **kw) -> Synthesizer:
    return Synthesizer(str(model_dir), backend="torch", **kw)


@pytest.fixture(scope="module")
def tts(tiny_model_dir, tmp_path_factory):
    """The tiny base model (make-model dir: speakers + synthetic prompt models)."""
    return _synth(tiny_model_dir, voices_dir=tmp_path_factory.mktemp("voices"))


@pytest.fixture(scope="module")
def instruct_tts(tiny_model_dir, tmp_path_factory):
    """The same weights under an Instruct model's dir name (the official rule)."""
    link = tmp_path_factory.mktemp("named") / "CosyVoice-300M-Instruct"
    os.symlink(tiny_model_dir, link)
    return _synth(link, voices_dir=False)


@pytest.fixture(scope="module")
def golden_tts():
    """tiny-a (official golden weights, no prompt models) offering the prompt modes anyway,
    to check their layouts against the golden tensors."""
    return _synth(TINY_A, voices_dir=False, modes=["zero_shot", "cross_lingual", "vc", "sft"])


@pytest.fixture(scope="module")
def golden():
    return torch.load(TINY_A / "golden.pt", weights_only=False)


@pytest.fixture(scope="module")
def prompt_voice(tts):
    return tts.prompt_voice(PROMPT, PROMPT_TEXT)


def _frames(tts, n):
    cfg = tts.config
    return mel_frames_for_tokens(n, token_rate=cfg.flow.input_frame_rate,
                                 sample_rate=cfg.sample_rate, hop=cfg.hift.hop_length)


# ---- modes per checkpoint ---------------------------------------------------------------------
def test_modes_per_checkpoint(tiny_model_dir, tmp_path, tts, instruct_tts):
    assert tts.modes == ["zero_shot", "cross_lingual", "vc", "sft"]
    assert instruct_tts.modes == ["instruct", "sft"]
    speakers = tts.speakers
    for name, kind, modes in [("CosyVoice-300M-SFT", "sft", ["sft"]),
                              ("cosyvoice-300m-instruct", "instruct", ["instruct", "sft"]),
                              ("CosyVoice-300M", "base", ["zero_shot", "cross_lingual", "vc",
                                                          "sft"]),
                              ("my-sftp-model", "base", ["zero_shot", "cross_lingual", "vc",
                                                         "sft"])]:
        link = tmp_path / name
        os.symlink(tiny_model_dir, link)
        assert v1_modes.checkpoint_kind(link) == kind
        assert list(v1_modes.modes_for(link, speakers)) == modes
    # a converted dir (manifest.json) inside an Instruct dir is an Instruct model
    conv = tmp_path / "CosyVoice-300M-Instruct-x" / "openvino"
    conv.mkdir(parents=True)
    (conv / "manifest.json").write_text("{}")
    assert v1_modes.checkpoint_kind(conv) == "instruct"
    # no prompt models (the golden tiny-a): sft only, and it says why
    assert list(v1_modes.modes_for(TINY_A, speakers)) == ["sft"]
    assert "prompt models" in v1_modes.unavailable_reason(TINY_A, speakers, "zero_shot")
    assert list(v1_modes.modes_for(tiny_model_dir, {})) == ["zero_shot", "cross_lingual", "vc"]


def test_mode_the_model_lacks_is_a_typed_error_naming_its_modes(tts, instruct_tts):
    with pytest.raises(InputError, match=r"mode 'instruct' is not supported by this model "
                                         r"\(instruct needs a CosyVoice-300M-Instruct.*"
                                         r"supported: zero_shot, cross_lingual, vc, sft"):
        tts.synthesize(TEXT, tts.speakers[0], mode="instruct", instruction="calm")
    with pytest.raises(InputError, match=r"mode 'zero_shot' is not supported .*Instruct model"
                                         r".*supported: instruct, sft"):
        instruct_tts.synthesize(TEXT, prompt_audio=PROMPT, prompt_text=PROMPT_TEXT,
                                mode="zero_shot")
    # no mode named: what the model lacks first, then the nearest mode's complaint
    with pytest.raises(InputError, match=r"^the inputs given fit none of this model's modes "
                                         r"\(instruct, sft\); not offered here: zero_shot, "
                                         r"cross_lingual, vc: voice cloning.*; nearest mode: "
                                         r"prompt_audio is not used by mode 'sft'$"):
        instruct_tts.synthesize(TEXT, prompt_audio=PROMPT)
    with pytest.raises(InputError, match="mode 'nope' is not supported"):
        tts.synthesize(TEXT, tts.speakers[0], mode="nope")
    with pytest.raises(InputError, match="modes: 'sing'"):
        _synth(TINY_A, voices_dir=False, modes=["sing"])


class _Prompts:
    """A stand-in prompt encoder (validation only)."""

    def __init__(self, voice):
        self.calls = []
        self._voice = voice

    def voice(self, audio, *, name, prompt_text=None):
        self.calls.append(("voice", audio))
        return Voice(name, self._voice.embedding, self._voice.prompt_speech_tokens,
                     self._voice.prompt_mel, prompt_text)

    def speech_tokens(self, audio):
        self.calls.append(("tokens", audio))
        return np.arange(10)


def test_request_without_mode_picks_the_first_that_fits(tts, prompt_voice):
    prompts = _Prompts(prompt_voice)
    registered = Voice("reg", prompt_voice.embedding, prompt_voice.prompt_speech_tokens,
                       prompt_voice.prompt_mel, "a transcript")
    untranscribed = Voice("bare", prompt_voice.embedding, prompt_voice.prompt_speech_tokens,
                          prompt_voice.prompt_mel)
    voices = {**tts.engine.builtin_voices, "reg": registered, "bare": untranscribed}
    spk = tts.speakers[0]

    def mode_of(**kw):
        req = SynthesisRequest(**{"text": TEXT, **kw}).validated(
            modes=tts.engine.modes, voices=voices, speech_vocab=4096, prompts=prompts)
        return req

    assert mode_of(voice=spk).mode == "sft"
    r = mode_of(prompt_audio="p.wav", prompt_text="hi")
    assert r.mode == "zero_shot" and r.prompt_text == "hi" and r.prompt_audio is None
    assert r.voice.has_prompt and r.voice.prompt_text == "hi"
    assert mode_of(prompt_audio="p.wav").mode == "cross_lingual"
    r = mode_of(voice="reg")
    assert r.mode == "zero_shot" and r.prompt_text == "a transcript"
    assert mode_of(voice="reg", prompt_text="other").prompt_text == "other"
    r = mode_of(voice="bare")
    assert r.mode == "cross_lingual" and r.prompt_text is None
    r = mode_of(text="", voice="reg", source_audio="s.wav")
    assert r.mode == "vc" and r.speech_tokens.tolist() == list(range(10))
    assert r.source_audio is None
    assert mode_of(voice="reg", mode="sft").mode == "sft"  # a registered voice as a speaker
    assert prompts.calls == [("voice", "p.wav"), ("voice", "p.wav"), ("tokens", "s.wav")]
    # a validated request validates to itself (idempotent: nothing is processed twice)
    again = r.validated(modes=tts.engine.modes, voices=voices, prompts=None)
    assert again.mode == "vc" and again.voice is r.voice
    for kw, match in [
        (dict(voice=spk, prompt_audio="p.wav"), "either voice .* or prompt_audio"),
        (dict(prompt_audio="p.wav", prompt_text="x", mode="cross_lingual"),
         "prompt_text is not used by mode 'cross_lingual'"),
        (dict(voice=spk, mode="zero_shot", prompt_text="x"),
         "needs prompt_audio or a registered voice; '中文女' is a built-in speaker"),
        (dict(voice="bare", mode="zero_shot"), "needs prompt_text"),
        (dict(voice="reg", source_audio="s.wav"), "text is not used by mode 'vc'"),
        (dict(voice="reg", mode="vc", text=""), "needs source_audio"),
        (dict(text="", voice="reg", source_audio="s.wav", speech_tokens=np.arange(3)),
         "either source_audio or speech_tokens"),
        (dict(voice=spk, instruction=3, mode="sft"), "instruction must be a string"),
    ]:
        with pytest.raises(InputError, match=match):
            mode_of(**kw)
    with pytest.raises(UnknownSpeakerError):
        mode_of(voice="nobody")


# ---- layouts against the golden tensors (sheet 3.8) ------------------------------------------
def _golden_voice(g, prompt_text=None):
    return Voice("g", g["llm"]["embedding"].numpy(),
                 g["llm"]["prompt_speech_token"].numpy()[0],
                 np.zeros((34, 80), np.float32), prompt_text)


def test_zero_shot_prefix_and_first_logp_match_the_golden(golden_tts, golden):
    """zero_shot: [SOS][SPK][TEXT(prompt_text ⧺ text)][TASK][PROMPT_SPEECH] through the engine
    (validation, the mode builder, the program's prefill) equals the official layout."""
    g = golden["llm"]
    (prompt_text, prompt_ids), (text, text_ids) = [
        next((t, ids) for t, ids in golden["tokenizer"] if list(ids) == want[0].tolist())
        for want in (g["prompt_text_token"], g["text_token"])]
    req = SynthesisRequest(text, _golden_voice(golden, prompt_text), seed=0,
                           num_speech_tokens=3)
    state = golden_tts.engine.start(req)
    program = state.program
    assert state.request.mode == "zero_shot"
    assert program.prefix.prompt_text_token[0].tolist() == list(prompt_ids)
    np.testing.assert_array_equal(program.prefix.prompt_speech_token,
                                  g["prompt_speech_token"].numpy())
    lm_input = golden_tts.pipeline.build_lm_input(
        np.asarray(program.segments[0].token_ids)[None], program.prefix.embedding,
        program.prefix.prompt_text_token, program.prefix.prompt_speech_token)
    assert lm_input.shape == tuple(g["zero_shot_lm_input"].shape) == (1, 62, 64)
    assert np.abs(lm_input - g["zero_shot_lm_input"].numpy()).max() < ATOL
    golden_tts.engine.step(state, "llm")  # prefill
    assert np.abs(program.logp - g["zero_shot_first_logp"].numpy()).max() < ATOL
    state.cancel.set()
    program.close()
    # cross_lingual: the sft layout [SOS][SPK][TEXT][TASK] with the prompt's embedding
    req = SynthesisRequest(text, _golden_voice(golden), seed=0)
    state = golden_tts.engine.start(req)
    p = state.program.prefix
    assert state.request.mode == "cross_lingual"
    assert p.prompt_text_token is None and p.prompt_speech_token is None
    lm_input = golden_tts.pipeline.build_lm_input(g["text_token"].numpy(), p.embedding)
    assert np.abs(lm_input - g["lm_input"].numpy()).max() < ATOL
    state.program.close()


def test_prompt_flow_conditioning_matches_the_golden_mel(golden_tts, golden):
    """vc / zero_shot / cross_lingual condition the flow on the prompt: the builder's output
    through the flow reproduces the official ``mel_with_prompt`` for the golden noise."""
    f = golden["flow"]
    voice = Voice("g", f["embedding"].numpy(), f["prompt_speech_token"].numpy()[0],
                  f["prompt_feat"].numpy()[0])
    req = SynthesisRequest(voice=voice, mode="vc", speech_tokens=f["speech_token"].numpy()[0],
                           seed=0).validated(modes=golden_tts.engine.modes, voices={})
    cond = v1_modes.flow_conditioning(req)
    assert cond.prompt_token.shape == (20,) and cond.prompt_feat.shape == (34, 80)
    mel = golden_tts.pipeline.tokens_to_mel(req.speech_tokens, cond.embedding,
                                            noise=f["noise_with_prompt"].numpy(),
                                            prompt_token=cond.prompt_token,
                                            prompt_feat=cond.prompt_feat)
    assert np.abs(mel - f["mel_with_prompt"].numpy()).max() < ATOL
    # sft / instruct: no prompt in the flow
    sft = v1_modes.flow_conditioning(SynthesisRequest(voice=voice, mode="sft").validated(
        modes=golden_tts.engine.modes, voices={}))
    assert sft.prompt_token is None and sft.prompt_feat is None


def test_instruct_prefix_layout_and_end_marker(instruct_tts):
    tok = instruct_tts.frontend.tokenize
    assert v1_modes.instruction_text("Speak calmly.") == "Speak calmly.<endofprompt>"
    # the HEAD spelling (and the v1 one) given by the user is kept, not doubled
    assert v1_modes.instruction_text("Speak calmly.<|endofprompt|>") == \
        "Speak calmly.<|endofprompt|>"
    assert v1_modes.instruction_text("Speak calmly.<endofprompt> ") == \
        "Speak calmly.<endofprompt>"
    # the two spellings are plain BPE for the v1 tokenizer (sheet 3.3)
    assert tok("<endofprompt>") == [27, 521, 2670, 28722, 662, 29]
    assert tok("<|endofprompt|>") == [27, 91, 521, 2670, 28722, 662, 91, 29]
    spk = instruct_tts.speakers[1]
    state = instruct_tts.engine.start(SynthesisRequest(TEXT, spk, instruction="Speak calmly.",
                                                       seed=0))
    p = state.program.prefix
    assert state.request.mode == "instruct"
    assert p.embedding is None and p.prompt_speech_token is None  # no SPK slot
    assert p.prompt_text_token[0].tolist() == tok("Speak calmly.<endofprompt>")
    text_ids = np.asarray(state.program.segments[0].token_ids)[None]
    lm = instruct_tts.pipeline.build_lm_input(text_ids, p.embedding, p.prompt_text_token)
    assert lm.shape[1] == 1 + p.prompt_text_token.shape[1] + text_ids.shape[1] + 1
    # the rows after SOS are the text encoder over instruction ⧺ text (no speaker row)
    enc = instruct_tts.stages.encode_text(np.concatenate([p.prompt_text_token, text_ids], 1))
    np.testing.assert_allclose(lm[:, 1:-1], enc, atol=1e-6)
    state.program.close()
    with pytest.raises(InputError, match="instruction has nothing speakable"):
        instruct_tts.synthesize(TEXT, spk, instruction="  ")
    with pytest.raises(InputError, match="mode 'instruct' needs instruction"):
        instruct_tts.synthesize(TEXT, spk, mode="instruct")


# ---- end to end, every mode ------------------------------------------------------------------
def _inputs(mode, tts, instruct_tts, prompt_voice):
    """(synthesizer, text, speaker, mode inputs) of one request per mode."""
    cl_voice = Voice("cl", prompt_voice.embedding, prompt_voice.prompt_speech_tokens,
                     prompt_voice.prompt_mel)
    return {
        "sft": (tts, TEXT, tts.speakers[0], {}),
        "zero_shot": (tts, TEXT, prompt_voice, {}),
        "cross_lingual": (tts, "<|en|>Hello there.", cl_voice, {}),
        "instruct": (instruct_tts, TEXT, instruct_tts.speakers[0],
                     {"instruction": "Speak calmly."}),
        "vc": (tts, "", prompt_voice, {"source_audio": OTHER_PROMPT}),
    }[mode]


@pytest.mark.parametrize("mode", ["sft", "zero_shot", "cross_lingual", "instruct", "vc"])
def test_every_mode_end_to_end(mode, tts, instruct_tts, prompt_voice):
    synth, text, voice, kw = _inputs(mode, tts, instruct_tts, prompt_voice)
    a = synth.synthesize(text, voice, seed=5, **kw)
    assert a.stats["segments"] == 1
    assert a.samples.dtype == np.float32 and a.samples.ndim == 1
    n = a.speech_tokens.size
    assert n > 0
    # the flow emits int(N / 50 * 22050 / 256) frames for N tokens (prompt frames dropped),
    # the vocoder 256 samples per frame
    assert a.samples.size == _frames(synth, n) * synth.config.hift.hop_length
    assert np.abs(a.samples).max() <= 0.99 + 1e-6
    b = synth.synthesize(text, voice, seed=5, **kw)
    np.testing.assert_array_equal(a.samples, b.samples)
    c = synth.synthesize(text, voice, seed=6, **kw)
    assert not np.array_equal(a.samples, c.samples)
    if mode == "vc":
        src = synth.prompt_voice(OTHER_PROMPT)  # the source's tokens are its prompt tokens
        np.testing.assert_array_equal(a.speech_tokens, src.prompt_speech_tokens)
        np.testing.assert_array_equal(a.speech_tokens, c.speech_tokens)  # no LLM sampling
    # streamed on the latency schedule: the same tokens, several chunks, the same length up
    # to the hops' frame rounding (tests/test_engine.py)
    n_forced = 60 if mode != "vc" else None
    whole = synth.synthesize(text, voice, seed=5, num_speech_tokens=n_forced, **kw) \
        if n_forced else a
    chunks = list(synth.stream(text, voice, seed=5, num_speech_tokens=n_forced, **kw))
    assert len(chunks) >= 2
    assert [c.stats["chunk"] for c in chunks] == list(range(len(chunks)))
    assert chunks[-1].stats["is_last_in_segment"]
    np.testing.assert_array_equal(np.concatenate([c.speech_tokens for c in chunks]),
                                  whole.speech_tokens)
    total = sum(c.samples.size for c in chunks)
    assert abs(total - whole.samples.size) <= 256 * 4
    again = list(synth.stream(text, voice, seed=5, num_speech_tokens=n_forced, **kw))
    np.testing.assert_array_equal(np.concatenate([c.samples for c in again]),
                                  np.concatenate([c.samples for c in chunks]))


def test_modes_change_the_audio(tts, instruct_tts, prompt_voice):
    """The mode inputs reach the models: another prompt, instruction or source changes the
    audio for the same seed."""
    other = tts.prompt_voice(OTHER_PROMPT, PROMPT_TEXT)
    a = tts.synthesize(TEXT, prompt_voice, seed=1, num_speech_tokens=30)
    b = tts.synthesize(TEXT, other, seed=1, num_speech_tokens=30)
    assert not np.array_equal(a.samples, b.samples)
    c = tts.synthesize(TEXT, prompt_voice, mode="cross_lingual", seed=1, num_speech_tokens=30)
    assert not np.array_equal(a.samples, c.samples)
    spk = instruct_tts.speakers[0]
    d = instruct_tts.synthesize(TEXT, spk, instruction="Speak calmly.", seed=1)
    e = instruct_tts.synthesize(TEXT, spk, instruction="Speak loudly!", seed=1)
    assert not np.array_equal(d.samples, e.samples)
    f = instruct_tts.synthesize(TEXT, spk, seed=1)  # sft on the Instruct model
    assert not np.array_equal(d.samples, f.samples)


def test_prompt_audio_per_request_equals_its_voice_and_is_processed_once(tts, prompt_voice,
                                                                       monkeypatch):
    long_text = "今天天气很好，我们一起去公园散步吧。" * 3 + "Hello there, how are you today? " * 4
    calls = []
    real = tts._prompts.models.embedding
    monkeypatch.setattr(tts._prompts.models, "embedding",
                        lambda fb: calls.append(1) or real(fb))
    with open(PROMPT, "rb") as fh:
        data = fh.read()
    a = tts.synthesize(long_text, prompt_audio=data, prompt_text=PROMPT_TEXT, seed=2,
                       num_speech_tokens=12)
    assert a.stats["segments"] >= 2 and calls == [1]  # once per request, not per segment
    b = tts.synthesize(long_text, prompt_voice, seed=2, num_speech_tokens=12)
    np.testing.assert_array_equal(a.samples, b.samples)
    # decoded samples + rate, and an Audio object, are accepted too
    import soundfile as sf

    samples, rate = sf.read(str(PROMPT), dtype="float32")
    c = tts.synthesize(TEXT, prompt_audio=(samples, rate), prompt_text=PROMPT_TEXT, seed=2,
                       num_speech_tokens=12)
    d = tts.synthesize(TEXT, prompt_audio=PROMPT, prompt_text=PROMPT_TEXT, seed=2,
                       num_speech_tokens=12)
    np.testing.assert_array_equal(c.samples, d.samples)


# ---- bad prompt audio through the public calls -----------------------------------------------
def _bad_sources(tmp_path):
    rng = np.random.default_rng(0)
    speech = lambda s: (0.1 * rng.standard_normal(int(16000 * s))).astype(np.float32)  # noqa
    nan = speech(2)
    nan[100] = np.nan
    return [
        (b"definitely not audio", NotAudioError, "not a readable audio file"),
        (str(tmp_path / "missing.wav"), NotAudioError, "file not found"),
        (12345, NotAudioError, "must be a path, bytes"),
        (np.zeros(16000, np.float32), NotAudioError, "must be a path, bytes"),
        (b"", EmptyAudioError, "empty"),
        ((speech(0.5), 16000), AudioTooShortError, "minimum is 1 s"),
        ((speech(31), 16000), AudioTooLongError, "limit is 30 s"),
        ((np.zeros(32000, np.float32), 16000), SilentAudioError, "silent"),
        ((nan, 16000), InvalidAudioError, "NaN"),
        ((speech(2), 4000), InvalidAudioError, "below the minimum"),
        ((speech(2), 0), InvalidAudioError, "sample rate must be a positive"),
        ((speech(2).astype(np.int32), 16000), NotAudioError, "float"),
    ]


def test_bad_prompt_audio_raises_typed_errors_everywhere(tts, tmp_path):
    for source, error, match in _bad_sources(tmp_path):
        with pytest.raises(error, match=match):
            tts.synthesize(TEXT, prompt_audio=source, prompt_text=PROMPT_TEXT)
        with pytest.raises(error, match=match):
            tts.stream(TEXT, prompt_audio=source)  # at the call, before anything runs
        with pytest.raises(error, match=match):
            tts.add_voice("bad", source, PROMPT_TEXT)
        assert "bad" not in tts.voices
    # the source of a voice conversion is named as such
    with pytest.raises(SilentAudioError, match="source audio is silent"):
        tts.synthesize(prompt_audio=PROMPT, source_audio=(np.zeros(32000, np.float32), 16000))
    with pytest.raises(AudioTooShortError, match="source audio is 0.10 s long; the minimum "
                                                 "is 0.2 s"):
        tts.synthesize(prompt_audio=PROMPT, source_audio=(
            0.1 * np.ones(1600, np.float32), 16000))


def test_missing_prompt_models_are_a_model_dir_error(tiny_model_dir, tmp_path):
    from cosyvino.errors import ModelDirError

    d = tmp_path / "base"
    d.mkdir()
    for f in os.listdir(tiny_model_dir):
        if f != "speech_tokenizer_v1.onnx" and os.path.isfile(os.path.join(tiny_model_dir, f)):
            os.symlink(os.path.join(tiny_model_dir, f), d / f)
    s = _synth(d, voices_dir=False, modes=["zero_shot", "sft"])
    with pytest.raises(ModelDirError, match="speech_tokenizer_v1.onnx not found"):
        s.synthesize(TEXT, prompt_audio=PROMPT, prompt_text=PROMPT_TEXT)
    assert "zero_shot" not in _synth(d, voices_dir=False).modes
    assert pathlib.Path(d).exists()


def test_hop_schedule_segment_streams_one_chunk_per_segment_with_a_prompt(tts, prompt_voice):
    req = SynthesisRequest(TEXT, prompt_voice, seed=3, num_speech_tokens=40,
                           streaming=StreamingOptions("segment"))
    chunks = list(tts.stream(req))
    assert len(chunks) == 1
    np.testing.assert_array_equal(chunks[0].samples, tts.synthesize(
        TEXT, prompt_voice, seed=3, num_speech_tokens=40).samples)
