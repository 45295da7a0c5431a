"""The machine an accuracy report was measured on (``cosyvino quantize`` records it in the
manifest; ``cosyvino plan`` compares it with the machine it plans for). No openvino, nncf or
torch: the planner's probe of ``/proc/cpuinfo`` and the environment.

INT8 kernels differ by ISA (VNNI / AMX dot products, or 16-bit saturating pair sums without
them), so the same quantized IRs score differently on different CPUs; the record says which
kind of CPU the numbers belong to (:func:`cosyvino.planner.rules.machine_kind`).
"""

from __future__ import annotations

import os

#: the ISA flags named in the record (flag -> present), the ones that decide which int8 and
#: bf16 kernels run
RECORDED_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_int8",
                  "amx_bf16")
#: environment variables that cap the ISA the runtime dispatches to: oneDNN's (OpenVINO's CPU
#: plugin kernels built on it) and the CPU plugin's own (OpenVINO 2026; both must be set
#: together, openvinotoolkit/openvino#36980). Values: oneDNN ``cpu_isa`` names, see
#: :data:`ISA_CAPS`.
ISA_CAP_ENV = ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "OV_CPU_MAX_ISA")
_AVX2 = ("avx2", "fma")
_AVX512 = _AVX2 + ("avx512f", "avx512dq", "avx512cd", "avx512bw", "avx512vl")
_AMX = ("amx_tile", "amx_int8", "amx_bf16")
#: ISA cap value (oneDNN developer guide, "CPU Dispatcher Controls") -> the cpuinfo flags the
#: kernels may still use under it (AVX-512 caps exclude AVX-VNNI, a VEX encoding: oneDNN's
#: ``avx512_core`` is not a superset of ``avx2_vnni``)
ISA_CAPS = {
    "SSE41": (), "AVX": (),
    "AVX2": _AVX2,
    "AVX2_VNNI": _AVX2 + ("avx_vnni",), "AVX2_VNNI_2": _AVX2 + ("avx_vnni",),
    "AVX512_CORE": _AVX512,
    "AVX512_CORE_VNNI": _AVX512 + ("avx512_vnni",),
    "AVX512_CORE_BF16": _AVX512 + ("avx512_vnni", "avx512_bf16"),
    "AVX512_CORE_FP16": _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16"),
    "AVX10_1_512": _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16"),
    "AVX512_CORE_AMX": _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16") + _AMX,
    "AVX10_1_512_AMX": _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16") + _AMX,
    "AVX512_CORE_AMX_FP16": _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16") + _AMX,
    "AVX10_1_512_AMX_FP16": _AVX512 + ("avx512_vnni", "avx512_bf16", "avx512_fp16") + _AMX,
}


def isa_caps(environ=None) -> dict[str, str]:
    """The ISA caps set in ``environ`` (default ``os.environ``): variable -> upper-cased value,
    ``DEFAULT`` / ``ALL`` / empty left out."""
    env = os.environ if environ is None else environ
    out = {}
    for name in ISA_CAP_ENV:
        v = str(env.get(name, "")).strip().upper()
        if v and v not in ("DEFAULT", "ALL"):
            out[name] = v
    return out


def effective_flags(flags, caps: dict[str, str]) -> list[str]:
    """``flags`` (cpuinfo names) minus what the ``caps`` (:func:`isa_caps`) forbid; an unknown
    cap value forbids nothing (recorded as given)."""
    allowed = set(flags)
    for value in caps.values():
        if value in ISA_CAPS:
            allowed &= set(ISA_CAPS[value])
    return sorted(allowed)


def machine_record(root: str = "/", environ=None) -> dict:
    """JSON-able record of this machine for an accuracy report: ``cpu_model``, ``flags`` (the
    planner's ISA flags the kernels may use: cpuinfo minus any ISA cap), ``isa_flags``
    (:data:`RECORDED_FLAGS` -> present), ``isa`` (summary), ``kind``
    (:func:`~cosyvino.planner.rules.machine_kind`) and, when set, ``isa_caps`` (the capping
    variables) with ``cpu_flags`` (the uncapped flags). ``root``: where ``/proc`` is read
    (tests)."""
    from ..planner.rules import machine_kind
    from ..planner.topology import Probe, probe_topology

    probe = probe_topology(root)
    caps = isa_caps(environ)
    flags = effective_flags(probe.flags, caps)
    rec = {"cpu_model": probe.cpu_model or "unknown", "flags": flags,
           "isa_flags": {f: f in flags for f in RECORDED_FLAGS},
           "isa": Probe(flags=flags).isa_summary(), "kind": machine_kind(flags)}
    if caps:
        rec["isa_caps"] = caps
        rec["cpu_flags"] = sorted(probe.flags)
    return rec


def describe(rec: dict) -> str:
    """One line for the summary: CPU model, kind, the recorded flags it has and lacks, caps."""
    flags = rec.get("isa_flags", {})
    have = " ".join(f for f, v in flags.items() if v) or "none of the recorded flags"
    lack = " ".join(f for f, v in flags.items() if not v)
    line = f"{rec.get('cpu_model', 'unknown')} (kind {rec.get('kind', '?')}): {have}"
    if lack:
        line += f"; without {lack}"
    if rec.get("isa_caps"):
        line += "; capped by " + ", ".join(f"{k}={v}" for k, v in rec["isa_caps"].items())
    return line
