"""Fake procfs/sysfs/cgroupfs trees for the planner tests, generated in code (small, readable,
no committed binary fixtures). Each builder returns the root directory."""

from __future__ import annotations

import os
import pathlib

BASE_FLAGS = ("fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush "
              "mmx fxsr sse sse2 ht syscall nx lm pni ssse3 sse4_1 sse4_2 popcnt aes xsave avx")
AVX2 = "fma f16c bmi1 bmi2 avx2"
AVX512 = "avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni"
SPR_EXTRA = "avx512_bf16 avx_vnni amx_bf16 avx512_fp16 amx_tile amx_int8"

GiB = 2**30


def _w(root: pathlib.Path, rel: str, text: str) -> None:
    p = root / rel.lstrip("/")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


def _ranges(cpus) -> str:
    from cosyvino.planner.topology import format_cpu_list
    return format_cpu_list(cpus)


def build(root: pathlib.Path, *, cpus: dict[int, tuple[int, int]], flags: str,
          model: str = "Intel(R) Xeon(R) Processor", nodes: dict[int, list[int]] | None = None,
          l2: str = "2048K", l3: str = "307200K", mem_total: int = 24 * GiB,
          cgroup: str = "v2", cgroup_path: str = "/", cpu_max: str | None = None,
          memory_max: str | None = None, v1_quota: tuple[int, int] | None = None,
          v1_mem: int | None = None, mount_root: str = "/", affinity=None,
          hybrid: tuple[list[int], list[int]] | None = None, loadavg: str = "0.10 0.10 0.10",
          skip: tuple[str, ...] = ()) -> pathlib.Path:
    """cpus: logical cpu -> (package, core). cgroup: "v2", "v1", "hybrid" (systemd-style v1
    controllers + empty unified v2) or "none". ``skip`` names top-level parts to leave out:
    "topology", "cpuinfo", "online", "node", "cgroup", "meminfo", "status", "mountinfo"."""
    root.mkdir(parents=True, exist_ok=True)
    online = sorted(cpus)
    if "online" not in skip:
        _w(root, "/sys/devices/system/cpu/online", _ranges(online) + "\n")
    for cpu, (pkg, core) in cpus.items():
        d = f"/sys/devices/system/cpu/cpu{cpu}"
        sib = [c for c, pc in cpus.items() if pc == (pkg, core)]
        if "topology" not in skip:
            _w(root, f"{d}/topology/physical_package_id", f"{pkg}\n")
            _w(root, f"{d}/topology/core_id", f"{core}\n")
            _w(root, f"{d}/topology/thread_siblings_list", _ranges(sib) + "\n")
        for idx, (level, ctype, size) in enumerate(((1, "Data", "48K"),
                                                    (1, "Instruction", "32K"),
                                                    (2, "Unified", l2), (3, "Unified", l3))):
            _w(root, f"{d}/cache/index{idx}/level", f"{level}\n")
            _w(root, f"{d}/cache/index{idx}/type", f"{ctype}\n")
            _w(root, f"{d}/cache/index{idx}/size", f"{size}\n")
    if "node" not in skip:
        for n, ncpus in (nodes or {0: online}).items():
            _w(root, f"/sys/devices/system/node/node{n}/cpulist", _ranges(ncpus) + "\n")
    if hybrid:
        _w(root, "/sys/devices/cpu_core/cpus", _ranges(hybrid[0]) + "\n")
        _w(root, "/sys/devices/cpu_atom/cpus", _ranges(hybrid[1]) + "\n")
    if "cpuinfo" not in skip:
        blocks = []
        for cpu in online:
            pkg, core = cpus[cpu]
            blocks.append(f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\nmodel name\t: {model}\n"
                          f"physical id\t: {pkg}\ncore id\t\t: {core}\n"
                          f"flags\t\t: {BASE_FLAGS} {flags}\n")
        _w(root, "/proc/cpuinfo", "\n".join(blocks) + "\n")
    if "meminfo" not in skip:
        _w(root, "/proc/meminfo", f"MemTotal:       {mem_total // 1024} kB\n"
                                  f"MemFree:        {mem_total // 2048} kB\n")
    if "status" not in skip:
        aff = online if affinity is None else affinity
        _w(root, "/proc/self/status", f"Name:\tpython\nCpus_allowed_list:\t{_ranges(aff)}\n")
    _w(root, "/proc/loadavg", f"{loadavg} 1/100 12345\n")
    if "cgroup" in skip or cgroup == "none":
        return root
    mounts = []
    if cgroup == "v2":
        _w(root, "/proc/self/cgroup", f"0::{cgroup_path}\n")
        mounts.append(f"30 23 0:26 {mount_root} /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 "
                      "rw,nsdelegate")
        base = "/sys/fs/cgroup"
        _w(root, f"{base}/cgroup.controllers", "cpuset cpu io memory pids\n")
        rel = cgroup_path if mount_root == "/" else cgroup_path[len(mount_root):] or "/"
        d = os.path.join(base, rel.lstrip("/"))
        if cpu_max is not None:
            _w(root, f"{base}/cpu.max", "max 100000\n")
            _w(root, f"{d}/cpu.max", cpu_max + "\n")
        if memory_max is not None:
            _w(root, f"{d}/memory.max", memory_max + "\n")
    elif cgroup in ("v1", "hybrid"):
        lines = [f"4:cpu,cpuacct:{cgroup_path}", f"3:memory:{cgroup_path}", "1:name=systemd:/"]
        if cgroup == "hybrid":
            lines.append("0::/")
            mounts.append("40 31 0:40 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw")
            _w(root, "/sys/fs/cgroup/unified/cgroup.controllers", "\n")
        _w(root, "/proc/self/cgroup", "\n".join(lines) + "\n")
        mounts.append("32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct")
        mounts.append("33 31 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory")
        quota, period = v1_quota or (-1, 100000)
        cdir = "/sys/fs/cgroup/cpu,cpuacct/" + cgroup_path.lstrip("/")
        _w(root, f"{cdir}/cpu.cfs_quota_us", f"{quota}\n")
        _w(root, f"{cdir}/cpu.cfs_period_us", f"{period}\n")
        _w(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us", "-1\n")
        _w(root, "/sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us", "100000\n")
        mdir = "/sys/fs/cgroup/memory/" + cgroup_path.lstrip("/")
        _w(root, f"{mdir}/memory.limit_in_bytes",
               f"{v1_mem if v1_mem is not None else 9223372036854771712}\n")
        _w(root, "/sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n")
    if "mountinfo" not in skip:
        _w(root, "/proc/self/mountinfo",
           "23 1 0:21 / /sys rw,nosuid - sysfs sysfs rw\n"
           "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n" + "\n".join(mounts) + "\n")
    return root


# ---- the fixture machines of issue 5 ---------------------------------------------------------
def this_machine(root):
    """2 vCPU Xeon VM: AVX-512 + VNNI + BF16, no AMX, no SMT, hybrid v1/v2 cgroups, no limits."""
    return build(root, cpus={0: (0, 0), 1: (0, 1)},
                 flags=f"{AVX2} {AVX512} avx512_bf16 avx_vnni hypervisor", cgroup="hybrid",
                 mem_total=24 * GiB)


def xeon_2s(root):
    """2 sockets x 56 cores, SMT (224 logical), AMX, 2 NUMA nodes, v2 with no limits."""
    cpus = {i: ((i % 112) // 56, i % 56) for i in range(224)}
    nodes = {0: [i for i in range(224) if cpus[i][0] == 0],
             1: [i for i in range(224) if cpus[i][0] == 1]}
    return build(root, cpus=cpus, flags=f"{AVX2} {AVX512} {SPR_EXTRA}", nodes=nodes,
                 model="Intel(R) Xeon(R) Platinum 8480+", l2="2048K", l3="107520K",
                 mem_total=512 * GiB, cgroup="v2", cpu_max="max 100000")


def container_64(root, memory_max: str = str(8 * GiB)):
    """A pod on a 64-core host: cpu.max 150000 100000 (1.5 CPUs) in its own cgroup."""
    return build(root, cpus={i: (0, i) for i in range(64)}, flags=f"{AVX2} {AVX512}",
                 mem_total=256 * GiB, cgroup="v2", cgroup_path="/kubepods/burstable/pod1/ctr",
                 cpu_max="150000 100000", memory_max=memory_max)


def laptop_hybrid(root):
    """AVX2-only laptop: 6 P-cores with SMT (CPUs 0-11) + 8 E-cores (CPUs 12-19)."""
    cpus = {i: (0, i // 2) for i in range(12)}
    cpus.update({12 + j: (0, 8 + j) for j in range(8)})
    return build(root, cpus=cpus, flags=f"{AVX2} avx_vnni", model="12th Gen Intel(R) Core(TM) "
                 "i7-1260P", l2="1280K", l3="18432K", mem_total=16 * GiB, cgroup="v2",
                 hybrid=(list(range(12)), list(range(12, 20))))


def v1_host(root):
    """cgroup v1 only: a docker container with cfs quota 4 CPUs and 8 GiB on 8 cores / 16
    threads."""
    cpus = {i: (0, i % 8) for i in range(16)}
    return build(root, cpus=cpus, flags=f"{AVX2} {AVX512}", cgroup="v1",
                 cgroup_path="/docker/abc123", v1_quota=(400000, 100000), v1_mem=8 * GiB,
                 mem_total=64 * GiB)


# ---- inventory stand-ins ---------------------------------------------------------------------
BOTH = {"openvino": {"available": True, "reason": ""}, "torch": {"available": True, "reason": ""}}
TORCH_ONLY = {"torch": {"available": True, "reason": ""}}


def model_with_irs(precisions=None, ov_bytes=1_300_000_000, torch_bytes=1_744_790_016):
    return {"dir": "/models/cosyvoice-300m-sft", "exists": True, "torch_bytes": torch_bytes,
            "openvino": {"present": True, "dirs": ["openvino"], "bytes": ov_bytes,
                         "precisions": precisions or {"llm": "fp32", "flow": "fp32",
                                                      "estimator": "fp32", "vocoder": "fp32"}}}


def model_without_irs(torch_bytes=1_744_790_016):
    return {"dir": "/models/cosyvoice-300m-sft", "exists": True, "torch_bytes": torch_bytes,
            "openvino": {"present": False, "dirs": [], "bytes": 0, "precisions": {}}}


# ---- the machine kinds of issue 16 (2-core VMs like the project's reference machines) ----------
ZEN4_AVX512 = ("avx512f avx512dq avx512ifma avx512cd avx512bw avx512vl avx512_bf16 avx512vbmi "
               "avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq")


def zen3_2c(root):
    """AVX2-only AMD Zen 3 VM: no AVX-512, no VNNI (neither AVX-512 nor AVX-VNNI), no BF16."""
    return build(root, cpus={0: (0, 0), 1: (0, 1)}, flags=f"{AVX2} hypervisor",
                 model="AMD EPYC 7B13", l2="512K", l3="32768K", mem_total=8 * GiB,
                 cgroup="none")


def zen4_2c(root):
    """AMD Zen 4 VM: AVX-512 with VNNI and BF16, no AMX."""
    return build(root, cpus={0: (0, 0), 1: (0, 1)}, flags=f"{AVX2} {ZEN4_AVX512} hypervisor",
                 model="AMD EPYC 9B14", l2="1024K", l3="32768K", mem_total=8 * GiB,
                 cgroup="none")


def spr_2c(root):
    """Sapphire Rapids Xeon VM: AVX-512, VNNI, BF16, AMX-BF16/INT8."""
    return build(root, cpus={0: (0, 0), 1: (0, 1)}, flags=f"{AVX2} {AVX512} {SPR_EXTRA}",
                 model="Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", mem_total=8 * GiB,
                 cgroup="none")


def write_ov_dir(d, file_precisions: dict, quant: dict | None = None) -> None:
    """A converted dir whose manifest records per-file stage and precision as `cosyvino
    quantize` writes them, with its ``quantization`` block when ``quant`` is given (``stages``
    filled from the non-fp32 files unless given)."""
    import json

    d.mkdir(parents=True)
    files = {}
    for stem, prec in file_precisions.items():
        for ext in (".xml", ".bin"):
            files[stem + ext] = {"digest": "0", "size": 1, "stage": stem, "precision": prec}
    manifest = {"format": 1, "files": files}
    if quant is not None:
        q = dict(quant)
        q.setdefault("stages", {s: {"precision": p, "seconds": 1.0}
                                for s, p in file_precisions.items() if p != "fp32"})
        manifest["quantization"] = q
    (d / "manifest.json").write_text(json.dumps(manifest))
