"""Kubernetes manifests sized by a plan (``cosyvino plan --emit k8s``; docs/deploy.md).

:func:`manifests` returns the objects as plain dicts, :func:`emit_k8s` the multi-document YAML:

* ``ConfigMap`` with the plan as ``plan.toml`` (its ``model_dir`` set to the image's model dir),
  mounted at ``/etc/cosyvino`` and named by ``COSYVINO_PLAN``;
* ``Deployment``: ``startupProbe`` and ``readinessProbe`` on ``GET /ready``, ``livenessProbe``
  on ``GET /health``; a ``preStop`` sleep of ``shutdown_delay`` seconds, then SIGTERM and a
  drain of at most ``drain_timeout`` seconds (``COSYVINO_DRAIN_TIMEOUT``), inside
  ``terminationGracePeriodSeconds`` = delay + drain + :data:`GRACE_MARGIN_S`; CPU/memory and the
  thread env from :func:`k8s_resources`; non-root, read-only root filesystem;
* ``Service`` (port ``http``) and ``PodDisruptionBudget`` (at most one pod down by eviction);
* an autoscaler on ``cosyvino_capacity_utilization`` ((running + queued) / sessions, per pod):
  a KEDA ``ScaledObject`` with a Prometheus trigger (default) or an ``autoscaling/v2``
  ``HorizontalPodAutoscaler`` on that Pods metric through the Prometheus adapter.

Plain data in, plain data out: no Kubernetes client, no torch; PyYAML only for the text.
"""

from __future__ import annotations

import dataclasses
import math
import re

from ..errors import InputError
from .planfile import Plan, dumps_toml

#: seconds of terminationGracePeriodSeconds beyond preStop delay + drain (the process exit and
#: the kubelet's own bookkeeping)
GRACE_MARGIN_S = 5
#: extra memory on top of the plan's estimate (allocator slack, page cache of the IR files)
MEMORY_MARGIN = 1.25
#: a pod is never sized below this (Python, the libraries, one small model)
MIN_MEMORY_MI = 256
#: where the image keeps the plan (a ConfigMap mount) and serves the model from
PLAN_MOUNT = "/etc/cosyvino"
AUTOSCALERS = ("keda", "hpa", "none")
#: the gauge the autoscalers read (cosyvino/server/metrics.py)
CAPACITY_METRIC = "cosyvino_capacity_utilization"

_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


@dataclasses.dataclass(frozen=True)
class K8sOptions:
    """What the manifests need besides the plan (the ``--k8s-*`` options of ``cosyvino plan``).

    ``replicas`` is the autoscaler's minimum (or the fixed count with ``autoscaler="none"``);
    ``target_utilization`` the average ``cosyvino_capacity_utilization`` per pod the autoscaler
    holds (0.8: scale out before requests queue; above 1 requests wait in every pod);
    ``static_cpu``: the nodes run the kubelet's static CPU manager (the pod's integer CPUs are
    exclusive cores, so the plan may pin threads); ``shutdown_delay`` / ``drain_timeout`` in
    seconds; ``prometheus`` the server KEDA queries; ``model_dir`` the served dir in the image.
    """

    name: str = "cosyvino"
    namespace: str | None = None
    image: str = "cosyvino:latest"
    replicas: int = 2
    max_replicas: int = 10
    autoscaler: str = "keda"
    target_utilization: float = 0.8
    prometheus: str = "http://prometheus-operated.monitoring.svc:9090"
    static_cpu: bool = False
    shutdown_delay: float = 10.0
    drain_timeout: float = 60.0
    model_dir: str = "/models/cosyvino"
    port: int = 8000

    def validated(self) -> "K8sOptions":
        """This, or :class:`~cosyvino.errors.InputError` naming the bad option."""
        if not _DNS_LABEL.fullmatch(self.name or "") or len(self.name) > 52:
            raise InputError(f"k8s name {self.name!r} is not a DNS label of at most 52 "
                             "characters (lowercase letters, digits, '-')")
        if self.namespace is not None and not _DNS_LABEL.fullmatch(self.namespace):
            raise InputError(f"k8s namespace {self.namespace!r} is not a DNS label")
        if not self.image or any(c.isspace() for c in self.image):
            raise InputError(f"k8s image {self.image!r} is not an image reference")
        if self.replicas < 1 or self.max_replicas < self.replicas:
            raise InputError(f"k8s replicas: need 1 <= replicas ({self.replicas}) <= "
                             f"max replicas ({self.max_replicas})")
        if self.autoscaler not in AUTOSCALERS:
            raise InputError(f"k8s autoscaler {self.autoscaler!r}: one of "
                             f"{', '.join(AUTOSCALERS)}")
        if not 0 < self.target_utilization <= 4:
            raise InputError(f"k8s target utilization {self.target_utilization}: must be in "
                             "(0, 4] (busy + queued requests per session)")
        if self.shutdown_delay < 0 or self.drain_timeout < 0:
            raise InputError("k8s shutdown delay and drain timeout must be >= 0 seconds")
        if not self.model_dir.startswith("/"):
            raise InputError(f"k8s model dir {self.model_dir!r} must be an absolute path in "
                             "the image")
        if not 1 <= self.port <= 65535:
            raise InputError(f"k8s port {self.port} is not a TCP port")
        return self

    @property
    def grace_seconds(self) -> int:
        """terminationGracePeriodSeconds: preStop delay + drain + margin, whole seconds."""
        return math.ceil(self.shutdown_delay + self.drain_timeout) + GRACE_MARGIN_S


def k8s_resources(plan: Plan) -> dict:
    """Container ``resources`` and ``env`` matching the plan: integer CPU requests = limits =
    the plan's total threads (Guaranteed QoS, so the kubelet's static CPU manager can give
    exclusive cores, and never more threads than the quota); memory = the plan's estimate
    x :data:`MEMORY_MARGIN` (at least :data:`MIN_MEMORY_MI` MiB), requests = limits; no memory
    entry when the plan has no estimate. ``env``: ``OMP_NUM_THREADS`` (the plan's threads) and
    ``COSYVINO_PLAN`` (the mounted plan file)."""
    cpus = max(1, plan.total_threads)
    need = int(plan.memory.get("required_bytes") or 0)
    mem_mi = max(MIN_MEMORY_MI, math.ceil(need * MEMORY_MARGIN / 2**20)) if need else None
    res = {"requests": {"cpu": str(cpus)}, "limits": {"cpu": str(cpus)}}
    if mem_mi:
        res["requests"]["memory"] = f"{mem_mi}Mi"
        res["limits"]["memory"] = f"{mem_mi}Mi"
    env = [{"name": "OMP_NUM_THREADS", "value": str(cpus)},
           {"name": "COSYVINO_PLAN", "value": f"{PLAN_MOUNT}/plan.toml"}]
    return {"resources": res, "env": env}


def plan_toml(plan: Plan, model_dir: str) -> str:
    """The plan as the pod reads it: TOML with ``model_dir`` = the image's ``model_dir``."""
    data = dict(plan.to_dict(), model_dir=model_dir)
    return dumps_toml(data, header=(
        "cosyvino deployment plan for Kubernetes (`cosyvino plan --emit k8s`); model_dir is "
        "the dir inside the image."))


def _labels(plan: Plan, o: K8sOptions) -> tuple[dict, dict]:
    select = {"app.kubernetes.io/name": "cosyvino", "app.kubernetes.io/instance": o.name}
    labels = dict(select, **{"app.kubernetes.io/component": "tts",
                             "app.kubernetes.io/managed-by": "cosyvino-plan"})
    if plan.cosyvino_version:
        labels["app.kubernetes.io/version"] = _label_value(plan.cosyvino_version)
    return labels, select


def _label_value(v: str) -> str:
    v = re.sub(r"[^A-Za-z0-9._-]", "-", str(v))[:63]
    return v.strip("-._") or "unknown"


def _meta(name: str, o: K8sOptions, labels: dict, **extra) -> dict:
    meta = {"name": name}
    if o.namespace:
        meta["namespace"] = o.namespace
    meta["labels"] = dict(labels)
    meta.update(extra)
    return meta


def _seconds(x: float) -> str:
    return f"{x:g}"


def _container(plan: Plan, o: K8sOptions) -> dict:
    k = k8s_resources(plan)
    env = k["env"] + [
        {"name": "COSYVINO_MODEL_DIR", "value": o.model_dir},
        {"name": "COSYVINO_HOST", "value": "0.0.0.0"},
        {"name": "COSYVINO_PORT", "value": str(o.port)},
        # preStop already waited for the endpoints to drop the pod: drain at once
        {"name": "COSYVINO_SHUTDOWN_DELAY", "value": "0"},
        {"name": "COSYVINO_DRAIN_TIMEOUT", "value": _seconds(o.drain_timeout)},
        {"name": "COSYVINO_LOG_FORMAT", "value": "json"},
        {"name": "COSYVINO_VOICES_DIR", "value": "/var/lib/cosyvino/voices"},
        # OpenVINO's compiled-blob cache and the result cache (the root filesystem is read-only)
        {"name": "XDG_CACHE_HOME", "value": "/var/lib/cosyvino/cache"},
        {"name": "COSYVINO_API_KEY", "valueFrom": {"secretKeyRef": {
            "name": f"{o.name}-api-key", "key": "api-key", "optional": True}}},
    ]
    http = {"path": "/ready", "port": "http"}
    return {
        "name": "cosyvino",
        "image": o.image,
        "imagePullPolicy": "IfNotPresent",
        "args": ["serve"],
        "ports": [{"name": "http", "containerPort": o.port, "protocol": "TCP"}],
        "env": env,
        "resources": k["resources"],
        # the model loads and warms up before /ready answers 200: up to 5 minutes
        "startupProbe": {"httpGet": http, "periodSeconds": 5, "timeoutSeconds": 3,
                         "failureThreshold": 60},
        "readinessProbe": {"httpGet": http, "periodSeconds": 5, "timeoutSeconds": 3,
                           "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/health", "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        # kubelet runs preStop, then sends SIGTERM: the pod is out of the Service's endpoints
        # (load balancers, kube-proxy) before the server stops taking requests
        "lifecycle": {"preStop": {"exec": {"command": [
            "sleep", str(math.ceil(o.shutdown_delay))]}}},
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [
            {"name": "plan", "mountPath": PLAN_MOUNT, "readOnly": True},
            {"name": "voices", "mountPath": "/var/lib/cosyvino/voices"},
            {"name": "cache", "mountPath": "/var/lib/cosyvino/cache"},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }


def _deployment(plan: Plan, o: K8sOptions, labels: dict, select: dict) -> dict:
    spec = {}
    if o.autoscaler == "none":
        spec["replicas"] = o.replicas   # else the autoscaler owns the count
    spec.update({
        "selector": {"matchLabels": select},
        # a new pod is ready before an old one stops: capacity never drops in a rollout
        "strategy": {"type": "RollingUpdate",
                     "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
        "template": {
            "metadata": {"labels": labels, "annotations": {
                "prometheus.io/scrape": "true", "prometheus.io/port": str(o.port),
                "prometheus.io/path": "/metrics"}},
            "spec": {
                "terminationGracePeriodSeconds": o.grace_seconds,
                "securityContext": {"runAsNonRoot": True, "runAsUser": 10001,
                                    "runAsGroup": 10001, "fsGroup": 10001,
                                    "seccompProfile": {"type": "RuntimeDefault"}},
                "enableServiceLinks": False,
                "topologySpreadConstraints": [{
                    "maxSkew": 1, "topologyKey": "kubernetes.io/hostname",
                    "whenUnsatisfiable": "ScheduleAnyway",
                    "labelSelector": {"matchLabels": select}}],
                "containers": [_container(plan, o)],
                "volumes": [
                    {"name": "plan", "configMap": {"name": f"{o.name}-plan"}},
                    {"name": "voices", "emptyDir": {}},
                    {"name": "cache", "emptyDir": {"sizeLimit": "2Gi"}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
                ],
            },
        },
    })
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": _meta(o.name, o, labels), "spec": spec}


def _capacity_query(o: K8sOptions) -> str:
    sel = f'pod=~"{o.name}-.*"'
    if o.namespace:
        sel = f'namespace="{o.namespace}",' + sel
    return f"sum({CAPACITY_METRIC}{{{sel}}})"


def _scale_behavior() -> dict:
    # out fast (a queue means latency), in slowly (one pod a minute after 5 calm minutes)
    return {"scaleUp": {"stabilizationWindowSeconds": 0,
                        "policies": [{"type": "Pods", "value": 2, "periodSeconds": 30}]},
            "scaleDown": {"stabilizationWindowSeconds": 300,
                          "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}]}}


def _autoscaler(o: K8sOptions, labels: dict) -> dict | None:
    target = {"apiVersion": "apps/v1", "kind": "Deployment", "name": o.name}
    if o.autoscaler == "keda":
        return {"apiVersion": "keda.sh/v1alpha1", "kind": "ScaledObject",
                "metadata": _meta(o.name, o, labels),
                "spec": {
                    "scaleTargetRef": target,
                    "minReplicaCount": o.replicas, "maxReplicaCount": o.max_replicas,
                    "pollingInterval": 15, "cooldownPeriod": 300,
                    "advanced": {"horizontalPodAutoscalerConfig": {
                        "behavior": _scale_behavior()}},
                    # AverageValue: replicas = ceil(sum of the pods' utilization / threshold)
                    "triggers": [{"type": "prometheus", "metricType": "AverageValue",
                                  "metadata": {"serverAddress": o.prometheus,
                                               "query": _capacity_query(o),
                                               "threshold": f"{o.target_utilization:g}"}}],
                }}
    if o.autoscaler == "hpa":
        milli = max(1, round(o.target_utilization * 1000))
        return {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler",
                "metadata": _meta(o.name, o, labels),
                "spec": {
                    "scaleTargetRef": target,
                    "minReplicas": o.replicas, "maxReplicas": o.max_replicas,
                    "metrics": [{"type": "Pods", "pods": {
                        "metric": {"name": CAPACITY_METRIC},
                        "target": {"type": "AverageValue", "averageValue": f"{milli}m"}}}],
                    "behavior": _scale_behavior(),
                }}
    return None


def manifests(plan: Plan, options: K8sOptions | None = None) -> list[dict]:
    """The objects for ``plan``: ConfigMap, Service, Deployment, PodDisruptionBudget and the
    autoscaler (none with ``autoscaler="none"``), as dicts ready for YAML/JSON.

    Raises:
        InputError: an option out of range (:meth:`K8sOptions.validated`).
    """
    o = (options or K8sOptions()).validated()
    labels, select = _labels(plan, o)
    docs = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": _meta(f"{o.name}-plan", o, labels),
         "data": {"plan.toml": plan_toml(plan, o.model_dir)}},
        {"apiVersion": "v1", "kind": "Service", "metadata": _meta(o.name, o, labels),
         "spec": {"type": "ClusterIP", "selector": select,
                  "ports": [{"name": "http", "port": o.port, "targetPort": "http",
                             "protocol": "TCP"}]}},
        _deployment(plan, o, labels, select),
        {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
         "metadata": _meta(o.name, o, labels),
         "spec": {"maxUnavailable": 1, "selector": {"matchLabels": select}}},
    ]
    scaler = _autoscaler(o, labels)
    if scaler is not None:
        docs.append(scaler)
    return docs


def _header(plan: Plan, o: K8sOptions) -> list[str]:
    pin = ("pinning on: the kubelet's static CPU manager gives this Guaranteed pod exclusive "
           "cores" if plan.pinning else "pinning off")
    lines = [
        f"cosyvino on Kubernetes, sized by the plan: {plan.backend}, {plan.streams} stream(s) "
        f"x {plan.threads_per_stream} thread(s), {plan.max_sessions} session(s) per pod.",
        "CPU requests = limits = the plan's threads (Guaranteed QoS); " + pin + ".",
    ]
    if plan.pinning and not o.static_cpu:
        lines.append("WARNING: the plan pins threads but the nodes are not said to run the "
                     "static CPU manager (--k8s-static-cpu): under a CFS quota pinned threads "
                     "cannot move away from busy cores.")
    elif not o.static_cpu:
        lines.append("No static CPU manager (--k8s-static-cpu): the pod gets a CFS quota, "
                     "not cores, so threads are not pinned.")
    lines += [
        f"Shutdown: preStop sleeps {math.ceil(o.shutdown_delay)} s (the pod leaves the "
        f"endpoints), SIGTERM, drain <= {o.drain_timeout:g} s; grace "
        f"{o.grace_seconds} s.",
    ]
    if o.autoscaler == "keda":
        lines.append(f"Autoscaling: KEDA (keda.sh) on {CAPACITY_METRIC} from {o.prometheus}.")
    elif o.autoscaler == "hpa":
        lines += [f"Autoscaling: HPA on the Pods metric {CAPACITY_METRIC}; the Prometheus "
                  "adapter must serve it, e.g. this rule:",
                  f'  - seriesQuery: \'{CAPACITY_METRIC}{{namespace!="",pod!=""}}\'',
                  "    resources: {overrides: {namespace: {resource: namespace}, "
                  "pod: {resource: pod}}}",
                  "    metricsQuery: 'avg(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'"]
    lines.append("API key: create the Secret "
                 f"{o.name}-api-key (key api-key) to require it. docs/deploy.md explains all.")
    return lines


def emit_k8s(plan: Plan, options: K8sOptions | None = None) -> str:
    """:func:`manifests` as multi-document YAML, headed by comments saying what was sized how.

    Raises:
        InputError: an option out of range.
    """
    import yaml

    class _Dumper(yaml.SafeDumper):
        pass

    def _str(dumper, value: str):
        # the plan file reads as a block, not as one escaped line
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    _Dumper.add_representer(str, _str)
    o = (options or K8sOptions()).validated()
    head = "".join(f"# {line}\n" for line in _header(plan, o))
    body = yaml.dump_all(manifests(plan, o), Dumper=_Dumper, sort_keys=False,
                         allow_unicode=True, width=100, explicit_start=True)
    return head + body
