"""What this CPU can do at most: fp32 FMA and int8 dot-product peaks by ISA, and the
``/proc/cpuinfo`` fields benchmark tables name. A leaf module (stdlib only), read by the planner
and the benchmarks.
"""

from __future__ import annotations

import os

#: fp32 FLOP per cycle per core of the vector FMA units, by ISA: 2 FMA ports x lanes x 2 (mul
#: + add). Intel: Skylake-SP and later Xeons have two 512-bit FMA ports (Intel 64 and IA-32
#: Architectures Optimization Reference Manual, "Intel AVX-512 FMA units"); AMD Zen 4 runs
#: 512-bit FMAs on two 256-bit pipes (AMD Software Optimization Guide for Zen 4, 2.11), so its
#: AVX-512 peak equals its AVX2 peak; Zen 2/3 and Intel AVX2 cores: two 256-bit FMA ports.
FMA_FLOP_PER_CYCLE = {"avx512": 64, "avx512_amd": 32, "avx2": 32, "sse": 8}


def fma_peak_gflops(flags, vendor: str, mhz: float | None, cores: int) -> tuple[float | None,
                                                                                str]:
    """fp32 FMA peak of ``cores`` cores at ``mhz`` (``/proc/cpuinfo`` "cpu MHz": the nominal
    clock in most VMs; turbo and AVX-512 down-clocking are not modelled) -> (GFLOP/s or None
    when the clock is unknown, a description such as ``AVX-512 2 x 2.0 GHz x 64``)."""
    flags = set(flags or ())
    if "avx512f" in flags:
        key, isa = ("avx512_amd" if vendor == "AuthenticAMD" else "avx512"), "AVX-512"
    elif "avx2" in flags and "fma" in flags:
        key, isa = "avx2", "AVX2"
    else:
        key, isa = "sse", "SSE"
    per = FMA_FLOP_PER_CYCLE[key]
    if not mhz:
        return None, f"{isa} x {per} FLOP/cycle (clock unknown)"
    return cores * mhz / 1e3 * per, f"{isa}: {cores} x {mhz / 1e3:.1f} GHz x {per} FLOP/cycle"


#: int8 dot products per cycle relative to fp32 FMAs: VNNI's ``vpdpbusd`` does 4 u8 x s8
#: multiply-adds per 32-bit lane where an FMA does one, on the same ports at the same
#: throughput (Intel Intrinsics Guide, ``_mm512_dpbusd_epi32``; AMD Software Optimization Guide
#: for Zen 4: AVX-512 VNNI on the 256-bit FP pipes, like its FMAs)
VNNI_OPS_PER_FMA_FLOP = 4
#: AMX-INT8 operations (2 per multiply-add) per cycle per core: TMUL does 1024 int8
#: multiply-adds per cycle (Intel 64 and IA-32 Architectures Optimization Reference Manual,
#: "Intel Advanced Matrix Extensions": 2048 INT8 ops/cycle/core)
AMX_INT8_OPS_PER_CYCLE = 2048


def int8_peak_gops(flags, vendor: str, mhz: float | None, cores: int) -> tuple[float | None,
                                                                               str]:
    """int8 dot-product peak of ``cores`` cores at ``mhz`` in GOP/s (2 ops per multiply-add):
    AMX-INT8, else VNNI (AVX-512 or AVX VNNI: :data:`VNNI_OPS_PER_FMA_FLOP` x the FMA peak of
    that vector width) -> (GOP/s, description), or (None, why) without int8 dot products (AVX2
    alone widens through ``vpmaddubsw``/``vpmaddwd``, no single peak to quote) or an unknown
    clock."""
    flags = set(flags or ())
    if "amx_int8" in flags:
        per, isa = AMX_INT8_OPS_PER_CYCLE, "AMX-INT8"
    elif "avx512_vnni" in flags and "avx512f" in flags:
        key = "avx512_amd" if vendor == "AuthenticAMD" else "avx512"
        per, isa = FMA_FLOP_PER_CYCLE[key] * VNNI_OPS_PER_FMA_FLOP, "AVX-512 VNNI"
    elif "avx_vnni" in flags:
        per, isa = FMA_FLOP_PER_CYCLE["avx2"] * VNNI_OPS_PER_FMA_FLOP, "AVX VNNI"
    else:
        return None, "no int8 dot products (VNNI/AMX)"
    if not mhz:
        return None, f"{isa} x {per} int8 ops/cycle (clock unknown)"
    return cores * mhz / 1e3 * per, f"{isa}: {cores} x {mhz / 1e3:.1f} GHz x {per} int8 ops/cycle"


def estimator_peak(weights: str | None, flags, vendor: str, mhz: float | None,
                   cores: int) -> tuple[float | None, str]:
    """The peak an estimator call is compared with: the int8 dot-product peak
    (:func:`int8_peak_gops`) for static INT8 weights (``int8-static`` in a converted dir's
    manifest), else the fp32 FMA peak (:func:`fma_peak_gflops`); (G ops/s or None, label)."""
    if weights == "int8-static":
        peak, desc = int8_peak_gops(flags, vendor, mhz, cores)
        return peak, f"int8, {desc}"
    peak, desc = fma_peak_gflops(flags, vendor, mhz, cores)
    return peak, f"fp32 FMA, {desc}"


def cpuinfo_field(name: str, root: str = "/") -> str | None:
    """The first value of ``name`` ("cpu MHz", "vendor_id", ...) in ``/proc/cpuinfo``, or
    None when absent or unreadable."""
    try:
        with open(os.path.join(root, "proc/cpuinfo"), encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() == name:
                    return value.strip()
    except OSError:
        pass
    return None


#: ISA flags a benchmark header names (the ones that change which kernels run)
HEADER_ISA = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_bf16",
              "amx_int8")


def cpu_summary(root: str = "/") -> str:
    """``MODEL NAME (isa flags)`` from ``/proc/cpuinfo`` for a benchmark table's header: the
    first "model name" and which of :data:`HEADER_ISA` the CPU has."""
    flags = set((cpuinfo_field("flags", root) or "").split())
    isa = [f for f in HEADER_ISA if f in flags]
    return f"{cpuinfo_field('model name', root) or 'unknown CPU'} ({' '.join(isa) or 'no AVX2'})"


def cpu_clock_mhz(root: str = "/") -> float | None:
    """The first "cpu MHz" of ``/proc/cpuinfo`` (None when absent)."""
    try:
        return float(cpuinfo_field("cpu MHz", root))
    except (TypeError, ValueError):
        return None
