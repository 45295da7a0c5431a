"""Ray Serve deployment (cosyvino/ray_serve.py) on a local Ray cluster on 127.0.0.1: two replicas
of the tiny model serve concurrent requests, same seed -> same bytes on both, the handle API,
and a replica killed mid-stream (its stream is cut, the other replica keeps serving, Serve
starts a new one). One cluster for the module (num_cpus=2, replicas of 0.5 CPU, 1 thread).

Skipped without the ``ray`` extra (``pip install -e '.[ray]'``); failed without it in CI
(``CI=true``; ``.ci/run`` installs it)."""

from __future__ import annotations

import concurrent.futures
import socket
import time

import pytest

from ci_required import optional_module, skip_or_fail

INSTALL = "pip install -e '.[ray]'"
ray = optional_module("ray", INSTALL)  # None only in CI: every test fails (_ray_installed)
httpx = pytest.importorskip("httpx")

from cosyvino.errors import InputError  # noqa: E402
from cosyvino.planner import Plan  # noqa: E402

if ray is not None:
    from ray import serve

    from cosyvino.ray_serve import (APP_NAME, DEPLOYMENT_NAME, REPLICA_HEADER, SpeechError,
                                    app_builder, build_app, deployment_options,
                                    replica_config)


@pytest.fixture(autouse=True)
def _ray_installed():
    if ray is None:
        skip_or_fail(f"ray is not importable; {INSTALL}")

#: long enough that a stream is still running when its replica is killed (~40 segments)
LONG_TEXT = "Hello there, this is a longer text to speak. " * 20
BODY = {"input": "Hello from two replicas.", "seed": 7, "response_format": "wav"}
#: bound on every wait: a test fails, never hangs
TIMEOUT = 60.0


# ---- plan -> deployment (no cluster) ---------------------------------------------------------
def _plan(**kw) -> Plan:
    fields = dict(backend="openvino", backend_options={"num_threads": 4, "num_streams": 2,
                                                       "cpu_pinning": True},
                  streams=2, threads_per_stream=2, pinning=True, max_sessions=2, queue_size=4,
                  model_dir="/models/sft")
    fields.update(kw)
    return Plan(**fields)


def test_replica_config_from_plan():
    config = replica_config(_plan())
    assert (config.backend, config.threads, config.max_sessions, config.queue_size,
            config.model_dir) == ("openvino", 4, 2, 4, "/models/sft")
    # num_threads became `threads`; pinning is off (Ray places by CPU count, not core set)
    assert config.backend_options == {"num_streams": 2, "cpu_pinning": False}
    # an explicit setting wins; another backend drops the plan's backend options
    config = replica_config(_plan(), backend="torch", threads=1, queue_size=0)
    assert (config.backend, config.threads, config.queue_size, config.backend_options) == \
        ("torch", 1, 0, {})
    with pytest.raises(InputError, match="unknown replica setting"):
        replica_config(_plan(), replicas=2)
    with pytest.raises(InputError, match="max sessions"):
        replica_config(_plan(), max_sessions=0)


def test_replica_config_from_plan_file(tmp_path):
    path = _plan().save(str(tmp_path / "plan.toml"))
    config = replica_config(path)
    assert (config.threads, config.max_sessions, config.source) == (4, 2, f"plan {path}")


def test_deployment_options():
    config = replica_config(_plan())
    opts = deployment_options(config, num_replicas=3)
    assert opts["num_replicas"] == 3
    assert opts["ray_actor_options"] == {"num_cpus": 4.0}  # the plan's threads
    assert opts["max_ongoing_requests"] == 6  # 2 sessions + 4 waiting
    assert opts["graceful_shutdown_timeout_s"] == config.drain_seconds
    auto = deployment_options(config, num_replicas=1, max_replicas=4, num_cpus=2)
    assert "num_replicas" not in auto
    assert auto["autoscaling_config"] == {"min_replicas": 1, "max_replicas": 4,
                                          "target_ongoing_requests": 2}
    assert auto["ray_actor_options"] == {"num_cpus": 2.0}
    for bad in ({"num_replicas": 0}, {"num_replicas": True}, {"max_replicas": 0},
                {"num_cpus": 0}):
        with pytest.raises(InputError):
            deployment_options(config, **bad)


def test_app_builder_types(monkeypatch):
    import cosyvino.ray_serve as rs

    calls = []
    monkeypatch.setattr(rs, "build_app", lambda plan=None, **kw: calls.append((plan, kw)))
    app_builder({"plan": "plan.toml", "num_replicas": "2", "num_cpus": "0.5",
                 "queue_size": "0", "backend": "torch"})
    assert calls == [("plan.toml", {"num_replicas": 2, "num_cpus": 0.5, "queue_size": 0,
                                    "backend": "torch"})]
    with pytest.raises(InputError, match="num_replicas must be an integer"):
        app_builder({"num_replicas": "two", "model_dir": "/m"})


def test_cli_refuses_bad_input_before_starting_ray(tmp_path):
    from click.testing import CliRunner

    from cosyvino.cli.ray_serve import ray_serve

    runner = CliRunner()
    result = runner.invoke(ray_serve, ["--replicas", "0"])
    assert result.exit_code == 2 and "--replicas" in result.output
    result = runner.invoke(ray_serve, ["--plan", str(tmp_path / "missing.toml")])
    assert result.exit_code == 2
    assert "cannot read plan" in result.output
    assert not ray.is_initialized()
    result = runner.invoke(ray_serve, ["--help"])
    assert result.exit_code == 0 and "--max-replicas" in result.output


def test_cli_passes_the_public_voice_list_to_the_replicas(monkeypatch):
    from click.testing import CliRunner

    import cosyvino.ray_serve as rs
    from cosyvino.cli.ray_serve import ray_serve

    seen = []

    def fake_build_app(plan=None, **kw):  # stops the command before Ray starts
        seen.append(kw)
        raise InputError("stop here")

    monkeypatch.setattr(rs, "build_app", fake_build_app)
    runner = CliRunner()
    env = {"COSYVINO_PLAN": "", "COSYVINO_PUBLIC_VOICE_LIST": ""}
    result = runner.invoke(ray_serve, ["--model-dir", "/m", "--api-key", "k",
                                       "--public-voice-list"], env=env)
    assert result.exit_code == 2 and "stop here" in result.output
    assert seen[-1]["public_voice_list"] is True and seen[-1]["api_key"] == "k"
    runner.invoke(ray_serve, ["--model-dir", "/m", "--api-key", "k"], env=env)
    assert "public_voice_list" not in seen[-1]  # not given: the ServerConfig default (off)
    assert replica_config(None, public_voice_list=True).public_voice_list is True
    assert not ray.is_initialized()


# ---- a local cluster -------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster(tiny_model_dir):
    """(base URL, replica ids at start) of the app: 2 replicas of the tiny model, torch,
    1 thread, 1 session and no queue each (so concurrent requests must use both), no cache."""
    started = time.perf_counter()
    # the workers inherit this process's environment (COSYVINO_PLUGINS of conftest)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        port = _free_port()
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        print(f"\nray + serve started in {time.perf_counter() - started:.1f} s")
        app = build_app(model_dir=tiny_model_dir, backend="torch", threads=1, num_replicas=2,
                        num_cpus=0.5, max_sessions=1, queue_size=0, cache_memory_mb=0.0,
                        cache_dir=None, warmup=False,
                        ray_options={"health_check_period_s": 1.0})
        serve.run(app, name=APP_NAME, route_prefix="/")
        print(f"\ncluster + 2 replicas ready in {time.perf_counter() - started:.1f} s")
        yield f"http://127.0.0.1:{port}", _replica_ids()
    finally:
        serve.shutdown()
        ray.shutdown()


def _replica_actors() -> dict[str, str]:
    """Replica id -> actor name of the live replicas of the app (named actors in Serve's
    namespace: ``SERVE_REPLICA::APP#DEPLOYMENT#ID``)."""
    prefix = f"SERVE_REPLICA::{APP_NAME}#{DEPLOYMENT_NAME}#"
    return {a["name"][len(prefix):]: a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(prefix)}


def _replica_ids() -> set[str]:
    return set(_replica_actors())


def _post(url: str, body: dict) -> httpx.Response:
    return httpx.post(f"{url}/v1/audio/speech", json=body, timeout=TIMEOUT)


def test_two_replicas_concurrent_same_seed_same_bytes(cluster):
    url, replicas = cluster
    assert len(replicas) == 2
    answers: dict[str, bytes] = {}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for _ in range(3):  # concurrent rounds until both replicas answered (one suffices)
            for r in pool.map(lambda _: _post(url, BODY), range(4)):
                assert r.status_code == 200, r.text
                assert r.headers["content-type"] == "audio/wav"
                answers.setdefault(r.headers[REPLICA_HEADER], r.content)
                # the same seed gives the same audio on every replica and every request
                assert r.content == next(iter(answers.values()))
            if len(answers) == 2:
                break
    assert set(answers) == replicas  # both replicas answered, named by their Serve ids
    assert len(next(iter(answers.values()))) > 44  # a WAV header and samples


def test_handle_api_same_bytes_as_http(cluster):
    url, _ = cluster
    handle = serve.get_app_handle(APP_NAME)
    data = handle.synthesize.remote(BODY["input"], seed=BODY["seed"],
                                    response_format="wav").result(timeout_s=TIMEOUT)
    assert data == _post(url, BODY).content
    with pytest.raises(SpeechError) as err:
        handle.synthesize.remote("Hi.", voice="no-such-voice-xyz").result(timeout_s=TIMEOUT)
    assert (err.value.status, err.value.code, err.value.param) == (400, "unknown_voice",
                                                                   "voice")
    with pytest.raises(SpeechError) as err:
        handle.synthesize.remote("Hi.", speed=9).result(timeout_s=TIMEOUT)
    assert (err.value.status, err.value.param) == (400, "speed")


def test_replica_killed_mid_stream(cluster):
    url, _ = cluster
    before = _replica_actors()
    assert len(before) == 2
    body = {"input": LONG_TEXT, "seed": 3, "response_format": "wav"}
    with httpx.Client(timeout=TIMEOUT) as client, \
            concurrent.futures.ThreadPoolExecutor(1) as pool:
        with client.stream("POST", f"{url}/v1/audio/speech", json=body) as stream:
            assert stream.status_code == 200
            victim = stream.headers[REPLICA_HEADER]
            chunks = stream.iter_bytes()
            received = len(next(chunks))  # it is synthesizing now
            # the victim is busy (1 session, no queue): this one goes to the other replica
            other = pool.submit(_post, url, {**BODY, "seed": 11})
            time.sleep(0.2)
            ray.kill(ray.get_actor(before[victim], namespace="serve"), no_restart=True)
            killed = time.perf_counter()
            with pytest.raises((httpx.RemoteProtocolError, httpx.ReadError)):
                for chunk in chunks:  # the stream is cut (no terminating chunk), no hang
                    received += len(chunk)
            assert time.perf_counter() - killed < TIMEOUT
        survivor = other.result(timeout=TIMEOUT)
        assert survivor.status_code == 200, survivor.text
        assert survivor.headers[REPLICA_HEADER] != victim
    # the other replica keeps serving while Serve replaces the killed one
    r = _post(url, BODY)
    assert r.status_code == 200 and r.headers[REPLICA_HEADER] != victim
    deadline = time.monotonic() + TIMEOUT
    while time.monotonic() < deadline:
        now = _replica_ids()
        dep = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME]
        if len(now) == 2 and victim not in now and dep.replica_states.get("RUNNING") == 2:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"Serve did not replace replica {victim}: {_replica_ids()}")
    # the new replica answers too: concurrent requests reach both again (once the proxy
    # has heard of it)
    seen: set[str] = set()
    deadline = time.monotonic() + TIMEOUT
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        while seen != now and time.monotonic() < deadline:
            for r in pool.map(lambda _: _post(url, BODY), range(4)):
                assert r.status_code == 200, r.text
                seen.add(r.headers[REPLICA_HEADER])
    assert seen == now

