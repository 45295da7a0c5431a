#!/usr/bin/env python
"""Load test for `cosyvino serve` (not a test): N concurrent clients on loopback for a bounded
time. Reports QPS, p50/p95 latency, first-byte latency, error/503 rates, audio RTF and server
RSS at start and end. Prints a markdown table; ``--json`` writes the numbers.

By default it starts its own server (subprocess, 127.0.0.1, random port) on a model directory:

    python benchmarks/load_test.py --model-dir D --clients 4 --duration 30 --tokens 100
    python benchmarks/load_test.py --tiny --clients 8 --duration 10     # synthetic tiny model

or measures a running one (loopback addresses only; pass --pid for its RSS):

    python benchmarks/load_test.py --url http://127.0.0.1:8000 --clients 4 --duration 30

Every loop is bounded by --duration (and --max-requests); clients stop by themselves.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import socket
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


def rss_mb(pid: int | None) -> float | None:
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


def pct(values, q):
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def check_loopback(url: str) -> None:
    host = urlparse(url).hostname or ""
    ok = host == "localhost"
    try:
        ok = ok or ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    if not ok:
        sys.exit(f"refusing to load-test {host!r}: loopback addresses only")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args) -> tuple[subprocess.Popen, str]:
    port = free_port()
    cmd = [sys.executable, "-c", "from cosyvino.cli import main; main()", "serve",
           "--port", str(port), "--no-cache", "--log-level", "warning",
           "--max-sessions", str(args.max_sessions), "--queue-size", str(args.queue_size)]
    if args.model_dir:
        cmd += ["--model-dir", args.model_dir]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.backend:
        cmd += ["--backend", args.backend]
    if args.tokens:
        cmd += ["--num-speech-tokens", str(args.tokens)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(url: str, proc, timeout: float) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + "/ready", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.25)
    sys.exit("server did not become ready in time")


def run_clients(url: str, args, proc=None) -> dict:
    import httpx

    def server_died() -> bool:
        return proc is not None and proc.poll() is not None

    deadline = time.monotonic() + args.duration
    lock = threading.Lock()
    rows: list[dict] = []
    budget = [args.max_requests]

    def client(i: int):
        with httpx.Client(timeout=args.timeout) as c:
            n = 0
            while time.monotonic() < deadline and not server_died():
                with lock:
                    if budget[0] <= 0:
                        return
                    budget[0] -= 1
                voice, text = TEXTS[(i + n) % len(TEXTS)]
                n += 1
                body = {"model": "tts-1", "input": text, "voice": voice,
                        "response_format": args.format}
                start = time.perf_counter()
                first = None
                size = 0
                status = None
                try:
                    with c.stream("POST", url + "/v1/audio/speech", json=body) as r:
                        status = r.status_code
                        for chunk in r.iter_raw():
                            if first is None and chunk:
                                first = time.perf_counter() - start
                            size += len(chunk)
                        if status == 503:
                            time.sleep(min(2.0, float(r.headers.get("retry-after", 1))))
                except httpx.HTTPError:
                    status = "transport"
                    time.sleep(0.5)  # no tight loop against a dead or restarting server
                with lock:
                    rows.append({"status": status, "latency": time.perf_counter() - start,
                                 "first_byte": first, "bytes": size})

    threads = [threading.Thread(target=client, args=(i,)) for i in range(args.clients)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - wall
    ok = [r for r in rows if r["status"] == 200]
    audio_s = 0.0
    if args.format == "wav":  # header + int16 at 22050
        audio_s = sum(max(0, r["bytes"] - 44) for r in ok) / 2 / 22050
    elif args.format == "pcm":
        audio_s = sum(r["bytes"] for r in ok) / 2 / 24000
    lat = [r["latency"] for r in ok]
    fb = [r["first_byte"] for r in ok if r["first_byte"] is not None]
    return {
        "clients": args.clients, "duration_s": round(wall, 2), "requests": len(rows),
        "ok": len(ok), "busy_503": sum(r["status"] == 503 for r in rows),
        "errors": sum(r["status"] not in (200, 503) for r in rows),
        "error_rate": round(sum(r["status"] != 200 for r in rows) / max(1, len(rows)), 4),
        "qps": round(len(ok) / wall, 3),
        "latency_p50_s": pct(lat, 0.5), "latency_p95_s": pct(lat, 0.95),
        "first_byte_p50_s": pct(fb, 0.5), "first_byte_p95_s": pct(fb, 0.95),
        "audio_seconds": round(audio_s, 2),
        "audio_x_realtime": round(audio_s / wall, 3) if wall else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", help="existing server (loopback only); default: start one")
    ap.add_argument("--pid", type=int, help="server pid for RSS (with --url)")
    ap.add_argument("--model-dir", help="model for the server it starts (default model)")
    ap.add_argument("--tiny", action="store_true", help="use a synthetic tiny model")
    ap.add_argument("--backend", default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--max-sessions", type=int, default=1)
    ap.add_argument("--queue-size", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=None,
                    help="force speech tokens per segment on the server it starts")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--duration", type=float, default=30.0, help="seconds (bounded)")
    ap.add_argument("--max-requests", type=int, default=10_000)
    ap.add_argument("--format", default="wav", choices=["wav", "pcm", "mp3", "flac", "opus"])
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    if args.clients < 1 or args.clients > 256 or not 0 < args.duration <= 3600:
        sys.exit("--clients must be 1..256 and --duration 0..3600 s")

    proc = None
    tmp = None
    try:
        if args.url:
            check_loopback(args.url)
            url, pid = args.url.rstrip("/"), args.pid
        else:
            if args.tiny and not args.model_dir:
                from cosyvino.families.cosyvoice1.synthetic import make_model

                tmp = tempfile.TemporaryDirectory(prefix="cosyvino-load-")
                args.model_dir = make_model("tiny", os.path.join(tmp.name, "tiny"))
            proc, url = start_server(args)
            pid = proc.pid
        wait_ready(url, proc, timeout=600)
        rss_start = rss_mb(pid)
        result = run_clients(url, args, proc)
        if proc is not None and proc.poll() is not None:
            print(f"warning: the server exited during the run (status {proc.returncode})",
                  file=sys.stderr)
        result["rss_start_mb"] = rss_start
        result["rss_end_mb"] = rss_mb(pid)
        result["server"] = {"max_sessions": args.max_sessions, "tokens": args.tokens,
                            "model_dir": args.model_dir or "default", "format": args.format}
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        if tmp is not None:
            tmp.cleanup()

    def f(v, unit=""):
        return "n/a" if v is None else (f"{v:.3f}{unit}" if isinstance(v, float) else f"{v}")

    print("| metric | value |\n|---|---|")
    for k in ("clients", "duration_s", "requests", "ok", "busy_503", "errors", "error_rate",
              "qps", "latency_p50_s", "latency_p95_s", "first_byte_p50_s", "first_byte_p95_s",
              "audio_seconds", "audio_x_realtime", "rss_start_mb", "rss_end_mb"):
        print(f"| {k} | {f(result[k])} |")
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
