"""Expected plans for the fixture machines of issue 5 (pure: fake trees + stand-in inventory)."""

from __future__ import annotations

import pytest

import planner_trees as trees
from cosyvino.planner import PlanError, make_plan
from cosyvino.planner.topology import probe_topology


def _probe(builder, tmp_path, *, backends=trees.BOTH, model=None, affinity=None):
    p = probe_topology(str(builder(tmp_path)), affinity=affinity)
    p.backends = dict(backends)
    p.model = model if model is not None else trees.model_with_irs()
    return p


def _reason(plan, name):
    return plan.decision(name)["reason"]


def _decision(plan, name):
    """The value of decision ``name``; None when the plan made none."""
    d = next((d for d in plan.decisions if d["name"] == name), None)
    return None if d is None else d["value"]


def _check_invariants(plan, probe):
    assert plan.total_threads == plan.streams * plan.threads_per_stream
    assert plan.total_threads <= probe.compute_cores
    if probe.cpu_quota is not None:
        assert plan.total_threads <= max(1, int(probe.cpu_quota))
    assert plan.backend_options["num_threads"] == plan.total_threads
    assert plan.max_sessions >= 1 and plan.queue_size >= 2
    assert plan.llm_batch >= 1
    if plan.decision("max_sessions")["reason"].startswith(f"{plan.streams} stream(s) x"):
        assert plan.max_sessions == plan.streams * plan.llm_batch
    assert all(d["reason"] for d in plan.decisions)


# ---- this machine: 2 vCPU, AVX-512 + VNNI + BF16, no AMX, no SMT -------------------------------
def test_this_machine_openvino_with_irs(tmp_path):
    p = _probe(trees.this_machine, tmp_path)
    plan = make_plan(p)
    _check_invariants(plan, p)
    assert plan.backend == "openvino" and "IRs found" in _reason(plan, "backend")
    assert (plan.streams, plan.threads_per_stream, plan.total_threads) == (1, 2, 2)
    # the process owns both CPUs, but a request's lanes (and 2 sessions) run calls at once on
    # the stream's cores: pinned, their threads could not move apart
    assert plan.pinning is False
    reason = _reason(plan, "pinning")
    assert "overlap_stages" in reason and "2 sessions share 1 stream(s)" in reason
    assert make_plan(p, pinning=True).pinning is True
    # one stream; 2 requests share its decode steps (the estimated 2-row step ~1.17x a lone one)
    assert (plan.llm_batch, plan.max_sessions, plan.queue_size) == (2, 2, 4)
    assert plan.backend_options == {"num_threads": 2, "num_streams": 1,
                                    "performance_hint": "LATENCY", "cpu_pinning": False,
                                    "precision": "f32", "kv_cache_precision": "f32",
                                    "release_intermediate_memory": False,
                                    "overlap_stages": True, "first_chunk_hold": True}
    assert "latency" in _reason(plan, "first_chunk_hold")
    assert make_plan(p, goal="throughput").backend_options["first_chunk_hold"] is False
    # bf16-capable (AVX512_BF16) but not measured: fp32, and the reason says how to change it
    assert plan.precision["estimator"] == "fp32"
    assert "AVX512_BF16" in _reason(plan, "compute_precision")
    assert "--tune" in _reason(plan, "compute_precision")


def test_this_machine_without_irs_picks_torch_and_says_why(tmp_path):
    p = _probe(trees.this_machine, tmp_path, model=trees.model_without_irs())
    plan = make_plan(p)
    assert plan.backend == "torch" and "cosyvino convert" in _reason(plan, "backend")
    assert (plan.streams, plan.threads_per_stream) == (1, 2)
    assert plan.backend_options == {"num_threads": 2, "overlap_stages": True,
                                    "first_chunk_hold": True}
    assert plan.pinning is False


def test_this_machine_without_openvino_plugin(tmp_path):
    p = _probe(trees.this_machine, tmp_path, backends=trees.TORCH_ONLY)
    plan = make_plan(p)
    assert plan.backend == "torch" and "not installed" in _reason(plan, "backend")


def test_this_machine_throughput(tmp_path):
    p = _probe(trees.this_machine, tmp_path)
    plan = make_plan(p, goal="throughput")
    _check_invariants(plan, p)
    assert (plan.streams, plan.threads_per_stream) == (2, 1)
    assert (plan.llm_batch, plan.max_sessions, plan.queue_size) == (4, 8, 64)
    assert plan.backend_options["performance_hint"] == "THROUGHPUT"


def test_taskset_c0_uses_one_thread(tmp_path):
    p = _probe(trees.this_machine, tmp_path, affinity=[0])
    for goal in ("latency", "throughput"):
        plan = make_plan(p, goal=goal)
        assert plan.total_threads == 1 and plan.streams == 1
        assert plan.max_sessions == plan.llm_batch
        assert plan.backend_options["num_threads"] == 1


# ---- 2-socket 56-core Xeon, SMT, AMX -----------------------------------------------------------
def test_xeon_latency(tmp_path):
    p = _probe(trees.xeon_2s, tmp_path)
    plan = make_plan(p)
    _check_invariants(plan, p)
    assert "SMT siblings not counted" in _reason(plan, "thread_budget")
    assert plan.decision("thread_budget")["value"] == 112
    assert plan.threads_per_stream == 16
    assert plan.streams == 6                      # 3 x 16-thread streams per 56-core node
    assert plan.pinning is False and (plan.llm_batch, plan.max_sessions) == (4, 24)
    assert "24 sessions share 6 stream(s)" in _reason(plan, "pinning")
    assert plan.backend_options["properties"] == {"ENABLE_HYPER_THREADING": False}
    assert "AMX" in _reason(plan, "compute_precision")


def test_xeon_throughput(tmp_path):
    p = _probe(trees.xeon_2s, tmp_path)
    plan = make_plan(p, goal="throughput")
    _check_invariants(plan, p)
    assert (plan.streams, plan.threads_per_stream) == (28, 4)
    assert (plan.llm_batch, plan.max_sessions, plan.queue_size) == (4, 112, 896)


def test_xeon_int8_irs(tmp_path):
    model = trees.model_with_irs({"llm": "int8", "flow": "fp32", "estimator": "int8",
                                  "vocoder": "fp32"})
    plan = make_plan(_probe(trees.xeon_2s, tmp_path, model=model))
    assert plan.precision["llm_weights"] == "int8"
    assert plan.precision["estimator"] == "int8" and "AMX" in _reason(plan,
                                                                       "estimator_precision")


def test_tuned_bf16(tmp_path):
    plan = make_plan(_probe(trees.xeon_2s, tmp_path), tuned={"bf16_faster": True})
    assert plan.precision["estimator"] == "bf16" and plan.backend_options["precision"] == "bf16"
    assert "kv_cache_precision" not in plan.backend_options


# ---- container: cpu.max 150000 100000 on a 64-core host ----------------------------------------
def test_container_quota(tmp_path):
    p = _probe(trees.container_64, tmp_path)
    plan = make_plan(p)
    _check_invariants(plan, p)
    assert plan.total_threads == 1                # floor(1.5): never exceed the quota
    assert "quota 1.5" in _reason(plan, "thread_budget")
    assert plan.pinning is False and "quota" in _reason(plan, "pinning")
    assert plan.backend_options["cpu_pinning"] is False


def test_container_memory_refusal(tmp_path):
    p = probe_topology(str(trees.container_64(tmp_path, memory_max=str(1 * trees.GiB))))
    p.backends, p.model = dict(trees.BOTH), trees.model_with_irs()
    with pytest.raises(PlanError, match="not enough memory.*cgroup limit"):
        make_plan(p)


def test_memory_limits_sessions(tmp_path):
    p = _probe(trees.xeon_2s, tmp_path)
    plan = make_plan(p, goal="throughput", memory_limit=4 * trees.GiB)
    assert plan.max_sessions < 28
    assert plan.decision("max_sessions_memory") is not None
    assert plan.memory["required_bytes"] <= 4 * trees.GiB


# ---- AVX2-only laptop with P/E cores -----------------------------------------------------------
def test_laptop_hybrid(tmp_path):
    p = _probe(trees.laptop_hybrid, tmp_path)
    plan = make_plan(p)
    _check_invariants(plan, p)
    assert plan.total_threads == 6 and plan.streams == 1
    assert "P-cores" in _reason(plan, "thread_budget")
    assert plan.backend_options["properties"] == {"ENABLE_HYPER_THREADING": False,
                                                  "SCHEDULING_CORE_TYPE": "PCORE_ONLY"}
    assert plan.precision["estimator"] == "fp32"
    assert "no AMX/AVX512_BF16" in _reason(plan, "compute_precision")


# ---- cgroup v1 host ----------------------------------------------------------------------------
def test_v1_host(tmp_path):
    p = _probe(trees.v1_host, tmp_path)
    plan = make_plan(p)
    _check_invariants(plan, p)
    assert plan.total_threads == 4 and plan.pinning is False


# ---- missing files -----------------------------------------------------------------------------
def test_empty_root_still_plans(tmp_path):
    p = _probe(lambda r: r, tmp_path, model=trees.model_without_irs())
    plan = make_plan(p)
    assert plan.total_threads >= 1 and plan.backend == "torch"
    assert any("memory check skipped" in w for w in plan.warnings)
    assert any("cpuinfo" in w for w in plan.warnings)


# ---- overrides ---------------------------------------------------------------------------------
def test_overrides_are_recorded(tmp_path):
    p = _probe(trees.this_machine, tmp_path)
    plan = make_plan(p, backend="torch", threads=1, pinning=False, sessions=3, queue=7,
                     shared_host=True)
    assert plan.backend == "torch" and "override" in _reason(plan, "backend")
    assert plan.total_threads == 1 and "override" in _reason(plan, "threads_override")
    assert (plan.max_sessions, plan.queue_size) == (3, 7)


def test_threads_and_streams_overrides_lay_out_total(tmp_path):
    p = _probe(trees.xeon_2s, tmp_path)
    plan = make_plan(p, threads=8)
    assert (plan.streams, plan.threads_per_stream) == (1, 8)
    plan = make_plan(p, threads=8, streams=4)
    assert (plan.streams, plan.threads_per_stream) == (4, 2)
    assert "override" in _reason(plan, "streams")
    plan = make_plan(_probe(trees.this_machine, tmp_path / "m"), streams=4)
    assert plan.total_threads == 4 and any("> the 2-thread budget" in w for w in plan.warnings)


def test_busy_host_turns_pinning_off(tmp_path):
    p = probe_topology(str(trees.build(tmp_path, cpus={0: (0, 0), 1: (0, 1)},
                                       flags=trees.AVX2, loadavg="1.80 1.50 1.00")))
    p.backends, p.model = dict(trees.BOTH), trees.model_with_irs()
    plan = make_plan(p, threads=1, sessions=1)  # one call at a time: only the load decides
    assert plan.pinning is False and "host busy" in _reason(plan, "pinning")
    assert make_plan(p, pinning=True).pinning is True
    # overlapping lanes: the reason that holds on a quiet host too comes first, the load after
    reason = _reason(make_plan(p), "pinning")
    assert reason.startswith("calls share a stream's cores")
    assert "also, the host was busy while planning (load average 1.8 on 2 CPUs)" in reason


def test_load_average_from_ended_work_keeps_pinning(tmp_path):
    """A high 1-minute load average whose work has ended (the probe's own /proc/stat sample
    says the CPUs are idle now, e.g. `plan` right after `convert`) does not turn pinning off;
    a sample that agrees with the average does."""
    p = probe_topology(str(trees.build(tmp_path, cpus={0: (0, 0), 1: (0, 1)},
                                       flags=trees.AVX2, loadavg="1.80 1.50 1.00")))
    p.backends, p.model = dict(trees.BOTH), trees.model_with_irs()
    p.busy_cpus = 0.1
    # one 1-thread stream, one session: no calls share its cores, so only the load decides
    plan = make_plan(p, threads=1, sessions=1)
    assert plan.pinning is True and "work that has ended" in _reason(plan, "pinning")
    assert not any("load average" in w for w in plan.warnings)
    p.busy_cpus = 1.6
    plan = make_plan(p, threads=1, sessions=1)
    assert plan.pinning is False and "1.6 busy now" in _reason(plan, "pinning")


def test_calls_sharing_a_streams_cores_turn_pinning_off(tmp_path):
    """Pinning stays on only when one call at a time runs on a stream's cores: 1-thread
    streams (no overlapping lanes) with one session each."""
    p = _probe(trees.this_machine, tmp_path)
    alone = make_plan(p, threads=1, sessions=1)
    assert alone.pinning is True and not alone.backend_options["overlap_stages"]
    lanes = make_plan(p, sessions=1)  # 2 threads: the LLM and audio lanes overlap
    assert lanes.backend_options["overlap_stages"] and lanes.pinning is False
    assert "overlap_stages" in _reason(lanes, "pinning")
    assert "sessions share" not in _reason(lanes, "pinning")
    shared = make_plan(p, threads=1, sessions=3)
    assert shared.pinning is False and _reason(shared, "pinning").startswith(
        "calls share a stream's cores: 3 sessions share 1 stream(s)")
    assert shared.backend_options["cpu_pinning"] is False
    assert make_plan(p, threads=1, sessions=3, pinning=True).pinning is True


def test_busy_cpus_sample_from_proc_stat():
    """busy CPUs = CPUs x busy share of the jiffies between two reads (idle and iowait are not
    busy); None when /proc/stat is unreadable or did not advance."""
    from cosyvino.planner.topology import sample_busy_cpus

    stats = iter(["cpu  100 0 100 800 0 0 0 0 0 0\ncpu0 1 2 3 4\n",
                  "cpu  250 0 150 1000 100 0 0 0 0 0\n"])
    # busy +200 of +500 jiffies (idle +200, iowait +100): 2 CPUs x 0.4
    assert sample_busy_cpus(lambda _: next(stats), 2, seconds=0) == 0.8
    assert sample_busy_cpus(lambda _: None, 2, seconds=0) is None
    same = "cpu  1 0 1 8 0 0 0 0 0 0\n"
    assert sample_busy_cpus(lambda _: same, 2, seconds=0) is None


def test_shared_host_turns_pinning_off(tmp_path):
    plan = make_plan(_probe(trees.this_machine, tmp_path), shared_host=True)
    assert plan.pinning is False and "--shared-host" in _reason(plan, "pinning")


def test_bad_inputs(tmp_path):
    p = _probe(trees.this_machine, tmp_path)
    with pytest.raises(PlanError, match="goal"):
        make_plan(p, goal="fast")
    with pytest.raises(PlanError, match="not installed"):
        make_plan(p, backend="onnx")
    p.backends = {"torch": {"available": False, "reason": "torch is not installed"}}
    with pytest.raises(PlanError, match="no usable backend"):
        make_plan(p)


def test_quantized_llm_dir_is_served(tmp_path):
    """`cosyvino quantize` output (openvino-int8-llm/, LLM files recorded as int8-weights) is
    found by the inventory and becomes the plan's model dir."""
    import json

    from cosyvino.planner.inventory import model_inventory

    model = tmp_path / "model"
    for sub, llm_prec in (("openvino", "fp32"), ("openvino-int8-llm", "int8-weights")):
        d = model / sub
        d.mkdir(parents=True)
        files = {"llm.xml": {"precision": llm_prec, "stage": "llm", "size": 1},
                 "llm.bin": {"precision": llm_prec, "stage": "llm", "size": 1},
                 "estimator.xml": {"precision": "fp32", "stage": "estimator", "size": 1}}
        (d / "manifest.json").write_text(json.dumps({"files": files}))
    (model / "cosyvoice.yaml").write_text("")
    inv = model_inventory(str(model))
    assert inv["openvino"]["precisions"]["llm"] == "int8"
    assert inv["openvino"]["quantized_dir"] == str(model / "openvino-int8-llm")
    plan = make_plan(_probe(trees.this_machine, tmp_path, model=inv), backend="openvino")
    assert plan.precision["llm_weights"] == "int8"
    assert plan.model_dir == str(model / "openvino-int8-llm")
    assert "INT8" in _reason(plan, "llm_weights")


def _write_ov_dir(d, file_precisions: dict, quant_stages: dict | None = None) -> None:
    """A converted dir whose manifest records per-file stage and precision as `cosyvino
    quantize` writes them (and, for a quantized dir, its ``quantization.stages``)."""
    import json

    d.mkdir(parents=True)
    files = {}
    for stem, prec in file_precisions.items():
        for ext in (".xml", ".bin"):
            files[stem + ext] = {"digest": "0", "size": 1, "stage": stem, "precision": prec}
    manifest = {"format": 1, "files": files}
    if quant_stages:
        manifest["quantization"] = {"preset": "int8", "stages": {
            s: {"precision": p, "seconds": 1.0} for s, p in quant_stages.items()}}
    (d / "manifest.json").write_text(json.dumps(manifest))


def test_int8_preset_dir_precisions_reach_the_plan(tmp_path):
    """`cosyvino quantize --preset int8` output: LLM + text encoder int8-weights, flow encoder
    and estimator int8-static, HiFT and length regulator fp16 storage. The plan's per-stage
    precision is the served dir's: flow and estimator int8, vocoder in the compute precision."""
    from cosyvino.planner.inventory import model_inventory

    model = tmp_path / "model"
    fp32 = {s: "fp32" for s in ("llm", "text_encoder", "flow_encoder", "length_regulator",
                                "estimator", "hift_f0", "hift_decode")}
    _write_ov_dir(model / "openvino", fp32)
    int8 = dict(fp32, llm="int8-weights", text_encoder="int8-weights",
                flow_encoder="int8-static", estimator="int8-static", length_regulator="fp16",
                hift_f0="fp16", hift_decode="fp16")
    _write_ov_dir(model / "openvino-int8", int8,
                  {s: p for s, p in int8.items() if p != "fp32"})
    (model / "cosyvoice.yaml").write_text("")
    inv = model_inventory(str(model))
    served = inv["openvino"]["dir_precisions"][str(model / "openvino-int8")]
    assert served == {"llm": "int8", "flow": "int8", "estimator": "int8", "vocoder": "fp16"}
    assert inv["openvino"]["dir_precisions"][str(model / "openvino")] == {
        s: "fp32" for s in ("llm", "flow", "estimator", "vocoder")}
    assert inv["openvino"]["quantized_dir"] == str(model / "openvino-int8")
    plan = make_plan(_probe(trees.this_machine, tmp_path, model=inv), backend="openvino")
    assert plan.model_dir == str(model / "openvino-int8")
    # this_machine has AMX/AVX512_BF16: with a quantized dir the vocoder runs in bf16
    assert plan.precision == {"llm_weights": "int8", "llm": "fp32", "flow": "int8",
                              "estimator": "int8", "vocoder": "bf16", "kv_cache": "u8",
                              "estimator_activations": "bf16"}
    assert plan.backend_options["kv_cache_precision"] == "u8"
    assert "u8 KV cache measured 29.2 ms/token" in _reason(plan, "kv_cache_precision")
    assert "INT4" not in _reason(plan, "kv_cache_precision")
    assert "LLM" not in _reason(plan, "vocoder_precision")  # the vocoder's own reason
    # a quantized dir is not the reference anyway: the compute reason says what f32 keeps
    assert "fp32 keeps the float stages at the reference" in _reason(plan, "compute_precision")
    assert "reference parity" not in _reason(plan, "compute_precision")
    assert "INT8 flow IR on disk" in _reason(plan, "flow_precision")
    assert "HiFT in bf16" in _reason(plan, "vocoder_precision")
    assert plan.backend_options["precision"] == "f32"
    assert plan.backend_options["stage_precision"] == {"hift_f0": "bf16", "hift_decode": "bf16",
                                                       "estimator": "bf16"}
    assert "52.9 vs 53.6 dB" in _reason(plan, "estimator_activations")
    plain = make_plan(_probe(trees.this_machine, tmp_path, model=inv), backend="openvino",
                      precision="fp32")
    assert plain.precision["vocoder"] == "fp32" and "stage_precision" not in plain.backend_options
    assert plain.backend_options["kv_cache_precision"] == "f32"  # --precision fp32: parity


def test_int4_llm_dir_reports_int4_weights(tmp_path):
    """An INT4-LLM dir: llm_weights int4 (the lowest precision of the stage wins over the fp32
    files copied next to it), flow stages in the compute precision, the vocoder in bf16."""
    from cosyvino.planner.inventory import model_inventory

    model = tmp_path / "model"
    fp32 = {s: "fp32" for s in ("llm", "flow_encoder", "estimator", "hift_decode")}
    _write_ov_dir(model / "openvino", fp32)
    _write_ov_dir(model / "openvino-int4-llm", {"text_encoder": "fp32", **fp32,
                                                 "llm": "int4-weights"}, {"llm": "int4-weights"})
    (model / "cosyvoice.yaml").write_text("")
    inv = model_inventory(str(model))
    plan = make_plan(_probe(trees.this_machine, tmp_path, model=inv), backend="openvino")
    assert plan.model_dir == str(model / "openvino-int4-llm")
    assert plan.precision["llm_weights"] == "int4" and "INT4" in _reason(plan, "llm_weights")
    assert {plan.precision[s] for s in ("flow", "estimator")} == {"fp32"}
    assert plan.precision["vocoder"] == "bf16"  # quantized dir on a bf16-capable CPU


def test_no_ready_backend_without_torch_warns_that_serving_will_fail(tmp_path):
    """OpenVINO installed but the model has no IRs, torch missing: the plan still names a
    backend (so the file is complete) but its warnings say `serve` will fail (trial finding)."""
    ov_only = {"openvino": {"available": True, "reason": ""}}
    p = _probe(trees.this_machine, tmp_path, backends=ov_only, model=trees.model_without_irs())
    plan = make_plan(p)
    assert plan.backend == "openvino" and "torch unavailable" in _reason(plan, "backend")
    assert any("no backend is ready" in w and "will fail" in w and "cosyvino[torch]" in w
               for w in plan.warnings)
    # with IRs there is nothing to warn about
    ready = make_plan(_probe(trees.this_machine, tmp_path / "b", backends=ov_only))
    assert not any("no backend is ready" in w for w in ready.warnings)


def test_int8_preset_dir_with_an_int4_llm_reaches_the_plan(tmp_path):
    """`cosyvino quantize --preset int8 --llm-weights int4` writes openvino-int8/ with an INT4
    LLM: the dir's name must not turn it into int8 (found by a fresh-user trial)."""
    from cosyvino.planner.inventory import model_inventory

    model = tmp_path / "model"
    fp32 = {s: "fp32" for s in ("llm", "text_encoder", "flow_encoder", "estimator",
                                "hift_decode")}
    _write_ov_dir(model / "openvino", fp32)
    quant = dict(fp32, llm="int4-weights", text_encoder="int8-weights",
                 flow_encoder="int8-static", estimator="int8-static")
    _write_ov_dir(model / "openvino-int8", quant, {s: p for s, p in quant.items()
                                                   if p != "fp32"})
    (model / "cosyvoice.yaml").write_text("")
    inv = model_inventory(str(model))
    served = inv["openvino"]["dir_precisions"][str(model / "openvino-int8")]
    assert served["llm"] == "int4" and served["estimator"] == "int8"
    plan = make_plan(_probe(trees.this_machine, tmp_path, model=inv), backend="openvino")
    assert plan.model_dir == str(model / "openvino-int8")
    assert plan.precision["llm_weights"] == "int4"
    assert "INT4" in _reason(plan, "llm_weights")
    # the KV cache reason says what was measured with an INT4 LLM, not only the INT8 numbers
    assert plan.precision["kv_cache"] == "u8"
    assert _reason(plan, "kv_cache_precision").startswith(
        "a quantized dir is served: with its INT4 LLM a u8 KV cache took 0.95x")
    assert "LLM" not in _reason(plan, "vocoder_precision")


def test_keep_buffers_follows_the_memory_budget(tmp_path):
    """OpenVINO declares the memory its stage buffers would keep: with memory to spare the plan
    keeps them (and counts them in its memory), on a tight budget it frees them; a backend
    declaring nothing (torch) gets no decision and no option."""
    from cosyvino.planner.rules import KEEP_BUFFERS_MAX_SHARE, _gib

    p = _probe(trees.this_machine, tmp_path)
    roomy = make_plan(p, backend="openvino")
    assert _decision(roomy, "keep_buffers") is True
    assert roomy.backend_options["release_intermediate_memory"] is False
    kept = roomy.memory["kept_buffer_bytes"]
    assert kept == 512 * 2**20 * roomy.streams
    assert "first chunk 0.69x" in _reason(roomy, "keep_buffers")
    # the memory row agrees with the plan's memory (found by a fresh-user trial)
    assert _decision(roomy, "memory").startswith(_gib(roomy.memory["required_bytes"]))
    assert "stage buffers kept" in _reason(roomy, "memory")
    need = roomy.memory["required_bytes"]  # buffers included
    tight = make_plan(p, backend="openvino",
                      memory_limit=int(need / KEEP_BUFFERS_MAX_SHARE) - 2**20)
    assert _decision(tight, "keep_buffers") is False
    assert tight.backend_options["release_intermediate_memory"] is True
    assert "kept_buffer_bytes" not in tight.memory
    assert tight.memory["required_bytes"] == need - kept
    assert "would exceed 50 %" in _reason(tight, "keep_buffers")
    assert "stage buffers" not in _reason(tight, "memory")
    torch_plan = make_plan(p, backend="torch")
    assert _decision(torch_plan, "keep_buffers") is None
    assert "release_intermediate_memory" not in torch_plan.backend_options
