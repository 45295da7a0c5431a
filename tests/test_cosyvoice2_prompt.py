"""The CosyVoice2 prompt side (sheet v2 §3.4-§3.6, §3.8): the 24 kHz prompt mel, the prompt
alignment rule, the prompt-audio intake at the family's rate, and voices from the stand-in
prompt models of a synthetic tiny v2 dir."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest
import soundfile as sf
from conftest import FIXTURES, TINY_C

from cosyvino.errors import ConfigError, InputError, ModelDirError
from cosyvino.families.cosyvoice1.config import MelConfig
from cosyvino.families.cosyvoice1.yaml_config import Tagged
from cosyvino.families.cosyvoice2.prompt_models import (
    PROMPT_MEL,
    PromptEncoder,
    align_prompt,
    prompt_mel_config,
    read_prompt_mel_config,
)
from cosyvino.frontend.features import prompt_mel, prompt_mel_of
from cosyvino.prompt_audio import MEL_RATE, load_prompt_audio

ZERO_SHOT = FIXTURES / "zero_shot_prompt.wav"          # 24 kHz float32 mono, 3.48 s
CROSS_LINGUAL = FIXTURES / "cross_lingual_prompt.wav"  # 22.05 kHz int16 mono, 13.75 s


# ---- a direct reference of the Matcha mel formula (sheet v2 §3.6), written independently -------

def _slaney_hz_to_mel(f: float) -> float:
    # linear 3 bins per 200 Hz below 1 kHz, then log steps of ln(6.4) / 27
    return f * 3.0 / 200.0 if f < 1000.0 else 15.0 + math.log(f / 1000.0) * 27.0 / math.log(6.4)


def _slaney_mel_to_hz(m: float) -> float:
    return m * 200.0 / 3.0 if m < 15.0 else 1000.0 * math.exp((m - 15.0) * math.log(6.4) / 27.0)


def _reference_mel(x: np.ndarray, sr=24000, n_fft=1920, hop=480, n_mels=80, fmax=8000.0):
    """log(max(slaney_mel @ |rfft(hann * frame)|, 1e-5)) with a DFT by matrix product."""
    pad = (n_fft - hop) // 2
    xp = np.concatenate([x[1:pad + 1][::-1], x, x[-pad - 1:-1][::-1]]).astype(np.float64)
    n_frames = (len(xp) - n_fft) // hop + 1
    frames = np.stack([xp[i * hop:i * hop + n_fft] for i in range(n_frames)])
    n = np.arange(n_fft)
    frames = frames * (0.5 - 0.5 * np.cos(2 * np.pi * n / n_fft))
    k = np.arange(n_fft // 2 + 1)[:, None]
    re = frames @ np.cos(2 * np.pi * k * n / n_fft).T
    im = frames @ np.sin(2 * np.pi * k * n / n_fft).T
    mag = np.sqrt(re ** 2 + im ** 2 + 1e-9)
    edges = [_slaney_mel_to_hz(_slaney_hz_to_mel(0.0) + i * (_slaney_hz_to_mel(fmax)
                                                            - _slaney_hz_to_mel(0.0)) / (n_mels + 1))
             for i in range(n_mels + 2)]
    bins = np.arange(n_fft // 2 + 1) * sr / n_fft
    bank = np.zeros((n_mels, len(bins)))
    for m in range(n_mels):
        lo, mid, hi = edges[m], edges[m + 1], edges[m + 2]
        for j, f in enumerate(bins):
            w = min((f - lo) / (mid - lo), (hi - f) / (hi - mid))
            bank[m, j] = max(0.0, w) * 2.0 / (hi - lo)
    return np.log(np.maximum(mag @ bank.T, 1e-5))  # [T, n_mels]


def test_24k_prompt_mel_matches_the_formula():
    x, sr = sf.read(ZERO_SHOT, dtype="float32")
    assert sr == 24000
    mel = prompt_mel_of(x, PROMPT_MEL)
    assert mel.shape == (1, 80, x.size // 480) == (1, 80, 174) and mel.dtype == np.float32
    ref = _reference_mel(x)
    np.testing.assert_allclose(mel[0].T, ref, atol=1e-4, rtol=0)
    # the v1 parameters are a different mel: the config decides
    assert prompt_mel(x, 24000).shape[2] == x.size // 256


def test_window_shorter_than_n_fft_is_centred_as_torch_stft():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal(4000).astype(np.float32)
    ours = prompt_mel(x, sample_rate=16000, n_fft=64, hop=16, n_mels=8, fmax=None, win=48)
    xp = torch.nn.functional.pad(torch.from_numpy(x)[None, None], (24, 24), mode="reflect")[0, 0]
    spec = torch.stft(xp.double(), 64, 16, 48, torch.hann_window(48, dtype=torch.float64),
                      center=False, return_complex=True)
    mag = torch.sqrt(spec.real ** 2 + spec.imag ** 2 + 1e-9).numpy()
    from cosyvino.frontend.features import slaney_mel_filters

    ref = np.log(np.maximum(slaney_mel_filters(16000, 64, 8, 0.0, None) @ mag, 1e-5))
    np.testing.assert_allclose(ours[0], ref, atol=1e-5)
    np.testing.assert_array_equal(prompt_mel(x, win=1024), prompt_mel(x))
    with pytest.raises(InputError, match="window"):
        prompt_mel(x, win=2048)


def test_prompt_mel_config_from_the_yaml(tmp_path):
    from cosyvino.families.cosyvoice1.yaml_config import load_inert_yaml

    assert read_prompt_mel_config(TINY_C) == PROMPT_MEL
    data = load_inert_yaml(TINY_C / "cosyvoice2.yaml")
    assert prompt_mel_config({}) == PROMPT_MEL
    bad = dict(data, feat_extractor=Tagged("name", "matcha.utils.audio.mel_spectrogram",
                                           {"hop_size": 256, "sampling_rate": 24000}))
    with pytest.raises(ConfigError, match="feat_extractor.*50 frames/s"):
        prompt_mel_config(bad, "x.yaml")
    with pytest.raises(ConfigError, match="numbers"):
        prompt_mel_config(dict(data, feat_extractor=Tagged("name", "m", {"n_fft": "big"})))


def test_alignment_rule():
    mel = np.arange(25 * 80, dtype=np.float32).reshape(25, 80)
    t, m = align_prompt(np.arange(13), mel)          # L = min(25 // 2, 13) = 12
    assert t.tolist() == list(range(12)) and m.shape == (24, 80) and t.dtype == np.int64
    np.testing.assert_array_equal(m, mel[:24])
    t, m = align_prompt(np.arange(10)[None], mel[None])  # L = min(12, 10) = 10
    assert t.shape == (10,) and m.shape == (20, 80)
    with pytest.raises(InputError, match="too short"):
        align_prompt(np.arange(3), mel[:1])
    with pytest.raises(InputError, match="tokens must be"):
        align_prompt(np.zeros((2, 3)), mel)


def test_intake_at_the_family_rate():
    v1 = load_prompt_audio(CROSS_LINGUAL)
    v2 = load_prompt_audio(CROSS_LINGUAL, mel_rate=24000)
    n = v1.wav_mel.size  # 22.05 kHz source: not resampled for v1
    assert v1.mel_rate == MEL_RATE and v1.wav_22k is v1.wav_mel
    assert v2.mel_rate == 24000 and abs(v2.wav_mel.size - n * 24000 / 22050) <= 1
    np.testing.assert_array_equal(v2.wav_16k, v1.wav_16k)
    with pytest.raises(AttributeError, match="24000 Hz"):
        v2.wav_22k  # noqa: B018
    assert load_prompt_audio(v2, mel_rate=24000) is v2
    with pytest.raises(InputError, match="loaded for a 22050 Hz prompt mel.*24000"):
        load_prompt_audio(v1, mel_rate=24000)
    x, _ = sf.read(ZERO_SHOT, dtype="float32")  # 24 kHz source: kept as is
    np.testing.assert_array_equal(load_prompt_audio(ZERO_SHOT, mel_rate=24000).wav_mel, x)


# ---- voices from the stand-in prompt models --------------------------------------------------

@pytest.fixture(scope="module", params=["onnxruntime", "openvino"])
def encoder(request, tiny_v2_model_dir):
    pytest.importorskip(request.param)
    enc = PromptEncoder(tiny_v2_model_dir, request.param)
    yield enc
    enc.close()


def test_voice_has_the_v2_bundle_shapes(encoder):
    x, _ = sf.read(ZERO_SHOT, dtype="float32")
    v = encoder.voice(ZERO_SHOT, name="z", prompt_text="希望你以后能够做的比我还好呦。")
    n16 = load_prompt_audio(ZERO_SHOT).wav_16k.size
    p = math.ceil(math.ceil((n16 // 160) / 2) / 2)  # 25 Hz: two stride-2 convs over 100 Hz
    assert v.embedding.shape == (1, 192) and v.embedding.dtype == np.float32
    assert v.prompt_speech_tokens.shape == (p,) == (87,)
    assert v.prompt_speech_tokens.dtype == np.int64 and v.prompt_speech_tokens.max() < 6561
    assert v.prompt_mel.shape == (x.size // 480, 80) == (174, 80)
    np.testing.assert_array_equal(v.prompt_mel, prompt_mel_of(x, PROMPT_MEL)[0].T)
    assert v.prompt_text == "希望你以后能够做的比我还好呦。" and v.prompt_seconds == 3.48
    tokens, mel = align_prompt(v.prompt_speech_tokens, v.prompt_mel)
    assert mel[None].shape == (1, 2 * tokens.size, 80) and tokens.shape == (87,)
    assert encoder.check_voice(v) is None


def test_voice_of_a_22k_recording_and_source_tokens(encoder):
    v = encoder.voice(CROSS_LINGUAL, name="c")
    n24 = load_prompt_audio(CROSS_LINGUAL, mel_rate=24000).wav_mel.size
    assert v.prompt_mel.shape == (n24 // 480, 80)
    tokens, mel = align_prompt(v.prompt_speech_tokens, v.prompt_mel)
    assert abs(tokens.size - v.prompt_speech_tokens.size) <= 1 and mel.shape[0] == 2 * tokens.size
    src = encoder.speech_tokens(ZERO_SHOT)
    assert src.shape == (87,) and src.dtype == np.int64
    with pytest.raises(InputError):
        encoder.voice(b"not audio")


def test_check_voice_and_missing_files(tmp_path, tiny_v2_model_dir):
    from cosyvino.voices import Voice

    enc = PromptEncoder(tiny_v2_model_dir, "onnxruntime")
    v1_voice = Voice(name="v1", embedding=np.zeros((1, 192), np.float32),
                     prompt_speech_tokens=np.array([6561]), prompt_mel=np.zeros((4, 80)))
    assert "outside 0..6560" in enc.check_voice(v1_voice)
    d = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_v2_model_dir, d)
    os.unlink(d / "speech_tokenizer_v2.onnx")
    with pytest.raises(ModelDirError, match="speech_tokenizer_v2.onnx not found"):
        PromptEncoder(d, "onnxruntime").voice(ZERO_SHOT)
    with pytest.raises(ConfigError, match="bins"):
        PromptEncoder(d, mel_bins=100)
    assert PromptEncoder(d, mel=MelConfig(n_fft=1920, sampling_rate=24000, hop_size=480,
                                          win_size=1920)).mel.sampling_rate == 24000


def test_prompt_and_synthetic_modules_do_not_import_torch(tmp_path):
    """Voices from recordings need no torch; the synthetic-dir modules import it only when
    writing weights (the prompt-model stand-ins need onnx, not torch)."""
    import subprocess
    import sys

    pytest.importorskip("onnx")
    code = ("import sys\n"
            "from cosyvino.families.cosyvoice2 import prompt_models, presets, yaml_writer\n"
            "from cosyvino.families.cosyvoice2 import synthetic, synthetic_prompt_models\n"
            "from cosyvino.frontend.features import prompt_mel_of\n"
            "yaml_writer.render_cosyvoice2_yaml(presets.full_0_5b())\n"
            f"synthetic_prompt_models.write_prompt_models({str(tmp_path)!r}, 'tiny')\n"
            f"prompt_models.read_prompt_mel_config({str(TINY_C)!r})\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=False)
    assert res.returncode == 0, res.stderr
