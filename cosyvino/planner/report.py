"""Human-readable rendering of a plan (probe summary, decisions with reasons, warnings); the
Kubernetes manifests that match it live in :mod:`cosyvino.planner.k8s` (re-exported here). No
torch, no runtime: what a backend found is printed from the lines it recorded (``summary`` of
its device view and of its inventory section)."""

from __future__ import annotations

from .k8s import emit_k8s, k8s_resources  # noqa: F401  (the k8s output moved to k8s.py)
from .planfile import Plan
from .topology import Probe, format_cpu_list


def _gib(n) -> str:
    if not n:
        return "unknown"
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def _yn(b: bool) -> str:
    return "yes" if b else "no"


def probe_rows(p: Probe) -> list[tuple[str, str]]:
    quota = "none" if p.cpu_quota is None else f"{p.cpu_quota:g} CPUs"
    rows = [
        ("CPU", f"{p.cpu_model or 'unknown'} ({p.arch or '?'})"),
        ("ISA", p.isa_summary()),
        ("AVX-512 VNNI", _yn(p.has("avx512_vnni"))),
        ("AVX-VNNI", _yn(p.has("avx_vnni"))),
        ("AVX512-BF16", _yn(p.has("avx512_bf16"))),
        ("AMX", _yn(p.amx)),
        ("logical CPUs", f"online {format_cpu_list(p.online_cpus)}; affinity "
                         f"{format_cpu_list(p.affinity)}; usable {p.usable_cpus}"),
        ("CPU quota", f"{quota} (cgroup {p.cgroup_version}"
                      + (f" {p.cgroup_path}" if p.cgroup_path else "") + ")"),
        ("physical cores", f"{p.physical_cores} ({p.threads_per_core} thread(s)/core, SMT "
                           f"{'on' if p.smt else 'off'}), {p.sockets} socket(s), "
                           f"{p.numa_nodes} NUMA node(s)"),
    ]
    if p.hybrid:
        rows.append(("hybrid", f"{p.p_cores} P-cores (CPUs {format_cpu_list(p.p_cpus)}), "
                               f"{p.e_cores} E-cores"))
    rows += [
        ("caches", f"L2 {p.l2_kb} KiB, L3 {p.l3_kb // 1024 if p.l3_kb >= 1024 else p.l3_kb} "
                   f"{'MiB' if p.l3_kb >= 1024 else 'KiB'}"),
        ("memory", f"{_gib(p.mem_total)} total, "
                   + (f"cgroup limit {_gib(p.mem_limit)}" if p.mem_limit else "no cgroup limit")),
    ]
    for name, info in p.devices.items():
        rows.append((str(info.get("label") or name),
                     str(info.get("summary") or (f"error: {info['error']}" if info.get("error")
                                                 else "no details"))))
    rows.append(("backends", ", ".join(f"{n} ({'ok' if b.get('available') else 'unavailable'})"
                                       for n, b in sorted(p.backends.items())) or "none"))
    m = p.model or {}
    if m:
        # each backend's inventory section says in one line what it found (its "summary")
        parts = [str(v["summary"]) for v in m.values()
                 if isinstance(v, dict) and v.get("summary")]
        if not m.get("exists"):
            parts.insert(0, "not created yet")
        rows.append(("model", f"{m.get('dir') or '?'}"
                              + (f" ({'; '.join(parts)})" if parts else "")))
    return rows


def format_plan(plan: Plan) -> str:
    """The table `cosyvino plan` prints."""
    p = Probe.from_dict(plan.probe)
    out = ["machine"]
    rows = probe_rows(p)
    w = max(len(k) for k, _ in rows)
    out += [f"  {k.ljust(w)}  {v}" for k, v in rows]
    out.append("")
    out.append(f"plan (goal: {plan.goal})")
    dec = [(d["name"], str(d["value"]), d["reason"]) for d in plan.decisions]
    w1 = max(len(n) for n, _, _ in dec)
    w2 = min(24, max(len(v) for _, v, _ in dec))
    out += [f"  {n.ljust(w1)}  {v.ljust(w2)}  {r}" for n, v, r in dec]
    out.append("")
    out.append(f"  => {plan.backend}: {plan.streams} stream(s) x {plan.threads_per_stream} "
               f"thread(s) = {plan.total_threads} thread(s); pinning "
               f"{'on' if plan.pinning else 'off'}; {plan.max_sessions} session(s), queue "
               f"{plan.queue_size}; LLM decode batch {plan.llm_batch}; estimator batch "
               f"{getattr(plan, 'estimator_batch', 1)}")
    opts = ", ".join(f"{k}={v}" for k, v in plan.backend_options.items())
    if plan.llm_batch > 1:
        opts += f", llm_batch={plan.llm_batch}"
    if getattr(plan, "estimator_batch", 1) > 1:
        opts += f", estimator_batch={plan.estimator_batch}"
    out.append(f"  => Synthesizer(model_dir, backend={plan.backend!r}, {opts})")
    tuning = plan.tuning or {}
    if tuning.get("candidates"):
        out.append("")
        out.append(f"tuning ({tuning.get('seconds', 0):.0f} s, {tuning.get('tokens')} forced "
                   "speech tokens per run)")
        for c in tuning["candidates"]:
            mark = "*" if c.get("label") == tuning.get("best") else " "
            if c.get("wall_s") is not None:
                out.append(f"  {mark} {c['label']:<28} wall {c['wall_s']:.3f} s  RTF "
                           f"{c.get('rtf', 0):.3f}  load {c.get('load_s', 0):.1f} s")
            else:
                out.append(f"  {mark} {c['label']:<28} {c.get('status', 'not run')}")
    if plan.warnings:
        out.append("")
        out.append("warnings")
        out += [f"  - {x}" for x in plan.warnings]
    return "\n".join(out)
