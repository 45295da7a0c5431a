"""Issue 18 item 6, operations: every `serve` setting from a COSYVINO_* variable (counted as
explicit against the plan), request ids, the access log and the two log formats, process
and capacity metrics, the SIGTERM shutdown delay (a real subprocess), `cosyvino download`
(offline, client missing, fake hub) and the one version source."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from click.testing import CliRunner  # noqa: E402

import cosyvino  # noqa: E402
from cosyvino.cli.main import main  # noqa: E402
from cosyvino.cli.serve import serve  # noqa: E402
from cosyvino.server import ServerConfig, create_app  # noqa: E402
from cosyvino.server.logs import configure_logging, usable_request_id  # noqa: E402


#: option -> its variable where the name is not simply COSYVINO_ + the option's name
ENV_EXCEPTIONS = {"--cors-origin": "COSYVINO_CORS_ORIGINS",
                  "--voice-alias": "COSYVINO_VOICE_ALIASES"}


@pytest.fixture
def captured(monkeypatch):
    """Runs `serve` without starting a server: returns the configs it would have run."""
    calls = []
    monkeypatch.setattr("cosyvino.server.runner.run",
                        lambda config, host, port, **kw: calls.append((config, host, port)))
    return calls


@pytest.fixture
def root_logging():
    """Restore the root logger after a test that configures logging."""
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    yield
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])




# ---- settings from the environment -----------------------------------------------------------
def test_every_serve_option_has_its_environment_variable():
    for param in serve.params:
        if not param.opts or not param.opts[0].startswith("--"):
            continue  # --help
        flag = param.opts[0]
        expected = ENV_EXCEPTIONS.get(flag, "COSYVINO_" + flag[2:].upper().replace("-", "_"))
        assert param.envvar == expected, flag


def test_environment_counts_as_explicit_against_the_plan(plan_file, captured, monkeypatch,
                                                         tmp_path):
    monkeypatch.chdir(tmp_path)
    env = {"COSYVINO_PLAN": plan_file, "COSYVINO_MAX_SESSIONS": "1",
           "COSYVINO_NO_CACHE": "1", "COSYVINO_PORT": "8123", "COSYVINO_HOST": "127.0.0.2",
           "COSYVINO_SHUTDOWN_DELAY": "5", "COSYVINO_DRAIN_TIMEOUT": "20",
           "COSYVINO_LOG_FORMAT": "text",
           "COSYVINO_CORS_ORIGINS": "https://a.example, https://b.example",
           "COSYVINO_VOICE_ALIASES": "alloy=中文男,echo=英文女"}
    r = CliRunner().invoke(main, ["serve"], env=env)
    assert r.exit_code == 0, r.output
    config, host, port = captured[-1]
    # the variable beat the plan's max_sessions = 2; the plan still gives queue and threads
    assert (config.max_sessions, config.queue_size, config.threads) == (1, 3, 1)
    assert config.source == f"plan {os.path.abspath(plan_file)}, overridden by --max-sessions"
    assert (host, port, config.cache_dir, config.cache_memory_mb) == ("127.0.0.2", 8123, None,
                                                                      0.0)
    assert (config.shutdown_delay, config.drain_seconds) == (5.0, 20.0)
    assert config.cors_origins == ("https://a.example", "https://b.example")
    assert config.voice_aliases == {"alloy": "中文男", "echo": "英文女"}
    # a flag beats its variable
    r = CliRunner().invoke(main, ["serve", "--max-sessions", "3", "--cors-origin",
                                  "https://c.example"], env=env)
    assert r.exit_code == 0, r.output
    assert captured[-1][0].max_sessions == 3
    assert captured[-1][0].cors_origins == ("https://c.example",)
    # without a variable or flag the plan decides
    env.pop("COSYVINO_MAX_SESSIONS")
    r = CliRunner().invoke(main, ["serve"], env=env)
    assert r.exit_code == 0 and captured[-1][0].max_sessions == 2


@pytest.mark.parametrize("env, message", [
    ({"COSYVINO_VOICE_ALIASES": "alloy"}, "bad voice alias 'alloy'"),
    ({"COSYVINO_CORS_ORIGINS": "chat.example.com"}, "CORS origin 'chat.example.com'"),
    ({"COSYVINO_SHUTDOWN_DELAY": "-1"}, "'--shutdown-delay': -1.0 is not in the range"),
    ({"COSYVINO_LOG_FORMAT": "xml"}, "'xml' is not one of"),
])
def test_bad_settings_from_the_environment(env, message, captured, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    r = CliRunner().invoke(main, ["serve", "--no-cache"], env=env)
    assert r.exit_code == 2 and message in r.output and not captured
    assert "Traceback" not in r.output


# ---- request ids, access log, log formats ----------------------------------------------------
def _app_with_a_logging_route(tmp_path):
    app = create_app(ServerConfig(model_dir=str(tmp_path / "none"), cache_memory_mb=0))

    @app.get("/test-log")
    def inside():  # a sync route: runs in the thread pool, the id must follow it there
        logging.getLogger("cosyvino.server").warning("inside the request")
        return {"ok": True}

    return app


def test_request_id_header(tmp_path):
    from fastapi.testclient import TestClient

    client = TestClient(_app_with_a_logging_route(tmp_path))  # no lifespan: no model
    r = client.get("/health", headers={"X-Request-ID": "abc-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "abc-123"
    generated = client.get("/health").headers["x-request-id"]
    assert re.fullmatch(r"[0-9a-f]{32}", generated)
    assert client.get("/health").headers["x-request-id"] != generated
    for unusable in ("has space", "x" * 129, "tab\there"):
        got = client.get("/health", headers={"X-Request-ID": unusable}).headers["x-request-id"]
        assert re.fullmatch(r"[0-9a-f]{32}", got)
    # errors carry it too
    r = client.get("/v1/models", headers={"X-Request-ID": "req-503"})
    assert r.status_code == 503 and r.headers["x-request-id"] == "req-503"
    assert usable_request_id("a" * 128) and usable_request_id("") is None


def test_json_logs_and_access_lines(tmp_path, root_logging):
    from fastapi.testclient import TestClient

    out = io.StringIO()
    configure_logging("json", "debug", stream=out)
    client = TestClient(_app_with_a_logging_route(tmp_path))
    client.get("/test-log", headers={"X-Request-ID": "rid-1"})
    client.get("/v1/models?x=secret", headers={"X-Request-ID": "rid-2"})
    client.get("/health", headers={"X-Request-ID": "rid-3"})
    lines = [json.loads(line) for line in out.getvalue().splitlines()]  # every line: JSON
    mine = [x for x in lines if x["logger"].startswith("cosyvino")]
    inside = next(x for x in mine if x["message"] == "inside the request")
    assert inside["request_id"] == "rid-1" and inside["level"] == "WARNING"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", inside["ts"])
    access = {x["request_id"]: x for x in mine if x["logger"] == "cosyvino.access"}
    assert set(access) == {"rid-1", "rid-2", "rid-3"}
    a = access["rid-2"]
    assert (a["method"], a["path"], a["status"], a["level"]) == ("GET", "/v1/models", 503,
                                                                  "INFO")
    assert "secret" not in json.dumps(a)  # no query string
    assert isinstance(a["duration_ms"], float) and a["duration_ms"] >= 0
    assert access["rid-3"]["level"] == "DEBUG"  # probes: debug


def test_text_logs_carry_the_request_id(tmp_path, root_logging):
    from fastapi.testclient import TestClient

    out = io.StringIO()
    configure_logging("text", "info", stream=out)
    client = TestClient(_app_with_a_logging_route(tmp_path))
    client.get("/test-log", headers={"X-Request-ID": "rid-t"})
    client.get("/health")  # debug: not shown at info
    text = out.getvalue()
    assert re.search(r" WARNING cosyvino\.server: inside the request request_id=rid-t$", text,
                     re.M)
    assert re.search(r" INFO cosyvino\.access: GET /test-log 200 [0-9.]+ ms request_id=rid-t$",
                     text, re.M)
    assert "cosyvino.access: GET /health" not in text


# ---- metrics, version ------------------------------------------------------------------------
def test_process_and_capacity_metrics(tmp_path):
    from fastapi.testclient import TestClient

    from cosyvino.server.metrics import Metrics
    from prometheus_client import generate_latest

    app = create_app(ServerConfig(model_dir=str(tmp_path / "none"), cache_memory_mb=0,
                                  max_sessions=2))
    text = TestClient(app).get("/metrics").text
    assert re.search(r"^cosyvino_sessions 2\.0$", text, re.M)
    assert re.search(r"^cosyvino_capacity_utilization 0\.0$", text, re.M)
    assert re.search(r'^cosyvino_build_info\{backend="torch",version="'
                     + re.escape(cosyvino.__version__) + r'"\} 1\.0$', text, re.M)
    assert re.search(r"^python_info\{", text, re.M)
    if sys.platform.startswith("linux"):
        assert re.search(r"^process_resident_memory_bytes [0-9.e+]+$", text, re.M)
        assert re.search(r"^process_cpu_seconds_total ", text, re.M)
    m = Metrics()
    admitted = [3]
    m.track_capacity(lambda: admitted[0], 2)
    assert b"cosyvino_capacity_utilization 1.5" in generate_latest(m.registry)
    admitted[0] = 1
    assert b"cosyvino_capacity_utilization 0.5" in generate_latest(m.registry)
    # before the model is loaded (no scheduler): the first-chunk hold gauges read 0
    assert re.search(r"^cosyvino_first_chunk_holds 0\.0$", text, re.M)
    stats = [None]
    m.track_first_chunk_hold(lambda: stats[0])
    assert m.registry.get_sample_value("cosyvino_first_chunk_holds") == 0
    stats[0] = {"holds": 7, "held_seconds": 2.5, "held_now": 1}
    assert m.registry.get_sample_value("cosyvino_first_chunk_holds") == 7
    assert m.registry.get_sample_value("cosyvino_first_chunk_held_seconds") == 2.5


def test_one_version_source(tmp_path):
    from fastapi.testclient import TestClient

    r = CliRunner().invoke(main, ["--version"])
    assert r.exit_code == 0 and r.output.strip() == f"cosyvino, version {cosyvino.__version__}"
    app = create_app(ServerConfig(model_dir=str(tmp_path / "none"), cache_memory_mb=0))
    client = TestClient(app)
    assert client.get("/ready").json()["version"] == cosyvino.__version__
    assert client.get("/openapi.json").json()["info"]["version"] == cosyvino.__version__


# ---- shutdown delay (a real process) ---------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_subprocess_shutdown_delay_keeps_serving_then_drains(tiny_model_dir, tmp_path):
    """SIGTERM with --shutdown-delay: /ready is 503 at once, new connections and syntheses
    are still served during the delay, then the drain closes the listener and the process
    exits 0. Settings from the environment, JSON logs on stderr."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = dict(os.environ, PYTHONUNBUFFERED="1", COSYVINO_MODEL_DIR=tiny_model_dir,
               COSYVINO_PORT=str(port), COSYVINO_SHUTDOWN_DELAY="4", COSYVINO_NO_CACHE="1",
               COSYVINO_NO_WARMUP="1", COSYVINO_NUM_SPEECH_TOKENS="8",
               COSYVINO_LOG_FORMAT="json", COSYVINO_THREADS="1")
    env.pop("COSYVINO_PLAN", None)
    proc = subprocess.Popen([sys.executable, "-m", "cosyvino.cli", "serve"], cwd=str(tmp_path),
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stderr.read().decode(errors="replace")
            try:
                if httpx.get(url + "/ready", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server never became ready"
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while True:  # a new connection each time: the listener is still open
            ready = httpx.get(url + "/ready", timeout=5)
            if ready.status_code == 503 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert ready.status_code == 503 and ready.json()["draining"] is True
        # still served: a new connection, a new synthesis (admitted before the drain starts,
        # so it finishes even when the delay runs out meanwhile)
        r = httpx.post(url + "/v1/audio/speech", timeout=60, headers={"X-Request-ID": "late"},
                       json={"input": "Hello.", "voice": "英文女", "response_format": "wav"})
        assert r.status_code == 200 and r.content[:4] == b"RIFF"
        assert proc.wait(60) == 0  # then the drain, and a clean exit
        with pytest.raises(httpx.ConnectError):
            httpx.get(url + "/health", timeout=5)
        lines = [json.loads(line) for line in proc.stderr.read().decode().splitlines()]
        access = [x for x in lines if x["logger"] == "cosyvino.access"
                  and x.get("request_id") == "late"]
        assert len(access) == 1 and access[0]["status"] == 200
        assert access[0]["path"] == "/v1/audio/speech"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# ---- cosyvino download -----------------------------------------------------------------------
def test_download_known_ids():
    from cosyvino.cli.download import KNOWN_MODELS, DownloadError, resolve_model

    assert resolve_model("cosyvoice-300m-sft", "huggingface") == (
        "FunAudioLLM/CosyVoice-300M-SFT", "CosyVoice-300M-SFT")
    assert resolve_model("CosyVoice-300M-Instruct", "modelscope") == (
        "iic/CosyVoice-300M-Instruct", "CosyVoice-300M-Instruct")
    assert resolve_model("me/my-model", "huggingface") == ("me/my-model", "my-model")
    assert set(KNOWN_MODELS) == {"CosyVoice-300M", "CosyVoice-300M-SFT",
                                 "CosyVoice-300M-Instruct", "CosyVoice2-0.5B",
                                 "Fun-CosyVoice3-0.5B-2512"}
    # the official README's snapshot_download ids (github.com/FunAudioLLM/CosyVoice)
    assert resolve_model("cosyvoice2-0.5b", "huggingface") == (
        "FunAudioLLM/CosyVoice2-0.5B", "CosyVoice2-0.5B")
    assert resolve_model("CosyVoice2-0.5B", "modelscope") == (
        "iic/CosyVoice2-0.5B", "CosyVoice2-0.5B")
    for source in ("huggingface", "modelscope"):
        assert resolve_model("Fun-CosyVoice3-0.5B-2512", source) == (
            "FunAudioLLM/Fun-CosyVoice3-0.5B-2512", "Fun-CosyVoice3-0.5B-2512")
    for bad in ("nope", "a/b/c", "/x"):
        with pytest.raises(DownloadError, match="unknown model"):
            resolve_model(bad, "huggingface")


def test_download_offline_is_a_clean_error(tmp_path):
    pytest.importorskip("huggingface_hub")
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    proc = subprocess.run([sys.executable, "-m", "cosyvino.cli", "download",
                           "CosyVoice-300M-SFT", "--dir", str(tmp_path / "m")],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "error: cannot download FunAudioLLM/CosyVoice-300M-SFT from huggingface " \
           "(offline or the hub unreachable?" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""


def test_download_without_the_client_library(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import now fails
    monkeypatch.setitem(sys.modules, "modelscope", None)
    r = CliRunner().invoke(main, ["download", "CosyVoice-300M", "--dir", str(tmp_path)])
    assert r.exit_code == 2 and "pip install 'cosyvino[download]'" in r.output
    r = CliRunner().invoke(main, ["download", "CosyVoice-300M", "--source", "modelscope"])
    assert r.exit_code == 2 and "pip install modelscope" in r.output


def test_download_with_a_fake_hub(monkeypatch, tmp_path):
    calls = []

    def fake_snapshot_download(repo_id, revision=None, local_dir=None):
        calls.append((repo_id, revision))
        os.makedirs(local_dir, exist_ok=True)
        if repo_id.endswith("SFT"):
            open(os.path.join(local_dir, "cosyvoice.yaml"), "w").close()
        return local_dir

    monkeypatch.setattr("cosyvino.cli.download._snapshot_download",
                        lambda source: fake_snapshot_download)
    dest = tmp_path / "sft"
    r = CliRunner().invoke(main, ["download", "CosyVoice-300M-SFT", "--dir", str(dest),
                                  "--source", "modelscope", "--revision", "v1"])
    assert r.exit_code == 0, r.output
    assert calls == [("iic/CosyVoice-300M-SFT", "v1")]
    assert str(dest) in r.output
    r = CliRunner().invoke(main, ["download", "CosyVoice-300M", "--dir", str(tmp_path / "b")])
    assert r.exit_code == 2 and "no cosyvoice.yaml" in r.output


@pytest.mark.parametrize("model,yaml_name,family,repo", [
    ("CosyVoice2-0.5B", "cosyvoice2.yaml", "cosyvoice2", "iic/CosyVoice2-0.5B"),
    ("Fun-CosyVoice3-0.5B-2512", "cosyvoice3.yaml", "cosyvoice3",
     "FunAudioLLM/Fun-CosyVoice3-0.5B-2512"),
])
def test_download_v2_v3_with_a_fake_hub(monkeypatch, tmp_path, model, yaml_name, family, repo):
    """A v2/v3 download needs no cosyvoice.yaml: the families say what arrived."""
    calls = []

    def fake_snapshot_download(repo_id, revision=None, local_dir=None):
        calls.append(repo_id)
        os.makedirs(local_dir, exist_ok=True)
        open(os.path.join(local_dir, yaml_name), "w").close()
        return local_dir

    monkeypatch.setattr("cosyvino.cli.download._snapshot_download",
                        lambda source: fake_snapshot_download)
    dest = tmp_path / "m"
    r = CliRunner().invoke(main, ["download", model, "--dir", str(dest), "--source",
                                  "modelscope"])
    assert r.exit_code == 0, r.output
    assert calls == [repo]
    assert f"(family {family})" in r.output and r.output.strip().endswith(str(dest))


def test_download_of_an_unrecognized_dir_names_the_yamls(monkeypatch, tmp_path):
    monkeypatch.setattr("cosyvino.cli.download._snapshot_download",
                        lambda source: lambda repo_id, revision=None, local_dir=None:
                        os.makedirs(local_dir, exist_ok=True))
    r = CliRunner().invoke(main, ["download", "me/other", "--dir", str(tmp_path / "o")])
    assert r.exit_code == 2
    assert ("not a model dir any registered family recognizes (no cosyvoice.yaml, "
            "cosyvoice2.yaml or cosyvoice3.yaml)") in r.output
