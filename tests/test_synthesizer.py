"""End to end on a synthetic tiny model: Synthesizer API, pipeline parity, bad input."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosyvino.audio import join_chunks
from cosyvino import Synthesizer
from cosyvino.errors import EmptyTextError, InputError, UnknownSpeakerError
from cosyvino.families.cosyvoice1.length_regulation import mel_frames_for_tokens
from cosyvino.families.cosyvoice1.pipeline import Pipeline
from conftest import TINY_A


@pytest.fixture(scope="module")
def tts(tiny_model_dir):
    return Synthesizer(tiny_model_dir, backend="torch")


@pytest.fixture(scope="module")
def golden_tts():
    return Synthesizer(str(TINY_A), backend="torch")


@pytest.fixture(scope="module")
def golden():
    return torch.load(TINY_A / "golden.pt", weights_only=False)


def test_forced_token_count_gives_exact_length(tts):
    audio = tts.synthesize("你好，世界。", "中文女", seed=0, num_speech_tokens=50)
    assert audio.sample_rate == 22050
    assert audio.samples.dtype == np.float32 and audio.samples.ndim == 1
    assert audio.speech_tokens.shape == (50,)
    assert audio.samples.shape == (mel_frames_for_tokens(50) * 256,)  # 86 frames * 256
    assert np.abs(audio.samples).max() <= 0.99 + 1e-6
    assert audio.stats["stages"]["llm_decode"]["calls"] == 49


def test_seed_makes_output_deterministic(tts):
    a = tts.synthesize("Hello world.", "英文女", seed=7)
    b = tts.synthesize("Hello world.", "英文女", seed=7)
    c = tts.synthesize("Hello world.", "英文女", seed=8)
    np.testing.assert_array_equal(a.samples, b.samples)
    np.testing.assert_array_equal(a.speech_tokens, b.speech_tokens)
    assert not np.array_equal(a.speech_tokens, c.speech_tokens)


def test_token_bounds_follow_text_length(tts):
    audio = tts.synthesize("Hello world.", "英文女", seed=1)
    n_text = len(tts.frontend.segments("Hello world.")[0].token_ids)
    assert 2 * n_text <= audio.speech_tokens.size <= 20 * n_text


def test_stream_yields_one_audio_per_segment(tts):
    text = "第一句话说完了。" * 12 + "Then an English sentence follows here."
    segs = tts.frontend.segments(text)
    chunks = list(tts.stream(text, "中文女", seed=3, num_speech_tokens=5))
    assert len(chunks) == len(segs) >= 2
    whole = tts.synthesize(text, "中文女", seed=3, num_speech_tokens=5)
    # 5 tokens per segment: one (final) hop each, the whole-segment computation
    np.testing.assert_array_equal(join_chunks(chunks, tts.sample_rate), whole.samples)
    assert whole.stats["segments"] == len(segs)


def test_speed_changes_length(tts):
    a = tts.synthesize("你好。", "中文女", seed=0, num_speech_tokens=50, speed=2.0)
    assert a.samples.size == int(mel_frames_for_tokens(50) / 2.0) * 256


def test_tokens_to_audio(tts):
    audio = tts.tokens_to_audio(list(range(100, 160)), "中文男", seed=0)
    assert audio.samples.size == mel_frames_for_tokens(60) * 256
    with pytest.raises(InputError):
        tts.tokens_to_audio([5000], "中文男")
    with pytest.raises(InputError):
        tts.tokens_to_audio([], "中文男")


@pytest.mark.parametrize("text", ["", "   \n\t", "。，！？", "😀😀🎉", "\x00\x01\x07"])
def test_nothing_to_speak_is_a_typed_error(tts, text):
    with pytest.raises(EmptyTextError):
        tts.synthesize(text, "中文女", seed=0)


def test_unknown_speaker_lists_valid_ones(tts):
    with pytest.raises(UnknownSpeakerError) as e:
        tts.synthesize("你好。", "nobody")
    assert "中文女" in str(e.value) and "nobody" in str(e.value)
    assert isinstance(e.value, InputError)


@pytest.mark.parametrize("kwargs", [{"speed": 0}, {"speed": 10}, {"speed": float("nan")},
                                    {"seed": -1}, {"seed": "x"}, {"num_speech_tokens": 0},
                                    {"n_timesteps": 0}, {"n_timesteps": 101},
                                    {"n_timesteps": 2.5}, {"n_timesteps": True}])
def test_bad_arguments(tts, kwargs):
    with pytest.raises(InputError):
        tts.synthesize("你好。", "中文女", **kwargs)


def test_non_string_text(tts):
    with pytest.raises(InputError):
        tts.synthesize(123, "中文女")


def test_no_final_punctuation_and_control_chars(tts):
    a = tts.synthesize("没有标点的句子", "中文女", seed=0, num_speech_tokens=5)
    assert a.samples.size > 0
    b = tts.synthesize("Hello\x00 world\x07", "英文女", seed=0, num_speech_tokens=5)
    assert b.samples.size > 0


def test_long_text_is_segmented_not_dropped(tts):
    text = "这是一个很长的句子，用来测试分段。" * 1200  # ~20,000 characters
    segs = tts.frontend.segments(text)
    assert len(segs) > 100
    assert max(len(s.token_ids) for s in segs) <= 400
    # synthesize only the first two segments' worth via streaming (bounded work)
    it = tts.stream(text, "中文女", seed=0, num_speech_tokens=3)
    first = next(it)
    assert first.samples.size == mel_frames_for_tokens(3) * 256
    it.close()


# ---- pipeline-level golden parity (shared numpy loops + torch stages) ---------------------

def test_pipeline_teacher_forced_logp_matches_golden(golden_tts, golden):
    g = golden["llm"]
    pipe = golden_tts.pipeline
    lm_input = pipe.build_lm_input(g["text_token"].numpy(), g["embedding"].numpy())
    np.testing.assert_allclose(lm_input, g["lm_input"].numpy(), atol=1e-4, rtol=0)
    session = golden_tts.stages.new_llm_session()
    rows = [session.forward(lm_input)]
    for tok in g["forced_speech_tokens"].tolist():
        rows.append(session.forward(golden_tts.stages.embed_speech_tokens(
            np.array([[tok]], dtype=np.int64))))
    np.testing.assert_allclose(np.stack(rows), g["logp"].numpy(), atol=1e-4, rtol=0)


def test_pipeline_mel_and_wav_match_golden(golden_tts, golden):
    f, h = golden["flow"], golden["hift"]
    pipe: Pipeline = golden_tts.pipeline
    mel = pipe.tokens_to_mel(f["speech_token"].numpy()[0], f["embedding"].numpy(),
                             noise=f["noise"].numpy())
    np.testing.assert_allclose(mel, f["mel"].numpy(), atol=1e-4, rtol=0)
    mel_p = pipe.tokens_to_mel(f["speech_token"].numpy()[0], f["embedding"].numpy(),
                               noise=f["noise_with_prompt"].numpy(),
                               prompt_token=f["prompt_speech_token"].numpy()[0],
                               prompt_feat=f["prompt_feat"].numpy()[0])
    np.testing.assert_allclose(mel_p, f["mel_with_prompt"].numpy(), atol=1e-4, rtol=0)
    wav = pipe.mel_to_wav(h["mel"].numpy(), source=h["source"].numpy())
    np.testing.assert_allclose(wav, h["wav"].numpy()[0], atol=1e-3, rtol=0)


def _counting_estimator(monkeypatch) -> list:
    """Count the estimator calls of every CFM solve (frames of each call)."""
    from cosyvino.families.cosyvoice1 import pipeline

    calls = []
    solve = pipeline.solve_euler_cfg

    def counted(estimator, *args, **kwargs):
        def estimate(x, *rest):
            calls.append(x.shape[-1])
            return estimator(x, *rest)
        return solve(estimate, *args, **kwargs)

    monkeypatch.setattr(pipeline, "solve_euler_cfg", counted)
    return calls


@pytest.mark.parametrize("schedule", ["segment", "official"])
def test_n_timesteps_sets_the_estimator_calls(tts, monkeypatch, schedule):
    """The ODE step count is a request option: the model's 10 by default (same audio as
    asking for 10), one estimator call per step, fewer steps change the audio but not its
    length."""
    calls = _counting_estimator(monkeypatch)
    kw = dict(seed=3, num_speech_tokens=40, hop_schedule=schedule)
    default = tts.synthesize("你好，世界。", "中文女", **kw)
    hops = len(calls) // 10
    assert hops >= 1 and len(calls) == 10 * hops
    ten = tts.synthesize("你好，世界。", "中文女", n_timesteps=10, **kw)
    np.testing.assert_array_equal(default.samples, ten.samples)
    calls.clear()
    three = tts.synthesize("你好，世界。", "中文女", n_timesteps=3, **kw)
    assert len(calls) == 3 * hops
    assert three.samples.shape == default.samples.shape
    # random tiny weights: the estimator barely moves the mel, so the change is small
    assert np.abs(three.samples - default.samples).max() > 1e-5
