#!/usr/bin/env python
"""Soak test for `cosyvino serve` (a benchmark, not a CI test; results in docs/reliability.md).

N clients on 127.0.0.1 for a bounded time against a server this script starts, with a text
mix of valid requests, bad requests (``--bad``, default 10 %) and clients that disconnect
mid-stream (``--disconnect``, default 5 %), and one SIGTERM + restart in the middle (same port,
same result cache, same voices dir). Before the load a voice is registered over HTTP
(``POST /v1/audio/voices`` with ``examples/zero_shot_prompt.wav``) and used in the load mix.
Checks, printed as a table (exit status 1 when one fails):

* 0 errors for valid admitted requests: every valid request ends as a complete, decodable
  200, a 503 with Retry-After, or (only while the server restarts) a refused connection;
  a 5xx/504, a cut body or a 4xx for a valid request is an error. Bad requests must get a 4xx.
* each server process exits 0 after SIGTERM (clean drain);
* the seeded results cached before the restart (a built-in speaker and the registered voice)
  are cache hits after it, byte-identical to the hits before it;
* the registered voice survives the restart: listed by ``GET /v1/audio/voices`` with the same
  ``sha256``, and its seeded request, sent as ``flac`` (a cache key the cache cannot hold, so
  process B synthesizes it), decodes to exactly the int16 samples of the wav from process A;
* RSS drift of each server process between 1/6 of its life ("minute 5 of 30", under load) and
  its end (idle): growth must stay below 5 % (a fall is memory given back, not a leak);
* no leaked threads or file descriptors: /proc/<pid> counts when idle after a warm-up burst
  vs when idle at the end (idle >= 12 s first, so anyio's idle worker threads have exited).

    python benchmarks/soak.py --tiny --clients 4 --duration 120 --timeout 30   # short run
    python benchmarks/soak.py --clients 16 --duration 1800                     # the full soak

Bounded: every client loop ends at the phase deadline and after --max-requests in total; every
wait (server ready, HTTP request, drain, thread join) has a timeout. When a step fails the
clients are stopped, the servers killed, and the table is printed with what was measured
(missing values are None and their checks FAIL), plus the failure.
"""

from __future__ import annotations

import argparse
import io
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
import traceback

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
VOICE_NAME = "soak-voice"
VOICE_WAV = os.path.join(REPO, "examples", "zero_shot_prompt.wav")
VOICE_TEXT = "希望你以后能够做的比我还好呦。"  # the transcript of VOICE_WAV
VOICE_REQUEST = {"input": "重启之后，这个注册的声音还在。", "voice": VOICE_NAME,
                 "response_format": "wav", "seed": 5151}
VOICE_LOAD_TEXT = "今天天气很好，我们用注册的声音说一句话。"
IDLE_S = 12.0
HTTP_SLACK_S = 30.0


class SoakError(RuntimeError):
    """A step of the soak failed (server did not start, exited, did not drain in time)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_stats(pid: int) -> dict:
    """RSS (MiB), threads and open fds of ``pid`` from /proc (None where unreadable)."""
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


def wav_samples(data: bytes):
    """int16 samples, shape (n,), of a wav response body (libsndfile reads the streamed
    header's unknown length as "to the end")."""
    import soundfile as sf

    samples, _ = sf.read(io.BytesIO(data), dtype="int16")
    return samples


def flac_samples(data: bytes):
    """int16 samples, shape (n,), of a mono s16 flac response body, decoded with PyAV (a
    streamed flac has no total length in its header, which libsndfile cannot read)."""
    import av
    import numpy as np

    with av.open(io.BytesIO(data), format="flac") as f:
        frames = [frame.to_ndarray().reshape(-1) for frame in f.decode(audio=0)]
    return np.concatenate(frames).astype(np.int16) if frames else np.zeros(0, np.int16)


class Server:
    """One ``cosyvino serve`` subprocess; its output goes to a temporary file."""

    def __init__(self, args, port: int, cache_dir: str, voices_dir: str):
        cmd = [sys.executable, "-c", "from cosyvino.cli import main; main()", "serve",
               "--port", str(port), "--cache-dir", cache_dir, "--voices-dir", voices_dir,
               "--log-level", "warning", "--timeout", str(args.timeout)]
        if args.plan:
            cmd += ["--plan", args.plan]
        # without --plan the defaults are 1 session, queue 8; with it the plan decides unless
        # they are given
        for flag, value, default in (("--max-sessions", args.max_sessions, 1),
                                     ("--queue-size", args.queue_size, 8)):
            if value is not None or not args.plan:
                cmd += [flag, str(value if value is not None else default)]
        if args.model_dir:
            cmd += ["--model-dir", args.model_dir]
        if args.tokens:
            cmd += ["--num-speech-tokens", str(args.tokens)]
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        self.pid = self.proc.pid

    def tail(self, n: int = 3000) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-n:]

    def served_config(self) -> str:
        """The server's own start-up line (backend, sessions, LLM batch, queue, threads,
        where the settings came from), as `cosyvino serve` prints it."""
        line = next((ln for ln in self.tail(20000).splitlines()
                     if ln.startswith("cosyvino serve:")), "")
        return line.split(" ", 3)[-1] if line else "unknown"

    def wait_ready(self, timeout: float) -> None:
        """Poll ``/ready``. Raises SoakError: the process exited or ``timeout`` s passed."""
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SoakError(f"server exited with {self.proc.returncode}:\n{self.tail()}")
            try:
                if httpx.get(self.url + "/ready", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.25)
        raise SoakError(f"server not ready after {timeout:.0f} s:\n{self.tail()}")

    def terminate(self, timeout: float) -> tuple[int, float]:
        """SIGTERM, wait; (exit status, seconds). Raises SoakError: still running after
        ``timeout`` s (the caller's cleanup kills it)."""
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise SoakError(f"server still running {timeout:.0f} s after SIGTERM") from None
        return code, round(time.monotonic() - t0, 2)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass


class Clients:
    """The client threads of one phase; results appended to ``rows``."""

    def __init__(self, url: str, args, rows: list, lock: threading.Lock, budget: list,
                 abort: threading.Event, voices=VALID):
        self.url, self.args, self.rows, self.lock, self.budget = url, args, rows, lock, budget
        self.abort, self.voices = abort, voices
        self.stop_at = 0.0
        self.restarting = threading.Event()  # refused connections are expected now

    def run(self, duration: float) -> None:
        self.stop_at = time.monotonic() + duration
        threads = [threading.Thread(target=self._client, args=(i,), daemon=True)
                   for i in range(self.args.clients)]
        for t in threads:
            t.start()
        deadline = self.stop_at + self.args.timeout + HTTP_SLACK_S + 30
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _take(self) -> bool:
        with self.lock:
            if self.budget[0] <= 0 or self.abort.is_set():
                return False
            self.budget[0] -= 1
            return True

    def _client(self, i: int) -> None:
        import httpx

        rng = random.Random(i * 7919 + int(time.time()))
        with httpx.Client(timeout=self.args.timeout + HTTP_SLACK_S) as c:
            while time.monotonic() < self.stop_at and self._take():
                x = rng.random()
                kind = "bad" if x < self.args.bad else (
                    "disconnect" if x < self.args.bad + self.args.disconnect else "valid")
                row = {"kind": kind, "t": time.monotonic(),
                       "restart": self.restarting.is_set()}
                try:
                    if kind == "bad":
                        row["bad_index"] = rng.randrange(len(BAD))
                        r = c.post(self.url + "/v1/audio/speech", content=BAD[row["bad_index"]],
                                   headers={"content-type": "application/json"})
                        row["status"] = r.status_code
                        row["retry_after"] = r.headers.get("retry-after")
                        row["body"] = r.text[:200] if not 400 <= r.status_code < 500 else None
                    else:
                        voice, text = rng.choice(self.voices)
                        row["voice"] = voice
                        body = {"input": text, "voice": voice, "response_format": "wav"}
                        row.update(self._stream(c, body, kind == "disconnect"))
                except httpx.ConnectError:
                    row["status"] = "refused"
                    row["restart"] = row["restart"] or self.restarting.is_set()
                    time.sleep(0.5)
                except httpx.HTTPError as e:
                    row["status"] = f"transport:{type(e).__name__}"
                    row["restart"] = row["restart"] or self.restarting.is_set()
                    time.sleep(0.5)
                except Exception as e:  # undecodable audio and the like: an error row
                    row["status"] = f"client:{type(e).__name__}: {e}"[:200]
                with self.lock:
                    self.rows.append(row)
                if row.get("status") == 503:
                    time.sleep(min(5.0, float(row.get("retry_after") or 1)))

    def _stream(self, c, body: dict, disconnect: bool) -> dict:
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
        samples = wav_samples(bytes(data))
        out["audio_s"] = samples.shape[0] / 22050
        out["complete"] = samples.shape[0] > 0
        return out


def idle_stats(pid: int, seconds: float = IDLE_S) -> dict:
    time.sleep(seconds)
    return proc_stats(pid)


def speech(url: str, body: dict, timeout: float) -> tuple[int, str, bytes]:
    """(status, ``x-cosyvino-cache`` header, body) of one ``/v1/audio/speech`` request."""
    import httpx

    r = httpx.post(url + "/v1/audio/speech", json=body, timeout=timeout)
    return r.status_code, r.headers.get("x-cosyvino-cache", ""), r.content


def register_voice(url: str, timeout: float) -> dict:
    """``POST /v1/audio/voices`` of :data:`VOICE_WAV`; the voice object.
    Raises SoakError: not a 200."""
    import httpx

    with open(VOICE_WAV, "rb") as f:
        r = httpx.post(url + "/v1/audio/voices", timeout=timeout,
                       data={"name": VOICE_NAME, "text": VOICE_TEXT},
                       files={"file": ("zero_shot_prompt.wav", f, "audio/wav")})
    if r.status_code != 200:
        raise SoakError(f"POST /v1/audio/voices: {r.status_code} {r.text[:500]}")
    return r.json()


def listed_voice(url: str, name: str, timeout: float) -> dict | None:
    """The voice object ``name`` as ``GET /v1/audio/voices`` lists it, else None."""
    import httpx

    r = httpx.get(url + "/v1/audio/voices", timeout=timeout)
    r.raise_for_status()
    return next((v for v in r.json().get("voices", []) if v.get("id") == name), None)


def compare_samples(flac: bytes, wav: bytes) -> str:
    """"identical" when the flac body decodes to exactly the wav body's int16 samples, else
    what differs (lengths, largest difference) or why one does not decode."""
    import numpy as np

    try:
        x, y = flac_samples(flac), wav_samples(wav)
    except Exception as e:  # an error body, not audio
        return f"undecodable: {type(e).__name__}: {e}"[:200]
    if x.shape != y.shape:
        return f"{x.shape[0]} vs {y.shape[0]} samples"
    diff = int(np.abs(x.astype(np.int32) - y.astype(np.int32)).max()) if x.size else 0
    return "identical" if diff == 0 else f"max |difference| {diff} LSB"


def before_restart(s: dict, a: Server, args) -> None:
    """On process A: the seeded marker and the registered voice's seeded request."""
    r = s["result"]
    t = args.timeout + HTTP_SLACK_S
    # each request twice: the cache keeps a complete file, while the first (a multi-chunk
    # stream) had "length unknown" headers; the second is the cached bytes (docs/server.md)
    r["marker_before"], _, s["marker_body"] = speech(a.url, MARKER, t)
    _, _, s["marker_body"] = speech(a.url, MARKER, t)
    s["voice_obj"] = register_voice(a.url, t)
    r["voice_registered"] = s["voice_obj"].get("id")
    r["voice_before"], r["voice_before_cache"], s["voice_body"] = speech(a.url, VOICE_REQUEST, t)
    _, _, s["voice_body"] = speech(a.url, VOICE_REQUEST, t)


def after_restart(s: dict, b: Server, args) -> None:
    """On process B: the voice is listed, both seeded entries are byte-identical hits, and
    the voice's request in flac (not in the cache) decodes to the same samples."""
    r = s["result"]
    t = args.timeout + HTTP_SLACK_S
    listed = listed_voice(b.url, VOICE_NAME, t)
    r["voice_listed_after"] = listed is not None
    r["voice_sha256_same"] = listed is not None and bool(listed.get("sha256")) \
        and listed.get("sha256") == s["voice_obj"].get("sha256")
    status, r["cache_after_restart"], body = speech(b.url, MARKER, t)
    r["cache_identical"] = status == 200 and body == s["marker_body"]
    status, r["voice_cache_after"], body = speech(b.url, VOICE_REQUEST, t)
    r["voice_cache_identical"] = status == 200 and body == s["voice_body"]
    flac = dict(VOICE_REQUEST, response_format="flac")
    status, r["voice_flac_cache_after"], body = speech(b.url, flac, t)
    r["voice_flac_status"] = status
    r["voice_resynth_vs_before"] = compare_samples(body, s["voice_body"]) \
        if status == 200 else None


def sample_later(server: Server, sampler: dict, key: str, delay: float) -> None:
    def run():
        time.sleep(delay)
        if server.proc.poll() is None:
            sampler[key] = proc_stats(server.pid)
    threading.Thread(target=run, daemon=True).start()


def run_soak(args, s: dict, tmp: str) -> None:
    """All phases; fills ``s`` (``result``, ``rows``, ``stats``, ``procs``) as it goes, so a
    failure midway leaves what was measured."""
    port, cache_dir = free_port(), os.path.join(tmp, "cache")
    voices_dir = os.path.join(tmp, "voices")
    r, stats, half = s["result"], s["stats"], args.duration / 2
    lock, budget = threading.Lock(), [args.max_requests]
    ready_s, drain_s = args.ready_timeout, args.timeout + 60
    # ---- process A ----
    a = Server(args, port, cache_dir, voices_dir)
    s["procs"].append(a)
    a.wait_ready(ready_s)
    r["served_config"] = a.served_config()
    before_restart(s, a, args)
    mix = VALID + ((VOICE_NAME, VOICE_LOAD_TEXT),)
    warm = Clients(a.url, args, [], lock, [10 * args.clients], s["abort"], mix)
    warm.run(min(20.0, args.duration / 10))  # lazily created pools exist from here on
    stats["base_a"] = idle_stats(a.pid)
    phase = Clients(a.url, args, s["rows"], lock, budget, s["abort"], mix)
    sample_later(a, stats, "a_warm", half / 3)
    phase.run(half)
    stats["end_a"] = idle_stats(a.pid)
    # SIGTERM with requests in flight, clients still sending
    phase.restarting.set()
    inflight = threading.Thread(target=phase.run, args=(8.0,), daemon=True)
    inflight.start()
    time.sleep(2.0)
    r["exit_a"], r["drain_s"] = a.terminate(drain_s)
    # ---- process B (same port, same cache, same voices dir) ----
    b = Server(args, port, cache_dir, voices_dir)
    s["procs"].append(b)
    b.wait_ready(ready_s)
    inflight.join(8.0 + args.timeout + HTTP_SLACK_S + 30)
    phase.restarting.clear()
    after_restart(s, b, args)
    stats["base_b"] = proc_stats(b.pid)
    sample_later(b, stats, "b_warm", half / 3)
    phase.run(half)
    stats["end_b"] = idle_stats(b.pid)
    r["exit_b"], _ = b.terminate(drain_s)


def drift(x: dict, y: dict) -> float | None:
    if not x.get("rss_mb") or not y.get("rss_mb"):
        return None
    return round(100.0 * (y["rss_mb"] - x["rss_mb"]) / x["rss_mb"], 2)


def not_above(end, *bases) -> bool:
    """``end`` <= max(bases) + 1, False when a count is missing."""
    known = [b for b in bases if b is not None]
    return end is not None and bool(known) and end <= max(known) + 1


def summarize(s: dict) -> dict:
    """Counts, resource figures and the checks (a missing measurement fails its check)."""
    rows, result, st = list(s["rows"]), s["result"], s["stats"]
    valid = [x for x in rows if x["kind"] == "valid"]
    bad = [x for x in rows if x["kind"] == "bad"]
    ok = [x for x in valid if x.get("status") == 200 and x.get("complete")]
    busy = [x for x in valid if x.get("status") == 503 and x.get("retry_after")]
    refused = [x for x in valid if x.get("status") == "refused" and x.get("restart")]
    errors = [x for x in valid if x not in ok and x not in busy and x not in refused]
    # while the server restarts it refuses connections, then answers 503 not_ready (with
    # Retry-After) to everything until the model has loaded, bad requests included
    bad_restart = [x for x in bad if x.get("restart") and (
        x.get("status") == "refused" or (x.get("status") == 503 and x.get("retry_after")))]
    bad_errors = [x for x in bad if not (isinstance(x.get("status"), int)
                                         and 400 <= x["status"] < 500)
                  and x not in bad_restart]
    g = {k: st.get(k) or {} for k in ("a_warm", "end_a", "b_warm", "end_b", "base_a",
                                      "base_b")}
    result.update({
        "requests": len(rows), "valid": len(valid), "ok": len(ok), "busy_503": len(busy),
        "refused_during_restart": len(refused), "valid_errors": len(errors),
        "ok_registered_voice": sum(1 for x in ok if x.get("voice") == VOICE_NAME),
        "bad": len(bad), "bad_refused_or_503_during_restart": len(bad_restart),
        "bad_not_4xx": len(bad_errors),
        "disconnects": sum(1 for x in rows if x.get("disconnected")),
        "audio_s": round(sum(x.get("audio_s", 0) for x in ok), 1),
        "rss_a_mb": [g["a_warm"].get("rss_mb"), g["end_a"].get("rss_mb")],
        "rss_b_mb": [g["b_warm"].get("rss_mb"), g["end_b"].get("rss_mb")],
        "rss_drift_a_pct": drift(g["a_warm"], g["end_a"]),
        "rss_drift_b_pct": drift(g["b_warm"], g["end_b"]),
        "threads_a": [g["base_a"].get("threads"), g["end_a"].get("threads")],
        "fds_a": [g["base_a"].get("fds"), g["end_a"].get("fds")],
        "threads_b": [g["base_b"].get("threads"), g["end_b"].get("threads")],
        "fds_b": [g["base_b"].get("fds"), g["end_b"].get("fds")],
    })
    s["errors"] = [{k: v for k, v in x.items() if k != "t"} for x in errors[:5]]
    s["bad_errors"] = [{k: v for k, v in x.items() if k != "t"} for x in bad_errors[:5]]
    r = result
    return {
        "completed every phase": "failure" not in r,
        "0 errors for valid admitted requests": not errors and bool(ok),
        "bad requests all 4xx": not bad_errors,
        "exit 0 after SIGTERM (both)": r.get("exit_a") == 0 and r.get("exit_b") == 0,
        "cache entry survives restart": r.get("cache_after_restart") == "hit"
        and bool(r.get("cache_identical")),
        "registered voice listed after restart, same sha256":
            bool(r.get("voice_listed_after")) and bool(r.get("voice_sha256_same")),
        "registered voice's cache entry survives restart":
            r.get("voice_before") == 200 and r.get("voice_cache_after") == "hit"
            and bool(r.get("voice_cache_identical")),
        "registered voice resynthesized after restart, identical samples":
            r.get("voice_flac_cache_after") == "miss"
            and r.get("voice_resynth_vs_before") == "identical",
        # a leak grows RSS; the end sample is taken idle and the minute-5 one under load, so a
        # fall (activations and allocator arenas given back) is not a failure
        "RSS growth < 5 % (minute 5 -> end)": all(
            d is not None and d < 5 for d in (r["rss_drift_a_pct"], r["rss_drift_b_pct"])),
        "no leaked threads": not_above(g["end_a"].get("threads"), g["base_a"].get("threads"))
        and not_above(g["end_b"].get("threads"), g["base_b"].get("threads"),
                      g["base_a"].get("threads")),
        "no leaked fds": not_above(g["end_a"].get("fds"), g["base_a"].get("fds"))
        and not_above(g["end_b"].get("fds"), g["base_b"].get("fds"), g["base_a"].get("fds")),
    }


def report(s: dict, json_out: str | None) -> int:
    """Print the tables (and the failure, the first errors); 0 when every check passed."""
    checks = summarize(s)
    result = s["result"]
    from cosyvino.bench_extras import cpu_summary

    print(f"CPU: {cpu_summary()}, {os.cpu_count()} logical CPUs\n")
    print("| metric | value |\n|---|---|")
    for k, v in result.items():
        if k != "failure":
            print(f"| {k} | {v} |")
    print("\n| check | result |\n|---|---|")
    for k, v in checks.items():
        print(f"| {k} | {'pass' if v else 'FAIL'} |")
    if s["errors"]:
        print("\nfirst errors:", json.dumps(s["errors"], ensure_ascii=False))
    if s["bad_errors"]:
        print("\nfirst bad requests not answered with a 4xx:",
              json.dumps(s["bad_errors"], ensure_ascii=False))
    if "failure" in result:
        print("\nfailed midway:", result["failure"])
    if json_out:
        with open(json_out, "w") as fh:
            json.dump({**result, "checks": checks, "error_samples": s["errors"],
                       "bad_error_samples": s["bad_errors"]}, fh,
                      indent=2, ensure_ascii=False)
    sys.stdout.flush()
    return 0 if all(checks.values()) else 1


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", help="model (default: the embedded default model)")
    ap.add_argument("--tiny", action="store_true", help="a synthetic tiny model")
    ap.add_argument("--tokens", type=int, default=None,
                    help="force speech tokens per segment (default: 25 with --tiny)")
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of load in total")
    ap.add_argument("--max-requests", type=int, default=200_000)
    ap.add_argument("--bad", type=float, default=0.10)
    ap.add_argument("--disconnect", type=float, default=0.05)
    ap.add_argument("--plan", help="plan file the servers serve (`cosyvino plan --out F`): "
                    "backend, threads, sessions, LLM decode batch, queue")
    ap.add_argument("--max-sessions", type=int, default=None,
                    help="default: the plan's with --plan, else 1")
    ap.add_argument("--queue-size", type=int, default=None,
                    help="default: the plan's with --plan, else 8")
    ap.add_argument("--timeout", type=float, default=120.0, help="the server's --timeout")
    ap.add_argument("--ready-timeout", type=float, default=900.0,
                    help="seconds a server may take to load and report /ready")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    if not (1 <= args.clients <= 256 and 30 <= args.duration <= 7200):
        ap.error("--clients must be 1..256 and --duration 30..7200 s")
    if not (0 <= args.bad and 0 <= args.disconnect and args.bad + args.disconnect <= 1):
        ap.error("--bad and --disconnect are fractions that sum to at most 1")
    return args


def _interrupted(signum, frame):
    raise KeyboardInterrupt(f"soak got signal {signum}")


def main() -> int:
    args = parse_args()
    signal.signal(signal.SIGTERM, _interrupted)  # a killed soak still kills its servers
    s = {"result": {"clients": args.clients, "duration_s": args.duration}, "rows": [],
         "stats": {}, "procs": [], "abort": threading.Event(), "errors": [],
         "bad_errors": []}
    tmp = tempfile.TemporaryDirectory(prefix="cosyvino-soak-")
    try:
        if args.tiny and not args.model_dir:
            from cosyvino.families.cosyvoice1.synthetic import make_model

            args.model_dir = make_model("tiny", os.path.join(tmp.name, "tiny"))
            args.tokens = args.tokens or 25
        run_soak(args, s, tmp.name)
    except (Exception, KeyboardInterrupt) as e:
        s["result"]["failure"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        s["abort"].set()  # client threads stop at their next request
        for p in s["procs"]:
            p.kill()
        tmp.cleanup()
    return report(s, args.json_out)


if __name__ == "__main__":
    sys.exit(main())
