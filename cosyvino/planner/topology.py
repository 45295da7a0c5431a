"""Machine probe: what CPUs, caches, ISA and memory this process may really use.

Pure reads of procfs/sysfs/cgroupfs under a ``root`` directory (``/`` on a real machine, a
fixture tree in tests), plus ``os.sched_getaffinity`` when ``root`` is ``/``. Fast (no
benchmarks), Linux first. A missing or unreadable file never raises: the probe falls back to a
safe guess and records a warning naming the file. Must not import torch or openvino (the
optional OpenVINO view lives in :mod:`cosyvino.planner.inventory`).

Counting rules (see ``docs/planner.md``):

* usable logical CPUs = affinity ∩ online, then limited to ``ceil(quota)`` where the quota is
  the smallest cgroup CPU limit on the way from the process's own cgroup up to the mount root
  (v2 ``cpu.max``; v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``);
* physical cores = unique (package, core) pairs among the affinity CPUs, from
  ``/sys/devices/system/cpu/cpuN/topology`` (``/proc/cpuinfo`` ids as a fallback);
* hybrid P/E cores from ``/sys/devices/cpu_core/cpus`` and ``/sys/devices/cpu_atom/cpus``.
"""

from __future__ import annotations

import math
import os
import platform
import time
from dataclasses import asdict, dataclass, field

#: /proc/cpuinfo flags the planner cares about (kernel spelling).
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
             "avx512_bf16", "amx_tile", "amx_int8", "amx_bf16", "avx512_fp16")

#: cgroup v1 reports "no limit" as a huge number (PAGE_COUNTER_MAX * page size).
_V1_UNLIMITED = 1 << 60


def parse_cpu_list(text: str) -> list[int]:
    """``"0-3,8,10-11"`` -> ``[0, 1, 2, 3, 8, 10, 11]``; empty text -> ``[]``.

    Raises:
        ValueError: malformed list.
    """
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return sorted(cpus)


def format_cpu_list(cpus) -> str:
    """Inverse of :func:`parse_cpu_list` (compact ranges)."""
    cpus = sorted(set(cpus))
    out, i = [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def _size_kb(text: str) -> int:
    """Cache size as sysfs writes it (``"2048K"``, ``"32M"``) -> KiB."""
    t = text.strip().upper()
    mult = 1
    if t.endswith("K"):
        t = t[:-1]
    elif t.endswith("M"):
        t, mult = t[:-1], 1024
    elif t.endswith("G"):
        t, mult = t[:-1], 1024 * 1024
    return int(t) * mult


#: seconds over which the probe samples /proc/stat for :attr:`Probe.busy_cpus`
BUSY_SAMPLE_S = 0.3
#: load per online CPU above which the host counts as shared (the planner then turns pinning
#: off, :func:`cosyvino.planner.rules.host_busy`)
BUSY_LOAD = 0.5


def _cpu_jiffies(stat: str | None) -> tuple[int, int] | None:
    """``(busy, total)`` jiffies of /proc/stat's aggregate ``cpu`` line (busy = total minus
    idle and iowait; proc(5)), or None when unreadable."""
    for line in (stat or "").splitlines():
        if line.startswith("cpu "):
            try:
                v = [int(x) for x in line.split()[1:]]
            except ValueError:
                return None
            if len(v) < 5:
                return None
            total = sum(v[:8])
            return total - v[3] - v[4], total
    return None


def sample_busy_cpus(read, n_cpus: int, seconds: float = BUSY_SAMPLE_S) -> float | None:
    """CPUs kept busy over ``seconds`` (``n_cpus`` x the busy share of /proc/stat's jiffies
    between two reads by ``read(path)``); None when /proc/stat is unreadable or did not
    advance. The caller sleeps meanwhile, so this is other processes' load."""
    a = _cpu_jiffies(read("/proc/stat"))
    if a is None:
        return None
    time.sleep(seconds)
    b = _cpu_jiffies(read("/proc/stat"))
    if b is None or b[1] <= a[1]:
        return None
    return round(n_cpus * (b[0] - a[0]) / (b[1] - a[1]), 2)


@dataclass
class Probe:
    """A snapshot of the machine as this process sees it. Plain data (TOML/JSON-able).

    CPU ids are kernel logical CPU numbers. ``usable_cpus`` is the number of logical CPUs the
    process may keep busy (affinity limited by the quota, rounded up); ``cpu_quota`` is the
    quota in CPUs (e.g. 1.5) or None when unlimited; ``physical_cores`` counts cores (not SMT
    siblings) among the affinity CPUs; ``p_cores``/``e_cores`` are physical P/E cores in the
    affinity set on hybrid CPUs (both 0 otherwise). Memory in bytes; ``mem_limit`` None when no
    cgroup limit. ``loadavg_1m`` is /proc/loadavg's 1-minute figure (lags: it still counts a
    job that ended a minute ago); ``busy_cpus`` is how many CPUs other processes kept busy over
    :data:`BUSY_SAMPLE_S` seconds of the probe (/proc/stat deltas, live machine only; None when
    not measured). ``flags`` are the :data:`ISA_FLAGS` present. ``devices`` (backend name -> its
    runtime's view of the CPU), ``backends`` and ``model`` are filled by
    :mod:`cosyvino.planner.inventory` (empty when not probed).
    """

    root: str = "/"
    arch: str = ""
    cpu_model: str = ""
    online_cpus: list[int] = field(default_factory=list)
    affinity: list[int] = field(default_factory=list)
    cgroup_version: str = "none"          # "v1", "v2", "hybrid" or "none"
    cgroup_path: str = ""
    cpu_quota: float | None = None
    usable_cpus: int = 1
    physical_cores: int = 1
    threads_per_core: int = 1              # SMT siblings per core within the affinity set
    smt: bool = False
    sockets: int = 1
    numa_nodes: int = 1
    cores_per_numa_node: list[int] = field(default_factory=list)
    l2_kb: int = 0
    l3_kb: int = 0
    hybrid: bool = False
    p_cores: int = 0
    e_cores: int = 0
    p_cpus: list[int] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    mem_total: int = 0
    mem_limit: int | None = None
    loadavg_1m: float | None = None
    busy_cpus: float | None = None
    devices: dict = field(default_factory=dict)
    backends: dict = field(default_factory=dict)
    model: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    # ---- derived ISA facts -------------------------------------------------------------------
    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def avx512(self) -> bool:
        return all(self.has(f) for f in ("avx512f", "avx512bw", "avx512vl"))

    @property
    def vnni(self) -> bool:
        """Int8 dot-product instructions (AVX-512 VNNI or AVX-VNNI)."""
        return self.has("avx512_vnni") or self.has("avx_vnni")

    @property
    def bf16(self) -> bool:
        """Native bf16 compute (AVX512_BF16 or AMX-BF16)."""
        return self.has("avx512_bf16") or self.amx_bf16

    @property
    def amx(self) -> bool:
        return self.has("amx_tile") and (self.has("amx_int8") or self.has("amx_bf16"))

    @property
    def amx_bf16(self) -> bool:
        return self.has("amx_tile") and self.has("amx_bf16")

    @property
    def memory_budget(self) -> int:
        """Bytes this process may use: the cgroup limit, else total RAM (0 = unknown)."""
        if self.mem_limit and self.mem_total:
            return min(self.mem_limit, self.mem_total)
        return self.mem_limit or self.mem_total

    @property
    def compute_cores(self) -> int:
        """Physical cores worth computing on: P cores on hybrid CPUs, else all physical."""
        return self.p_cores if self.hybrid and self.p_cores else self.physical_cores

    def isa_summary(self) -> str:
        parts = []
        if self.amx:
            parts.append("AMX")
        if self.avx512:
            parts.append("AVX-512")
        elif self.has("avx2"):
            parts.append("AVX2")
        if self.has("avx512_vnni"):
            parts.append("AVX512-VNNI")
        elif self.has("avx_vnni"):
            parts.append("AVX-VNNI")
        if self.has("avx512_bf16"):
            parts.append("AVX512-BF16")
        if self.has("avx512_fp16"):
            parts.append("AVX512-FP16")
        return " ".join(parts) or "baseline x86/other"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "Probe":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


class _Reader:
    """File access under ``root`` that records what was missing instead of raising."""

    def __init__(self, root: str):
        self.root = root
        self.warnings: list[str] = []

    def path(self, p: str) -> str:
        return os.path.join(self.root, p.lstrip("/"))

    def read(self, p: str, *, warn: str | None = None) -> str | None:
        try:
            with open(self.path(p), encoding="utf-8", errors="replace") as f:
                return f.read()
        except OSError:
            if warn:
                self.warnings.append(f"{p} unreadable: {warn}")
            return None

    def exists(self, p: str) -> bool:
        return os.path.exists(self.path(p))

    def listdir(self, p: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(p)))
        except OSError:
            return []


def _cpuinfo_blocks(text: str) -> list[dict[str, str]]:
    blocks, cur = [], {}
    for line in text.splitlines():
        if not line.strip():
            if cur:
                blocks.append(cur)
                cur = {}
            continue
        if ":" in line:
            k, v = line.split(":", 1)
            cur[k.strip()] = v.strip()
    if cur:
        blocks.append(cur)
    return blocks


def _meminfo_total(text: str | None) -> int:
    for line in (text or "").splitlines():
        if line.startswith("MemTotal:"):
            parts = line.split()
            return int(parts[1]) * 1024
    return 0


# ---- cgroups ---------------------------------------------------------------------------------
def _mounts(r: _Reader) -> list[tuple[str, str, str, set[str]]]:
    """(fstype, mount root, mount point, super options) of cgroup mounts from mountinfo."""
    text = r.read("/proc/self/mountinfo")
    out = []
    for line in (text or "").splitlines():
        pre, sep, post = line.partition(" - ")
        if not sep:
            continue
        f = pre.split()
        p = post.split()
        if len(f) < 5 or len(p) < 1 or p[0] not in ("cgroup", "cgroup2"):
            continue
        opts = set(p[2].split(",")) if len(p) > 2 else set()
        out.append((p[0], f[3], f[4], opts))
    return out


def _cgroup_dir(mount_root: str, mount_point: str, path: str) -> str:
    """The directory of cgroup ``path`` inside a mount of ``mount_root`` at ``mount_point``."""
    mount_root = mount_root.rstrip("/") or "/"
    if mount_root != "/" and (path == mount_root or path.startswith(mount_root + "/")):
        path = path[len(mount_root):] or "/"
    return os.path.join(mount_point, path.lstrip("/")).rstrip("/") or "/"


def _walk_up(r: _Reader, start: str, stop: str) -> list[str]:
    """Directories from ``start`` up to ``stop`` (inclusive) that exist under the root."""
    dirs, d = [], start
    while True:
        if r.exists(d):
            dirs.append(d)
        if d.rstrip("/") == stop.rstrip("/") or d in ("/", ""):
            break
        parent = os.path.dirname(d.rstrip("/"))
        if parent == d:
            break
        d = parent
    if not dirs and r.exists(stop):
        dirs.append(stop)
    return dirs


def _v2_quota(r: _Reader, d: str) -> float | None:
    text = r.read(os.path.join(d, "cpu.max"))
    if not text:
        return None
    parts = text.split()
    if not parts or parts[0] == "max":
        return None
    period = int(parts[1]) if len(parts) > 1 else 100000
    return int(parts[0]) / period if period > 0 else None


def _v1_quota(r: _Reader, d: str) -> float | None:
    q = r.read(os.path.join(d, "cpu.cfs_quota_us"))
    p = r.read(os.path.join(d, "cpu.cfs_period_us"))
    if q is None or p is None:
        return None
    q_, p_ = int(q.strip()), int(p.strip())
    return q_ / p_ if q_ > 0 and p_ > 0 else None


def _v2_mem(r: _Reader, d: str) -> int | None:
    text = r.read(os.path.join(d, "memory.max"))
    if not text or text.strip() == "max":
        return None
    return int(text.strip())


def _v1_mem(r: _Reader, d: str) -> int | None:
    text = r.read(os.path.join(d, "memory.limit_in_bytes"))
    if not text:
        return None
    v = int(text.strip())
    return v if v < _V1_UNLIMITED else None


def _min_opt(values):
    vals = [v for v in values if v is not None]
    return min(vals) if vals else None


def _probe_cgroups(r: _Reader) -> tuple[str, str, float | None, int | None]:
    """(version, own path, cpu quota in CPUs, memory limit bytes) — smallest limits found on the
    way from the process's own cgroup(s) up to the mount roots."""
    text = r.read("/proc/self/cgroup", warn="no cgroup limits applied (assuming none)")
    if text is None:
        return "none", "", None, None
    v2_path, v1_paths = None, {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        hid, ctrls, path = parts
        if hid == "0" and ctrls == "":
            v2_path = path
        else:
            for c in ctrls.split(","):
                v1_paths[c] = path
    mounts = _mounts(r)
    if not mounts:
        # no mountinfo: assume the conventional layout
        if r.exists("/sys/fs/cgroup/cgroup.controllers"):
            mounts = [("cgroup2", "/", "/sys/fs/cgroup", set())]
        elif r.exists("/sys/fs/cgroup/cpu"):
            mounts = [("cgroup", "/", "/sys/fs/cgroup/cpu", {"cpu"}),
                      ("cgroup", "/", "/sys/fs/cgroup/memory", {"memory"})]
        if (v2_path or v1_paths):
            r.warnings.append("/proc/self/mountinfo unreadable: assumed cgroups under "
                              "/sys/fs/cgroup")
    quotas, mems, versions = [], [], set()
    own = v2_path or ""
    for fstype, mroot, mpoint, opts in mounts:
        if fstype == "cgroup2" and v2_path is not None:
            d = _cgroup_dir(mroot, mpoint, v2_path)
            if not r.exists(d):
                r.warnings.append(f"own cgroup {v2_path} not visible under {mpoint}; "
                                  "read limits at the mount root")
                d = mpoint
            dirs = _walk_up(r, d, mpoint)
            q = _min_opt(_v2_quota(r, x) for x in dirs)
            m = _min_opt(_v2_mem(r, x) for x in dirs)
            versions.add("v2")
            quotas.append(q)
            mems.append(m)
        elif fstype == "cgroup":
            for ctrl, reader, bucket in (("cpu", _v1_quota, quotas), ("memory", _v1_mem, mems)):
                if ctrl in opts and ctrl in v1_paths:
                    versions.add("v1")
                    own = own or v1_paths[ctrl]
                    d = _cgroup_dir(mroot, mpoint, v1_paths[ctrl])
                    if not r.exists(d):
                        r.warnings.append(f"own cgroup {v1_paths[ctrl]} not visible under "
                                          f"{mpoint}; read limits at the mount root")
                        d = mpoint
                    bucket.append(_min_opt(reader(r, x) for x in _walk_up(r, d, mpoint)))
    version = ("hybrid" if versions == {"v1", "v2"} else versions.pop() if versions else "none")
    return version, own or v1_paths.get("cpu", ""), _min_opt(quotas), _min_opt(mems)


# ---- the probe -------------------------------------------------------------------------------
def probe_topology(root: str = "/", *, affinity=None) -> Probe:
    """Probe CPU topology, ISA, cgroup limits and memory under ``root``.

    Args:
        root: filesystem root to read ``/proc`` and ``/sys`` from (tests pass a fixture tree).
        affinity: logical CPU ids the process may run on. None = ``os.sched_getaffinity(0)``
            when ``root`` is ``/``, else ``Cpus_allowed_list`` from ``<root>/proc/self/status``.

    Never raises for missing files; see :attr:`Probe.warnings`.
    """
    r = _Reader(root)
    pr = Probe(root=root, arch=platform.machine() if root == "/" else "")

    # online CPUs
    text = r.read("/sys/devices/system/cpu/online")
    online: list[int] = []
    if text:
        try:
            online = parse_cpu_list(text)
        except ValueError:
            r.warnings.append("/sys/devices/system/cpu/online malformed")
    if not online:
        online = sorted(int(n[3:]) for n in r.listdir("/sys/devices/system/cpu")
                        if n.startswith("cpu") and n[3:].isdigit())
    cpuinfo_text = r.read("/proc/cpuinfo", warn="ISA flags unknown (assuming none)")
    blocks = _cpuinfo_blocks(cpuinfo_text or "")
    by_cpu = {int(b["processor"]): b for b in blocks if b.get("processor", "").isdigit()}
    if not online:
        online = sorted(by_cpu) or list(range(os.cpu_count() or 1) if root == "/" else [0])
        r.warnings.append("/sys/devices/system/cpu/online unreadable: CPU list taken from "
                          "/proc/cpuinfo")
    pr.online_cpus = online

    # affinity
    if affinity is None:
        if root == "/" and hasattr(os, "sched_getaffinity"):
            affinity = sorted(os.sched_getaffinity(0))
        else:
            status = r.read("/proc/self/status") or ""
            for line in status.splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    affinity = parse_cpu_list(line.split(":", 1)[1])
            if affinity is None:
                r.warnings.append("/proc/self/status has no Cpus_allowed_list: assuming all "
                                  "online CPUs")
                affinity = online
    aff = sorted(set(affinity) & set(online)) or sorted(set(affinity)) or online
    pr.affinity = aff

    # ISA and model name (first affinity CPU's block; flags equal across cores on Linux)
    block = by_cpu.get(aff[0]) or (blocks[0] if blocks else {})
    flags = set(block.get("flags", "").split())
    pr.flags = [f for f in ISA_FLAGS if f in flags]
    pr.cpu_model = block.get("model name", "") or block.get("Model", "")
    if root != "/" and not pr.arch:
        pr.arch = "x86_64" if "sse2" in flags or pr.flags else ""

    # physical cores, sockets, SMT
    core_of: dict[int, tuple[int, int]] = {}
    missing_topo = []
    for cpu in aff:
        base = f"/sys/devices/system/cpu/cpu{cpu}/topology/"
        pkg, core = r.read(base + "physical_package_id"), r.read(base + "core_id")
        if pkg is not None and core is not None:
            core_of[cpu] = (int(pkg), int(core))
        elif cpu in by_cpu and "core id" in by_cpu[cpu]:
            core_of[cpu] = (int(by_cpu[cpu].get("physical id", 0)), int(by_cpu[cpu]["core id"]))
        else:
            missing_topo.append(cpu)
            core_of[cpu] = (-1, -1 - cpu)   # unknown: count it as its own core
    if missing_topo:
        r.warnings.append(f"no topology for CPUs {format_cpu_list(missing_topo)} in sysfs or "
                          "/proc/cpuinfo: each counted as a physical core (SMT unknown)")
    cores: dict[tuple[int, int], list[int]] = {}
    for cpu, key in core_of.items():
        cores.setdefault(key, []).append(cpu)
    pr.physical_cores = max(1, len(cores))
    pr.threads_per_core = max(len(v) for v in cores.values()) if cores else 1
    pr.smt = pr.threads_per_core > 1
    pr.sockets = max(1, len({k[0] for k in cores if k[0] >= 0}))

    # hybrid P/E
    p_text, e_text = (r.read("/sys/devices/cpu_core/cpus"), r.read("/sys/devices/cpu_atom/cpus"))
    if p_text and e_text:
        p_cpus = set(parse_cpu_list(p_text)) & set(aff)
        e_cpus = set(parse_cpu_list(e_text)) & set(aff)
        pr.hybrid = bool(p_cpus) and bool(e_cpus)
        pr.p_cpus = sorted(p_cpus)
        pr.p_cores = len({core_of[c] for c in p_cpus})
        pr.e_cores = len({core_of[c] for c in e_cpus})

    # NUMA
    nodes = [n for n in r.listdir("/sys/devices/system/node")
             if n.startswith("node") and n[4:].isdigit()]
    per_node = []
    for n in nodes:
        text = r.read(f"/sys/devices/system/node/{n}/cpulist")
        if text is None:
            continue
        cpus = set(parse_cpu_list(text)) & set(aff)
        if cpus:
            per_node.append(len({core_of[c] for c in cpus}))
    if not per_node:
        per_node = [pr.physical_cores]
        if not nodes:
            r.warnings.append("/sys/devices/system/node missing: assuming one NUMA node")
    pr.numa_nodes, pr.cores_per_numa_node = len(per_node), per_node

    # caches of the first affinity CPU
    cache = f"/sys/devices/system/cpu/cpu{aff[0]}/cache"
    for idx in r.listdir(cache):
        if not idx.startswith("index"):
            continue
        level, size = r.read(f"{cache}/{idx}/level"), r.read(f"{cache}/{idx}/size")
        ctype = (r.read(f"{cache}/{idx}/type") or "").strip()
        if level is None or size is None or ctype == "Instruction":
            continue
        try:
            if level.strip() == "2":
                pr.l2_kb = _size_kb(size)
            elif level.strip() == "3":
                pr.l3_kb = _size_kb(size)
        except ValueError:
            pass

    # cgroups: quota and memory limit
    pr.cgroup_version, pr.cgroup_path, quota, mem_limit = _probe_cgroups(r)
    pr.cpu_quota = round(quota, 4) if quota is not None else None
    pr.usable_cpus = len(aff)
    if quota is not None:
        pr.usable_cpus = max(1, min(len(aff), math.ceil(quota - 1e-9)))
    pr.mem_total = _meminfo_total(r.read("/proc/meminfo", warn="total memory unknown"))
    pr.mem_limit = mem_limit if (mem_limit and (not pr.mem_total or mem_limit < pr.mem_total)) \
        else None
    load = r.read("/proc/loadavg")
    if load:
        try:
            pr.loadavg_1m = float(load.split()[0])
        except (ValueError, IndexError):
            pass
    if root == "/" and pr.loadavg_1m is not None and pr.online_cpus:
        # only worth the wait when the lagging load average says busy
        if pr.loadavg_1m > BUSY_LOAD * len(pr.online_cpus):
            pr.busy_cpus = sample_busy_cpus(r.read, len(pr.online_cpus))
    pr.warnings = r.warnings
    return pr
