"""`cosyvino serve` as a user runs it: plan/flag resolution, and a real subprocess that drains
in-flight requests on SIGTERM."""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402

from cosyvino.cli.main import main  # noqa: E402
from cosyvino.server.config import settings_from_plan  # noqa: E402





@pytest.fixture
def captured(monkeypatch):
    """Runs `serve` without starting a server: returns what it would have run."""
    calls = []

    def fake_run(config, host, port, **kw):
        calls.append((config, host, port))

    monkeypatch.setattr("cosyvino.server.runner.run", fake_run)
    return calls


def test_settings_from_plan(plan_file, tiny_model_dir):
    got = settings_from_plan(plan_file)
    # a plan without llm_batch / estimator_batch (written before them) means batch 1
    assert got == {"model_dir": tiny_model_dir, "backend": "torch", "max_sessions": 2,
                   "queue_size": 3, "threads": 1, "llm_batch": 1, "estimator_batch": 1}


def test_serve_takes_the_plans_estimator_batch_unless_given(plan_file, captured, monkeypatch):
    with open(plan_file, encoding="utf-8") as f:
        text = f.read()
    with open(plan_file, "w", encoding="utf-8") as f:
        f.write(text.replace("max_sessions = 2\n", "max_sessions = 2\nestimator_batch = 2\n"))
    monkeypatch.delenv("COSYVINO_ESTIMATOR_BATCH", raising=False)
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--no-cache"])
    assert r.exit_code == 0, r.output
    assert captured[-1][0].estimator_batch == 2 and "estimator_batch=2" in r.output
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--estimator-batch", "1",
                                  "--no-cache"])
    assert r.exit_code == 0 and captured[-1][0].estimator_batch == 1
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--max-sessions", "1",
                                  "--no-cache"])
    # the 2 comes from the plan, not a flag: the warning says so
    assert r.exit_code == 0, r.output
    assert "estimator batch 2 (from the plan) has no effect with 1 session" in r.output
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--max-sessions", "1",
                                  "--estimator-batch", "3", "--no-cache"])
    assert r.exit_code == 0 and "--estimator-batch 3 has no effect with 1 session" in r.output
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--estimator-batch", "0",
                                  "--no-cache"])
    assert r.exit_code == 2


def test_serve_takes_the_plans_llm_batch_unless_given(plan_file, captured, monkeypatch):
    with open(plan_file, encoding="utf-8") as f:
        text = f.read()
    with open(plan_file, "w", encoding="utf-8") as f:
        f.write(text.replace("max_sessions = 2\n", "max_sessions = 2\nllm_batch = 2\n"))
    monkeypatch.delenv("COSYVINO_LLM_BATCH", raising=False)
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--no-cache"])
    assert r.exit_code == 0, r.output
    assert captured[-1][0].llm_batch == 2 and "llm_batch=2" in r.output
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--llm-batch", "1", "--no-cache"])
    assert r.exit_code == 0, r.output
    assert captured[-1][0].llm_batch == 1
    assert "the plan's 2 session(s), which the plan sized for its own batch" in r.output
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--llm-batch", "1",
                                  "--max-sessions", "1", "--no-cache"])
    assert r.exit_code == 0 and "sized for its own batch" not in r.output
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--no-cache"],
                           env={"COSYVINO_LLM_BATCH": "3"})
    assert r.exit_code == 0, r.output
    assert captured[-1][0].llm_batch == 3


def test_serve_first_chunk_hold_from_the_plan_unless_given(plan_file, captured, monkeypatch):
    monkeypatch.delenv("COSYVINO_FIRST_CHUNK_HOLD", raising=False)
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--no-cache"])
    assert r.exit_code == 0, r.output
    # the fixture plan says nothing: the Synthesizer's default (on)
    assert "first_chunk_hold" not in captured[-1][0].backend_options
    assert "first_chunk_hold=True" in r.output
    with open(plan_file, encoding="utf-8") as f:
        text = f.read()
    with open(plan_file, "w", encoding="utf-8") as f:
        f.write(text.replace("[backend_options]\n",
                             "[backend_options]\nfirst_chunk_hold = false\n"))
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--no-cache"])
    assert r.exit_code == 0, r.output
    assert captured[-1][0].backend_options["first_chunk_hold"] is False
    assert "first_chunk_hold=False" in r.output
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--first-chunk-hold",
                                  "--no-cache"])
    assert r.exit_code == 0 and captured[-1][0].backend_options["first_chunk_hold"] is True
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--no-cache"],
                           env={"COSYVINO_FIRST_CHUNK_HOLD": "1"})
    assert r.exit_code == 0 and captured[-1][0].backend_options["first_chunk_hold"] is True


def test_serve_uses_the_plan_and_flags_override_it(plan_file, captured, tiny_model_dir):
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--no-cache"])
    assert r.exit_code == 0, r.output
    config, host, port = captured[-1]
    assert (config.max_sessions, config.queue_size, config.threads) == (2, 3, 1)
    assert config.model_dir == tiny_model_dir and host == "127.0.0.1" and port == 8000
    assert config.source.startswith("plan ")
    r = CliRunner().invoke(main, ["serve", "--plan", plan_file, "--max-sessions", "1",
                                  "--queue-size", "0", "--no-cache"])
    assert r.exit_code == 0, r.output
    config = captured[-1][0]
    assert (config.max_sessions, config.queue_size, config.threads) == (1, 0, 1)


def test_serve_without_plan_uses_flags(captured, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    monkeypatch.setenv("COSYVINO_MODEL_DIR", str(tmp_path / "no-model-here"))
    r = CliRunner().invoke(main, ["serve", "--max-sessions", "3", "--queue-size", "5",
                                  "--threads", "1", "--api-key", "k", "--no-cache"])
    assert r.exit_code == 0, r.output
    config = captured[-1][0]
    assert (config.max_sessions, config.queue_size, config.threads, config.api_key) == (3, 5, 1,
                                                                                      "k")
    assert config.source == "flags" and config.cache_dir is None


def test_serve_picks_up_plan_toml_in_cwd(captured, plan_file, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # plan_file is tmp_path/plan.toml
    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    r = CliRunner().invoke(main, ["serve", "--no-cache"])
    assert r.exit_code == 0, r.output
    assert captured[-1][0].max_sessions == 2


def test_serve_bad_plan_is_a_clean_error(tmp_path, captured):
    r = CliRunner().invoke(main, ["serve", "--plan", str(tmp_path / "missing.toml")])
    assert r.exit_code == 2 and "error:" in r.output and not captured
    bad = tmp_path / "bad.toml"
    bad.write_text("backend = [unclosed", encoding="utf-8")
    r = CliRunner().invoke(main, ["serve", "--plan", str(bad)])
    assert r.exit_code == 2 and "error:" in r.output and not captured


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_subprocess_serve_drains_in_flight_request_on_sigterm(plan_file, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from cosyvino.cli import main; main()", "serve", "--plan",
         plan_file, "--port",
         str(port), "--no-cache", "--num-speech-tokens", "30", "--log-level", "warning"],
        cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read().decode(errors="replace")
            try:
                r = httpx.get(url + "/ready", timeout=5)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.2)
        info = r.json()
        assert info["sessions"] == 2 and info["queue_size"] == 3
        assert info["settings"].startswith("plan ")

        text = "第一句话说完了，第二句话也说完了。" * 30
        result = {}
        first_bytes = threading.Event()

        def client():
            body = io.BytesIO()
            with httpx.stream("POST", url + "/v1/audio/speech", timeout=120,
                              json={"input": text, "voice": "中文女", "response_format": "wav",
                                    "seed": 1}) as resp:
                result["status"] = resp.status_code
                for chunk in resp.iter_raw():
                    body.write(chunk)
                    first_bytes.set()
            result["body"] = body.getvalue()

        keep_alive = httpx.Client(timeout=30)  # a connection opened before the signal
        assert keep_alive.get(url + "/v1/models").status_code == 200
        t = threading.Thread(target=client)
        t.start()
        assert first_bytes.wait(60)
        proc.send_signal(signal.SIGTERM)
        # issue 19 item 9: on the already-open connection /ready says draining (once the
        # signal handler has run: poll), then a synthesis there gets the documented 503 (it was
        # a broken pipe). The 503 says Connection: close and the listening socket is closed by
        # then, so nothing may follow it on this client.
        deadline = time.monotonic() + 10
        while True:
            ready = keep_alive.get(url + "/ready")
            if ready.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.02)
        assert ready.status_code == 503 and ready.json()["draining"] is True
        r = keep_alive.post(url + "/v1/audio/speech", json={"input": "hi", "voice": "中文女"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "server_busy"
        assert int(r.headers["retry-after"]) >= 1 and r.headers["connection"] == "close"
        keep_alive.close()
        t.join(120)
        assert result.get("status") == 200
        import soundfile as sf

        samples, rate = sf.read(io.BytesIO(result["body"]), dtype="int16")
        from cosyvino.families.cosyvoice1.official_stream import stream_mel_frames
        from cosyvino.families.cosyvoice1.streaming import LATENCY
        from cosyvino.frontend import TextFrontend

        # every segment has exactly 30 speech tokens in the default (latency) hops: the whole
        # text arrived, not a prefix
        n_segments = len(TextFrontend().segments(text))
        assert n_segments >= 2
        assert samples.shape[0] == n_segments * stream_mel_frames(30, LATENCY) * 256
        # a clean drain exits 0 (uvicorn alone re-raises the signal: -15)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_settings_from_plan_without_the_planner(plan_file, tiny_model_dir, monkeypatch):
    """The fallback reader (planner not installed) maps the same keys."""
    monkeypatch.setitem(sys.modules, "cosyvino.planner", None)  # import now fails
    assert settings_from_plan(plan_file) == {"model_dir": tiny_model_dir, "backend": "torch",
                                             "max_sessions": 2, "queue_size": 3, "threads": 1}


@pytest.mark.parametrize("backend", ["torch", "onnxruntime"])
def test_subprocess_serve_exits_when_model_cannot_load(tmp_path, backend):
    """A model that cannot load never becomes ready: `serve` must exit non-zero with the
    reason on stderr instead of answering 503 not_ready forever."""
    pytest.importorskip(backend)
    missing = tmp_path / "nope"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.run(
        [sys.executable, "-m", "cosyvino.cli", "serve", "--backend", backend, "--model-dir",
         str(missing), "--port", "0", "--no-cache", "--no-warmup"],
        cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 2, proc.stderr
    assert (f"error: model failed to load: model directory not found: {missing}"
            in proc.stderr.splitlines())
    assert "Traceback" not in proc.stderr


def test_serve_help_does_not_claim_defaults_the_plan_overrides():
    """Issue 19 item 4: `serve --help` showed torch / 1 session / queue 8 as defaults (the plan
    overrides them) and called --threads 'per session'."""
    r = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200)
    assert r.exit_code == 0
    text = " ".join(r.output.split())
    for flag, fallback in (("--backend", "torch"), ("--max-sessions", "1"),
                           ("--queue-size", "8"), ("--threads", "the backend's default"),
                           ("--model-dir", "the embedded default model")):
        line = text[text.index(flag):]
        line = line[:line.index(" --", 3)]
        assert f"Default: from the plan, else {fallback}" in line, line
        assert "[default:" not in line, line
    assert "per session" not in text
    assert "--metrics-auth" in text and "--drain-timeout" in text


def test_serve_metrics_auth_flag(captured, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    r = CliRunner().invoke(main, ["serve", "--metrics-auth", "--no-cache"],
                           env={"COSYVINO_API_KEY": ""})
    assert r.exit_code == 2 and "needs an API key" in r.output and not captured
    r = CliRunner().invoke(main, ["serve", "--no-cache", "--api-key", "k", "--drain-timeout",
                                  "7"], env={"COSYVINO_METRICS_AUTH": "1"})
    assert r.exit_code == 0, r.output
    config = captured[-1][0]
    assert config.metrics_auth is True and config.drain_seconds == 7.0
    r = CliRunner().invoke(main, ["serve", "--no-cache"], env={"COSYVINO_API_KEY": ""})
    assert captured[-1][0].metrics_auth is False and captured[-1][0].drain_seconds == 120.0


def test_serve_public_voice_list_flag(captured, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    r = CliRunner().invoke(main, ["serve", "--no-cache", "--api-key", "k"],
                           env={"COSYVINO_PUBLIC_VOICE_LIST": ""})
    assert r.exit_code == 0, r.output
    assert captured[-1][0].public_voice_list is False  # off by default
    r = CliRunner().invoke(main, ["serve", "--no-cache", "--api-key", "k",
                                  "--public-voice-list"])
    assert r.exit_code == 0 and captured[-1][0].public_voice_list is True
    assert "public-voice-list" not in r.output  # no warning with a key
    r = CliRunner().invoke(main, ["serve", "--no-cache", "--api-key", "k"],
                           env={"COSYVINO_PUBLIC_VOICE_LIST": "1"})
    assert r.exit_code == 0 and captured[-1][0].public_voice_list is True
    r = CliRunner().invoke(main, ["serve", "--no-cache", "--public-voice-list"],
                           env={"COSYVINO_API_KEY": ""})
    assert r.exit_code == 0
    assert "--public-voice-list has no effect without --api-key" in r.output


def test_llm_batch_without_concurrency_is_reported(captured, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    r = CliRunner().invoke(main, ["serve", "--llm-batch", "2", "--no-cache"])
    assert r.exit_code == 0, r.output
    assert "--llm-batch 2 has no effect with 1 session" in r.output
    assert captured[-1][0].llm_batch == 2
    r = CliRunner().invoke(main, ["serve", "--llm-batch", "2", "--max-sessions", "2",
                                  "--no-cache"])
    assert r.exit_code == 0 and "no effect" not in r.output
