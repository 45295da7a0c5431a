"""Decision rules: probe (+ model inventory) -> :class:`Plan`, one recorded reason per decision.

Every rule is documented in ``docs/planner.md`` with its override. Pure functions of their
inputs (no I/O besides the optional model-dir inventory), so fixture probes give exact plans.

The rules are about the machine; what a backend can do and how its options are spelled is the
backend's answer (:class:`cosyvino.backends.Backend`: ``capabilities``, ``plan_options``,
``reference``, ``install_hint``), never a check of its name.
"""

from __future__ import annotations

import dataclasses
import datetime
import math
import os

from ..backends.base import Backend, Capabilities
from .inventory import STAGES, backend_capabilities, installed_backends, model_inventory
from .planfile import PLAN_VERSION, Plan, PlanError
from .topology import BUSY_LOAD, Probe

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
#: stages whose int8 IRs compute in int8 (static INT8); the LLM's int8/int4 is weight-only
#: compression and shows as ``llm_weights``
INT8_COMPUTE_STAGES = ("flow", "estimator", "vocoder")
#: CPU flags of int8 dot-product instructions (u8 x s8 products summed straight into 32 bits).
#: Without them the int8 kernels multiply with VPMADDUBSW, which adds pairs of u8 x s8 products
#: into a saturating 16-bit sum (Intel SDM, PMADDUBSW; oneDNN developer guide, "Nuances of int8
#: computations"): static INT8 then loses accuracy and speed. Measured on an AVX2-only Zen 3
#: (issue 16): the INT8 estimator 10 % slower than OpenVINO f32 and 38.5 dB SNR vs fp32,
#: against 51.7 dB with AVX-512 VNNI (docs/planner.md, "Machine kinds").
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")
#: machine kinds (:func:`machine_kind`), best int8/bf16 unit first
MACHINE_KINDS = ("amx", "avx512-bf16", "avx512-vnni", "avx512", "avx2-vnni", "avx2", "baseline")


def machine_kind(flags) -> str:
    """The kind of CPU for precision choices, from its cpuinfo ISA flags (any iterable of flag
    names): ``amx`` (AMX tiles with INT8 or BF16: Sapphire Rapids and later), ``avx512-bf16``
    (AVX-512 with VNNI and BF16: Zen 4, Cooper Lake), ``avx512-vnni`` (Cascade/Ice Lake),
    ``avx512`` (AVX-512 without VNNI: Skylake-SP), ``avx2-vnni`` (AVX-VNNI: Alder Lake and
    later cores), ``avx2`` (no int8 dot products: Zen 2/3, Haswell-Comet Lake), ``baseline``."""
    f = set(flags)
    if "amx_tile" in f and ({"amx_int8", "amx_bf16"} & f):
        return "amx"
    if "avx512f" in f:
        if "avx512_bf16" in f:
            return "avx512-bf16"
        return "avx512-vnni" if "avx512_vnni" in f else "avx512"
    if "avx_vnni" in f:
        return "avx2-vnni"
    return "avx2" if "avx2" in f else "baseline"


def int8_dot_products(flags) -> bool:
    """Whether the CPU has int8 dot-product instructions (:data:`INT8_DOT_FLAGS`)."""
    return bool(set(INT8_DOT_FLAGS) & set(flags))


#: what a backend is assumed to offer when it could not describe itself (override only)
UNKNOWN_CAPABILITIES = Capabilities(ready=False, reason="capabilities unknown")
def host_busy(probe: Probe) -> bool:
    """Other processes load these CPUs: the 1-minute load average is above :data:`BUSY_LOAD`
    per online CPU and, where the probe sampled it, so is the load right now (the average
    still counts a `cosyvino convert` that ended seconds ago: README's first command runs
    `plan` right after one)."""
    n_online = max(1, len(probe.online_cpus))
    if probe.loadavg_1m is None or probe.loadavg_1m <= BUSY_LOAD * n_online:
        return False
    busy_now = probe.busy_cpus
    return busy_now is None or busy_now > BUSY_LOAD * n_online
#: keep this share of the memory budget free (page cache, allocator slack)
MEMORY_HEADROOM = 0.9
#: a backend keeps its stage buffers (``keep_buffers``) only while the plan, buffers included,
#: needs at most this share of the memory budget: on a tight budget (a container sized to
#: the plan) the ~0.3-0.5 GiB go to sessions instead; where memory is plentiful speed wins
KEEP_BUFFERS_MAX_SHARE = 0.5


class _Log:
    def __init__(self):
        self.decisions: list[dict] = []
        self.warnings: list[str] = []

    def decide(self, name: str, value, reason: str):
        self.decisions.append({"name": name, "value": _plain(value), "reason": reason})
        return value

    def decision(self, name: str) -> dict | None:
        return next((d for d in self.decisions if d["name"] == name), None)


def _plain(v):
    if isinstance(v, dict):
        return ", ".join(f"{k}={x}" for k, x in v.items())
    return v


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _own_reason(name: str, reason: str) -> str:
    """``reason`` without a leading ``"NAME: "``: the plan names the backend already (in the
    decision's name and in the not-chosen list), so a reason that repeats it would read twice."""
    head, sep, rest = reason.partition(":")
    return rest.strip() if sep and head.strip() == name and rest.strip() else reason


def _is_reference(classes: dict, name: str) -> bool:
    return bool(getattr(classes.get(name), "reference", False))


def _candidates(probe: Probe, model_dir: str | None, classes: dict, log: _Log
                ) -> dict[str, Capabilities]:
    """Capabilities of every installed, available backend on ``model_dir``, one decision
    ``candidate:NAME`` each; backends that cannot describe themselves become warnings, and a
    registered backend the probe lacks is named with its ``install_hint``. Reasons are
    returned without a leading ``"NAME: "`` (:func:`_own_reason`)."""
    from ..plugins import plugin_errors

    backends = probe.backends
    usable = sorted(n for n, b in backends.items() if b.get("available"))
    caps, problems = backend_capabilities(usable, model_dir, probe)
    caps = {n: dataclasses.replace(c, reason=_own_reason(n, c.reason)) for n, c in caps.items()}
    for name, err in sorted(plugin_errors().items()):
        log.warnings.append(f"backend plugin {name!r} failed to load and was skipped: {err}")
    for name in sorted(backends):
        if name in problems:
            log.warnings.append(f"backend plugin {name!r} skipped: {problems[name]}")
            log.decide(f"candidate:{name}", "skipped", problems[name])
        elif name not in caps:
            log.decide(f"candidate:{name}", "unusable",
                       _own_reason(name, backends[name].get("reason") or "")
                       or "is_available() said no")
        elif caps[name].ready:
            c = caps[name]
            log.decide(f"candidate:{name}", "ready", f"{c.reason}, ~{c.relative_speed:g}x torch")
        else:
            log.decide(f"candidate:{name}", "not ready", caps[name].reason)
    for name in sorted(classes):
        hint = getattr(classes[name], "install_hint", "")
        if hint and name not in backends:
            log.decide(f"candidate:{name}", "not installed", f"plugin not installed ({hint})")
    return caps


def _choose_backend(probe: Probe, want: str | None, caps: dict[str, Capabilities],
                    classes: dict, log: _Log) -> tuple[str, Capabilities]:
    """Override, else the ready candidate with the highest relative_speed (ties: the reference
    backend last, then by name), else the reference backend (torch; it loads the checkpoint,
    which may appear before load: the default model is created on first use), else the first
    usable backend."""
    backends = probe.backends
    usable = {n for n, b in backends.items() if b.get("available")}
    model_dir = probe.model.get("dir") or "the model dir"
    if want:
        if want not in backends:
            raise PlanError(f"backend {want!r} is not installed; installed: "
                            f"{', '.join(sorted(backends)) or 'none'}")
        if want not in usable:
            raise PlanError(f"backend {want!r} cannot run here: {backends[want].get('reason')}")
        chosen = caps.get(want, UNKNOWN_CAPABILITIES)
        if not chosen.ready:
            log.warnings.append(f"--backend {want}: not ready for {model_dir}: {chosen.reason}")
        return log.decide("backend", want, "chosen by --backend (override)"), chosen

    def summary(name: str) -> str:
        d = log.decision(f"candidate:{name}")
        return f"{name}: {d['value']}: {d['reason']}" if d else name

    others = [d["name"].split(":", 1)[1] for d in log.decisions
              if d["name"].startswith("candidate:")]
    ready = sorted((n for n, c in caps.items() if c.ready),
                   key=lambda n: (-caps[n].relative_speed, _is_reference(classes, n), n))
    if ready:
        be = ready[0]
        rest = "; ".join(summary(n) for n in others if n != be)
        return log.decide("backend", be,
                          f"{caps[be].reason} (fastest ready backend, ~"
                          f"{caps[be].relative_speed:g}x torch)"
                          + (f"; not chosen: {rest}" if rest else "")), caps[be]
    why = "; ".join(summary(n) for n in others) or "no backend plugins installed"
    refs = [n for n in sorted(caps) if _is_reference(classes, n)]
    if refs:
        return log.decide("backend", refs[0],
                          f"no backend is ready for {model_dir} ({why}); using the {refs[0]} "
                          "reference backend, which loads the checkpoint once it is there"), \
            caps[refs[0]]
    if caps:
        be = sorted(caps)[0]
        log.warnings.append(f"no backend is ready for {model_dir} and torch is not installed: "
                            f"`cosyvino serve` with this plan will fail until {be} can load the "
                            f"model ({caps[be].reason}); converting a checkpoint needs torch: "
                            "pip install 'cosyvino[torch]'")
        return log.decide("backend", be, f"no backend is ready ({why}); torch unavailable; "
                                         "first usable installed backend"), caps[be]
    raise PlanError(f"no usable backend: {why}. Install one: pip install 'cosyvino[torch]'")


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


def _layout(probe: Probe, backend: str, caps: Capabilities, goal: str, budget: int,
            threads: int | None, streams: int | None, log: _Log) -> tuple[int, int]:
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
    if not caps.streams:
        tps = min(budget, MAX_THREADS_PER_STREAM)
        log.decide("streams", 1, f"{backend}: one process-wide thread pool and one synthesis "
                                 "at a time per process (the backend has no parallel "
                                 "inference streams)")
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


def _pinning(probe: Probe, backend: str, caps: Capabilities, shared_host: bool,
             override: bool | None, log: _Log, *, overlap: bool = False, sessions: int = 1,
             streams: int = 1) -> bool:
    """Whether the backend pins each stream's threads to cores. Off when the process does not
    own its cores (quota, ``--shared-host``, a busy host) and when calls run at once on a
    stream's cores (``overlap`` lanes, more ``sessions`` than ``streams``): each call's
    threads are then pinned to the same cores and cannot move apart when they contend."""
    if override is not None:
        return log.decide("pinning", override, "set by --pinning/--no-pinning (override)")
    if not caps.pinning:
        return log.decide("pinning", False, f"{backend} backend has no pinning control")
    if shared_host:
        return log.decide("pinning", False, "--shared-host: other workers share these cores; "
                                            "pinned threads could not move away from them")
    if probe.cpu_quota is not None and probe.cpu_quota < len(probe.affinity):
        return log.decide("pinning", False,
                          f"CPU quota {probe.cpu_quota:g} < {len(probe.affinity)} allowed CPUs: "
                          "the process does not own whole cores")
    n_online = max(1, len(probe.online_cpus))
    busy_now = probe.busy_cpus
    # the structural reason first: it holds however loaded the host is while planning
    shared = []
    if overlap:
        shared.append("a request's LLM and flow/vocoder lanes run at once (overlap_stages)")
    if sessions > streams:
        shared.append(f"{sessions} sessions share {streams} stream(s)")
    shared_reason = (
        f"calls share a stream's cores: {' and '.join(shared)}; pinned, their threads could "
        "not move apart (AMD Zen 4, 2 cores: a streamed request was 13-23 % faster "
        "unpinned; docs/performance.md, 'CPU pinning with calls at once')"
        if shared else "")
    if shared_reason:
        busy = ""
        if host_busy(probe):
            busy = (f"; also, the host was busy while planning (load average "
                    f"{probe.loadavg_1m:g} on {n_online} CPUs)")
        return log.decide("pinning", False,
                          f"{shared_reason}{busy}; `cosyvino plan --pinning` forces it on")
    if host_busy(probe):
        now = "" if busy_now is None else f", {busy_now:g} busy now"
        return log.decide("pinning", False,
                          f"host busy while planning (load average {probe.loadavg_1m:g}"
                          f"{now} on {n_online} CPUs): other workers appear to share these "
                          "cores; `--pinning` forces it on")
    after = ""
    if probe.loadavg_1m is not None and probe.loadavg_1m > BUSY_LOAD * n_online:
        after = (f"; the load average {probe.loadavg_1m:g} is from work that has ended "
                 f"({busy_now:g} of {n_online} CPUs busy while planning)")
    return log.decide("pinning", True, f"the process owns CPUs {_cpus(probe.affinity)} "
                                       "(no quota); pass --shared-host if other heavy "
                                       f"processes run on them{after}")


def _precision(probe: Probe, backend: str, caps: Capabilities, tuned: dict | None,
               override: str | None, log: _Log) -> dict:
    """Per-stage precision from the backend's ``precisions``. A backend with more than fp32
    takes one compute precision for all stages (OpenVINO: INFERENCE_PRECISION_HINT); INT8
    weights come from quantized files on disk (``caps.weight_precisions``: what the backend
    found in the dir it serves; served as they are even where the backend computes only fp32,
    e.g. OpenVINO without bf16 or int8 dot products)."""
    on_disk = caps.weight_precisions
    fp32_only = set(caps.precisions) <= {"fp32"}
    if fp32_only and not ({"int8", "int4"} & set(on_disk.values())):
        if override and override != "fp32":
            log.warnings.append(f"--precision {override} ignored: the {backend} backend "
                                "computes in fp32 only")
        log.decide("precision", "fp32", f"{backend} backend computes in fp32")
        return {s: "fp32" for s in STAGES}
    prec: dict[str, str] = {}
    llm_w = on_disk.get("llm", "fp32")
    prec["llm_weights"] = llm_w
    dots = ("with int8 dot products here, OpenVINO quantizes the activations per group of "
            "128 and multiplies in int8" if int8_dot_products(probe.flags) else
            "without int8 dot products the weights are widened to f32 before the multiply")
    log.decide("llm_weights", llm_w,
               f"{llm_w.upper()} LLM weights found on disk (a one-row decode step reads every "
               f"weight: fewer bytes per token; weight-only: {dots})" if llm_w in ("int8", "int4")
               else f"{llm_w} IRs on disk (no INT8/INT4 LLM variant found)")
    unit = "AMX" if probe.amx_bf16 else "AVX512_BF16"
    # a quantized dir's audio is not the reference's anyway: say what f32 keeps there
    parity = ("fp32 keeps the float stages at the reference (and the INT8 LLM measured faster "
              "with f32 than bf16 activations)" if {"int8", "int4"} & set(on_disk.values())
              else "fp32 keeps reference parity")
    if override and fp32_only and override != "fp32":
        log.warnings.append(f"--precision {override} ignored: the {backend} backend computes "
                            "in fp32 only on this CPU")
        compute, why = "fp32", f"{backend} backend computes in fp32 here"
    elif override:
        compute, why = override, "set by --precision (override)"
    elif "bf16" in caps.precisions and tuned and tuned.get("bf16_faster"):
        compute, why = "bf16", f"bf16-capable ({unit}) and measured faster by --tune"
    elif "bf16" in caps.precisions and tuned and any(
            c.get("bf16") and c.get("status") == "ok" for c in tuned.get("candidates", ())):
        compute = "fp32"
        why = (f"CPU can do bf16 ({unit}), but --tune measured bf16 not >= 5 % faster than "
               f"fp32 here (see [tuning]): {parity}; `--precision bf16` forces it")
    elif "bf16" in caps.precisions:
        compute = "fp32"
        why = (f"CPU can do bf16 ({unit}) and OpenVINO would pick it by default, but bf16 "
               f"has not been measured faster on this machine: {parity}; "
               "`cosyvino plan --tune` measures bf16, `--precision bf16` forces it")
    else:
        compute, why = "fp32", "no AMX/AVX512_BF16: fp32 (bf16 would be emulated, slower)"
    log.decide("compute_precision", compute,
               why + f" (the {backend} backend applies it to every stage not moved below)")
    for s in STAGES:
        prec[s] = compute
    for stage in INT8_COMPUTE_STAGES:
        if on_disk.get(stage) != "int8":
            continue
        # quantized IRs run in int8 whatever the hint: the plan says what is served
        prec[stage] = "int8"
        if "int8" in caps.precisions:
            log.decide(f"{stage}_precision", "int8", f"INT8 {stage} IR on disk and the CPU "
                       "has " + ("AMX-INT8" if probe.amx else "VNNI") + " dot products")
        else:
            log.decide(f"{stage}_precision", "int8", f"INT8 {stage} IR on disk (no VNNI/AMX)")
            log.warnings.append(f"INT8 {stage} IR on disk but no VNNI/AMX: int8 runs slowly "
                                "here; serve an fp32/fp16 conversion instead")
    quantized = llm_w in ("int8", "int4") or any(prec.get(s) == "int8"
                                                 for s in INT8_COMPUTE_STAGES)
    if quantized and compute == "fp32" and "bf16" in caps.precisions and not override:
        prec["vocoder"] = "bf16"
        log.decide("vocoder_precision", "bf16",
                   f"a quantized dir is served (its audio is already not bit-exact to fp32): "
                   f"HiFT in bf16 on {unit} measured ~2x faster at ~47 dB SNR vs fp32 "
                   "(docs/performance.md)")
    if prec.get("vocoder") == "bf16" and prec.get("estimator") == "int8":
        prec["estimator_activations"] = "bf16"
        log.decide("estimator_activations", "bf16",
                   "INT8 estimator IR: its non-quantized ops (norms, softmax, time embedding, "
                   f"first/last convolutions) in bf16 on {unit}, measured 5-7 % faster per call "
                   "at 52.9 vs 53.6 dB estimator SNR vs fp32 (docs/performance.md)")
    if quantized and compute == "fp32" and not override and fp32_only:
        log.decide("kv_cache_precision", "f32",
                   "a quantized dir is served, but the u8 KV cache was measured faster only on "
                   "CPUs with AVX-512 VNNI/BF16 (docs/performance.md): f32 here")
    elif quantized and compute == "fp32" and not override:
        prec["kv_cache"] = "u8"
        if llm_w == "int4":
            why = ("a quantized dir is served: with its INT4 LLM a u8 KV cache took 0.95x the "
                   "time of an f32 cache per decode step, logp within 4.5e-4 of it (AMD Zen 4, "
                   "one interleaved A/B); with the INT8 LLM u8 measured 29.2 vs 32.8 ms/token, "
                   "top-1 agreement with fp32 1.000 either way; and a quarter of the memory "
                   "(docs/performance.md)")
        else:
            why = ("a quantized dir is served: for the INT8 LLM a u8 KV cache measured 29.2 "
                   "ms/token vs 32.8 with f32, top-1 agreement with fp32 1.000 either way "
                   "(mean KL 7.7e-8 with u8 vs 7.3e-8 with f32), and less memory "
                   "(docs/performance.md)")
        log.decide("kv_cache_precision", "u8", why)
    return prec


#: planner component -> the `cosyvino quantize` report variant (and floor) of its static INT8
#: stage (docs/quantization.md, "Per machine: the record and the accuracy floors")
_REPORT_SCOPE = {"flow": "flow_encoder", "estimator": "estimator", "vocoder": "vocoder"}
#: LLM weight precision -> rank of a dir offered instead of static INT8 (lower first): an
#: INT8-weight LLM is fast without int8 dot products (weights are widened to f32 before the
#: multiply; decoding is memory-bound), INT4 trades more accuracy for speed
_LLM_RANK = {"int8": 0, "int4": 1}


def _int8_stages(cap: Capabilities) -> list[str]:
    return [s for s in INT8_COMPUTE_STAGES if cap.weight_precisions.get(s) == "int8"]


def _served_dir(probe: Probe, cap: Capabilities) -> str:
    return cap.load_dir or probe.model.get("dir", "")


def _int8_compute_choice(probe: Probe, backend_cls, cap: Capabilities, log: _Log
                         ) -> Capabilities:
    """On a CPU without int8 dot products (:data:`INT8_DOT_FLAGS`), the backend's served dir
    with static INT8 compute stages is swapped for another conversion of the same model
    without them (:func:`~.inventory.conversion_variants`: an INT8/INT4-LLM dir first, else the
    fp32 dir), asked from the backend like the first; one decision ``int8_compute`` says what
    and why. Kept, with the reason, when there is none or the dir was given explicitly (the
    model dir is the quantized dir itself). Elsewhere (VNNI, AMX) ``cap`` is returned as is."""
    from .inventory import conversion_variants

    stages = _int8_stages(cap)
    if not stages or int8_dot_products(probe.flags):
        return cap
    served = _served_dir(probe, cap)
    kind = machine_kind(probe.flags)
    why = (f"no int8 dot products on this CPU ({probe.isa_summary()}, kind {kind}: no VNNI or "
           f"AMX-INT8): the static INT8 {' and '.join(stages)} of {served} would run on "
           "VPMADDUBSW kernels (16-bit saturating sums), measured on an AVX2-only Zen 3 10 % "
           "slower than fp32 and 13 dB less accurate (estimator SNR 38.5 vs 51.7 dB with "
           "AVX-512 VNNI)")
    model = probe.model or {}
    explicit = bool(model.get("converted_dir")) and os.path.realpath(
        model.get("dir") or "") == os.path.realpath(served)
    if explicit:
        log.decide("int8_compute", "int8 (as given)",
                   f"{why}; kept because the model dir is the quantized dir itself (pass the "
                   "model dir above it to let the planner choose)")
        return cap
    options = []
    for d in conversion_variants(served):
        try:
            c = backend_cls.capabilities(d, probe)
        except Exception:  # noqa: BLE001  a plugin's self-description must not break planning
            continue
        if not isinstance(c, Capabilities) or not c.ready or _int8_stages(c):
            continue
        c = dataclasses.replace(c, load_dir=c.load_dir or d)
        llm = c.weight_precisions.get("llm", "fp32")
        options.append((_LLM_RANK.get(llm, len(_LLM_RANK)), os.path.basename(d), c, llm))
    if not options:
        log.decide("int8_compute", "int8", f"{why}; served anyway: no conversion of this model "
                   f"without static INT8 next to it (`cosyvino convert` writes the fp32 "
                   "`openvino/`, `cosyvino quantize --preset int8-llm-only` an INT8-LLM dir)")
        return cap
    _, name, alt, llm = min(options, key=lambda o: o[:2])
    keeps = (f"its LLM keeps {llm.upper()} weights (weight-only: fast without dot products)"
             if llm in _LLM_RANK else
             "every stage in fp32 (`cosyvino quantize --preset int8-llm-only` adds an "
             "INT8-weight LLM, which suits this CPU)")
    log.decide("int8_compute", f"not served: {name}",
               f"{why}; serving {alt.load_dir} instead: {keeps}")
    return dataclasses.replace(alt, reason=f"{alt.reason}, chosen over {served} for this CPU")


def _quantized_accuracy(probe: Probe, served: str, prec: dict, log: _Log) -> None:
    """What `cosyvino quantize` recorded about the served dir's INT8 stages: a decision
    ``int8_accuracy`` with the measured SNR per stage and the machine it was measured on, and
    a warning when that machine was another kind (:func:`machine_kind`) or a stage was kept
    below its floor (``--keep-below-floor``)."""
    from .inventory import quantization_record

    stages = [s for s in INT8_COMPUTE_STAGES if prec.get(s) == "int8"]
    if not stages:
        return
    q = quantization_record(served)
    scopes = ((q.get("accuracy") or {}).get("audio") or {}).get("scopes") or {}
    snrs = [f"{s} {scopes[_REPORT_SCOPE[s]]['mean_snr_db']:.1f} dB" for s in stages
            if isinstance(scopes.get(_REPORT_SCOPE[s]), dict)
            and isinstance(scopes[_REPORT_SCOPE[s]].get("mean_snr_db"), (int, float))]
    machine = q.get("machine") if isinstance(q.get("machine"), dict) else None
    here = machine_kind(probe.flags)
    measured = ", ".join(snrs) + " SNR vs fp32" if snrs else "no accuracy report recorded"
    if machine is None:
        log.decide("int8_accuracy", "unknown machine",
                   f"{measured}; the dir does not record the machine it was measured on "
                   "(quantized before cosyvino recorded it): re-run `cosyvino quantize` on "
                   "this kind of machine to measure, and guard, its INT8 stages here")
        return
    flags = machine.get("flags")
    there = machine_kind(flags) if isinstance(flags, list) else str(machine.get("kind"))
    where = f"{machine.get('cpu_model') or 'unknown CPU'} (kind {there})"
    origin = (f"measured by `cosyvino quantize` on {where}" if snrs else
              f"quantized on {where} without an audio report (`--eval-per-language 0`): "
              "its INT8 stages were not checked against their floors")
    if not snrs:
        log.decide("int8_accuracy", "not checked", f"{measured}, {origin}; this CPU: kind {here}")
        log.warnings.append(f"{served}: its INT8 {', '.join(stages)} were never checked against "
                            "the accuracy floors (quantized with --eval-per-language 0): re-run "
                            f"`cosyvino quantize --preset {q.get('preset') or 'int8'}` without "
                            "that option (its default measures 2 texts per language) to "
                            "measure and guard them")
    else:
        log.decide("int8_accuracy", "same kind" if there == here else f"measured on {there}",
                   f"{measured}, {origin}; this CPU: kind {here}")
    if there != here:
        log.warnings.append(f"{served} was quantized and its accuracy measured on {where}, "
                            f"another kind of machine than this one ({here}): int8 kernels "
                            "differ by ISA (estimator SNR 51.7 dB with AVX-512 VNNI, 38.5 dB "
                            "on AVX2), so re-run `cosyvino quantize` here to measure and "
                            "guard it on this machine")
    floors = q.get("floors") if isinstance(q.get("floors"), dict) else {}
    kept = sorted(g for g, f in floors.items()
                  if isinstance(f, dict) and f.get("verdict") == "kept")
    if kept:
        log.warnings.append(f"{served}: INT8 {', '.join(kept)} kept below the accuracy floor "
                            "(`cosyvino quantize --keep-below-floor`)")


def _backend_options(backend_cls, probe: Probe, caps: Capabilities, goal: str, streams: int,
                     tps: int, pinning: bool, prec: dict, log: _Log,
                     keep_buffers: bool | None = None) -> dict:
    """Keyword arguments for ``Synthesizer(..., backend=backend, **options)``: the backend's own
    translation of the decisions (:meth:`cosyvino.backends.Backend.plan_options`). One that
    raises or returns no dict gets the generic names instead, with a warning."""
    decisions = {"goal": goal, "threads": streams * tps, "streams": streams,
                 "threads_per_stream": tps, "pinning": pinning, "precision": dict(prec),
                 "capabilities": caps, "smt": bool(probe.smt), "hybrid": bool(probe.hybrid)}
    if keep_buffers is not None:
        decisions["keep_buffers"] = keep_buffers
    try:
        opts = backend_cls.plan_options(dict(decisions))
        if not isinstance(opts, dict):
            raise TypeError(f"returned {type(opts).__name__}, not dict")
    except Exception as e:  # a plugin's translation must not break planning
        log.warnings.append(f"backend {backend_cls.name!r}: plan_options() failed "
                            f"({type(e).__name__}: {e}); generic option names used")
        opts = Backend.plan_options(decisions)
    return dict(opts)


def _keep_buffers(backend: str, caps: Capabilities, streams: int, mem: dict,
                  log: _Log) -> bool | None:
    """Whether the backend keeps every stage's intermediate buffers between stage calls
    (faster) instead of freeing them (less memory); None when it declares no such trade
    (``Capabilities.kept_buffer_bytes``). Kept only while the plan, buffers included, uses at
    most :data:`KEEP_BUFFERS_MAX_SHARE` of the memory budget; adds them to ``mem``."""
    if not caps.kept_buffer_bytes:
        return None
    extra = int(caps.kept_buffer_bytes) * streams
    budget = mem.get("budget_bytes")
    with_extra = mem["required_bytes"] + extra
    cost = ("streamed first chunk 0.69x, streamed synthesis 0.87x, whole 0.94x, peak RSS "
            "+267-315 MiB (AMD Zen 4, OpenVINO INT8; docs/performance.md, 'Stage buffers "
            "kept')")
    if not budget or with_extra > KEEP_BUFFERS_MAX_SHARE * budget:
        why = "memory size unknown" if not budget else (
            f"{_gib(with_extra)} with them would exceed {int(KEEP_BUFFERS_MAX_SHARE * 100)} % "
            f"of {_gib(budget)}")
        return log.decide("keep_buffers", False, f"{why}: {backend} frees each stage's "
                          f"intermediate buffers between stage calls (keeping them: {cost})")
    mem["kept_buffer_bytes"] = extra
    mem["required_bytes"] = with_extra
    row = log.decision("memory")  # the memory row counts them too
    if row is not None:
        row["value"] = f"{_gib(with_extra)} of {_gib(budget)}"
        row["reason"] += f" + {_gib(extra)} stage buffers kept (keep_buffers)"
    return log.decide("keep_buffers", True, f"{_gib(with_extra)} of {_gib(budget)} with "
                      f"them: {backend} keeps every stage's intermediate buffers (~"
                      f"{_gib(extra)}) instead of freeing and re-allocating them at each stage "
                      f"change (dozens per streamed request): {cost}")


def _overlap_stages(backend: str, caps: Capabilities, tps: int, log: _Log) -> bool:
    """Whether a request's LLM lane and flow/vocoder lane run at the same time
    (``Synthesizer(overlap_stages=)``), both on the stream's threads."""
    if not caps.thread_safe:
        return log.decide("overlap_stages", False, f"{backend}: stages are not thread-safe, so "
                          "a request's LLM and flow/vocoder hops run one after the other")
    if tps < 2:
        return log.decide("overlap_stages", False, "1 thread per stream: overlapping the LLM "
                          "with the flow/vocoder hops would only time-share it")
    return log.decide("overlap_stages", True, f"{backend} stages are thread-safe: the LLM "
                      f"decodes the next speech tokens while the flow/vocoder turn the due hop "
                      f"into audio, both on the stream's {tps} threads (the first chunk still "
                      "gets them alone); an LLM held to 1 thread was slower "
                      "(docs/performance.md, 'Token-level streaming')")


def _first_chunk_hold(goal: str, log: _Log) -> bool:
    """Whether the steps of streaming requests wait while a new request makes its first
    chunk (``Synthesizer(first_chunk_hold=)``, :class:`cosyvino.engine.Scheduler`)."""
    where = "docs/performance.md, 'Streamed batch rows and the first-chunk hold'"
    if goal == "throughput":
        return log.decide("first_chunk_hold", False, "throughput: a new request shares the "
                          "cores with the requests that already stream (the hold cost 2-5 % "
                          "of the audio per second with 4 clients on 2 cores; " + where + ")")
    return log.decide("first_chunk_hold", True, "latency: while a new request makes its first "
                      "chunk, the steps of requests that already stream (audio buffered at "
                      "their clients) wait, for at most 2 s (4 clients on 2 cores: p95 first "
                      "chunk 0.56-0.67x, at a cost of 2-5 % of the audio per second; "
                      + where + ")")


def _llm_batch(probe: Probe, backend: str, caps: Capabilities, goal: str, streams: int,
               tps: int, prec: dict, model_dir: str | None, tuned: dict | None,
               override: int | None, log: _Log, family_why: str = "") -> int:
    """Decode rows one batched LLM step advances per stream (:mod:`.batching`)."""
    from .batching import choose_llm_batch, estimate_step_cost, fit_step_cost

    if override is not None:
        if override < 1:
            raise PlanError(f"--llm-batch must be >= 1, got {override}")
        if override > 1 and caps.max_llm_batch < override:
            who = family_why or f"{backend} batches at most {caps.max_llm_batch} rows"
            log.warnings.append(f"--llm-batch {override}: {who}; the scheduler caps it there")
        return log.decide("llm_batch", override, "set by --llm-batch (override)")
    if caps.max_llm_batch <= 1:
        if family_why:
            return log.decide("llm_batch", 1, f"{family_why}: each request's step reads the "
                              "weights itself")
        return log.decide("llm_batch", 1, f"{backend} cannot batch decode steps (max_llm_batch "
                          "1): each request's step reads the weights itself")
    profile, src = _decode_profile(model_dir)
    if profile is None:
        return log.decide("llm_batch", 1, f"{src}: nothing to batch")
    cost = None
    steps = (tuned or {}).get("llm_batch_steps")
    if steps:
        try:
            cost = fit_step_cost(steps)
        except ValueError as e:
            log.warnings.append(f"--tune llm_batch_steps unusable ({e}): estimated instead")
    if cost is None:
        weights = prec.get("llm_weights") or caps.weight_precisions.get("llm", "fp32")
        if weights == "fp32" and prec.get("llm") == "bf16":
            weights = "bf16"
        sockets = max(1, probe.sockets)
        cost = estimate_step_cost(profile, weights, tps, probe.flags, probe.cpu_model,
                                  streams_per_socket=max(1, -(-streams // sockets)),
                                  kv_cache=prec.get("kv_cache", "f32"))
    batch, why = choose_llm_batch(cost, goal, caps.max_llm_batch)
    return log.decide("llm_batch", batch, f"{why} ({src})" if src else why)


#: a measured batched / concurrent estimator time at or above this turns estimator batching off
#: (the rendezvous then costs waits for no gain)
ESTIMATOR_BATCH_MIN_GAIN = 0.95


def _estimator_batch(backend: str, caps: Capabilities, streams: int, max_sessions: int,
                     override: int | None, tuned: dict | None, log: _Log,
                     family_why: str = "") -> int:
    """Concurrent requests whose equal-shape estimator calls run as one call
    (:class:`cosyvino.engine.rendezvous.CallRendezvous`)."""
    per_stream = max_sessions // max(1, streams)
    if override is not None:
        if override < 1:
            raise PlanError(f"--estimator-batch must be >= 1, got {override}")
        n, why = override, "set by --estimator-batch (override)"
        if n > 1 and caps.max_estimator_batch < n:
            n = max(1, caps.max_estimator_batch)
            why += (f", capped at {n}: {family_why}" if family_why else
                    f", capped at {n}: {backend} takes at most {n} request(s) per estimator "
                    "call")
        if n > 1 and per_stream < n:
            log.warnings.append(f"--estimator-batch {n}: only {per_stream} session(s) per stream "
                                f"({max_sessions} on {streams} stream(s)), so at most "
                                f"{per_stream} request(s) can share an estimator call"
                                + ("; it has no effect" if per_stream < 2 else ""))
        return log.decide("estimator_batch", n, why)
    if caps.max_estimator_batch <= 1:
        return log.decide("estimator_batch", 1, family_why or f"{backend} takes one request "
                          "per estimator call (max_estimator_batch 1)")
    if per_stream < 2:
        return log.decide("estimator_batch", 1, f"{max_sessions} session(s) on {streams} "
                          "stream(s): no two requests share a stream's cores, nothing to batch")
    n = min(per_stream, caps.max_estimator_batch)
    measured = (tuned or {}).get("estimator_batch")
    if isinstance(measured, dict) and isinstance(measured.get("ratio"), (int, float)):
        ratio, frames = float(measured["ratio"]), measured.get("frames", "?")
        if ratio >= ESTIMATOR_BATCH_MIN_GAIN:
            return log.decide("estimator_batch", 1, f"--tune: one batched call of two requests "
                              f"took {ratio:.2f}x the time of their two calls at once "
                              f"({frames} frames): no gain here")
        return log.decide("estimator_batch", n, f"{per_stream} requests per stream; --tune: one "
                          f"batched call of two requests took {ratio:.2f}x the time of their "
                          f"two calls at once ({frames} frames); equal-length hops share it, a "
                          "lone request never waits")
    return log.decide(
        "estimator_batch", n,
        f"{per_stream} requests per stream: flow hops of equal length (the same streaming "
        "schedule and token count) share one estimator call instead of time-sharing the "
        "stream's cores; measured 0.72-0.77x the time of two calls at once (2 cores, AVX2, "
        "fp32) and 0.71-0.91x of two calls in turn (AMX Xeon, INT8), same rows, but no gain "
        "in the load test on an AVX-512 Zen 4 (INT8): not measured on this machine, "
        "`cosyvino plan --tune` measures it; a lone request never waits (docs/performance.md, "
        "'Batched estimator calls across requests')")


def _family_limits(probe: Probe, model_dir: str | None) -> tuple[str | None, dict]:
    """(family name or None, its :meth:`~cosyvino.families.base.ModelFamily.batch_limits`):
    the family the inventory recorded, else the one that recognizes ``model_dir``; ``{}``
    when none is known (the backend's capabilities decide)."""
    from ..families import family_classes, recognized_family

    name = (probe.model or {}).get("family") or (recognized_family(model_dir)
                                                 if model_dir else None)
    cls = family_classes().get(name) if name else None
    if cls is None:
        return name, {}
    try:
        limits = dict(cls.batch_limits() or {})
    except Exception:  # noqa: BLE001 - a family's self-description must not break planning
        limits = {}
    return name, {k: int(v) for k, v in limits.items() if isinstance(v, int) and v >= 1}


def _family_capped(caps: Capabilities, family: str | None, limits: dict
                   ) -> tuple[Capabilities, dict[str, str]]:
    """``caps`` with ``max_llm_batch`` / ``max_estimator_batch`` lowered to the family's
    limits, and {decision: the reason clause} for each limit that lowered one."""
    why: dict[str, str] = {}
    changes = {}
    for key, field in (("llm_batch", "max_llm_batch"), ("estimator_batch",
                                                         "max_estimator_batch")):
        lim = limits.get(key)
        if lim is not None and lim < getattr(caps, field):
            changes[field] = lim
            what = ("decode one request's row per step" if key == "llm_batch"
                    else "take one request per estimator call")
            why[key] = (f"the {family} stages {what} on every backend ({field} {lim})"
                        if lim == 1 else f"the {family} stages batch at most {lim} "
                        f"({field})")
    return (dataclasses.replace(caps, **changes) if changes else caps), why


def _decode_profile(model_dir: str | None):
    """(the model's decode profile or None, a note on where it came from)."""
    from .batching import DEFAULT_PROFILE

    try:
        from ..families import detect_family

        family = detect_family(model_dir)
        profile = family.decode_profile(family.read_config(model_dir))
    except Exception:  # model not on disk yet (or unreadable): the 300M default
        return DEFAULT_PROFILE, "model config not readable: CosyVoice-300M's decoder assumed"
    if profile is None:
        return None, f"family {family.name} has no token decoder"
    return profile, ""


def _reference_estimate(probe: Probe, model_dir: str | None, caps: dict[str, Capabilities],
                        classes: dict) -> tuple[str, Capabilities] | None:
    """(name, capabilities) of the first reference backend with a resident-memory estimate
    for ``model_dir`` (it loads the checkpoint itself, so its estimate is the checkpoint's
    size); asked even when it is not usable here, since the files are what counts."""
    for name in sorted(n for n in classes if _is_reference(classes, n)):
        c = caps.get(name)
        if c is None:
            c = backend_capabilities([name], model_dir, probe)[0].get(name)
        if c is not None and c.resident_bytes:
            return name, c
    return None


def _budget_source(probe: Probe, memory_limit: int | None) -> str:
    """Where the memory budget comes from, for messages."""
    if memory_limit:
        return "--memory-limit"
    return "the cgroup limit" if probe.mem_limit else "the machine"


def _memory(probe: Probe, backend: str, caps: Capabilities, reference, sessions: int,
            memory_limit: int | None, log: _Log) -> tuple[int, dict]:
    """``reference``: None or (name, capabilities) of :func:`_reference_estimate`, used when
    ``caps`` has no estimate."""
    if caps.resident_bytes:
        weights = int(caps.resident_bytes)
        src = caps.resident_basis or f"{backend}'s estimate"
    elif reference is not None:
        name, ref = reference
        weights, src = int(ref.resident_bytes), ref.resident_basis or f"{name}'s estimate"
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
            f"runtime) but {_budget_source(probe, memory_limit)} leaves {_gib(usable)} usable "
            f"({int(MEMORY_HEADROOM * 100)}% of {_gib(budget)}). "
            # rounded up to 0.1 GiB, so the printed minimum is itself enough
            + (f"It needs at least {math.ceil(need(1) / MEMORY_HEADROOM / 2**30 * 10) / 10:.1f} GiB"
               + (" (--memory-limit)" if memory_limit else
                  "; raise the limit, or pass --memory-limit if the detected one is wrong")))
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
              memory_limit: int | None = None, tuned: dict | None = None,
              llm_batch: int | None = None, estimator_batch: int | None = None) -> Plan:
    """Decide backend, threads, streams, pinning, precision, sessions and queue for ``probe``.

    Args:
        probe: from :func:`cosyvino.planner.probe` (or a fixture). Its ``backends`` and
            ``model`` are filled here when empty (installed plugins; ``model_dir`` inventory).
        model_dir: the model to serve (None = the default model dir).
        goal: "latency" (fastest single request) or "throughput" (most requests per second).
        backend/threads/streams/pinning/sessions/queue/precision/shared_host/memory_limit:
            overrides, each recorded as the reason of its decision (see docs/planner.md).
            ``threads`` is the total; ``precision`` the compute precision (fp32/bf16).
        tuned: measured facts from :mod:`cosyvino.planner.tune` (e.g. estimator_bf16_faster,
            llm_batch_steps).
        llm_batch: override of the decode batch (:mod:`cosyvino.planner.batching`).
        estimator_batch: override of the requests per batched estimator call.

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
    from ..plugins import backend_classes

    classes = backend_classes()
    log = _Log()
    log.warnings.extend(probe.warnings)
    inv_dir = probe.model.get("dir", model_dir)
    caps = _candidates(probe, inv_dir, classes, log)
    be, cap = _choose_backend(probe, backend, caps, classes, log)
    # a backend the probe names but this process has not registered (a recorded probe) gets
    # the generic option names
    be_cls = classes.get(be, Backend)
    cap = _int8_compute_choice(probe, be_cls, cap, log)
    budget = _thread_budget(probe, log)
    n_streams, tps = _layout(probe, be, cap, goal, budget, threads, streams, log)
    prec = _precision(probe, be, cap, tuned, precision, log)
    _quantized_accuracy(probe, _served_dir(probe, cap), prec, log)

    # the family's stages may batch less than the backend could (CosyVoice2/3: one row)
    family, limits = _family_limits(probe, inv_dir)
    cap, family_why = _family_capped(cap, family, limits)
    batch = _llm_batch(probe, be, cap, goal, n_streams, tps, prec, inv_dir, tuned, llm_batch,
                       log, family_why.get("llm_batch", ""))
    if sessions is not None:
        max_sessions = log.decide("max_sessions", sessions, "set by --sessions (override)")
    elif batch > 1:
        max_sessions = log.decide(
            "max_sessions", n_streams * batch,
            f"{n_streams} stream(s) x llm_batch {batch}: that many requests decode together in "
            "one batched step per stream (one weight read for all their tokens); their "
            "flow/vocoder hops time-share the stream")
    elif cap.streams:
        max_sessions = log.decide("max_sessions", n_streams,
                                  f"one concurrent synthesis per {be} stream (more would "
                                  "time-share the same cores and raise everyone's latency)")
    else:
        max_sessions = log.decide("max_sessions", 1, f"{be}: syntheses in one process run one "
                                                     "at a time")
    reference = None if cap.resident_bytes else _reference_estimate(probe, inv_dir, caps,
                                                                    classes)
    max_sessions, mem = _memory(probe, be, cap, reference, max_sessions, memory_limit, log)
    if batch > max(1, max_sessions // n_streams):
        batch = log.decide("llm_batch_capped", max(1, max_sessions // n_streams),
                           f"{max_sessions} session(s) on {n_streams} stream(s) (see "
                           "max_sessions / memory) leave at most that many rows per batch")
    log.decide("llm_batch_window_ms", 0,
               "continuous batching: a request joins the running batch at the next decode step "
               "after its own prefill and leaves at its end, so no step waits for company "
               "(a window would add its wait to every token of a lone request)"
               if batch > 1 else "no batching")
    est_batch = _estimator_batch(be, cap, n_streams, max_sessions, estimator_batch, tuned, log,
                                 family_why.get("estimator_batch", ""))
    if queue is not None:
        queue_size = log.decide("queue_size", queue, "set by --queue (override)")
    else:
        factor = 2 if goal == "latency" else 8
        queue_size = log.decide("queue_size", max(2, factor * max_sessions),
                                f"{goal}: {factor} x sessions waiting; beyond that the server "
                                "answers 503 at once instead of letting latency grow"
                                if goal == "latency" else
                                f"{goal}: {factor} x sessions waiting, so a session never idles "
                                "for want of work; admission still refuses (503) what would "
                                "miss its deadline")
    n_online = max(1, len(probe.online_cpus))
    if host_busy(probe):
        log.warnings.append(f"load average {probe.loadavg_1m:g} on {n_online} online CPUs: "
                            "other processes are busy here; --tune measurements include "
                            "their load")
    if probe.hybrid and not probe.p_cores:
        log.warnings.append("hybrid CPU but no P-cores in the affinity set: running on E-cores")

    serve_dir = probe.model.get("dir", model_dir or "")
    if cap.load_dir and cap.load_dir != serve_dir:
        serve_dir = log.decide("model_dir", cap.load_dir, f"{be} serves {cap.load_dir}: "
                                                          f"{cap.reason}")

    overlap = _overlap_stages(be, cap, tps, log)
    # after the sessions and lanes are known: calls that run at once on a stream's cores
    # decide it too
    pin = _pinning(probe, be, cap, shared_host, pinning, log, overlap=overlap,
                   sessions=max_sessions, streams=n_streams)
    keep = _keep_buffers(be, cap, n_streams, mem, log)
    options = _backend_options(be_cls, probe, cap, goal, n_streams, tps, pin, prec, log,
                               keep_buffers=keep)
    options["overlap_stages"] = overlap
    options["first_chunk_hold"] = _first_chunk_hold(goal, log)

    from .. import __version__
    plan = Plan(
        backend=be, goal=goal, model_dir=serve_dir, backend_options=options,
        streams=n_streams, threads_per_stream=tps, pinning=pin,
        max_sessions=max_sessions, queue_size=queue_size, llm_batch=batch,
        estimator_batch=est_batch, precision=prec,
        memory=mem,
        decisions=log.decisions, warnings=log.warnings, probe=probe.to_dict(),
        tuning=dict(tuned or {}), version=PLAN_VERSION,
        created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        cosyvino_version=__version__)
    return plan
