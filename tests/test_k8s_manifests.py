"""`cosyvino plan --emit k8s`: the manifests sized by a plan (cosyvino/planner/k8s.py), validated
offline with kubernetes-validate (core kinds) and checked field by field (KEDA's CRD)."""

from __future__ import annotations

import math

import pytest
import yaml
from click.testing import CliRunner

import planner_trees as trees
from cosyvino.cli.main import main
from cosyvino.errors import InputError
from cosyvino.planner import Plan, make_plan
from cosyvino.planner.k8s import (CAPACITY_METRIC, GRACE_MARGIN_S, K8sOptions, emit_k8s,
                                  k8s_resources, manifests)
from cosyvino.planner.planfile import _toml_loads
from cosyvino.planner.topology import probe_topology


def _plan(tmp_path, builder=trees.xeon_2s, **kw) -> Plan:
    p = probe_topology(str(builder(tmp_path / "root")))
    p.backends, p.model = dict(trees.BOTH), trees.model_with_irs()
    return make_plan(p, model_dir="/host/models/cosyvoice", goal="throughput", **kw)


def _by_kind(docs) -> dict:
    kinds = {}
    for d in docs:
        assert d["kind"] not in kinds, f"two {d['kind']} objects"
        kinds[d["kind"]] = d
    return kinds


def _container(deploy: dict) -> dict:
    (c,) = deploy["spec"]["template"]["spec"]["containers"]
    return c


def _env(container: dict) -> dict:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_deployment_is_sized_by_the_plan(tmp_path):
    plan = _plan(tmp_path, shared_host=True)
    assert plan.total_threads > 1 and plan.max_sessions > 1   # a plan with something to size
    kinds = _by_kind(manifests(plan, K8sOptions(namespace="tts", image="reg.example/cv:1")))
    assert set(kinds) == {"ConfigMap", "Service", "Deployment", "PodDisruptionBudget",
                          "ScaledObject"}
    deploy = kinds["Deployment"]
    c = _container(deploy)
    cpus = str(plan.total_threads)
    assert c["resources"]["requests"]["cpu"] == c["resources"]["limits"]["cpu"] == cpus
    need_mi = plan.memory["required_bytes"] * 1.25 / 2**20
    assert c["resources"]["limits"]["memory"] == f"{math.ceil(need_mi)}Mi"
    assert c["resources"]["requests"] == c["resources"]["limits"]   # Guaranteed QoS
    env = _env(c)
    assert env["OMP_NUM_THREADS"] == cpus
    assert env["COSYVINO_MODEL_DIR"] == "/models/cosyvino"
    assert env["COSYVINO_DRAIN_TIMEOUT"] == "60"
    assert env["COSYVINO_API_KEY"]["secretKeyRef"]["optional"] is True
    assert c["image"] == "reg.example/cv:1"
    # the plan file the pod reads is the ConfigMap's key, mounted where COSYVINO_PLAN points
    mount = next(m for m in c["volumeMounts"] if m["name"] == "plan")
    vol = next(v for v in deploy["spec"]["template"]["spec"]["volumes"] if v["name"] == "plan")
    assert vol["configMap"]["name"] == kinds["ConfigMap"]["metadata"]["name"]
    assert env["COSYVINO_PLAN"] == mount["mountPath"] + "/plan.toml"
    assert "plan.toml" in kinds["ConfigMap"]["data"]
    for d in kinds.values():
        assert d["metadata"]["namespace"] == "tts"


def test_probes_and_shutdown_timeline(tmp_path):
    o = K8sOptions(shutdown_delay=7.5, drain_timeout=42)
    deploy = _by_kind(manifests(_plan(tmp_path), o))["Deployment"]
    c = _container(deploy)
    assert c["startupProbe"]["httpGet"]["path"] == "/ready"
    assert c["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health"
    assert {p["httpGet"]["port"] for p in (c["startupProbe"], c["livenessProbe"])} == {"http"}
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    # startup may take longer than the liveness budget: the model loads and warms up
    startup = c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"]
    assert startup >= 120
    assert c["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "8"]
    grace = deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace == 8 + 42 + GRACE_MARGIN_S == o.grace_seconds
    assert grace >= 7.5 + 42
    assert _env(c)["COSYVINO_SHUTDOWN_DELAY"] == "0"   # the preStop sleep did the waiting
    rollout = deploy["spec"]["strategy"]["rollingUpdate"]
    assert rollout == {"maxSurge": 1, "maxUnavailable": 0}


def test_pod_runs_as_non_root(tmp_path):
    spec = _by_kind(manifests(_plan(tmp_path)))["Deployment"]["spec"]["template"]["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    sc = _container({"spec": {"template": {"spec": spec}}})["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    # every path the server writes is a volume (the root filesystem is read-only)
    mounts = {m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    env = _env(spec["containers"][0])
    assert {env["COSYVINO_VOICES_DIR"], env["XDG_CACHE_HOME"], "/tmp"} <= mounts


def test_configmap_plan_round_trips_with_the_image_model_dir(tmp_path):
    plan = _plan(tmp_path)
    cm = _by_kind(manifests(plan, K8sOptions(model_dir="/srv/model")))["ConfigMap"]
    back = Plan.from_dict(_toml_loads(cm["data"]["plan.toml"]))
    assert back.model_dir == "/srv/model"
    assert back.backend == plan.backend and back.backend_options == plan.backend_options
    assert (back.streams, back.threads_per_stream, back.max_sessions, back.queue_size) == (
        plan.streams, plan.threads_per_stream, plan.max_sessions, plan.queue_size)


def test_keda_scaled_object_on_the_capacity_metric(tmp_path):
    o = K8sOptions(name="tts", namespace="speech", replicas=3, max_replicas=12,
                   target_utilization=0.75, prometheus="http://prom:9090")
    kinds = _by_kind(manifests(_plan(tmp_path), o))
    so = kinds["ScaledObject"]
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    spec = so["spec"]
    # KEDA's required fields (CRD ScaledObject v1alpha1): scaleTargetRef.name, triggers[].type
    # and .metadata; the prometheus scaler needs serverAddress, query, threshold as strings
    assert spec["scaleTargetRef"]["name"] == kinds["Deployment"]["metadata"]["name"] == "tts"
    assert (spec["minReplicaCount"], spec["maxReplicaCount"]) == (3, 12)
    (trig,) = spec["triggers"]
    assert trig["type"] == "prometheus" and trig["metricType"] == "AverageValue"
    meta = trig["metadata"]
    assert all(isinstance(meta[k], str) for k in ("serverAddress", "query", "threshold"))
    assert meta["serverAddress"] == "http://prom:9090" and meta["threshold"] == "0.75"
    assert meta["query"] == f'sum({CAPACITY_METRIC}{{namespace="speech",pod=~"tts-.*"}})'
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] > 0
    # the autoscaler owns the replica count
    assert "replicas" not in kinds["Deployment"]["spec"]


def test_hpa_and_fixed_replicas(tmp_path):
    plan = _plan(tmp_path)
    hpa = _by_kind(manifests(plan, K8sOptions(autoscaler="hpa", replicas=2, max_replicas=5,
                                              target_utilization=0.8)))["HorizontalPodAutoscaler"]
    assert hpa["apiVersion"] == "autoscaling/v2"
    (m,) = hpa["spec"]["metrics"]
    assert m["type"] == "Pods" and m["pods"]["metric"]["name"] == CAPACITY_METRIC
    assert m["pods"]["target"] == {"type": "AverageValue", "averageValue": "800m"}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 5)
    kinds = _by_kind(manifests(plan, K8sOptions(autoscaler="none", replicas=4)))
    assert kinds["Deployment"]["spec"]["replicas"] == 4
    assert not {"ScaledObject", "HorizontalPodAutoscaler"} & set(kinds)


@pytest.mark.parametrize("autoscaler", ["keda", "hpa", "none"])
def test_core_kinds_validate_offline(tmp_path, autoscaler):
    kv = pytest.importorskip("kubernetes_validate")
    plan, o = _plan(tmp_path), K8sOptions(namespace="tts", autoscaler=autoscaler)
    docs = list(yaml.safe_load_all(emit_k8s(plan, o)))
    assert docs == manifests(plan, o)   # the YAML says exactly what manifests() built
    version = kv.latest_version()
    checked = 0
    for d in docs:
        if d["apiVersion"].startswith("keda.sh/"):
            continue   # a CRD: no schema offline (checked field by field above)
        kv.validate(d, version, strict=True)   # raises ValidationError
        checked += 1
    assert checked == (4 if autoscaler in ("keda", "none") else 5)


def test_validation_catches_a_broken_manifest(tmp_path):
    kv = pytest.importorskip("kubernetes_validate")
    deploy = _by_kind(manifests(_plan(tmp_path)))["Deployment"]
    _container(deploy)["livenessProbe"]["periodSeconds"] = "ten"
    with pytest.raises(kv.ValidationError):
        kv.validate(deploy, kv.latest_version(), strict=True)


@pytest.mark.parametrize("kw, words", [
    ({"replicas": 5, "max_replicas": 2}, "replicas"),
    ({"name": "Bad_Name"}, "DNS label"),
    ({"autoscaler": "vpa"}, "autoscaler"),
    ({"target_utilization": 0}, "utilization"),
    ({"model_dir": "models"}, "absolute"),
    ({"drain_timeout": -1}, "drain"),
])
def test_bad_options_are_input_errors(tmp_path, kw, words):
    with pytest.raises(InputError, match=words):
        manifests(_plan(tmp_path), K8sOptions(**kw))


def test_resources_without_a_memory_estimate():
    plan = Plan(backend="x", backend_options={}, streams=2, threads_per_stream=3,
                pinning=False, max_sessions=2, queue_size=4)
    k = k8s_resources(plan)
    assert k["resources"] == {"requests": {"cpu": "6"}, "limits": {"cpu": "6"}}


def _cli_docs(tmp_path, *args) -> dict:
    r = CliRunner().invoke(main, ["plan", "--model-dir", str(tmp_path / "nomodel"),
                                  "--no-write", "--emit", "k8s", "--threads", "1", *args])
    assert r.exit_code == 0, r.output
    return _by_kind(yaml.safe_load_all(r.output))


def test_cli_emits_manifests_and_plans_pinning_by_cpu_manager(tmp_path, monkeypatch):
    import cosyvino.planner as planner

    seen = []
    real = planner.make_plan

    def spy(*args, **kw):
        seen.append(kw["shared_host"])
        return real(*args, **kw)

    monkeypatch.setattr(planner, "make_plan", spy)
    kinds = _cli_docs(tmp_path, "--k8s-namespace", "tts", "--k8s-autoscaler", "hpa",
                      "--k8s-image", "cv:2", "--k8s-drain-timeout", "30")
    assert "HorizontalPodAutoscaler" in kinds and "ScaledObject" not in kinds
    deploy = kinds["Deployment"]
    assert _container(deploy)["image"] == "cv:2"
    assert deploy["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 10 + 30 + 5
    plan = _toml_loads(kinds["ConfigMap"]["data"]["plan.toml"])
    assert plan["model_dir"] == "/models/cosyvino" and plan["pinning"] is False
    # no static CPU manager: the pod shares the node's cores, planned as a shared host (no
    # pinning); with it the rules decide as on the machine itself
    _cli_docs(tmp_path, "--k8s-static-cpu")
    assert seen == [True, False]


def test_shared_host_plans_no_pinning(tmp_path):
    # an idle 2-socket host that owns its cores: pinned when asked (the rules leave it off
    # there because several sessions share each stream's cores)
    assert _plan(tmp_path, pinning=True).pinning is True
    plan = _plan(tmp_path / "shared", shared_host=True)
    assert plan.pinning is False and "--shared-host" in plan.decision("pinning")["reason"]
    assert "pinning off" in emit_k8s(plan)
    assert "WARNING: the plan pins" in emit_k8s(_plan(tmp_path / "pinned", pinning=True))
    assert "WARNING" not in emit_k8s(_plan(tmp_path / "static", pinning=True),
                                     K8sOptions(static_cpu=True))


def test_cli_refuses_bad_k8s_options(tmp_path):
    r = CliRunner().invoke(main, ["plan", "--model-dir", str(tmp_path), "--no-write", "--emit",
                                  "k8s", "--k8s-replicas", "4", "--k8s-max-replicas", "2"])
    assert r.exit_code == 2 and "replicas" in r.output
