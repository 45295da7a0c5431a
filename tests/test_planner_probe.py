"""The planner's machine probe on fake sysfs/procfs/cgroup trees, and on this machine."""

from __future__ import annotations

import os

import pytest

import planner_trees as trees
from cosyvino.planner.topology import format_cpu_list, parse_cpu_list, probe_topology


def test_cpu_list_round_trip():
    assert parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]
    assert parse_cpu_list("") == []
    assert format_cpu_list([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


def test_this_machine_shape(tmp_path):
    p = probe_topology(str(trees.this_machine(tmp_path)))
    assert (p.online_cpus, p.affinity, p.usable_cpus) == ([0, 1], [0, 1], 2)
    assert p.physical_cores == 2 and p.threads_per_core == 1 and not p.smt
    assert p.sockets == 1 and p.numa_nodes == 1
    assert p.has("avx512_vnni") and p.vnni and p.avx512 and p.bf16 and not p.amx
    assert p.cgroup_version == "hybrid" and p.cpu_quota is None and p.mem_limit is None
    assert p.l2_kb == 2048 and p.l3_kb == 307200
    assert p.mem_total == 24 * trees.GiB
    assert p.warnings == []


def test_taskset_c0_affinity_passed_in(tmp_path):
    p = probe_topology(str(trees.this_machine(tmp_path)), affinity=[0])
    assert p.affinity == [0] and p.usable_cpus == 1 and p.physical_cores == 1


def test_affinity_from_status_file(tmp_path):
    root = trees.build(tmp_path, cpus={0: (0, 0), 1: (0, 1)}, flags=trees.AVX2, affinity=[1])
    p = probe_topology(str(root))
    assert p.affinity == [1] and p.usable_cpus == 1


def test_xeon_two_sockets_smt_amx(tmp_path):
    p = probe_topology(str(trees.xeon_2s(tmp_path)))
    assert len(p.online_cpus) == 224 and p.usable_cpus == 224
    assert p.physical_cores == 112 and p.threads_per_core == 2 and p.smt
    assert p.sockets == 2 and p.numa_nodes == 2 and p.cores_per_numa_node == [56, 56]
    assert p.amx and p.amx_bf16 and p.bf16 and p.vnni
    assert p.cgroup_version == "v2" and p.cpu_quota is None
    assert p.l3_kb == 107520


def test_container_quota_found_in_own_cgroup(tmp_path):
    p = probe_topology(str(trees.container_64(tmp_path)))
    assert p.cpu_quota == 1.5
    assert p.usable_cpus == 2            # ceil(1.5)
    assert len(p.affinity) == 64 and p.physical_cores == 64
    assert p.mem_limit == 8 * trees.GiB
    assert p.cgroup_path == "/kubepods/burstable/pod1/ctr"


def test_container_with_cgroup_namespace(tmp_path):
    # inside a cgroup namespace the mount root is the container's cgroup and the process
    # sees itself at "/": limits are read at the mount point
    root = trees.build(tmp_path, cpus={i: (0, i) for i in range(8)}, flags=trees.AVX2,
                       cgroup="v2", cgroup_path="/", cpu_max="200000 100000")
    p = probe_topology(str(root))
    assert p.cpu_quota == 2.0 and p.usable_cpus == 2


def test_quota_from_parent_cgroup(tmp_path):
    root = trees.build(tmp_path, cpus={i: (0, i) for i in range(8)}, flags=trees.AVX2,
                       cgroup="v2", cgroup_path="/a/b", cpu_max="max 100000")
    (tmp_path / "sys/fs/cgroup/a/cpu.max").write_text("300000 100000\n")
    p = probe_topology(str(root))
    assert p.cpu_quota == 3.0 and p.usable_cpus == 3


def test_laptop_hybrid_pe(tmp_path):
    p = probe_topology(str(trees.laptop_hybrid(tmp_path)))
    assert p.hybrid and p.p_cores == 6 and p.e_cores == 8
    assert p.physical_cores == 14 and p.compute_cores == 6
    assert p.has("avx2") and not p.avx512 and p.vnni and not p.bf16 and not p.amx
    assert p.threads_per_core == 2


def test_v1_cgroup_host(tmp_path):
    p = probe_topology(str(trees.v1_host(tmp_path)))
    assert p.cgroup_version == "v1" and p.cgroup_path == "/docker/abc123"
    assert p.cpu_quota == 4.0 and p.usable_cpus == 4
    assert p.physical_cores == 8 and p.smt
    assert p.mem_limit == 8 * trees.GiB


def test_missing_everything_degrades_with_warnings(tmp_path):
    p = probe_topology(str(tmp_path))          # empty root
    assert p.physical_cores >= 1 and p.usable_cpus >= 1
    assert p.warnings and any("cpuinfo" in w for w in p.warnings)
    assert p.flags == [] and p.mem_total == 0


@pytest.mark.parametrize("skip", [("topology",), ("topology", "cpuinfo"), ("online",),
                                  ("node",), ("meminfo", "status"), ("mountinfo",),
                                  ("cgroup",)])
def test_missing_parts_degrade(tmp_path, skip):
    root = trees.build(tmp_path, cpus={i: (0, i // 2) for i in range(4)},
                       flags=trees.AVX2, cgroup="v2", cpu_max="200000 100000", skip=skip)
    p = probe_topology(str(root))
    assert 1 <= p.physical_cores <= len(p.affinity) <= 4
    if skip == ("topology",):               # ids from /proc/cpuinfo instead
        assert p.physical_cores == 2 and p.smt
    if skip == ("topology", "cpuinfo"):
        assert p.physical_cores == 4 and any("no topology" in w for w in p.warnings)
    if skip == ("mountinfo",):              # conventional layout assumed, still finds the quota
        assert p.cpu_quota == 2.0 and any("mountinfo" in w for w in p.warnings)
    if skip == ("cgroup",):
        assert p.cpu_quota is None and any("cgroup" in w for w in p.warnings)


def test_real_probe_is_consistent():
    p = probe_topology()
    assert 1 <= p.physical_cores <= len(p.affinity) <= len(p.online_cpus)
    assert 1 <= p.usable_cpus <= len(p.online_cpus)
    assert p.usable_cpus <= len(os.sched_getaffinity(0))
    assert set(p.affinity) <= set(p.online_cpus)
    if p.cpu_quota is not None:
        assert p.usable_cpus <= max(1, -(-p.cpu_quota // 1))
    assert p.mem_total > 0
