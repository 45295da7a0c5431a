"""The cosyvino command line on a synthetic tiny model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import soundfile as sf
from click.testing import CliRunner

from cosyvino.cli import main
from cosyvino.length_regulation import mel_frames_for_tokens


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
