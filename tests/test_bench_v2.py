"""`cosyvino bench` on a CosyVoice2 dir: the family's rates, decode profile and estimator size
price the rows (25 speech tokens per second, no v1 sizes), and a model without built-in
speakers is benchmarked with a registered voice."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("torch")


def _in_process_worker(monkeypatch):
    """Run bench columns in this process (the subprocess only isolates peak RSS)."""
    from cosyvino import bench

    def run(backend, model_dir, tokens, threads, options, **kw):
        kw.pop("timeout", None)
        return bench.run_worker(backend, model_dir, tokens, threads, options, **kw)

    monkeypatch.setattr("cosyvino.bench.run_backend_subprocess", run)


def test_bench_on_a_v2_dir_uses_the_family_sizes(tiny_v2_model_dir, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from cosyvino.bench import profile_decode_bytes
    from cosyvino.cli.main import main
    from cosyvino.families import get_family

    _in_process_worker(monkeypatch)
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["bench", "--backends", "torch", "--model-dir",
                                    tiny_v2_model_dir, "--tokens", "10", "--threads", "1",
                                    "--stream-runs", "0", "--prompt-runs", "0",
                                    "--json-out", str(out)])
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    (r,) = data["results"]
    # 10 forced tokens at CosyVoice2's 25 tokens/s, 24 kHz output: 0.4 s per text
    assert [row["audio_s"] for row in r["rows"]] == [pytest.approx(0.4)] * 2
    fam = get_family("cosyvoice2")
    cfg = fam.read_config(tiny_v2_model_dir)
    profile = fam.decode_profile(cfg)
    roof = data["roofline"]
    want = profile_decode_bytes(profile, roof["mean_cache_len"])["total_bytes"]
    col = roof["per_backend"]["torch"]
    assert col["bytes_per_token"] == pytest.approx(want)
    assert col["int8_roofline_ms_per_token"] < col["roofline_ms_per_token"]
    assert col["int4_roofline_ms_per_token"] < col["int8_roofline_ms_per_token"]
    # the v2 estimator at 2 frames per token
    frames, gflop = fam.estimator_cost(cfg, 10)
    assert data["estimator"]["frames"] == frames == 20
    assert data["estimator"]["gflop_per_call"] == pytest.approx(gflop)
    assert "| LLM INT8-weight roofline ms/token (measured / it) |" in res.output
    assert "| audio (s) | 0.40 |" in res.output


def test_profile_decode_bytes_prices_weights_and_cache():
    from cosyvino.bench import profile_decode_bytes
    from cosyvino.families.base import DecodeProfile

    p = DecodeProfile(params=1000, kv_bytes_per_position=64, typical_positions=5)
    b = profile_decode_bytes(p, 10, weight_bytes=1, kv_bytes=1)
    assert b == {"params": 1000, "weight_bytes": 1000, "kv_bytes": 160.0,
                 "total_bytes": 1160.0}
    assert profile_decode_bytes(p, 10)["total_bytes"] == 4000 + 640


def test_bench_voice_without_built_in_speakers(tiny_v2_model_dir, tmp_path):
    """No spk2info.pt (the official CosyVoice2-0.5B ships none with speakers): the bench
    registers a prompt voice instead of failing on speakers[0]."""
    from cosyvino import Synthesizer
    from cosyvino.bench import BENCH_VOICE, bench_voice

    d = tmp_path / "v2-no-speakers"
    shutil.copytree(tiny_v2_model_dir, d)
    (d / "spk2info.pt").unlink()
    tts = Synthesizer(str(d), backend="torch")
    assert tts.speakers == []
    voice = bench_voice(tts, "中文女")
    assert voice.name == BENCH_VOICE and voice.prompt_speech_tokens is not None
    assert bench_voice(tts) is voice  # made once per model
    assert not (d / "voices").exists() and BENCH_VOICE not in tts.voices  # nothing stored
    audio = tts.synthesize("hello", voice, seed=0, num_speech_tokens=5)
    assert audio.sample_rate == 24000 and audio.stats["speech_tokens"] == 5


def test_bench_voice_prefers_the_named_speaker(tiny_v2_model_dir):
    from cosyvino import Synthesizer
    from cosyvino.bench import bench_voice

    tts = Synthesizer(tiny_v2_model_dir, backend="torch", voices_dir=False)
    assert bench_voice(tts, "英文女") == "英文女"
    assert bench_voice(tts, "no such speaker") == tts.speakers[0]
