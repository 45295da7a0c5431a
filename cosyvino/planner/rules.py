"""Decision rules: probe (+ model inventory) -> :class:`Plan`, one recorded reason per decision.

Every rule is documented in ``docs/planner.md`` with its override. Pure functions of their
inputs (no I/O besides the optional model-dir inventory), so fixture probes give exact plans.
"""

from __future__ import annotations

import datetime
import math

from .inventory import STAGES, installed_backends, model_inventory
from .planfile import PLAN_VERSION, Plan, PlanError
from .topology import Probe

GOALS = ("latency", "throughput")

#: the 300M model's matmuls (1024 wide, batch 1 in the LLM) stop scaling past ~16 threads; more
#: cores become more streams instead
MAX_THREADS_PER_STREAM = 16
#: bytes of weights assumed when the model is not on disk yet (CosyVoice-300M, fp32 .pt files)
DEFAULT_WEIGHTS_BYTES = 1_750_000_000
#: Python, libraries and compiled-graph overhead of one serving process
RUNTIME_OVERHEAD_BYTES = 512 * 2**20
#: working memory of one active session (KV cache up to ~2000 positions, estimator activations)
#: as a fraction of the weights, at least 64 MiB
SESSION_FRACTION = 0.15
#: resident bytes per byte of IR weights once OpenVINO has compiled the models (measured on the
#: synthetic 300M: 3.1 GB resident after load for 1.75 GB of .bin files — the CPU plugin keeps
#: repacked weight copies next to the mapped originals)
OPENVINO_RESIDENT_FACTOR = 1.8
#: load average per online CPU above which the host counts as shared (pinning off)
BUSY_LOAD = 0.5
#: keep this share of the memory budget free (page cache, allocator slack)
MEMORY_HEADROOM = 0.9


class _Log:
    def __init__(self):
        self.decisions: list[dict] = []
        self.warnings: list[str] = []

    def decide(self, name: str, value, reason: str):
        self.decisions.append({"name": name, "value": _plain(value), "reason": reason})
        return value


def _plain(v):
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    return v


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _choose_backend(probe: Probe, want: str | None, log: _Log) -> str:
    backends = probe.backends
    usable = {n for n, b in backends.items() if b.get("available")}
    ov_model = probe.model.get("openvino", {})
    model_dir = probe.model.get("dir") or "the model dir"
    if want:
        if want not in backends:
            raise PlanError(f"backend {want!r} is not installed; installed: "
                            f"{', '.join(sorted(backends)) or 'none'}")
        if want not in usable:
            raise PlanError(f"backend {want!r} cannot run here: {backends[want].get('reason')}")
        return log.decide("backend", want, "chosen by --backend (override)")
    if "openvino" in usable and ov_model.get("present"):
        return log.decide("backend", "openvino",
                          f"OpenVINO plugin installed and converted IRs found in "
                          f"{model_dir}/{'|'.join(ov_model.get('dirs', ['openvino']))} "
                          "(fastest CPU backend)")
    if "openvino" not in backends:
        why = "OpenVINO plugin not installed (pip install 'cosyvino[openvino]')"
    elif "openvino" not in usable:
        why = f"OpenVINO plugin unusable: {backends['openvino'].get('reason')}"
    else:
        why = (f"no converted IRs at {model_dir}/openvino/manifest.json "
               "(run `cosyvino convert` to enable OpenVINO)")
    if "torch" in usable:
        return log.decide("backend", "torch", f"{why}; using the PyTorch reference backend")
    others = sorted(usable - {"openvino"})
    if others:
        return log.decide("backend", others[0], f"{why}; torch unavailable; first usable "
                                                "installed backend")
    details = "; ".join(f"{n}: {b.get('reason')}" for n, b in sorted(backends.items()))
    raise PlanError(f"no usable backend: {why}; {details or 'no backend plugins installed'}. "
                    "Install one: pip install 'cosyvino[torch]'")


def _thread_budget(probe: Probe, log: _Log) -> int:
    cores = probe.compute_cores
    parts = [f"{probe.physical_cores} physical cores in the affinity set "
             f"{_cpus(probe.affinity)}"]
    if probe.smt:
        parts.append(f"SMT siblings not counted ({probe.threads_per_core} threads/core: "
                     "more threads than cores made inference slower)")
    if probe.hybrid and probe.p_cores:
        parts.append(f"hybrid CPU: only the {probe.p_cores} P-cores ({probe.e_cores} E-cores "
                     "would make every parallel op wait for the slowest core)")
    budget = cores
    if probe.cpu_quota is not None:
        q = max(1, math.floor(probe.cpu_quota + 1e-9))
        if q < budget:
            parts.append(f"cgroup CPU quota {probe.cpu_quota:g} CPUs -> {q} (floor: threads "
                         "beyond the quota get throttled, which collapses throughput)")
        budget = min(budget, q)
    return log.decide("thread_budget", max(1, budget), "; ".join(parts))


def _cpus(cpus) -> str:
    from .topology import format_cpu_list
    return "{" + format_cpu_list(cpus) + "}"


def _layout(probe: Probe, backend: str, goal: str, budget: int, threads: int | None,
            streams: int | None, log: _Log) -> tuple[int, int]:
    """(streams, threads per stream) with streams x threads <= budget unless overridden."""
    if streams is not None:
        tps = max(1, (threads if threads is not None else budget) // streams)
        if streams * tps > budget:
            log.warnings.append(f"override uses {streams * tps} threads > the "
                                f"{budget}-thread budget: expect contention")
        log.decide("streams", streams, "set by --streams (override)")
        log.decide("threads_per_stream", tps, f"{'--threads' if threads else 'budget'} "
                                              f"{threads or budget} // {streams} streams")
        return streams, tps
    if threads is not None:
        if threads > budget:
            log.warnings.append(f"--threads {threads} > the {budget}-thread budget: expect "
                                "contention")
        log.decide("threads_override", threads, "set by --threads (override): laid out below "
                                                "as if it were the budget")
        budget = threads
    if backend != "openvino":
        tps = min(budget, MAX_THREADS_PER_STREAM)
        log.decide("streams", 1, f"{backend}: one process-wide thread pool and one synthesis "
                                 "at a time per process (parallel streams need OpenVINO)")
        log.decide("threads_per_stream", tps,
                   f"all of the {budget}-thread budget" + (
                       f", capped at {MAX_THREADS_PER_STREAM} (no scaling beyond)"
                       if budget > MAX_THREADS_PER_STREAM else ""))
        return 1, tps
    node_cores = [n for n in probe.cores_per_numa_node if n > 0] or [budget]
    if goal == "latency":
        tps = min(budget, MAX_THREADS_PER_STREAM, max(node_cores))
        why = (f"latency: one request gets as many cores as help it (budget {budget}, cap "
               f"{MAX_THREADS_PER_STREAM}, largest NUMA node {max(node_cores)} cores)")
    else:
        tps = max(1, min(4, budget // 8))
        why = (f"throughput: small streams (budget {budget} // 8, between 1 and 4 threads) "
               "run more requests side by side; batch-1 decoding is memory-bound")
    per_node = sum(n // tps for n in node_cores)
    n_streams = max(1, min(budget // tps, per_node if per_node > 0 else budget // tps))
    log.decide("threads_per_stream", tps, why)
    log.decide("streams", n_streams,
               f"{budget} // {tps} threads, streams kept inside NUMA nodes "
               f"({len(node_cores)} node(s)); streams x threads = {n_streams * tps} <= {budget}")
    return n_streams, tps


def _pinning(probe: Probe, backend: str, shared_host: bool, override: bool | None,
             log: _Log) -> bool:
    if override is not None:
        return log.decide("pinning", override, "set by --pinning/--no-pinning (override)")
    if backend != "openvino":
        return log.decide("pinning", False, f"{backend} backend has no pinning control")
    if shared_host:
        return log.decide("pinning", False, "--shared-host: other workers share these cores; "
                                            "pinned threads could not move away from them")
    if probe.cpu_quota is not None and probe.cpu_quota < len(probe.affinity):
        return log.decide("pinning", False,
                          f"CPU quota {probe.cpu_quota:g} < {len(probe.affinity)} allowed CPUs: "
                          "the process does not own whole cores")
    n_online = max(1, len(probe.online_cpus))
    if probe.loadavg_1m is not None and probe.loadavg_1m > BUSY_LOAD * n_online:
        return log.decide("pinning", False,
                          f"host busy while planning (load average {probe.loadavg_1m:g} on "
                          f"{n_online} CPUs): other workers appear to share these cores; "
                          "`--pinning` forces it on")
    return log.decide("pinning", True, f"the process owns CPUs {_cpus(probe.affinity)} "
                                       "(no quota); pass --shared-host if other heavy "
                                       "processes run on them")


def _precision(probe: Probe, backend: str, tuned: dict | None, override: str | None,
               log: _Log) -> dict:
    """Per-stage precision. The OpenVINO backend takes one compute precision
    (INFERENCE_PRECISION_HINT) for all stages; INT8 comes from quantized IRs on disk."""
    if backend != "openvino":
        if override and override != "fp32":
            log.warnings.append(f"--precision {override} ignored: the {backend} backend "
                                "computes in fp32 only")
        log.decide("precision", "fp32", f"{backend} backend computes in fp32")
        return {s: "fp32" for s in STAGES}
    on_disk = probe.model.get("openvino", {}).get("precisions", {})
    prec: dict[str, str] = {}
    llm_w = on_disk.get("llm", "fp32")
    prec["llm_weights"] = llm_w
    log.decide("llm_weights", llm_w,
               "INT8 LLM weights found on disk (decoding is memory-bound: fewer bytes/token)"
               if llm_w == "int8" else f"{llm_w} IRs on disk (no INT8 LLM variant found)")
    unit = "AMX" if probe.amx_bf16 else "AVX512_BF16"
    if override:
        compute, why = override, "set by --precision (override)"
    elif probe.bf16 and tuned and tuned.get("bf16_faster"):
        compute, why = "bf16", f"bf16-capable ({unit}) and measured faster by --tune"
    elif probe.bf16:
        compute = "fp32"
        why = (f"CPU can do bf16 ({unit}) and OpenVINO would pick it by default, but it was "
               "not measured faster here: fp32 keeps reference parity; `cosyvino plan --tune` "
               "tries bf16, `--precision bf16` forces it")
    else:
        compute, why = "fp32", "no AMX/AVX512_BF16: fp32 (bf16 would be emulated, slower)"
    log.decide("compute_precision", compute,
               why + " (the OpenVINO backend applies one precision to every stage)")
    for s in STAGES:
        prec[s] = compute
    if on_disk.get("estimator") == "int8":
        if probe.vnni or probe.amx:
            prec["estimator"] = "int8"
            log.decide("estimator_precision", "int8", "INT8 estimator IR on disk and the CPU "
                       "has " + ("AMX-INT8" if probe.amx else "VNNI") + " dot products")
        else:
            log.warnings.append("INT8 estimator IR on disk but no VNNI/AMX: int8 runs slowly "
                                "here; convert an fp32/fp16 estimator instead")
    return prec


_OV_PREC = {"fp32": "f32", "bf16": "bf16", "fp16": "f16", "int8": "f32"}


def _backend_options(probe: Probe, backend: str, goal: str, streams: int, tps: int,
                     pinning: bool, prec: dict) -> dict:
    """Keyword arguments for ``Synthesizer(..., backend=backend, **options)``, in the backends'
    own option names (see plugins/cosyvino_openvino/__init__.py)."""
    total = streams * tps
    if backend != "openvino":
        return {"num_threads": total}
    compute = _OV_PREC[prec["llm"]]
    opts = {"num_threads": total, "num_streams": streams,
            "performance_hint": "LATENCY" if goal == "latency" else "THROUGHPUT",
            "cpu_pinning": pinning, "precision": compute}
    if compute == "f32":
        opts["kv_cache_precision"] = "f32"   # else OpenVINO picks u8 on recent CPUs
    props = {}
    if probe.smt:
        props["ENABLE_HYPER_THREADING"] = False
    if probe.hybrid:
        props["SCHEDULING_CORE_TYPE"] = "PCORE_ONLY"
    if props:
        opts["properties"] = props
    return opts


def _memory(probe: Probe, backend: str, sessions: int, memory_limit: int | None,
            log: _Log) -> tuple[int, dict]:
    model = probe.model
    if backend == "openvino" and model.get("openvino", {}).get("bytes"):
        weights = int(model["openvino"]["bytes"] * OPENVINO_RESIDENT_FACTOR)
        src = f"OpenVINO IR .bin files x {OPENVINO_RESIDENT_FACTOR} once compiled"
    elif model.get("torch_bytes"):
        weights, src = model["torch_bytes"], "llm.pt + flow.pt + hift.pt"
    else:
        weights, src = DEFAULT_WEIGHTS_BYTES, "model not on disk yet: 300M default assumed"
    per_session = max(64 * 2**20, int(weights * SESSION_FRACTION))

    def need(n: int) -> int:
        return RUNTIME_OVERHEAD_BYTES + weights + n * per_session

    budget = memory_limit or probe.memory_budget
    info = {"weights_bytes": weights, "per_session_bytes": per_session,
            "overhead_bytes": RUNTIME_OVERHEAD_BYTES, "budget_bytes": budget}
    if not budget:
        log.warnings.append("memory size unknown: memory check skipped")
        info["required_bytes"] = need(sessions)
        return sessions, info
    usable = int(budget * MEMORY_HEADROOM)
    if need(1) > usable:
        raise PlanError(
            f"not enough memory: one session needs ~{_gib(need(1))} (weights {_gib(weights)} "
            f"from {src} + {_gib(per_session)} working memory + {_gib(RUNTIME_OVERHEAD_BYTES)} "
            f"runtime) but the {'cgroup limit' if probe.mem_limit else 'machine'} allows "
            f"{_gib(budget)} ({int(MEMORY_HEADROOM * 100)}% usable). Raise the memory limit, "
            "or pass --memory-limit if the detected limit is wrong")
    fit = max(1, (usable - RUNTIME_OVERHEAD_BYTES - weights) // per_session)
    if fit < sessions:
        log.decide("max_sessions_memory", int(fit),
                   f"memory: {sessions} sessions would need ~{_gib(need(sessions))} of "
                   f"{_gib(budget)}; reduced to {fit}")
        sessions = int(fit)
    info["required_bytes"] = need(sessions)
    log.decide("memory", f"{_gib(need(sessions))} of {_gib(budget)}",
               f"weights {_gib(weights)} ({src}) + {sessions} x {_gib(per_session)} per session "
               f"+ {_gib(RUNTIME_OVERHEAD_BYTES)} runtime")
    return sessions, info


def make_plan(probe: Probe, model_dir: str | None = None, goal: str = "latency", *,
              backend: str | None = None, threads: int | None = None,
              streams: int | None = None, pinning: bool | None = None,
              sessions: int | None = None, queue: int | None = None,
              precision: str | None = None, shared_host: bool = False,
              memory_limit: int | None = None, tuned: dict | None = None) -> Plan:
    """Decide backend, threads, streams, pinning, precision, sessions and queue for ``probe``.

    Args:
        probe: from :func:`cosyvino.planner.probe` (or a fixture). Its ``backends`` and
            ``model`` are filled here when empty (installed plugins; ``model_dir`` inventory).
        model_dir: the model to serve (None = the default model dir).
        goal: "latency" (fastest single request) or "throughput" (most requests per second).
        backend/threads/streams/pinning/sessions/queue/precision/shared_host/memory_limit:
            overrides, each recorded as the reason of its decision (see docs/planner.md).
            ``threads`` is the total; ``precision`` the compute precision (fp32/bf16).
        tuned: measured facts from :mod:`cosyvino.planner.tune` (e.g. estimator_bf16_faster).

    Raises:
        PlanError: unknown goal/backend, no usable backend, not enough memory.
    """
    if goal not in GOALS:
        raise PlanError(f"goal must be one of {', '.join(GOALS)}, got {goal!r}")
    if model_dir is None and not probe.model:
        from ..defaults import default_model_dir
        model_dir = default_model_dir()
    if not probe.model:
        probe.model = model_inventory(model_dir)
    if not probe.backends:
        probe.backends = installed_backends()
    log = _Log()
    log.warnings.extend(probe.warnings)
    be = _choose_backend(probe, backend, log)
    budget = _thread_budget(probe, log)
    n_streams, tps = _layout(probe, be, goal, budget, threads, streams, log)
    pin = _pinning(probe, be, shared_host, pinning, log)
    prec = _precision(probe, be, tuned, precision, log)

    if sessions is not None:
        max_sessions = log.decide("max_sessions", sessions, "set by --sessions (override)")
    elif be == "openvino":
        max_sessions = log.decide("max_sessions", n_streams,
                                  "one concurrent synthesis per OpenVINO stream (more would "
                                  "time-share the same cores and raise everyone's latency)")
    else:
        max_sessions = log.decide("max_sessions", 1, f"{be}: syntheses in one process run one "
                                                     "at a time")
    max_sessions, mem = _memory(probe, be, max_sessions, memory_limit, log)
    if queue is not None:
        queue_size = log.decide("queue_size", queue, "set by --queue (override)")
    else:
        factor = 2 if goal == "latency" else 8
        queue_size = log.decide("queue_size", max(2, factor * max_sessions),
                                f"{goal}: {factor} x sessions waiting; beyond that the server "
                                "answers 503 at once instead of letting latency grow")
    n_online = max(1, len(probe.online_cpus))
    if probe.loadavg_1m is not None and probe.loadavg_1m > BUSY_LOAD * n_online:
        log.warnings.append(f"load average {probe.loadavg_1m:g} on {n_online} online CPUs: "
                            "other processes are busy here; --tune measurements include "
                            "their load")
    if probe.hybrid and not probe.p_cores:
        log.warnings.append("hybrid CPU but no P-cores in the affinity set: running on E-cores")

    serve_dir = probe.model.get("dir", model_dir or "")
    int8_dir = probe.model.get("openvino", {}).get("int8_llm_dir")
    if be == "openvino" and int8_dir and prec.get("llm_weights") == "int8":
        serve_dir = log.decide("model_dir", int8_dir, "converted dir with INT8 LLM weights "
                               "(`cosyvino quantize`); the fp32 IRs stay next to it")

    from .. import __version__
    plan = Plan(
        backend=be, goal=goal, model_dir=serve_dir,
        backend_options=_backend_options(probe, be, goal, n_streams, tps, pin, prec),
        streams=n_streams, threads_per_stream=tps, pinning=pin,
        max_sessions=max_sessions, queue_size=queue_size, precision=prec, memory=mem,
        decisions=log.decisions, warnings=log.warnings, probe=probe.to_dict(),
        tuning=dict(tuned or {}), version=PLAN_VERSION,
        created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        cosyvino_version=__version__)
    return plan
