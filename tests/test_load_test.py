"""Pure helpers of benchmarks/load_test.py (no server is started here)."""

from __future__ import annotations

import importlib.util
import io
import os
import re
import wave
from types import SimpleNamespace

import pytest

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "load_test.py")
_spec = importlib.util.spec_from_file_location("load_test", _PATH)
lt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lt)


def _wav_bytes(frames: int) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(22050)
        w.writeframes(b"\x01\x00" * frames)
    return buf.getvalue()


def test_header_size_of_a_plain_wav_and_of_pcm():
    data = _wav_bytes(10)
    assert lt.header_size("wav", data) == 44
    assert lt.header_size("wav", data[:30]) is None      # too short to tell
    assert lt.header_size("pcm", b"") == 0
    assert lt.header_size("mp3", data) is None


def test_header_size_skips_other_chunks():
    data = _wav_bytes(4)
    extra = b"LIST" + (5).to_bytes(4, "little") + b"abcde" + b"\x00"  # odd size: pad byte
    with_list = data[:36] + extra + data[36:]
    assert lt.header_size("wav", with_list) == 44 + len(extra)
    assert lt.header_size("wav", b"RIFX" + data[4:]) is None


def test_audio_seconds_from_sizes():
    assert lt.audio_seconds("wav", 44 + 2 * 22050, 44) == pytest.approx(1.0)
    assert lt.audio_seconds("pcm", 2 * 12000, 0) == pytest.approx(0.5)
    assert lt.audio_seconds("mp3", 10_000, 0) == 0.0


def test_request_bodies_repeat_and_differ_by_client():
    a = [lt.request_body(c, n, "wav") for c in range(3) for n in range(4)]
    b = [lt.request_body(c, n, "wav") for c in range(3) for n in range(4)]
    assert a == b
    assert len({x["seed"] for x in a}) == len(a)
    assert all(x["stream"] is True and x["response_format"] == "wav" for x in a)
    assert a[0]["input"] != lt.request_body(0, 1, "wav")["input"]


def test_summarize_counts_and_percentiles():
    rows = [{"status": 200, "latency": float(i), "first_chunk": i / 10, "audio_s": 2.0}
            for i in range(1, 11)]
    rows += [{"status": 503, "latency": 0.01, "first_chunk": None, "audio_s": 0.0},
             {"status": "transport", "latency": 0.5, "first_chunk": None, "audio_s": 0.0}]
    s = lt.summarize(rows, 20.0)
    assert (s["requests"], s["ok"], s["busy_503"], s["errors"]) == (12, 10, 1, 1)
    assert s["audio_s_per_wall_s"] == pytest.approx(1.0)
    assert s["requests_per_min"] == pytest.approx(30.0)
    assert s["latency_p50_s"] == 5.0 and s["latency_p95_s"] == 10.0
    assert s["first_chunk_p95_s"] == pytest.approx(1.0)
    empty = lt.summarize([], 5.0)
    assert empty["latency_p95_s"] is None and empty["audio_s_per_wall_s"] == 0.0


def test_lone_baseline_is_the_median():
    rows = [{"status": 200, "latency": v, "first_chunk": v / 2} for v in (3.0, 1.0, 2.0)]
    assert lt.lone_baseline(rows) == {"lone_first_chunk_s": 1.0, "lone_latency_s": 2.0}
    assert lt.lone_baseline([{"status": 503, "latency": 1, "first_chunk": None}]) == \
        {"lone_first_chunk_s": None, "lone_latency_s": None}


def test_ratio_line_is_parseable():
    line = lt.ratio_line({"audio_s_per_wall_s": 0.5},
                         {"audio_s_per_wall_s": 1.25, "first_chunk_p95_s": 0.6,
                          "lone_first_chunk_s": 0.4})
    m = re.fullmatch(r"batched/unbatched aggregate throughput: (\d+\.\d\d)x; "
                     r"p95 first chunk batched / lone: (\d+\.\d\d)x", line)
    assert m and m.groups() == ("2.50", "1.50")
    assert lt.ratio_line({}, {"audio_s_per_wall_s": 1.0}).count("n/a") == 2


def _args(**kw):
    base = dict(compare_batching=None, unbatched_sessions=1, max_sessions=1, queue_size=64,
                timeout=300.0, plan=None, model_dir=None, threads=None, backend=None,
                tokens=None, estimator_batch=None, llm_only_too=False)
    base.update(kw)
    return SimpleNamespace(**base)


def test_server_configs_and_commands():
    args = _args(compare_batching=4, unbatched_sessions=4, plan="p.toml", model_dir="D",
                 threads=2, backend="openvino", tokens=40)
    cfgs = lt.server_configs(args)
    assert [(c["max_sessions"], c["llm_batch"], c["estimator_batch"]) for c in cfgs] == [
        (4, 1, 1), (4, 4, 4)]
    unb, bat = (lt.server_command(args, c, 1234) for c in cfgs)
    assert unb[unb.index("--llm-batch") + 1] == "1"        # explicit: a plan cannot batch it
    assert unb[unb.index("--estimator-batch") + 1] == "1"
    assert bat[bat.index("--llm-batch") + 1] == "4"
    assert bat[bat.index("--estimator-batch") + 1] == "4"
    assert bat[bat.index("--max-sessions") + 1] == "4"
    for flag, value in (("--plan", "p.toml"), ("--model-dir", "D"), ("--threads", "2"),
                        ("--backend", "openvino"), ("--num-speech-tokens", "40"),
                        ("--port", "1234")):
        assert unb[unb.index(flag) + 1] == value
    assert [c["max_sessions"] for c in lt.server_configs(_args(max_sessions=3))] == [3]
    three = lt.server_configs(_args(compare_batching=2, estimator_batch=2, llm_only_too=True))
    assert [(c["llm_batch"], c["estimator_batch"]) for c in three] == [(1, 1), (2, 1), (2, 2)]
    llm_only = lt.server_configs(_args(compare_batching=2, estimator_batch=1, llm_only_too=True))
    assert [(c["llm_batch"], c["estimator_batch"]) for c in llm_only] == [(1, 1), (2, 1)]


def test_parse_args_compare_batching_default_and_errors():
    assert lt.parse_args(["--compare-batching"]).compare_batching == 4
    assert lt.parse_args(["--compare-batching", "2"]).compare_batching == 2
    assert lt.parse_args([]).compare_batching is None
    with pytest.raises(SystemExit):
        lt.parse_args(["--compare-batching", "1"])
    with pytest.raises(SystemExit):
        lt.parse_args(["--compare-batching", "--url", "http://127.0.0.1:1"])


def test_cpu_line_reads_model_and_isa(tmp_path):
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc" / "cpuinfo").write_text(
        "processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse avx2 fma avx512f\n")
    line = lt.cpu_line(str(tmp_path))
    assert line.startswith("CPU: Test CPU 9000;")
    assert line.endswith("ISA: avx2 fma avx512f")


def test_markdown_table_has_a_column_per_config():
    table = lt.markdown_table([{"name": "a", "ok": 3}, {"name": "b", "ok": 5, "window_s": 1.5}])
    lines = table.splitlines()
    assert lines[0] == "| metric | a | b |"
    assert "| ok | 3 | 5 |" in lines
    assert "| measured window (s) | n/a | 1.500 |" in lines


def test_parse_gauges_reads_the_batch_occupancy():
    text = ("# HELP cosyvino_llm_batch_mean_rows Mean rows\n"
            "# TYPE cosyvino_llm_batch_mean_rows gauge\n"
            "cosyvino_llm_batch_mean_rows 2.5\n"
            "cosyvino_estimator_batch_mean_requests 1.75\n"
            'cosyvino_requests_total{endpoint="/ready"} 3.0\n'
            "cosyvino_llm_batch_steps nan-ish\n")
    got = lt.parse_gauges(text, lt.BATCH_GAUGES)
    assert got == {"cosyvino_llm_batch_mean_rows": 2.5,
                   "cosyvino_estimator_batch_mean_requests": 1.75}


def test_first_chunk_overlap_split():
    """benchmarks/first_chunk_priority.py: a request counts as overlapped when its wait for a
    first chunk shares time with another's (touching ends do not); no first chunk: left out."""
    import sys

    sys.path.insert(0, os.path.dirname(_PATH))
    try:
        spec = importlib.util.spec_from_file_location(
            "first_chunk_priority", os.path.join(os.path.dirname(_PATH),
                                                 "first_chunk_priority.py"))
        fcp = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fcp)
    finally:
        sys.path.remove(os.path.dirname(_PATH))
    rows = [{"start": 0.0, "first": 1.0}, {"start": 0.5, "first": 1.5},
            {"start": 2.0, "first": 0.25}, {"start": 3.0, "first": None}]
    both, alone = fcp.split_by_overlap(rows)
    assert both == [1.0, 1.5] and alone == [0.25]
