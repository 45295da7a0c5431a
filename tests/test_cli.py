"""The cosyvino command line on a synthetic tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import soundfile as sf
from click.testing import CliRunner

from cosyvino.cli.main import main
from cosyvino.families.cosyvoice1.length_regulation import mel_frames_for_tokens
from conftest import TINY_A


def test_synth_writes_expected_file_via_console_script(tiny_model_dir, tmp_path):
    out = tmp_path / "x.wav"
    proc = subprocess.run(
        [sys.executable, "-m", "cosyvino.cli", "synth", "--model-dir", str(tiny_model_dir),
         "-s", "英文女", "--num-speech-tokens", "100", "--seed", "1", "-o", str(out), "--json",
         "Hello there, general Kenobi."], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    stats = json.loads(proc.stdout)
    data, sr = sf.read(out)
    assert sr == 22050 and data.ndim == 1
    assert data.shape[0] == mel_frames_for_tokens(100) * 256
    assert abs(stats["audio_seconds"] - data.shape[0] / 22050) < 1e-3
    assert stats["speech_tokens"] == 100 and stats["rtf"] > 0


def test_synth_formats_and_text_file(tiny_model_dir, tmp_path):
    (tmp_path / "t.txt").write_text("你好。", encoding="utf-8")
    for fmt in ("flac", "ogg", "mp3"):
        out = tmp_path / f"y.{fmt}"
        r = CliRunner().invoke(main, ["synth", "--model-dir", str(tiny_model_dir),
                                      "--text-file", str(tmp_path / "t.txt"),
                                      "--num-speech-tokens", "20", "-o", str(out)])
        assert r.exit_code == 0, r.output
        info = sf.info(out)
        assert info.samplerate == 22050 and info.channels == 1 and info.frames > 0


def test_bad_input_exits_2_with_message(tiny_model_dir, tmp_path):
    r = CliRunner().invoke(main, ["synth", "--model-dir", str(tiny_model_dir), "-s", "nobody",
                                  "hi.", "-o", str(tmp_path / "z.wav")])
    assert r.exit_code == 2 and "unknown speaker 'nobody'" in r.output
    r = CliRunner().invoke(main, ["synth", "--model-dir", str(tiny_model_dir), "   ",
                                  "-o", str(tmp_path / "z.wav")])
    assert r.exit_code == 2 and "error:" in r.output
    assert not (tmp_path / "z.wav").exists()
    r = CliRunner().invoke(main, ["synth", "--model-dir", str(tmp_path / "missing"), "hi"])
    assert r.exit_code == 2 and "not found" in r.output


def test_speakers_info_backends(tiny_model_dir):
    r = CliRunner().invoke(main, ["speakers", "--model-dir", str(tiny_model_dir), "--json"])
    assert r.exit_code == 0 and "中文女" in json.loads(r.output)
    r = CliRunner().invoke(main, ["info", "--model-dir", str(tiny_model_dir), "--json"])
    data = json.loads(r.output)
    assert data["synthetic"] is True and data["sample_rate"] == 22050
    # a base model with its prompt models: the cloning modes and sft, not instruct
    assert data["modes"] == "zero_shot, cross_lingual, vc, sft"
    r = CliRunner().invoke(main, ["backends"])
    assert r.exit_code == 0
    assert any(line.startswith("torch: ") for line in r.output.splitlines())


def test_make_model_refuses_existing_dir(tiny_model_dir):
    r = CliRunner().invoke(main, ["make-model", "--preset", "tiny", str(tiny_model_dir)])
    assert r.exit_code == 2 and "already exists" in r.output


def test_output_in_missing_directory_is_refused(tiny_model_dir, tmp_path):
    out = tmp_path / "no" / "such" / "dir" / "a.wav"
    r = CliRunner().invoke(main, ["synth", "--model-dir", str(tiny_model_dir),
                                  "--num-speech-tokens", "5", "hi.", "-o", str(out)])
    assert r.exit_code == 2 and "output directory does not exist" in r.output
    assert not (tmp_path / "no").exists()


def test_output_file_mode_follows_umask(tiny_model_dir, tmp_path):
    out = tmp_path / "m.wav"
    r = CliRunner().invoke(main, ["synth", "--model-dir", str(tiny_model_dir),
                                  "--num-speech-tokens", "5", "hi.", "-o", str(out)])
    assert r.exit_code == 0, r.output
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o666 & ~umask


def test_speakers_on_missing_dir(tmp_path):
    r = CliRunner().invoke(main, ["speakers", "--model-dir", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "model directory not found" in r.output


@pytest.mark.parametrize("fixture,runtime", [("converted_dir", "openvino"),
                                             ("onnx_dir", "onnxruntime")])
def test_speakers_and_info_on_converted_dir(request, fixture, runtime):
    """`speakers` and `info` read a converted dir (D/openvino, D/onnx) from its speakers.json
    and manifest, in a process that never imports torch or the runtime."""
    conv = request.getfixturevalue(fixture)(TINY_A)
    official = CliRunner().invoke(main, ["speakers", "--model-dir", str(TINY_A), "--json"])
    assert official.exit_code == 0, official.output
    code = ("import json, sys\n"
            "from click.testing import CliRunner\n"
            "from cosyvino.cli import main\n"
            "s = CliRunner().invoke(main, ['speakers', '--model-dir', sys.argv[1], '--json'])\n"
            "i = CliRunner().invoke(main, ['info', '--model-dir', sys.argv[1], '--json'])\n"
            "assert s.exit_code == 0 and i.exit_code == 0, (s.output, i.output)\n"
            "print(json.dumps({'speakers': json.loads(s.output), 'info': json.loads(i.output),"
            " 'imported': sorted({'torch', 'openvino', 'onnxruntime'} & set(sys.modules))}))\n")
    out = subprocess.run([sys.executable, "-c", code, conv], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["imported"] == []
    assert res["speakers"] == json.loads(official.output)
    info = res["info"]
    assert info["converted"] == runtime
    assert info["path"] == os.path.abspath(conv)
    src_info = json.loads(CliRunner().invoke(main, ["info", "--model-dir", str(TINY_A),
                                                    "--json"]).output)
    for key in ("synthetic", "sample_rate", "llm", "flow", "hift"):  # from the copied yaml
        assert info[key] == src_info[key], key
    assert info["sample_rate"] == 22050
    assert info["speakers"] == ", ".join(res["speakers"])
    assert info["modes"] == src_info["modes"] and "sft" in info["modes"]
    ext = ".xml" if runtime == "openvino" else ".onnx"
    assert {f"llm{ext}", "speakers.json", "speakers.npy"} <= set(info["files"])
    assert all(v.endswith(" MB") or " MB (" in v for v in info["files"].values())
    assert "llm.pt" not in info["files"] and "parameters" not in info


def test_speakers_on_converted_dir_with_bad_speakers_file(tmp_path):
    from cosyvino.converted import write_manifest

    write_manifest(str(tmp_path), {"format": 1, "runtime": "onnxruntime", "files": {}})
    r = CliRunner().invoke(main, ["speakers", "--model-dir", str(tmp_path)])
    assert r.exit_code == 2
    assert "speakers.json: cannot read speakers" in r.output
    assert "cosyvino convert --format onnx" in r.output


def test_make_model_without_torch_is_a_typed_error(tmp_path):
    """In an install without torch, make-model exits 2 with a one-line hint, not a traceback."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\n"
            "from cosyvino.cli import main\n"
            f"main(['make-model', {str(tmp_path / 'm')!r}])\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "make-model needs torch" in r.stderr and "cosyvino[torch]" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "m").exists()


# ---- issue 19 item 12: everything that can be checked is checked before the model loads ----
@pytest.fixture
def no_model_load(monkeypatch):
    """Fail the test if synth gets as far as loading (or creating) a model."""
    import cosyvino.defaults
    import cosyvino.synthesizer

    def boom(*a, **k):
        raise AssertionError("the model was loaded before the input was checked")

    monkeypatch.setattr(cosyvino.synthesizer.Synthesizer, "__init__", boom)
    monkeypatch.setattr(cosyvino.defaults, "ensure_default_model", boom)


def _synth(args, **kwargs):
    return CliRunner().invoke(main, ["synth", *args], **kwargs)


def test_invalid_utf8_text_is_a_typed_error_before_loading(tiny_model_dir, tmp_path,
                                                           no_model_load):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Grüße aus Köln.".encode("latin-1"))
    out = tmp_path / "o.wav"
    r = _synth(["--model-dir", tiny_model_dir, "--text-file", str(bad), "-o", str(out)])
    assert r.exit_code == 2, r.output
    assert f"--text-file {bad} is not valid UTF-8: byte 0xfc at offset 2" in r.output
    assert r.exception is None or isinstance(r.exception, SystemExit)  # no traceback
    r = _synth(["--model-dir", tiny_model_dir, "--text-file", "-", "-o", str(out)],
               input=b"\xff\xfe hello")
    assert r.exit_code == 2 and "--text-file stdin is not valid UTF-8: byte 0xff at offset 0" \
        in r.output
    # undecodable bytes in argv reach Python as lone surrogates
    r = _synth(["--model-dir", tiny_model_dir, "caf\udce9", "-o", str(out)])
    assert r.exit_code == 2 and "TEXT is not valid UTF-8" in r.output
    assert not out.exists()


def test_invalid_utf8_on_stdin_has_no_traceback(tiny_model_dir, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "cosyvino.cli", "synth", "--model-dir",
                           tiny_model_dir, "--text-file", "-", "-o", str(tmp_path / "o.wav")],
                          input=b"ok \xc3\x28", capture_output=True, timeout=120)
    assert proc.returncode == 2
    assert b"not valid UTF-8: byte 0xc3 at offset 3" in proc.stderr
    assert b"Traceback" not in proc.stderr


@pytest.mark.parametrize("args,message", [
    (["-o", "{tmp}/x.aac"], "unknown audio format 'aac' (from -o {tmp}/x.aac)"),
    (["-o", "{tmp}/x.wav", "--stream", "--format", "xyz"], "Invalid value for '--format'"),
    (["-o", "-", "--format", "wav"], "-o - writes raw int16 PCM to stdout"),
    (["-o", "{tmp}/missing/x.wav", "--stream"], "output directory does not exist"),
    (["-o", "{tmp}"], "is a directory"),
    (["-o", "{tmp}/x.wav", "--speed", "9"], "Invalid value for '--speed'"),
])
def test_bad_output_or_option_fails_before_loading(tiny_model_dir, tmp_path, no_model_load,
                                                   args, message):
    args = [a.replace("{tmp}", str(tmp_path)) for a in args]
    r = _synth(["--model-dir", tiny_model_dir, "Hello.", *args])
    assert r.exit_code == 2, r.output
    assert message.replace("{tmp}", str(tmp_path)) in r.output
    assert list(tmp_path.iterdir()) == []


def test_bad_text_and_speaker_fail_before_loading(tiny_model_dir, tmp_path, no_model_load):
    out = str(tmp_path / "o.wav")
    r = _synth(["--model-dir", tiny_model_dir, " ...  ", "-o", out])
    assert r.exit_code == 2 and "the text has nothing to speak" in r.output
    r = _synth(["--model-dir", tiny_model_dir, "-s", "nobody", "Hello.", "-o", out])
    assert r.exit_code == 2 and "unknown speaker 'nobody'; available speakers: " in r.output
    r = _synth(["--model-dir", str(tmp_path / "nope"), "Hello.", "-o", out])
    assert r.exit_code == 2 and "model directory not found" in r.output
    assert not os.path.exists(out)


# ---- issue 19 item 4: demo and synth run as the plan says --------------------------------------
def _write_plan(path, model_dir, backend="torch", threads=1, **options):
    from cosyvino.planner import Plan

    Plan(backend=backend, backend_options={"num_threads": threads, **options}, streams=1,
         threads_per_stream=threads, pinning=False, max_sessions=1, queue_size=2,
         model_dir=str(model_dir)).save(str(path))
    return str(path)


def test_synth_uses_the_plan_unless_flags_override(tiny_model_dir, tmp_path, monkeypatch):
    plan = _write_plan(tmp_path / "plan.toml", tiny_model_dir, threads=1)
    monkeypatch.setenv("COSYVINO_PLAN", plan)
    base = ["--model-dir", tiny_model_dir, "--num-speech-tokens", "5", "--seed", "0", "--json",
            "Hello."]
    r = _synth([*base, "-o", str(tmp_path / "a.wav")])
    assert r.exit_code == 0, r.output
    assert (f"cosyvino synth: backend torch, threads 1 (plan {plan}); model dir "
            f"{tiny_model_dir}") in r.stderr
    assert "voice: " in r.stderr and "-s picks another" in r.stderr  # no -s: said which
    stats = json.loads(r.stdout)
    assert stats["threads"] == 1 and stats["settings_source"] == f"plan {plan}"
    r = _synth([*base, "--threads", "2", "-o", str(tmp_path / "b.wav")])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["threads"] == 2
    assert f"threads 2 (plan {plan}, overridden by --threads)" in r.stderr
    # a plan made for another model is not used for --model-dir
    other = _write_plan(tmp_path / "other.toml", tmp_path / "elsewhere", threads=1)
    r = _synth([*base, "--plan", other, "-o", str(tmp_path / "c.wav")])
    assert r.exit_code == 0, r.output
    assert f"note: plan {other} is for {tmp_path / 'elsewhere'}, not {tiny_model_dir}" in r.stderr
    assert json.loads(r.stdout)["threads"] is None


def test_backend_flag_over_a_plan_of_a_converted_dir_uses_its_source(converted_dir, tmp_path,
                                                                     monkeypatch):
    """The trial's case: after `quantize` the plan names an IR-only dir; `synth --backend
    torch` must load the checkpoint it was converted from, not fail on the missing llm.pt."""
    from cosyvino.cli.plan_settings import source_model_dir

    conv = converted_dir(TINY_A)
    src = source_model_dir(conv)
    assert src != conv and os.path.isfile(os.path.join(src, "llm.pt"))
    plan = _write_plan(tmp_path / "plan.toml", conv, backend="openvino", threads=1,
                       precision="f32", kv_cache_precision="f32")
    monkeypatch.setenv("COSYVINO_PLAN", plan)
    r = _synth(["--backend", "torch", "--num-speech-tokens", "5", "--json", "Hello.",
                "-o", str(tmp_path / "t.wav")])
    assert r.exit_code == 0, r.output
    assert f"model dir {src}" in r.stderr
    assert os.path.getsize(tmp_path / "t.wav") > 44


def test_demo_and_synth_follow_a_plan_that_chose_openvino(converted_dir, tmp_path,
                                                          monkeypatch):
    """The trial's case: `convert` + `plan` chose OpenVINO, `demo` ran torch."""
    conv = converted_dir(TINY_A)
    plan = _write_plan(tmp_path / "plan.toml", conv, backend="openvino", threads=1,
                       precision="f32", kv_cache_precision="f32")
    monkeypatch.setenv("COSYVINO_PLAN", plan)
    r = CliRunner().invoke(main, ["demo", "--out-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    assert (f"model: {conv} (backend openvino, threads 1, kv_cache_precision f32, "
            f"precision f32 (plan {plan})") in r.output
    assert sf.info(tmp_path / "demo-en.wav").frames > 0
    r = _synth(["--num-speech-tokens", "5", "--json", "Hello.", "-o", str(tmp_path / "x.wav")])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["backend"] == "openvino" and stats["backend_options"]["precision"] == "f32"
    r = _synth(["--backend", "torch", "--model-dir", str(TINY_A), "--num-speech-tokens", "5",
                "--json", "Hello.", "-o", str(tmp_path / "y.wav")])
    assert r.exit_code == 0, r.output
    stats = json.loads(r.stdout)
    assert stats["backend"] == "torch" and stats["backend_options"] == {}  # plan's go with it


# ---- issue 14 item 5: synth --stream ------------------------------------------------------------
TWO_SEGMENTS = "第一句话。" * 20  # two text segments (80 + 20 characters)


@pytest.mark.parametrize("hop", ["segment", "latency"])
def test_stream_writes_the_same_file_as_whole_synthesis(tiny_model_dir, tmp_path, hop):
    if hop not in __import__("cosyvino.request").request.HOP_SCHEDULES:
        pytest.skip(f"hop schedule {hop!r} not in this build")
    base = ["--model-dir", tiny_model_dir, "--num-speech-tokens", "40", "--seed", "7",
            "--hop-schedule", hop, "--json", TWO_SEGMENTS]
    r = _synth([*base, "--stream", "-o", str(tmp_path / "s.wav")])
    assert r.exit_code == 0, r.output
    # the live line once; RTF and first audio are in the stats (here: JSON on stdout)
    assert r.stderr.count("first audio") == 1 and "first audio after " in r.stderr
    assert "streamed " in r.stderr
    stats = json.loads(r.stdout)
    assert stats["rtf"] > 0
    assert stats["first_audio_seconds"] > 0 and stats["chunks"] >= 2
    r2 = _synth([*base, "-o", str(tmp_path / "w.wav")])
    assert r2.exit_code == 0, r2.output
    streamed, whole = (tmp_path / "s.wav").read_bytes(), (tmp_path / "w.wav").read_bytes()
    assert streamed == whole  # one header, then the same PCM
    data, sr = sf.read(tmp_path / "s.wav", dtype="int16")
    assert sr == 22050
    if hop == "segment":  # token hops may add a few frames at the joins (official streaming)
        assert data.shape[0] == 2 * mel_frames_for_tokens(40) * 256  # 2 segments
    assert abs(stats["audio_seconds"] - data.shape[0] / sr) < 1e-3
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_stream_raw_to_stdout_is_the_wav_pcm(tiny_model_dir, tmp_path):
    args = [sys.executable, "-m", "cosyvino.cli", "synth", "--model-dir", tiny_model_dir,
            "--num-speech-tokens", "30", "--seed", "3", "--hop-schedule", "segment", "Hello."]
    proc = subprocess.run([*args, "--stream", "-o", "-", "--json"], capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert b"first audio after " in proc.stderr and b'"first_audio_seconds"' in proc.stderr
    ref = subprocess.run([*args, "-o", str(tmp_path / "r.wav")], capture_output=True,
                         timeout=300)
    assert ref.returncode == 0, ref.stderr
    pcm, _ = sf.read(tmp_path / "r.wav", dtype="int16")
    assert proc.stdout == pcm.astype("<i2").tobytes()


def test_stream_failure_leaves_no_file(tiny_model_dir, tmp_path, monkeypatch):
    import cosyvino.synthesizer
    from cosyvino.errors import BackendError

    real = cosyvino.synthesizer.Synthesizer.stream

    class Failing:  # the first chunk, then a stage error
        def __init__(self, stream):
            self.stream, self.total, self.n = stream, stream.total, 0

        def __iter__(self):
            return self

        def __next__(self):
            if self.n:
                self.stream.close()
                raise BackendError("stage failed")
            self.n += 1
            return next(self.stream)

        def close(self):
            self.stream.close()

    def failing(self, *a, **k):
        return Failing(real(self, *a, **k))

    monkeypatch.setattr(cosyvino.synthesizer.Synthesizer, "stream", failing)
    out = tmp_path / "f.wav"
    r = _synth(["--model-dir", tiny_model_dir, "--num-speech-tokens", "30", "--stream",
                TWO_SEGMENTS, "-o", str(out)])
    assert r.exit_code == 2 and "stage failed" in r.output
    assert "first audio after" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_output_without_extension_says_it_writes_wav(tiny_model_dir, tmp_path):
    out = tmp_path / "speech"
    r = _synth(["--model-dir", tiny_model_dir, "--num-speech-tokens", "5", "Hello.", "-o",
                str(out)])
    assert r.exit_code == 0, r.output
    assert f"note: {out} has no extension: writing WAV" in r.stderr
    assert sf.info(str(out)).format == "WAV"
    r = _synth(["--model-dir", tiny_model_dir, "--num-speech-tokens", "5", "Hello.", "-o",
                str(tmp_path / "x2"), "--format", "flac"])
    assert r.exit_code == 0 and "no extension" not in r.stderr
    assert sf.info(str(tmp_path / "x2")).format == "FLAC"
