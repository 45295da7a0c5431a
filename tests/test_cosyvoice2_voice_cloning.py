"""CosyVoice2 voice cloning end to end on a synthetic tiny v2 dir (its stand-in campplus.onnx and
speech_tokenizer_v2.onnx): the family's prompt encoder, zero_shot / cross_lingual / instruct2 /
vc from recordings at 24 kHz with the prompt aligned per mode (sheet v2 §3.6, §3.8), a v1
voice refused, registered voices and the CLI (voices add, synth, vc, info, speakers), and the
converted ONNX dir carrying the prompt models."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import soundfile as sf
from click.testing import CliRunner
from conftest import FIXTURES

torch = pytest.importorskip("torch")
pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from cosyvino import Synthesizer
from cosyvino.cli.main import main
from cosyvino.errors import InputError, VoiceMismatchError
from cosyvino.families import get_family
from cosyvino.families.cosyvoice1.config import MelConfig
from cosyvino.families.cosyvoice2 import modes as v2_modes
from cosyvino.families.cosyvoice2.prompt_models import (
    PromptEncoder,
    prompt_rate_reason,
    read_prompt_mel_config,
)
from cosyvino.frontend.features import prompt_mel_of
from cosyvino.request import StreamingOptions, SynthesisRequest
from cosyvino.voice_store import CorruptVoiceError, VoiceStore
from cosyvino.voices import Voice

ZERO_SHOT = str(FIXTURES / "zero_shot_prompt.wav")          # 24 kHz, 3.48 s: 87 tokens, 174 frames
CROSS_LINGUAL = str(FIXTURES / "cross_lingual_prompt.wav")  # 22.05 kHz, 13.75 s: 344 / 687
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"
TEXT = "Hello world, this is a test."
#: 24 kHz samples per mel frame and per speech token (sheet v2 §2)
HOP, SAMPLES_PER_TOKEN = 480, 960
#: ONNX Runtime vs torch, whole synthesis (as test_cosyvoice2_family's SYNTH_ATOL)
SYNTH_ATOL = 5e-3


@pytest.fixture(scope="module")
def tts(tiny_v2_model_dir):
    t = Synthesizer(tiny_v2_model_dir, backend="torch", voices_dir=False,
                    prompt_backend="onnxruntime")
    yield t
    t.close()


def _run(tts, text, **kw):
    """(audio samples, speech tokens, mode) of one request, streamed whole per segment."""
    req = SynthesisRequest(text=text, streaming=StreamingOptions("segment"), **kw)
    chunks = list(tts.stream(req))
    modes = {c.stats["mode"] for c in chunks}
    assert len(modes) == 1
    return (np.concatenate([c.samples for c in chunks]),
            np.concatenate([c.speech_tokens for c in chunks]), modes.pop())


# ---- the family's prompt encoder ---------------------------------------------------------------

def _linked_copy(src, dst, leave_out=()):
    os.makedirs(dst)
    for name in os.listdir(src):
        if name not in leave_out:
            os.symlink(os.path.join(src, name), os.path.join(dst, name))
    return str(dst)


def test_prompt_encoder_follows_the_prompt_models(tiny_v2_model_dir, tmp_path):
    fam = get_family("cosyvoice2")
    stages = SimpleNamespace(config=fam.read_config(tiny_v2_model_dir), speakers={"a": None})
    enc = fam.prompt_encoder(tiny_v2_model_dir, stages, backend="onnxruntime", num_threads=1)
    assert type(enc) is PromptEncoder and enc.backend == "onnxruntime"
    assert (enc.embedding_dim, enc.speech_vocab, enc.mel_bins) == (192, 6561, 80)
    assert enc.mel == read_prompt_mel_config(tiny_v2_model_dir) and enc.mel_rate == 24000
    assert enc._options == {"num_threads": 1}
    every = ["zero_shot", "cross_lingual", "vc", "instruct2", "sft"]
    assert list(fam.modes_for(tiny_v2_model_dir, stages)) == every

    bare = _linked_copy(tiny_v2_model_dir, tmp_path / "bare", ("speech_tokenizer_v2.onnx",))
    for model_dir in (bare, None):
        enc = fam.prompt_encoder(model_dir, stages)
        assert type(enc) is v2_modes.UnavailablePromptEncoder and enc.mel_rate == 24000
        with pytest.raises(InputError, match="speech_tokenizer_v2.onnx"):
            enc.voice(ZERO_SHOT, name="x")
        with pytest.raises(InputError, match="speech_tokenizer_v2.onnx"):
            enc.speech_tokens(ZERO_SHOT)
    assert list(fam.modes_for(bare, stages)) == every  # stored voices still serve them
    assert fam.mode_unavailable_reason(bare, stages, "zero_shot") is None


# ---- the prompt per mode (sheet v2 §3.6, §3.8) -------------------------------------------------

def _request(mode, voice):
    return SimpleNamespace(mode=mode, voice=voice, prompt_text="hello", instruction="Slowly.")


def test_llm_and_flow_prompts_are_aligned_except_for_vc():
    """12 tokens, 20 frames: L = 10; the LLM's prompt tokens are the flow's (cut), vc keeps
    both uncut. (The LLM got all 12 before.)"""
    voice = Voice(name="v", embedding=np.ones((1, 192), np.float32),
                  prompt_speech_tokens=np.arange(12), prompt_mel=np.ones((20, 80), np.float32))

    def tokenize(text):
        return [1, 2, 3]

    prefix = v2_modes.llm_prefix(_request("zero_shot", voice), tokenize, str.strip)
    np.testing.assert_array_equal(prefix.prompt_speech_token, np.arange(10)[None])
    for mode in ("zero_shot", "cross_lingual", "instruct2"):
        cond = v2_modes.flow_conditioning(_request(mode, voice))
        np.testing.assert_array_equal(cond.prompt_token, np.arange(10))
        assert cond.prompt_feat.shape == (20, 80)
    cond = v2_modes.flow_conditioning(_request("vc", voice))
    assert cond.prompt_token.shape == (12,) and cond.prompt_feat.shape == (20, 80)

    long_mel = Voice(name="m", embedding=voice.embedding, prompt_speech_tokens=np.arange(8),
                     prompt_mel=np.ones((21, 80), np.float32))
    cond = v2_modes.flow_conditioning(_request("cross_lingual", long_mel))
    assert cond.prompt_token.shape == (8,) and cond.prompt_feat.shape == (16, 80)
    one = Voice(name="short", embedding=voice.embedding, prompt_speech_tokens=np.arange(3),
                prompt_mel=np.ones((1, 80), np.float32))
    with pytest.raises(InputError, match="voice 'short': prompt too short"):
        v2_modes.flow_conditioning(_request("zero_shot", one))


# ---- synthesis from recordings (torch backend) -------------------------------------------------

def test_zero_shot_from_a_recording(tts):
    assert tts.sample_rate == 24000 and type(tts.prompt_encoder) is PromptEncoder
    assert tts.modes == ["zero_shot", "cross_lingual", "vc", "instruct2", "sft"]
    samples, tokens, mode = _run(tts, TEXT, prompt_audio=ZERO_SHOT, prompt_text=PROMPT_TEXT,
                                 seed=3)
    assert mode == "zero_shot" and tokens.size > 0 and tokens.max() < 6561
    assert samples.dtype == np.float32 and samples.size == SAMPLES_PER_TOKEN * tokens.size
    assert np.std(samples) > 1e-4
    # the same recording as a Voice object: the same audio for the seed
    voice = tts.prompt_voice(ZERO_SHOT, PROMPT_TEXT)
    again, again_tokens, _ = _run(tts, TEXT, voice=voice, seed=3)
    np.testing.assert_array_equal(again_tokens, tokens)
    np.testing.assert_array_equal(again, samples)


def test_zero_shot_llm_gets_the_aligned_prompt_tokens(tts, monkeypatch):
    """cross_lingual_prompt.wav: 344 tokens, 687 mel frames -> L = 343 for the LLM and the
    flow (sheet v2 §3.8); the LLM prefix is [sos, text, task, prompt speech]."""
    from cosyvino.families.cosyvoice2 import program

    seen = []
    real = program.v2_modes.llm_prefix

    def spy(*a, **kw):
        seen.append(real(*a, **kw))
        return seen[-1]

    monkeypatch.setattr(program.v2_modes, "llm_prefix", spy)
    samples, tokens, mode = _run(tts, TEXT, prompt_audio=CROSS_LINGUAL, prompt_text="Hello.",
                                 seed=4)
    assert mode == "zero_shot" and samples.size == SAMPLES_PER_TOKEN * tokens.size > 0
    assert seen[0].prompt_speech_token.shape == (1, 343)


@pytest.mark.parametrize("extra, mode", [({}, "cross_lingual"),
                                         ({"instruction": "用四川话说这句话"}, "instruct2")])
def test_other_prompt_modes_from_a_recording(tts, extra, mode):
    samples, tokens, got = _run(tts, TEXT, prompt_audio=ZERO_SHOT, seed=5, **extra)
    assert got == mode and samples.size == SAMPLES_PER_TOKEN * tokens.size > 0


@pytest.mark.parametrize("prompt, source, p, m, n", [(ZERO_SHOT, CROSS_LINGUAL, 87, 174, 344),
                                                     (CROSS_LINGUAL, ZERO_SHOT, 344, 687, 87)])
def test_vc_from_recordings_keeps_the_prompt_uncut(tts, prompt, source, p, m, n):
    """The flow emits 2(P + N) - M frames (sheet v2 §3.8 note 3): 2N when M = 2P, one frame
    more for the 13.75 s prompt (M = 687 = 2P - 1), which the other modes would cut."""
    samples, tokens, mode = _run(tts, "", prompt_audio=prompt, source_audio=source, seed=1)
    assert mode == "vc" and tokens.size == n
    np.testing.assert_array_equal(tokens, tts.prompt_encoder.speech_tokens(source))
    assert samples.size == HOP * (2 * (p + n) - m)


# ---- a voice made for another model ------------------------------------------------------------

def _v1_voice(seconds=True) -> Voice:
    """A CosyVoice v1 bundle of zero_shot_prompt.wav: the 22.05 kHz mel (hop 256: 299 frames),
    50 Hz tokens (174, ids below 4096)."""
    x, sr = sf.read(ZERO_SHOT, dtype="float32")
    x22 = np.interp(np.arange(int(x.size * 22050 / sr)) * sr / 22050, np.arange(x.size), x)
    mel = prompt_mel_of(x22.astype(np.float32), MelConfig())[0].T
    return Voice(name="v1", embedding=np.ones((1, 192), np.float32),
                 prompt_speech_tokens=np.arange(174) % 4096, prompt_mel=mel,
                 prompt_text=PROMPT_TEXT, prompt_seconds=3.48 if seconds else None)


def test_a_v1_voice_is_refused(tts, tmp_path):
    v1 = _v1_voice()
    assert v1.prompt_mel.shape == (299, 80)
    with pytest.raises(VoiceMismatchError, match=r"voice 'v1' does not fit this model: .*85\.9 "
                                                 r"frames per second.*takes 50 \(24000 Hz"):
        tts.synthesize(TEXT, voice=v1, seed=1)
    assert "frames per speech token" in tts.prompt_encoder.check_voice(_v1_voice(seconds=False))
    v2 = tts.prompt_voice(ZERO_SHOT, PROMPT_TEXT)
    assert tts.prompt_encoder.check_voice(v2) is None and prompt_rate_reason(v2) is None

    # in a voice store: a file of another family, and a family-less one, are skipped
    VoiceStore(tmp_path / "any").add(v1)
    VoiceStore(tmp_path / "v1", family="cosyvoice1").add(v1)
    for name, why in (("any", "does not fit this model: its prompt mel has 85.9"),
                      ("v1", "made for model family 'cosyvoice1'")):
        with pytest.warns(UserWarning, match="skipping"):
            store = VoiceStore(tmp_path / name, family="cosyvoice2",
                               check=tts.prompt_encoder.check_voice)
        with pytest.raises(CorruptVoiceError, match=why):
            store["v1"]


# ---- the CLI -----------------------------------------------------------------------------------

def _cli(*args):
    r = CliRunner().invoke(main, [str(a) for a in args])
    assert r.exit_code == 0, r.output + repr(r.exception)
    return r.output


def test_cli_voices_add_then_synth_by_name(tiny_v2_model_dir, tmp_path):
    voices = tmp_path / "voices"
    out = _cli("voices", "add", "amy", "--model-dir", tiny_v2_model_dir, "--voices-dir", voices,
               "--prompt-wav", ZERO_SHOT, "--prompt-text", PROMPT_TEXT,
               "--prompt-backend", "onnxruntime")
    assert "registered voice 'amy' (3.48 s prompt, 87 prompt tokens, with transcript)" in out
    listed = json.loads(_cli("voices", "list", "--model-dir", tiny_v2_model_dir, "--voices-dir",
                             voices, "--json"))
    assert [(v["name"], v["prompt_tokens"], v["prompt_text"]) for v in listed] == \
        [("amy", 87, PROMPT_TEXT)]
    # persisted: a fresh store reads it back as it was made
    enc = PromptEncoder(tiny_v2_model_dir, "onnxruntime")
    stored = VoiceStore(voices, family="cosyvoice2", check=enc.check_voice)["amy"]
    made = enc.voice(ZERO_SHOT, name="amy", prompt_text=PROMPT_TEXT)
    assert stored.digest() == made.digest()
    wav = tmp_path / "amy.wav"
    out = _cli("synth", "--model-dir", tiny_v2_model_dir, "--voices-dir", voices, "-v", "amy",
               TEXT, "--seed", 2, "-o", wav, "--json")
    stats = json.loads(out[out.index("{"):])
    assert stats["mode"] == "zero_shot" and stats["sample_rate"] == 24000
    samples, sr = sf.read(wav, dtype="float32")
    assert sr == 24000 and samples.size == SAMPLES_PER_TOKEN * stats["speech_tokens"] > 0


def test_cli_synth_and_vc_from_recordings(tiny_v2_model_dir, tmp_path):
    wav = tmp_path / "zs.wav"
    out = _cli("synth", "--model-dir", tiny_v2_model_dir, "--voices-dir", tmp_path / "none",
               "--prompt-wav", CROSS_LINGUAL, "--prompt-text", "Hello.", TEXT,
               "--seed", 1, "-o", wav, "--json")
    stats = json.loads(out[out.index("{"):])
    samples, sr = sf.read(wav, dtype="float32")
    assert stats["mode"] == "zero_shot" and sr == 24000
    assert samples.size == SAMPLES_PER_TOKEN * stats["speech_tokens"] > 0
    vc = tmp_path / "vc.wav"
    _cli("vc", "--model-dir", tiny_v2_model_dir, "--voices-dir", tmp_path / "none",
         "--source-wav", ZERO_SHOT, "--prompt-wav", CROSS_LINGUAL, "--seed", 1, "-o", vc)
    samples, sr = sf.read(vc, dtype="float32")
    assert sr == 24000 and samples.size == HOP * (2 * (344 + 87) - 687)


def test_cli_info_and_speakers(tiny_v2_model_dir):
    info = json.loads(_cli("info", "--model-dir", tiny_v2_model_dir, "--json"))
    assert info["family"] == "cosyvoice2" and info["synthetic"] is True
    assert info["modes"] == "zero_shot, cross_lingual, vc, instruct2, sft"
    assert info["recordings"].startswith("yes")
    assert info["files"]["speech_tokenizer_v2.onnx"] != "absent"
    names = _cli("speakers", "--model-dir", tiny_v2_model_dir).split()
    assert names == ["中文女", "中文男", "日语男", "粤语女", "英文女", "英文男", "韩语女"]


# ---- the converted ONNX dir --------------------------------------------------------------------

def test_converted_onnx_dir_clones_voices_like_torch(tiny_v2_model_dir, tmp_path, tts):
    conv = tmp_path / "onnx"
    out = _cli("convert", "--format", "onnx", "--model-dir", tiny_v2_model_dir, "--out", conv)
    assert "wrote" in out
    manifest = json.loads((conv / "manifest.json").read_text(encoding="utf-8"))
    for name in ("campplus.onnx", "speech_tokenizer_v2.onnx"):
        assert manifest["files"][name]["precision"] == "onnx"
        with open(os.path.join(tiny_v2_model_dir, name), "rb") as f:
            assert (conv / name).read_bytes() == f.read()
    assert "speech_tokenizer_v1.onnx" not in manifest["files"]
    ort = Synthesizer(str(conv), backend="onnxruntime", voices_dir=str(tmp_path / "voices"),
                      prompt_backend="onnxruntime")
    try:
        assert type(ort.prompt_encoder) is PromptEncoder
        voice = ort.add_voice("amy", ZERO_SHOT, PROMPT_TEXT)
        assert voice.digest() == tts.prompt_voice(ZERO_SHOT, PROMPT_TEXT, name="amy").digest()
        got, got_tokens, mode = _run(ort, TEXT, voice="amy", seed=3)
        want, want_tokens, _ = _run(tts, TEXT, voice=voice, seed=3)
        assert mode == "zero_shot"
        np.testing.assert_array_equal(got_tokens, want_tokens)
        assert got.shape == want.shape
        assert float(np.max(np.abs(got - want))) < SYNTH_ATOL
        vc, tokens, _ = _run(ort, "", voice="amy", source_audio=CROSS_LINGUAL, seed=1)
        assert tokens.size == 344 and vc.size == SAMPLES_PER_TOKEN * 344
    finally:
        ort.close()
