#!/usr/bin/env python
"""Soak test for `cosyvino serve` (a benchmark, not a CI test; results in docs/reliability.md).

N clients on 127.0.0.1 for a bounded time against a server this script starts, with a text
mix of valid requests, bad requests (``--bad``, default 10 %) and clients that disconnect
mid-stream (``--disconnect``, default 5 %), and one SIGTERM + restart in the middle (same port,
same result cache). Checks, printed as a table (exit status 1 when one fails):

* 0 errors for valid admitted requests: every valid request ends as a complete, decodable
  200, a 503 with Retry-After, or (only while the server restarts) a refused connection;
  a 5xx/504, a cut body or a 4xx for a valid request is an error. Bad requests must get a 4xx.
* each server process exits 0 after SIGTERM (clean drain);
* the seeded result cached before the restart is a cache hit, byte-identical, after it;
* RSS drift of each server process between 1/6 of its life ("minute 5 of 30") and its end;
* no leaked threads or file descriptors: /proc/<pid> counts when idle after a warm-up burst
  vs when idle at the end (idle >= 12 s first, so anyio's idle worker threads have exited).

    python benchmarks/soak.py --tiny --clients 4 --duration 200        # short run
    python benchmarks/soak.py --clients 16 --duration 1800             # the full soak (300M)

Bounded: every client loop ends at the phase deadline and after --max-requests in total.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

VALID = (
    ("中文女", "收到好友从远方寄来的生日礼物，"
              "那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。"),
    ("英文女", "CosyVoice is a multilingual speech synthesis model that runs on ordinary "
              "servers."),
    ("中文男", "今天天气很好。我们去公园散步吧。"),
    ("英文男", "Hello there. This is a short one."),
    ("中文女", "第一句话说完了，第二句话也说完了。" * 4),
)
BAD = (
    b'{"input": "hi",',                                              # malformed JSON
    json.dumps({"input": "hi", "voice": "nobody"}).encode(),         # unknown voice
    json.dumps({"input": "   ", "voice": "中文女"}).encode(),        # nothing to say
    json.dumps({"input": "hi", "voice": "中文女", "speed": 10}).encode(),
    json.dumps({"input": "a" * 5000, "voice": "中文女"}).encode(),   # over 4096 characters
    b'{"input": ' + b"[" * 1000 + b"]" * 1000 + b"}",                # nested 1,000 levels
)
MARKER = {"input": "这句话在重启前后都应该来自缓存。", "voice": "中文女",
          "response_format": "wav", "seed": 4242}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stats(pid: int) -> dict:
    """RSS (MiB), threads and open fds of ``pid`` from /proc."""
    out = {"rss_mb": None, "threads": None, "fds": None}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = int(line.split()[1]) / 1024.0
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        pass
    return out


class Server:
    def __init__(self, args, port: int, cache_dir: str):
        cmd = [sys.executable, "-c", "from cosyvino.cli import main; main()", "serve",
               "--port", str(port), "--cache-dir", cache_dir, "--log-level", "warning",
               "--max-sessions", str(args.max_sessions), "--queue-size", str(args.queue_size),
               "--timeout", str(args.timeout)]
        if args.model_dir:
            cmd += ["--model-dir", args.model_dir]
        if args.tokens:
            cmd += ["--num-speech-tokens", str(args.tokens)]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 600) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                sys.exit(f"server exited with {self.proc.returncode}:\n"
                         + self.log.read().decode(errors="replace")[-3000:])
            try:
                if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        sys.exit("server did not become ready in time")


class Clients:
    """The client threads of one phase; results in :attr:`rows`."""

    def __init__(self, url: str, args, rows: list, lock: threading.Lock, budget: list):
        self.url, self.args, self.rows, self.lock, self.budget = url, args, rows, lock, budget
        self.stop_at = 0.0
        self.restarting = threading.Event()  # refused connections are expected now

    def run(self, duration: float) -> None:
        self.stop_at = time.monotonic() + duration
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                   for i in range(self.args.clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(duration + self.args.timeout + 60)

    def _client(self, i: int) -> None:
        import httpx

        rng = random.Random(i * 7919 + int(time.time()))
        with httpx.Client(timeout=self.args.timeout + 30) as c:
            while time.monotonic() < self.stop_at:
                with self.lock:
                    if self.budget[0] <= 0:
                        return
                    self.budget[0] -= 1
                x = rng.random()
                kind = "bad" if x < self.args.bad else (
                    "disconnect" if x < self.args.bad + self.args.disconnect else "valid")
                row = {"kind": kind, "t": time.monotonic()}
                try:
                    if kind == "bad":
                        r = c.post(self.url + "/v1/audio/speech", content=rng.choice(BAD),
                                   headers={"content-type": "application/json"})
                        row["status"] = r.status_code
                    else:
                        voice, text = rng.choice(VALID)
                        body = {"input": text, "voice": voice, "response_format": "wav"}
                        row.update(self._stream(c, body, kind == "disconnect"))
                except httpx.ConnectError:
                    row["status"] = "refused"
                    row["restart"] = self.restarting.is_set()
                    time.sleep(0.5)
                except httpx.HTTPError as e:
                    row["status"] = f"transport:{type(e).__name__}"
                    row["restart"] = self.restarting.is_set()
                    time.sleep(0.5)
                with self.lock:
                    self.rows.append(row)
                if row.get("status") == 503:
                    time.sleep(min(5.0, float(row.get("retry_after") or 1)))

    def _stream(self, c, body: dict, disconnect: bool) -> dict:
        import io

        import soundfile as sf

        out = {}
        with c.stream("POST", self.url + "/v1/audio/speech", json=body) as r:
            out["status"] = r.status_code
            out["retry_after"] = r.headers.get("retry-after")
            if r.status_code != 200:
                r.read()
                out["code"] = (r.json().get("error") or {}).get("code") \
                    if r.headers.get("content-type", "").startswith("application/json") else None
                return out
            data = bytearray()
            for chunk in r.iter_raw():
                data += chunk
                if disconnect and data:
                    out["disconnected"] = True
                    return out  # leaving the block closes the connection mid-stream
        samples, _ = sf.read(io.BytesIO(bytes(data)), dtype="int16")
        out["audio_s"] = samples.shape[0] / 22050
        out["complete"] = samples.shape[0] > 0
        return out


def idle_stats(pid: int, seconds: float = 12.0) -> dict:
    time.sleep(seconds)
    return proc_stats(pid)


def marker(url: str) -> tuple[int, str, bytes]:
    import httpx

    r = httpx.post(url + "/v1/audio/speech", json=MARKER, timeout=120)
    return r.status_code, r.headers.get("x-cosyvino-cache", ""), r.content


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", help="model (default: the embedded default model)")
    ap.add_argument("--tiny", action="store_true", help="a synthetic tiny model")
    ap.add_argument("--tokens", type=int, default=None,
                    help="force speech tokens per segment (default: 25 with --tiny)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds in total")
    ap.add_argument("--max-requests", type=int, default=200_000)
    ap.add_argument("--bad", type=float, default=0.10)
    ap.add_argument("--disconnect", type=float, default=0.05)
    ap.add_argument("--max-sessions", type=int, default=1)
    ap.add_argument("--queue-size", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    if not (1 <= args.clients <= 256 and 30 <= args.duration <= 7200):
        sys.exit("--clients must be 1..256 and --duration 30..7200 s")
    tmp = tempfile.TemporaryDirectory(prefix="cosyvino-soak-")
    if args.tiny and not args.model_dir:
        from cosyvino.families.cosyvoice1.synthetic import make_model

        args.model_dir = make_model("tiny", os.path.join(tmp.name, "tiny"))
        args.tokens = args.tokens or 25
    port, cache_dir = free_port(), os.path.join(tmp.name, "cache")
    rows: list = []
    lock = threading.Lock()
    budget = [args.max_requests]
    half = args.duration / 2
    procs = []
    result: dict = {"clients": args.clients, "duration_s": args.duration}
    try:
        # ---- process A ----
        a = Server(args, port, cache_dir)
        procs.append(a)
        a.wait_ready()
        m_status, _, m_body = marker(a.url)
        result["marker_before"] = m_status
        warm = Clients(a.url, args, [], lock, [10 * args.clients])
        warm.run(min(20.0, args.duration / 10))  # lazily created pools exist from here on
        base_a = idle_stats(a.pid)
        phase = Clients(a.url, args, rows, lock, budget)
        sampler = {}

        def sample_at(server, key, delay):
            def run():
                time.sleep(delay)
                sampler[key] = proc_stats(server.pid)
            threading.Thread(target=run, daemon=True).start()

        sample_at(a, "a_warm", half / 3)
        phase_thread = threading.Thread(target=phase.run, args=(half,))
        phase_thread.start()
        phase_thread.join()
        end_a = idle_stats(a.pid)
        # SIGTERM with requests in flight, clients still sending
        phase.restarting.set()
        inflight = threading.Thread(target=phase.run, args=(8.0,))
        inflight.start()
        time.sleep(2.0)
        t_term = time.monotonic()
        a.proc.send_signal(signal.SIGTERM)
        result["exit_a"] = a.proc.wait(args.timeout + 60)
        result["drain_s"] = round(time.monotonic() - t_term, 2)
        # ---- process B (same port, same cache) ----
        b = Server(args, port, cache_dir)
        procs.append(b)
        b.wait_ready()
        inflight.join()
        phase.restarting.clear()
        m2_status, m2_cache, m2_body = marker(b.url)
        result["cache_after_restart"] = m2_cache
        result["cache_identical"] = m2_status == 200 and m2_body == m_body
        base_b = proc_stats(b.pid)
        sample_at(b, "b_warm", half / 3)
        phase.run(half)
        end_b = idle_stats(b.pid)
        b.proc.send_signal(signal.SIGTERM)
        result["exit_b"] = b.proc.wait(args.timeout + 60)
    finally:
        for s in procs:
            if s.proc.poll() is None:
                s.proc.kill()
                s.proc.wait(10)
        tmp.cleanup()

    valid = [r for r in rows if r["kind"] == "valid"]
    bad = [r for r in rows if r["kind"] == "bad"]
    ok = [r for r in valid if r.get("status") == 200 and r.get("complete")]
    busy = [r for r in valid if r.get("status") == 503 and r.get("retry_after")]
    refused = [r for r in valid if r.get("status") == "refused" and r.get("restart")]
    errors = [r for r in valid if r not in ok and r not in busy and r not in refused]
    bad_errors = [r for r in bad if not (isinstance(r.get("status"), int)
                                         and 400 <= r["status"] < 500)
                  and not (r.get("restart") and r.get("status") == "refused")]
    a_warm, b_warm = sampler.get("a_warm", {}), sampler.get("b_warm", {})

    def drift(x, y):
        if not x or not y or not x.get("rss_mb") or not y.get("rss_mb"):
            return None
        return round(100.0 * (y["rss_mb"] - x["rss_mb"]) / x["rss_mb"], 2)

    result.update({
        "requests": len(rows), "valid": len(valid), "ok": len(ok), "busy_503": len(busy),
        "refused_during_restart": len(refused), "valid_errors": len(errors),
        "bad": len(bad), "bad_not_4xx": len(bad_errors),
        "disconnects": sum(1 for r in rows if r.get("disconnected")),
        "audio_s": round(sum(r.get("audio_s", 0) for r in ok), 1),
        "rss_a_mb": [a_warm.get("rss_mb"), end_a.get("rss_mb")],
        "rss_b_mb": [b_warm.get("rss_mb"), end_b.get("rss_mb")],
        "rss_drift_a_pct": drift(a_warm, end_a), "rss_drift_b_pct": drift(b_warm, end_b),
        "threads_a": [base_a["threads"], end_a["threads"]],
        "fds_a": [base_a["fds"], end_a["fds"]],
        "threads_b": [base_b["threads"], end_b["threads"]],
        "fds_b": [base_b["fds"], end_b["fds"]],
        "error_samples": [{k: v for k, v in r.items() if k != "t"} for r in errors[:5]],
    })
    checks = {
        "0 errors for valid admitted requests": not errors,
        "bad requests all 4xx": not bad_errors,
        "exit 0 after SIGTERM (both)": result.get("exit_a") == 0 and result.get("exit_b") == 0,
        "cache entry survives restart": result.get("cache_after_restart") == "hit"
        and result.get("cache_identical"),
        "RSS drift < 5 %": all(d is not None and abs(d) < 5 for d in
                               (result["rss_drift_a_pct"], result["rss_drift_b_pct"])),
        "no leaked threads": end_a["threads"] <= base_a["threads"] + 1
        and end_b["threads"] <= max(base_b["threads"], base_a["threads"]) + 1,
        "no leaked fds": end_a["fds"] <= base_a["fds"] + 1
        and end_b["fds"] <= max(base_b["fds"], base_a["fds"]) + 1,
    }
    result["checks"] = checks
    print("| metric | value |\n|---|---|")
    for k, v in result.items():
        if k not in ("checks", "error_samples"):
            print(f"| {k} | {v} |")
    print("\n| check | result |\n|---|---|")
    for k, v in checks.items():
        print(f"| {k} | {'pass' if v else 'FAIL'} |")
    if errors:
        print("\nfirst errors:", json.dumps(result["error_samples"], ensure_ascii=False))
    if args.json_out:
        with open(args.json_out, "w") as fh:
            json.dump(result, fh, indent=2, ensure_ascii=False)
    return 0 if all(checks.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
