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
