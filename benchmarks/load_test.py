#!/usr/bin/env python
"""Load test for `cosyvino serve` (not a test): N concurrent clients on loopback for a bounded
time, a fixed text mix and a fixed seed order. Per server configuration it reports requests
ok / 503 / errors, aggregate audio seconds per wall second, requests per minute, p50/p95 total
latency, p50/p95 first-chunk latency (time to the first audio bytes after the container header
of a streamed wav/pcm response), a lone-request first-chunk baseline (median of 3 sequential
requests on the same server before the load) and server RSS at start and end. Prints a
markdown table with one column per configuration; ``--json`` writes the numbers.

By default it starts its own server (subprocess, 127.0.0.1, random port) on a model directory:

    python benchmarks/load_test.py --model-dir D --clients 4 --duration 30 --tokens 100
    python benchmarks/load_test.py --tiny --clients 8 --duration 10     # synthetic tiny model

or measures a running one (loopback addresses only; pass --pid for its RSS):

    python benchmarks/load_test.py --url http://127.0.0.1:8000 --clients 4 --duration 30

Batched vs unbatched in one run (``--compare-batching [N]``, N = 4 without a value): first a
server with ``--max-sessions U`` (``--unbatched-sessions U``, default 1: what the plan serves
on 2 cores; U = N compares "N sessions time-sharing" with "N sessions batched"), then one with
``--llm-batch N --estimator-batch E --max-sessions N`` (``--estimator-batch E``, default N:
equal-length flow hops of concurrent requests share estimator calls; 1 = LLM batching only),
one after the other, same clients, duration, texts and seeds; ``--llm-only-too`` measures
``--llm-batch N --estimator-batch 1`` in between (what each kind of batching gives). The last
line printed (first configuration against the last) is

    batched/unbatched aggregate throughput: X.XXx; p95 first chunk batched / lone: Y.YYx

("lone" = the batched server's own lone-request baseline; ``n/a`` where a number is missing).

Smoke run on the synthetic tiny model (seconds of CPU):

    python benchmarks/load_test.py --tiny --clients 4 --duration 20 --compare-batching 4 --tokens 40

The issue-17 targets on the 300M INT8 serving config (2-core reference machine; D = the 300M
model directory with its converted OpenVINO IRs, README command 1):

    cosyvino quantize --model-dir D --preset int8          # once: D/openvino-int8/
    cosyvino plan --model-dir D --out /tmp/int8-plan.toml  # picks the INT8 dir + backend
    python benchmarks/load_test.py --plan /tmp/int8-plan.toml --clients 4 --duration 120 \\
        --compare-batching 4 --tokens 100 --format pcm --json /tmp/load-1v4.json
    python benchmarks/load_test.py --plan /tmp/int8-plan.toml --clients 4 --duration 120 \\
        --compare-batching 4 --unbatched-sessions 4 --tokens 100 --format pcm \\
        --json /tmp/load-4v4.json

(``--tokens K`` forces K speech tokens per segment, so every request costs the same; drop it
for the model's own lengths. ``--backend``/``--threads``/``--model-dir`` override the plan.)

Every loop is bounded: clients start no request after --duration (and --max-requests), each
request is limited by --timeout, server start-up by --ready-timeout; servers are terminated in
a ``finally`` (Ctrl-C and SIGTERM included), one at a time, never both running together.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from urllib.parse import urlparse

TEXTS = (
    ("中文女", "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。"),
    ("英文女", "CosyVoice is a multilingual speech synthesis model that runs on ordinary servers."),
)
#: sample rate (Hz) of the int16 mono formats whose duration follows from their size
#: (docs/server.md, response formats)
RATES = {"wav": 22050, "pcm": 24000}
#: formats whose first audio byte can be told from the header (first-chunk latency)
STREAM_FORMATS = ("wav", "pcm")
LONE_REQUESTS = 3
SEED_BASE = 1000
#: /proc/cpuinfo flags shown in the table header (fallback when the planner is missing)
_ISA_FALLBACK = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16",
                 "amx_tile", "amx_int8")

METRICS = (  # (key, label)
    ("config", "server"),
    ("requests", "requests"),
    ("ok", "ok"),
    ("busy_503", "503"),
    ("errors", "errors"),
    ("window_s", "measured window (s)"),
    ("audio_seconds", "audio (s)"),
    ("audio_s_per_wall_s", "audio s / wall s"),
    ("requests_per_min", "requests / min"),
    ("latency_p50_s", "latency p50 (s)"),
    ("latency_p95_s", "latency p95 (s)"),
    ("first_chunk_p50_s", "first chunk p50 (s)"),
    ("first_chunk_p95_s", "first chunk p95 (s)"),
    ("lone_first_chunk_s", "lone first chunk (s, median of 3)"),
    ("lone_latency_s", "lone latency (s, median of 3)"),
    ("p95_first_chunk_over_lone", "p95 first chunk / lone"),
    ("rss_start_mb", "server RSS start (MB)"),
    ("rss_end_mb", "server RSS end (MB)"),
    ("llm_batch_mean_rows", "LLM rows per batched decode step (mean)"),
    ("estimator_batch_mean_requests", "requests per estimator call (mean)"),
)


# ---------------------------------------------------------------- pure helpers


def rss_mb(pid: int | None) -> float | None:
    """Resident set size of ``pid`` in MiB (``VmRSS``), None when unknown."""
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        return None
    return None


def pct(values, q: float):
    """Nearest-rank percentile ``q`` (0..1) of ``values``; None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def ratio(num, den):
    """``num / den``, None when either is missing or ``den`` is not positive."""
    if num is None or den is None or den <= 0:
        return None
    return num / den


def header_size(fmt: str, prefix: bytes) -> int | None:
    """Bytes of container header before the first audio sample of a streamed ``fmt`` response
    whose first bytes are ``prefix``: 0 for pcm, the end of the ``data`` chunk header for wav;
    None while ``prefix`` is too short to tell, or for formats without a fixed layout."""
    if fmt == "pcm":
        return 0
    if fmt == "wav":
        if len(prefix) < 12 or prefix[:4] != b"RIFF" or prefix[8:12] != b"WAVE":
            return None
        pos = 12
        while pos + 8 <= len(prefix):
            cid, size = prefix[pos:pos + 4], int.from_bytes(prefix[pos + 4:pos + 8], "little")
            if cid == b"data":
                return pos + 8
            pos += 8 + size + (size & 1)
        return None
    return None


def audio_seconds(fmt: str, nbytes: int, header: int | None) -> float:
    """Seconds of int16 mono audio in a ``fmt`` body of ``nbytes`` with a ``header``-byte
    header; 0.0 for compressed formats (unknown from the size)."""
    rate = RATES.get(fmt)
    if rate is None:
        return 0.0
    return max(0, nbytes - (header or 0)) / 2 / rate


def seed_for(client: int, n: int) -> int:
    """Seed of client ``client``'s ``n``-th request: the same in every configuration."""
    return SEED_BASE + client * 100_000 + n


def request_body(client: int, n: int, fmt: str) -> dict:
    """JSON body of client ``client``'s ``n``-th request (text mix + seed order fixed)."""
    voice, text = TEXTS[(client + n) % len(TEXTS)]
    return {"model": "tts-1", "input": text, "voice": voice, "response_format": fmt,
            "stream": True, "seed": seed_for(client, n)}


def summarize(rows: list[dict], window_s: float) -> dict:
    """Aggregate per-request ``rows`` (status, latency, first_chunk, audio_s) measured over
    ``window_s`` wall seconds into the table's numbers (seconds, counts)."""
    ok = [r for r in rows if r["status"] == 200]
    lat = [r["latency"] for r in ok]
    fc = [r["first_chunk"] for r in ok if r["first_chunk"] is not None]
    audio = sum(r["audio_s"] for r in ok)
    return {
        "requests": len(rows), "ok": len(ok),
        "busy_503": sum(r["status"] == 503 for r in rows),
        "errors": sum(r["status"] not in (200, 503) for r in rows),
        "window_s": window_s, "audio_seconds": audio,
        "audio_s_per_wall_s": ratio(audio, window_s),
        "requests_per_min": ratio(60.0 * len(ok), window_s),
        "latency_p50_s": pct(lat, 0.5), "latency_p95_s": pct(lat, 0.95),
        "first_chunk_p50_s": pct(fc, 0.5), "first_chunk_p95_s": pct(fc, 0.95),
    }


def lone_baseline(rows: list[dict]) -> dict:
    """Median first chunk and latency of the sequential lone requests (None when none ok)."""
    ok = [r for r in rows if r["status"] == 200]
    fc = [r["first_chunk"] for r in ok if r["first_chunk"] is not None]
    return {"lone_first_chunk_s": statistics.median(fc) if fc else None,
            "lone_latency_s": statistics.median([r["latency"] for r in ok]) if ok else None}


def ratio_line(unbatched: dict, batched: dict) -> str:
    """The parseable last line: aggregate throughput ratio and batched p95 first chunk over
    the batched server's lone request."""
    def x(v):
        return "n/a" if v is None else f"{v:.2f}x"

    thr = ratio(batched.get("audio_s_per_wall_s"), unbatched.get("audio_s_per_wall_s"))
    fc = ratio(batched.get("first_chunk_p95_s"), batched.get("lone_first_chunk_s"))
    return (f"batched/unbatched aggregate throughput: {x(thr)}; "
            f"p95 first chunk batched / lone: {x(fc)}")


def fmt_value(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.3f}"
    return str(v)


def markdown_table(results: list[dict]) -> str:
    """One row per metric, one column per configuration."""
    names = [r["name"] for r in results]
    lines = ["| metric | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, label in METRICS:
        lines.append(f"| {label} | " + " | ".join(fmt_value(r.get(key)) for r in results) + " |")
    return "\n".join(lines)


def cpu_line(root: str = "/") -> str:
    """``CPU: <model name>; N cores; ISA: flags`` from /proc/cpuinfo."""
    from cosyvino.bench_extras import cpuinfo_field

    try:
        from cosyvino.planner.topology import ISA_FLAGS
    except ImportError:
        ISA_FLAGS = _ISA_FALLBACK
    have = set((cpuinfo_field("flags", root) or "").split())
    isa = " ".join(f for f in ISA_FLAGS if f in have) or "none of " + " ".join(ISA_FLAGS)
    return f"CPU: {cpuinfo_field('model name', root) or 'unknown'}; {os.cpu_count()} cores; " \
           f"ISA: {isa}"


def server_configs(args) -> list[dict]:
    """The server configurations to measure, in order: name, max_sessions, llm_batch,
    estimator_batch."""
    if args.compare_batching is None:
        return [{"name": f"sessions {args.max_sessions}", "max_sessions": args.max_sessions,
                 "llm_batch": 1, "estimator_batch": 1}]
    n, u = args.compare_batching, args.unbatched_sessions
    e = n if args.estimator_batch is None else args.estimator_batch
    out = [{"name": f"unbatched (sessions {u})", "max_sessions": u, "llm_batch": 1,
            "estimator_batch": 1}]
    if args.llm_only_too and e > 1:
        out.append({"name": f"llm-batch {n}, sessions {n}", "max_sessions": n,
                    "llm_batch": n, "estimator_batch": 1})
    out.append({"name": f"batched (llm-batch {n}, estimator-batch {e}, sessions {n})",
                "max_sessions": n, "llm_batch": n, "estimator_batch": e})
    return out


def server_command(args, cfg: dict, port: int) -> list[str]:
    """argv of `cosyvino serve` for configuration ``cfg`` on 127.0.0.1:``port``."""
    cmd = [sys.executable, "-c", "from cosyvino.cli import main; main()", "serve",
           "--port", str(port), "--no-cache", "--log-level", "warning",
           "--max-sessions", str(cfg["max_sessions"]), "--queue-size", str(args.queue_size),
           "--timeout", str(args.timeout), "--drain-timeout", "5",
           # explicit: a plan's batch sizes must not leak in
           "--llm-batch", str(cfg["llm_batch"]),
           "--estimator-batch", str(cfg.get("estimator_batch", 1))]
    for flag, value in (("--plan", args.plan), ("--model-dir", args.model_dir),
                        ("--threads", args.threads), ("--backend", args.backend),
                        ("--num-speech-tokens", args.tokens)):
        if value:
            cmd += [flag, str(value)]
    return cmd


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    ok = host == "localhost"
    try:
        ok = ok or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not ok:
        sys.exit(f"refusing to load-test {host!r}: loopback addresses only")


# ---------------------------------------------------------------- server + clients


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(args, cfg: dict):
    """Start `cosyvino serve` for ``cfg``; yield (proc, url); always terminate it (SIGTERM,
    then SIGKILL after 30 s)."""
    port = free_port()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen(server_command(args, cfg, port), stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc, f"http://127.0.0.1:{port}", log
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        log.close()


def server_log_tail(log, limit: int = 2000) -> str:
    if log is None:
        return ""
    log.flush()
    log.seek(0)
    return log.read().decode("utf-8", "replace")[-limit:]


def wait_ready(url: str, proc, timeout: float, log=None) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{server_log_tail(log)}")
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    raise RuntimeError(f"server did not become ready in {timeout:.0f} s")


def one_request(c, url: str, body: dict, fmt: str) -> dict:
    """POST one streamed speech request; status, total latency, first-chunk latency (first
    audio bytes after the header; first body byte for compressed formats), audio seconds."""
    import httpx

    start = time.perf_counter()
    first = None
    size = 0
    prefix = b""
    header = 0 if fmt not in RATES else None
    status = None
    retry_after = 0.0
    try:
        with c.stream("POST", url + "/v1/audio/speech", json=body) as r:
            status = r.status_code
            for chunk in r.iter_raw():
                size += len(chunk)
                if header is None:
                    prefix = (prefix + chunk)[:4096]
                    header = header_size(fmt, prefix)
                if first is None and header is not None and size > header:
                    first = time.perf_counter() - start
            if status == 503:
                try:
                    retry_after = min(2.0, float(r.headers.get("retry-after", 1)))
                except ValueError:
                    retry_after = 1.0
    except httpx.HTTPError:
        status = "transport"
        retry_after = 0.5  # no tight loop against a dead or restarting server
    row = {"status": status, "latency": time.perf_counter() - start,
           "first_chunk": first if status == 200 else None,
           "audio_s": audio_seconds(fmt, size, header) if status == 200 else 0.0}
    return row, retry_after


def run_lone(url: str, args) -> list[dict]:
    """LONE_REQUESTS sequential requests (client 0's first texts, seeds of a client index no
    load client uses) before the load."""
    import httpx

    rows = []
    with httpx.Client(timeout=args.timeout) as c:
        for n in range(LONE_REQUESTS):
            row, _ = one_request(c, url, request_body(args.clients + 1, n, args.format),
                                 args.format)
            rows.append(row)
    return rows


def run_clients(url: str, args, proc=None, stop: threading.Event | None = None) -> tuple:
    """``args.clients`` clients in threads until ``args.duration`` passes (no request starts
    later) or ``args.max_requests`` are sent; returns (rows, measured window in s: first start
    to last request end)."""
    import httpx

    stop = stop or threading.Event()
    deadline = time.monotonic() + args.duration
    lock = threading.Lock()
    rows: list[dict] = []
    budget = [args.max_requests]

    def go_on() -> bool:
        return time.monotonic() < deadline and not stop.is_set() and \
            (proc is None or proc.poll() is None)

    def client(i: int):
        with httpx.Client(timeout=args.timeout) as c:
            n = 0
            while go_on():
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                row, pause = one_request(c, url, request_body(i, n, args.format), args.format)
                n += 1
                with lock:
                    rows.append(row)
                if pause:
                    stop.wait(pause)

    threads = [threading.Thread(target=client, args=(i,), daemon=True)
               for i in range(args.clients)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    hard_end = time.monotonic() + args.duration + args.timeout + 10
    for t in threads:
        while t.is_alive() and time.monotonic() < hard_end:
            t.join(0.5)
    stop.set()
    return rows, time.perf_counter() - wall


def measure(url: str, pid, proc, args) -> dict:
    """Lone baseline, then the load, on one ready server."""
    rss_start = rss_mb(pid)
    lone = lone_baseline(run_lone(url, args))
    rows, window = run_clients(url, args, proc)
    if proc is not None and proc.poll() is not None:
        print(f"warning: the server exited during the run (status {proc.returncode})",
              file=sys.stderr)
    result = summarize(rows, window)
    result.update(lone)
    result["p95_first_chunk_over_lone"] = ratio(result["first_chunk_p95_s"],
                                                result["lone_first_chunk_s"])
    result["rss_start_mb"] = rss_start
    result["rss_end_mb"] = rss_mb(pid)
    result.update(batch_gauges(url))
    return result


#: /metrics gauge -> result key: how much batching the run saw
BATCH_GAUGES = {"cosyvino_llm_batch_mean_rows": "llm_batch_mean_rows",
                "cosyvino_estimator_batch_mean_requests": "estimator_batch_mean_requests"}


def parse_gauges(text: str, names) -> dict:
    """Values of the unlabelled gauges ``names`` in a Prometheus text exposition."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] in names:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def batch_gauges(url: str) -> dict:
    """The server's batch occupancy after the run (None where /metrics did not answer)."""
    import httpx

    try:
        text = httpx.get(url + "/metrics", timeout=10).text
    except httpx.HTTPError:
        text = ""
    got = parse_gauges(text, BATCH_GAUGES)
    return {key: got.get(name) for name, key in BATCH_GAUGES.items()}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="existing server (loopback only); default: start one")
    ap.add_argument("--pid", type=int, help="server pid for RSS (with --url)")
    ap.add_argument("--model-dir", help="model for the server it starts (default model)")
    ap.add_argument("--plan", help="plan file for the servers it starts (cosyvino serve --plan)")
    ap.add_argument("--tiny", action="store_true", help="use a synthetic tiny model")
    ap.add_argument("--backend", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-sessions", type=int, default=1,
                    help="sessions of the one server (without --compare-batching)")
    ap.add_argument("--compare-batching", type=int, nargs="?", const=4, default=None,
                    metavar="N", help="measure an unbatched server, then one with "
                    "--llm-batch N --max-sessions N (N = 4 without a value)")
    ap.add_argument("--estimator-batch", type=int, default=None, metavar="E",
                    help="--estimator-batch of the batched server (default: N)")
    ap.add_argument("--llm-only-too", action="store_true",
                    help="also measure --llm-batch N --estimator-batch 1 in between")
    ap.add_argument("--unbatched-sessions", type=int, default=1,
                    help="--max-sessions of the unbatched server of --compare-batching")
    ap.add_argument("--queue-size", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=None,
                    help="force speech tokens per segment on the servers it starts")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds (bounded)")
    ap.add_argument("--max-requests", type=int, default=10_000)
    ap.add_argument("--format", default="wav", choices=["wav", "pcm", "mp3", "flac", "opus"])
    ap.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    if args.clients < 1 or args.clients > 256 or not 0 < args.duration <= 3600:
        ap.error("--clients must be 1..256 and --duration 0..3600 s")
    if args.compare_batching is not None:
        if args.url:
            ap.error("--compare-batching starts its own servers: no --url")
        if args.compare_batching < 2 or args.unbatched_sessions < 1:
            ap.error("--compare-batching N needs N >= 2 and --unbatched-sessions >= 1")
        if args.estimator_batch is not None and args.estimator_batch < 1:
            ap.error("--estimator-batch must be >= 1")
    if not 0 < args.timeout <= 3600:
        ap.error("--timeout must be 0..3600 s")
    return args


def run_configs(args) -> list[dict]:
    results = []
    for cfg in server_configs(args):
        if args.url:
            check_loopback(args.url)
            url = args.url.rstrip("/")
            wait_ready(url, None, args.ready_timeout)
            result = measure(url, args.pid, None, args)
        else:
            with running_server(args, cfg) as (proc, url, log):
                wait_ready(url, proc, args.ready_timeout, log)
                result = measure(url, proc.pid, proc, args)
        result.update(name=cfg["name"], config=f"sessions {cfg['max_sessions']}, "
                      f"llm-batch {cfg['llm_batch']}, estimator-batch "
                      f"{cfg['estimator_batch']}", max_sessions=cfg["max_sessions"],
                      llm_batch=cfg["llm_batch"], estimator_batch=cfg["estimator_batch"])
        results.append(result)
    return results


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv=None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)  # `timeout`, `kill`: clean up as on Ctrl-C
    tmp = None
    try:
        if args.tiny and not args.model_dir and not args.url:
            from cosyvino.families.cosyvoice1.synthetic import make_model

            tmp = tempfile.TemporaryDirectory(prefix="cosyvino-load-")
            args.model_dir = make_model("tiny", os.path.join(tmp.name, "tiny"))
        results = run_configs(args)
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the servers are already terminated (running_server)
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        if tmp is not None:
            tmp.cleanup()

    print(f"{cpu_line()}; clients {args.clients}, {args.duration:g} s each, format "
          f"{args.format}, tokens {args.tokens or 'model'}, model {args.model_dir or 'default'}"
          f"{', plan ' + args.plan if args.plan else ''}")
    print()
    print(markdown_table(results))
    if args.json_out:
        from cosyvino.fileutil import atomic_write

        meta = {"cpu": cpu_line(), "clients": args.clients, "duration_s": args.duration,
                "format": args.format, "tokens": args.tokens, "backend": args.backend,
                "threads": args.threads, "plan": args.plan,
                "model_dir": args.model_dir or "default"}
        with atomic_write(args.json_out) as fh:
            fh.write(json.dumps({"run": meta, "results": results}, indent=2,
                                ensure_ascii=False).encode("utf-8"))
    if len(results) >= 2:
        print(ratio_line(results[0], results[-1]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
