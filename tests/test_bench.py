"""`cosyvino bench` helpers: roofline bytes, table, backend specs (the full run is a benchmark,
not a test)."""

from __future__ import annotations

import os

import click
import pytest

from cosyvino.bench import llm_decode_bytes, markdown, memory_bandwidth_gbs
from cosyvino.cli.bench import _parse_spec
from cosyvino.families.cosyvoice1.yaml_config import read_model_config
from conftest import TINY_A


def test_decode_bytes_count_every_llm_weight():
    pytest.importorskip("torch")
    from cosyvino.families.cosyvoice1.torch.llm import TransformerLM

    cfg = read_model_config(TINY_A / "cosyvoice.yaml")
    lm = TransformerLM(cfg.llm)
    expected = (sum(p.numel() for p in lm.llm.parameters())
                + sum(p.numel() for p in lm.llm_decoder.parameters()))
    b = llm_decode_bytes(cfg, 10)
    assert b["params"] == expected
    assert b["weight_bytes"] == 4 * expected
    e = cfg.llm.llm
    assert b["kv_bytes"] == e.num_blocks * 2 * 10 * e.output_size * 4


def test_bandwidth_is_positive():
    assert memory_bandwidth_gbs(mb=8, repeats=2) > 0.1
    assert memory_bandwidth_gbs(mb=8, repeats=2, threads=2) > 0.1


def test_roofline_takes_the_best_bandwidth_sample_of_the_run():
    """Each worker's bandwidth sample joins the parent's: the roofline uses the best (a low
    sample taken while the VM's neighbours were busy moved the ratio by 1.4x)."""
    from cosyvino.bench import roofline

    cfg = read_model_config(os.path.join(TINY_A, "cosyvoice.yaml"))
    mean = {"llm_ms_per_token": 2.0, "total_s": 1.0}
    res = [{"label": "a", "mean": mean, "rows": [{"text_tokens": 7}], "bandwidth_gbs": 25.0},
           {"label": "b", "mean": mean, "rows": [{"text_tokens": 7}], "bandwidth_gbs": 18.0},
           {"label": "c", "error": "x"}]
    roof = roofline(cfg, res, 20, bandwidth_gbs=20.0)
    assert roof["bandwidth_gbs"] == 25.0 and roof["bandwidth_samples_gbs"] == [20.0, 25.0, 18.0]
    assert roof["mean_cache_len"] == 7 + 3 + 10
    a = roof["per_backend"]["a"]
    assert a["roofline_ms_per_token"] == pytest.approx(a["bytes_per_token"] / 25e9 * 1e3)
    assert a["ratio"] == pytest.approx(2.0 / a["roofline_ms_per_token"])
    assert "| LLM roofline ms/token (25.0 GB/s copy, best of 3 samples 18.0-25.0) |" in \
        markdown(res, roof)


def test_markdown_table_side_by_side():
    mean = {"llm_ms_per_token": 20.0, "total_s": 10.0, "rtf": 2.0}
    res = [{"label": "torch", "load_s": 1.0, "peak_rss_mb": 100, "mean": mean},
           {"label": "openvino", "load_s": 1.0, "peak_rss_mb": 100, "load_peak_rss_mb": 61,
            "mean": dict(mean, total_s=4.0)},
           {"label": "openvino:bf16", "error": "worker exited with status -11"}]
    roof = {"bandwidth_gbs": 20.0, "per_backend": {
        "torch": {"roofline_ms_per_token": 10.0, "ratio": 2.0},
        "openvino": {"roofline_ms_per_token": 10.0, "ratio": 2.0}}}
    table = markdown(res, roof)
    assert table.splitlines()[0] == "| metric | torch | openvino |"
    assert "| speed-up vs torch | 1.00x | 2.50x |" in table
    assert "| peak RSS by end of load (MiB) |  | 61 |" in table  # absent for torch: blank
    assert "openvino:bf16: FAILED" in table


def test_estimator_rows_compare_each_column_with_its_precisions_peak():
    """An INT8 estimator is compared with the int8 dot-product peak, an fp32 one with the fp32
    FMA peak (one shared fp32 peak read 199 % for the INT8 column on AMD Zen 4)."""
    from cosyvino.bench_extras import estimator_peak

    flags, mhz = {"avx2", "fma", "avx512f", "avx512_vnni"}, 2600.0
    peaks = {label: dict(zip(("gops", "peak"), estimator_peak(w, flags, "AuthenticAMD", mhz, 2)))
             for label, w in (("torch", None), ("plan", "int8-static"))}
    assert peaks["torch"]["gops"] == pytest.approx(2 * 2.6 * 32)
    assert peaks["plan"]["gops"] == pytest.approx(2 * 2.6 * 128)
    res = [{"label": "torch", "mean": {"total_s": 30.0, "estimator_ms_per_call": 1000.0}},
           {"label": "plan", "mean": {"total_s": 8.0, "estimator_ms_per_call": 250.0}}]
    table = markdown(res, None, {"gflop_per_call": 83.2, "peak_gflops": 166.4, "peak": "x",
                                 "peaks": peaks})
    assert "| estimator G ops/s (83.2 G ops/call: 2 per multiply-add) | 83 | 333 |" in table
    assert "| estimator / its peak | 50 % | 50 % |" in table
    assert "(int8, AVX-512 VNNI: 2 x 2.6 GHz x 128 int8 ops/cycle)" in table
    assert "(fp32 FMA, AVX-512: 2 x 2.6 GHz x 32 FLOP/cycle)" in table
    # no int8 dot products: the INT8 column has no peak to quote, the fp32 one keeps its own
    peaks["plan"] = dict(zip(("gops", "peak"), estimator_peak("int8-static", {"avx2", "fma"},
                                                              "AuthenticAMD", mhz, 2)))
    table = markdown(res, None, {"gflop_per_call": 83.2, "peaks": peaks})
    assert "| estimator / its peak | 50 % |  |" in table
    assert "no int8 dot products" in table


def test_backend_specs():
    assert _parse_spec("torch") == ("torch", {})
    assert _parse_spec("openvino") == ("openvino", {"precision": "f32",
                                                    "kv_cache_precision": "f32"})
    assert _parse_spec("openvino:default") == ("openvino", {"precision": None})
    with pytest.raises(click.BadParameter):
        _parse_spec("openvino:f64")
    with pytest.raises(click.BadParameter):
        _parse_spec("torch:bf16")


def test_quantized_dir_combines_with_a_precision():
    """``openvino@SUBDIR:PREC``: the quantized dir with the CPU's default compute precision (or
    any other), the way issue 4's INT8 columns are compared."""
    from cosyvino.cli.bench import _split_subdir

    spec, sub = _split_subdir("openvino@openvino-int8:default")
    assert (spec, sub) == ("openvino:default", "openvino-int8")
    assert _parse_spec(spec) == ("openvino", {"precision": None})
    spec, sub = _split_subdir("openvino@openvino-int8:u8kv")
    assert sub == "openvino-int8"
    assert _parse_spec(spec) == ("openvino", {"precision": "f32", "kv_cache_precision": "u8"})
    assert _split_subdir("openvino@openvino-int8") == ("openvino", "openvino-int8")
    assert _parse_spec("openvino:vocbf16") == ("openvino", {
        "precision": "f32", "kv_cache_precision": "f32",
        "stage_precision": {"hift_f0": "bf16", "hift_decode": "bf16"}})
    assert _parse_spec("openvino:served") == ("openvino", {
        "precision": "f32", "kv_cache_precision": "u8",
        "stage_precision": {"hift_f0": "bf16", "hift_decode": "bf16", "estimator": "bf16"}})


def test_onnxruntime_specs():
    from cosyvino.cli.bench import _split_subdir

    assert _parse_spec("onnxruntime") == ("onnxruntime", {})
    assert _parse_spec("onnxruntime:iobinding") == ("onnxruntime", {"io_binding": True})
    assert _split_subdir("onnxruntime@onnx-copy") == ("onnxruntime", "onnx-copy")
    with pytest.raises(click.BadParameter):
        _parse_spec("onnxruntime:bf16")
    with pytest.raises(click.BadParameter):
        _split_subdir("torch@x")


def test_bench_without_convertible_model_reports_a_failed_row(tmp_path):
    """No ONNX dir and the automatic `cosyvino convert --format onnx` fails (not a model dir):
    a FAILED row naming the command, exit status 1, no traceback."""
    from click.testing import CliRunner

    from cosyvino.cli.main import main

    res = CliRunner().invoke(main, ["bench", "--backends", "onnxruntime", "--model-dir",
                                    str(tmp_path), "--json-out", str(tmp_path / "r.json")])
    assert res.exit_code == 1, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "onnxruntime: FAILED" in res.output
    assert "cosyvino convert --format onnx" in res.output
    import json
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["results"][0]["label"] == "onnxruntime" and "error" in data["results"][0]


def test_module_subprocesses_ignore_the_current_directory():
    """``python -m cosyvino...`` children must import the installed package even when the
    current directory holds a folder named ``cosyvino`` (PYTHONSAFEPATH)."""
    import os
    import subprocess
    import sys
    import tempfile

    from cosyvino.bench import module_subprocess_env

    env = module_subprocess_env()
    assert env["PYTHONSAFEPATH"] == "1" and env["PATH"] == os.environ["PATH"]
    with tempfile.TemporaryDirectory() as d:
        os.mkdir(os.path.join(d, "cosyvino"))
        out = subprocess.run([sys.executable, "-c", "import sys; print(sys.path[0] == '')"],
                             cwd=d, env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ("False" if sys.version_info >= (3, 11) else "True")


def test_play_underrun_counts_the_player_waiting():
    from cosyvino.bench import play_underrun

    assert play_underrun([]) == 0.0
    # chunks arrive faster than they play: no wait
    assert play_underrun([(1.0, 2.0), (2.0, 2.0), (2.5, 1.0)]) == 0.0
    # the second arrives 1 s after the first finished, the third 0.5 s after the second
    assert play_underrun([(1.0, 1.0), (3.0, 0.5), (4.0, 1.0)]) == pytest.approx(1.5)


def test_markdown_streaming_rows():
    mean = {"llm_ms_per_token": 20.0, "total_s": 10.0, "rtf": 2.0}
    stream = [{"text": "1 sentence", "schedule": s, "audio_s": 5.0, "first_chunk_p50_s": f,
               "first_chunk_p95_s": f + 0.1, "rtf": 1.2, "underrun_s": 0.7}
              for s, f in (("latency", 0.5), ("segment", 6.0))]
    table = markdown([{"label": "openvino", "mean": mean, "streaming": stream}], None)
    assert "| 1 sentence (5.0 s) | latency | first chunk p50 (s) | 0.50 |" in table
    assert "| 1 sentence (5.0 s) | segment | first chunk p95 (s) | 6.10 |" in table
    assert "| 1 sentence (5.0 s) | latency | underrun after first chunk (s) | 0.70 |" in table


def test_measure_stream_on_the_tiny_model():
    pytest.importorskip("torch")
    from cosyvino import Synthesizer
    from cosyvino.bench import measure_stream

    tts = Synthesizer(str(TINY_A), backend="torch")
    try:
        r = measure_stream(tts, "你好，世界。", tts.speakers[0], 60, "latency", runs=2)
    finally:
        tts.close()
    assert r["chunks"] >= 2 and r["audio_s"] > 1.0
    assert 0 < r["first_chunk_p50_s"] <= r["first_chunk_p95_s"]
    assert r["rtf"] > 0 and r["underrun_s"] >= 0


def test_prompt_clip_is_exactly_five_seconds_of_the_recording():
    sf = pytest.importorskip("soundfile")
    import numpy as np

    from cosyvino.bench import default_prompt_wav, prompt_clip

    path = default_prompt_wav()
    assert path is not None and path.endswith("examples/zero_shot_prompt.wav")
    x, rate = prompt_clip(path)
    original, orig_rate = sf.read(path, dtype="float32")
    assert rate == orig_rate and x.shape == (5 * rate,) and x.dtype == np.float32
    n = len(original)  # 3.48 s, looped: the clip starts again after the recording's end
    np.testing.assert_array_equal(x[:n], original)
    np.testing.assert_array_equal(x[n:2 * n][: x.size - n], original[: x.size - n])
    y, r16 = prompt_clip(None)
    assert r16 == 16000 and y.shape == (80000,)
    assert -25 < 20 * np.log10(np.sqrt(np.mean(y ** 2))) < -20  # the stand-in is not silent


def test_measure_prompt_on_the_tiny_model(tiny_model_dir):
    pytest.importorskip("onnx")
    from cosyvino import Synthesizer
    from cosyvino.bench import PROMPT_ROWS, measure_prompt, prompt_clip

    tts = Synthesizer(tiny_model_dir, backend="torch", voices_dir=False)
    try:
        r = measure_prompt(tts, prompt_clip(None), tokens=10, runs=1)
        assert tts.registered_voices == ["bench-voice"]
    finally:
        tts.close()
    assert r["backend"] == "openvino" and r["seconds"] == 5.0
    parts = ("intake_ms", "embedding_ms", "tokens_ms", "mel_ms")
    assert all(r[k] > 0 for k in parts)
    assert r["total_ms"] == pytest.approx(sum(r[k] for k in parts), rel=1e-6)
    assert r["zero_shot_prompt_s"] > 0 and r["zero_shot_voice_s"] > 0
    table = markdown([{"label": "torch", "mean": {"total_s": 1.0}, "prompt": r}], None)
    for label, key, fmt in PROMPT_ROWS:
        assert f"| {label} | {fmt.format(r[key])} |" in table


def test_default_backends_leave_out_what_is_not_installed(monkeypatch):
    from cosyvino.cli import bench as cli_bench

    class Here:
        reference = True

        @classmethod
        def is_available(cls):
            return True, ""

    class Missing:
        @classmethod
        def is_available(cls):
            return False, "zeta is not installed"

    monkeypatch.setattr("cosyvino.plugins.backend_classes",
                        lambda: {"here": Here, "zeta": Missing})
    assert cli_bench.default_backends() == "here"


def test_plan_column_runs_what_the_planner_serves(tiny_model_dir, tmp_path, monkeypatch):
    """`--backends torch,plan`: the plan column is the planner's backend, model dir, options
    and threads (planned now); torch keeps the flags'. `--neighbour` doubles every column."""
    from click.testing import CliRunner

    from cosyvino.cli.main import main
    from cosyvino.planner import make_plan, probe

    expected = make_plan(probe(model_dir=tiny_model_dir), model_dir=tiny_model_dir)
    calls = []

    def fake(backend, model_dir, tokens, threads, options, **kw):
        calls.append((backend, model_dir, threads, options, kw["ode_steps"]))
        return {"backend": backend, "error": "not run (test)"}

    monkeypatch.setattr("cosyvino.bench.run_backend_subprocess", fake)
    res = CliRunner().invoke(main, ["bench", "--backends", "torch,plan", "--model-dir",
                                    tiny_model_dir, "--threads", "1", "--ode-steps", "5,3",
                                    "--neighbour", "--json-out", str(tmp_path / "r.json")])
    assert res.exit_code == 1  # every column "failed" (faked)
    opts = dict(expected.backend_options)
    threads = opts.pop("num_threads", None)
    assert calls == [("torch", tiny_model_dir, 1, {}, [5, 3])] * 2 + [
        (expected.backend, expected.model_dir, threads, opts, [5, 3])] * 2
    bad = CliRunner().invoke(main, ["bench", "--model-dir", tiny_model_dir, "--ode-steps", "0"])
    assert bad.exit_code == 2 and "--ode-steps" in bad.output


@pytest.mark.parametrize("busy", [True, False])
def test_bench_warns_when_the_host_is_busy_as_it_starts(tiny_model_dir, tmp_path, monkeypatch,
                                                        busy):
    """Other processes loading the CPUs before the first column: a warning on stderr, in the
    table's header and in the JSON (a trial's numbers were taken under a CI run unwarned)."""
    import json

    from click.testing import CliRunner

    from cosyvino.cli.main import main

    monkeypatch.setattr("cosyvino.planner.rules.host_busy", lambda probe: busy)
    monkeypatch.setattr("cosyvino.bench.run_backend_subprocess",
                        lambda backend, *a, **kw: {"backend": backend, "error": "not run"})
    out = tmp_path / "r.json"
    res = CliRunner().invoke(main, ["bench", "--backends", "torch", "--model-dir",
                                    tiny_model_dir, "--json-out", str(out)])
    assert res.exit_code == 1  # the faked column "failed"
    warning = json.loads(out.read_text())["busy_host_warning"]
    if busy:
        assert warning.startswith("warning: load average ") and "other processes" in warning
        assert warning in res.output
    else:
        assert warning is None and "load average" not in res.output
