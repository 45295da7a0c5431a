"""Voice cloning on the command line (issue 15, item 5): ``cosyvino synth`` in every mode
(zero-shot, cross-lingual, instruct, a registered voice), ``cosyvino vc``, ``cosyvino voices
add | list | remove``; the written audio equals the library's for the same seed, whole and
--stream; bad prompt audio is a one-line error with exit status 2, found before the model
loads. Tiny synthetic model with the synthetic prompt models."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest

pytest.importorskip("onnx")
sf = pytest.importorskip("soundfile")
from click.testing import CliRunner  # noqa: E402

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.audio import float_to_int16  # noqa: E402
from cosyvino.cli.main import main  # noqa: E402
from conftest import FIXTURES  # noqa: E402

PROMPT = FIXTURES / "zero_shot_prompt.wav"
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"
TEXT = "你好，世界。"
TOKENS = 12
#: what `synth` / `vc` print just before the model loads
LOADING = ": backend torch, threads"


def _wav(samples, rate) -> bytes:
    buf = io.BytesIO()
    sf.write(buf, samples, rate, format="WAV", subtype="PCM_16")
    return buf.getvalue()


@pytest.fixture(scope="module")
def voices_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("voices"))


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 1.5 s source recording for voice conversion."""
    x, rate = sf.read(FIXTURES / "cross_lingual_prompt.wav", dtype="float32")
    path = tmp_path_factory.mktemp("src") / "source.wav"
    sf.write(path, x[: int(1.5 * rate)], rate)
    return str(path)


@pytest.fixture(scope="module")
def instruct_dir(tiny_model_dir, tmp_path_factory):
    link = tmp_path_factory.mktemp("named") / "CosyVoice-300M-Instruct"
    os.symlink(tiny_model_dir, link)
    return str(link)


@pytest.fixture(scope="module")
def tts(tiny_model_dir, voices_dir):
    return Synthesizer(tiny_model_dir, backend="torch", voices_dir=voices_dir)


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def voices(tiny_model_dir, voices_dir, *args):
    return run("voices", *args, "--model-dir", tiny_model_dir, "--voices-dir", voices_dir)


@pytest.fixture(scope="module")
def alice(tiny_model_dir, voices_dir, tts):
    r = voices(tiny_model_dir, voices_dir, "add", "alice", "--prompt-wav", PROMPT,
               "--prompt-text", PROMPT_TEXT)
    assert r.exit_code == 0, r.output
    return "alice"


def test_voices_add_list_remove(tiny_model_dir, voices_dir, alice, tts):
    r = voices(tiny_model_dir, voices_dir, "list", "--json")
    assert r.exit_code == 0, r.output
    listed = json.loads(r.stdout)
    assert [v["name"] for v in listed] == ["alice"]
    assert listed[0]["prompt_text"] == PROMPT_TEXT
    assert listed[0]["prompt_seconds"] == pytest.approx(3.48, abs=0.01)
    # the Synthesizer on the same store sees it, with the bundle a per-call prompt gives
    assert tts.voice_info("alice")["sha256"] == listed[0]["sha256"]
    assert tts.voice("alice").digest() == tts.prompt_voice(PROMPT, PROMPT_TEXT).digest()
    r = voices(tiny_model_dir, voices_dir, "add", "alice", "--prompt-wav", PROMPT)
    assert r.exit_code == 2 and "pass --overwrite" in r.output
    r = voices(tiny_model_dir, voices_dir, "add", "中文女", "--prompt-wav", PROMPT)
    assert r.exit_code == 2 and "built-in speaker" in r.output
    r = voices(tiny_model_dir, voices_dir, "add", "a/b", "--prompt-wav", PROMPT)
    assert r.exit_code == 2 and "invalid voice name" in r.output
    r = voices(tiny_model_dir, voices_dir, "add", "tmp1", "--prompt-wav", PROMPT)
    assert r.exit_code == 0 and "no transcript: cross-lingual" in r.output
    assert "tmp1\t3.48 s\t(no transcript)" in voices(tiny_model_dir, voices_dir,
                                                      "list").output
    r = voices(tiny_model_dir, voices_dir, "remove", "tmp1")
    assert r.exit_code == 0 and not os.path.exists(os.path.join(voices_dir, "tmp1.npz"))
    r = voices(tiny_model_dir, voices_dir, "remove", "tmp1")
    assert r.exit_code == 2 and "no registered voice 'tmp1'" in r.output
    r = voices(tiny_model_dir, voices_dir, "remove", "中文女")
    assert r.exit_code == 2 and "built-in speaker" in r.output


def _cases(tiny_model_dir, instruct_dir, source):
    """mode -> (CLI args, model dir, library synthesize() arguments)."""
    return {
        "zero_shot": (["synth", TEXT, "--prompt-wav", PROMPT, "--prompt-text", PROMPT_TEXT],
                      tiny_model_dir, dict(text=TEXT, prompt_audio=str(PROMPT),
                                           prompt_text=PROMPT_TEXT)),
        "cross_lingual": (["synth", "<|en|>Hello.", "--prompt-wav", PROMPT], tiny_model_dir,
                          dict(text="<|en|>Hello.", prompt_audio=str(PROMPT))),
        "voice": (["synth", TEXT, "-v", "alice"], tiny_model_dir,
                  dict(text=TEXT, speaker="alice")),
        "instruct": (["synth", TEXT, "-s", "中文女", "--instruct", "A calm narrator."],
                     instruct_dir, dict(text=TEXT, speaker="中文女",
                                        instruction="A calm narrator.")),
        "vc": (["vc", "--source-wav", source, "--prompt-wav", PROMPT], tiny_model_dir,
               dict(source_audio=source, prompt_audio=str(PROMPT))),
    }


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", ["zero_shot", "cross_lingual", "voice", "instruct", "vc"])
def test_every_mode_writes_the_library_audio(case, stream, tiny_model_dir, instruct_dir, source,
                                             voices_dir, alice, tts, tmp_path):
    args, model_dir, call = _cases(tiny_model_dir, instruct_dir, source)[case]
    out = tmp_path / "out.wav"
    extra = ["--stream", "--hop-schedule", "segment"] if stream else []
    r = run(*args, "--model-dir", model_dir, "--voices-dir", voices_dir, "--seed", 4,
            "--num-speech-tokens", TOKENS, "-o", out, "--json", *extra)
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["mode"] == {"voice": "zero_shot"}.get(case, case)
    got, rate = sf.read(out, dtype="int16")
    lib = tts if model_dir == tiny_model_dir else Synthesizer(model_dir, backend="torch",
                                                              voices_dir=False)
    want = lib.synthesize(**call, seed=4, num_speech_tokens=TOKENS)
    assert rate == want.sample_rate
    np.testing.assert_array_equal(got, float_to_int16(want.samples))
    if case == "vc":  # as long as the source (1.5 s), whatever --num-speech-tokens says
        assert abs(len(got) / rate - 1.5) < 0.1
    else:
        assert len(got) > 0


def test_mode_errors_name_the_cli_options(instruct_dir, tmp_path):
    """A library mode error reaches the CLI user with the option names (--prompt-wav), not
    the library's argument names (prompt_audio)."""
    r = run("synth", TEXT, "--prompt-wav", PROMPT, "--prompt-text", PROMPT_TEXT, "--model-dir",
            instruct_dir, "-o", tmp_path / "x.wav")
    assert r.exit_code == 2
    assert "nearest mode: --prompt-wav is not used by mode 'sft'" in r.output
    assert "prompt_audio" not in r.output and not (tmp_path / "x.wav").exists()


def _bad(tmp_path):
    rng = np.random.default_rng(0)
    speech = lambda s, rate=16000: (0.1 * rng.standard_normal(int(rate * s))  # noqa: E731
                                    ).astype(np.float32)
    files = {
        "missing": (None, "file not found"),
        "not-audio": (b"definitely not audio", "not a readable audio file"),
        "empty": (b"", "is empty (0 bytes)"),
        "too-short": (_wav(speech(0.5), 16000), "the minimum is 1 s"),
        "too-long": (_wav(speech(31), 16000), "the limit is 30 s"),
        "silent": (_wav(np.zeros(32000, np.float32), 16000), "is silent"),
        "low-rate": (_wav(speech(2, 4000), 4000), "below the minimum of 8000 Hz"),
    }
    out = []
    for name, (data, match) in files.items():
        path = tmp_path / f"{name}.wav"
        if data is not None:
            path.write_bytes(data)
        out.append((name, path, match))
    return out


def test_bad_prompt_audio_is_exit_2_before_the_model_loads(tiny_model_dir, voices_dir, source,
                                                           tmp_path):
    for name, path, match in _bad(tmp_path):
        for args in (["synth", TEXT, "--prompt-wav", path, "--prompt-text", PROMPT_TEXT],
                     ["vc", "--source-wav", source, "--prompt-wav", path],
                     ["voices", "add", "x", "--prompt-wav", path, "--voices-dir",
                      voices_dir]):
            r = run(*args, "--model-dir", tiny_model_dir)
            assert r.exit_code == 2, (name, args, r.output)
            assert "error: --prompt-wav: prompt audio" in r.output, (name, r.output)
            assert match in r.output, (name, r.output)
            assert "Traceback" not in r.output and LOADING not in r.output
        if name != "too-short":  # 0.5 s is a valid source (the source minimum is 0.2 s)
            r = run("vc", "--source-wav", path, "--prompt-wav", PROMPT, "--model-dir",
                    tiny_model_dir)
            assert r.exit_code == 2 and "error: --source-wav: source audio" in r.output, \
                r.output
    assert not os.path.exists(os.path.join(voices_dir, "x.npz"))


def test_argument_errors_are_exit_2(tiny_model_dir, voices_dir, source):
    base = ["--model-dir", tiny_model_dir, "--voices-dir", voices_dir]
    r = run("synth", TEXT, "-s", "中文女", "-v", "alice", *base)
    assert r.exit_code == 2 and "either -s/--speaker or -v/--voice" in r.output
    r = run("synth", TEXT, "-v", "nobody", *base)
    assert r.exit_code == 2 and "unknown speaker 'nobody'" in r.output
    assert LOADING not in r.output
    r = run("synth", TEXT, "-s", "中文女", "--prompt-wav", PROMPT, *base)
    assert r.exit_code == 2 and "not both" in r.output
    r = run("synth", TEXT, "--prompt-wav", PROMPT, "--prompt-text", " ", *base)
    assert r.exit_code == 2 and "--prompt-text is empty" in r.output
    r = run("vc", "--source-wav", source, *base)
    assert r.exit_code == 2 and "--prompt-wav FILE or -v/--voice NAME" in r.output
    # instruct on a base model: the library's error, naming the model's modes
    r = run("synth", TEXT, "-s", "中文女", "--instruct", "calm", *base)
    assert r.exit_code == 2 and "instruct needs a CosyVoice-300M-Instruct" in r.output


def test_prompt_and_voice_errors_are_reexported():
    import cosyvino
    from cosyvino import errors, prompt_audio, voice_store
    from cosyvino.voices import Voice

    for name in ("PromptAudioError", "NotAudioError", "EmptyAudioError", "AudioTooShortError",
                 "AudioTooLongError", "SilentAudioError", "InvalidAudioError"):
        assert getattr(errors, name) is getattr(prompt_audio, name)
        assert issubclass(getattr(errors, name), errors.InputError)
    for name in ("VoiceStoreError", "CorruptVoiceError", "InvalidVoiceNameError",
                 "VoiceExistsError", "UnknownVoiceError"):
        assert getattr(errors, name) is getattr(voice_store, name)
    assert cosyvino.Voice is Voice
    with pytest.raises(AttributeError):
        errors.NoSuchError  # noqa: B018


def test_a_corrupt_registered_voice_is_named_as_such_before_loading(tiny_model_dir,
                                                                    tmp_path):
    """`-v NAME` whose stored file fails its checks: 'unusable, register it again', not
    'unknown speaker' (trial finding)."""
    store = tmp_path / "voices"
    store.mkdir()
    (store / "broken.npz").write_bytes(b"garbage")
    r = run("synth", TEXT, "-v", "broken", "--model-dir", tiny_model_dir, "--voices-dir",
            str(store), "-o", str(tmp_path / "x.wav"))
    assert r.exit_code == 2, r.output
    assert "voice 'broken' is registered but its file is unusable" in r.output
    assert "--overwrite" in r.output and "unknown speaker" not in r.output
    assert LOADING not in r.output
