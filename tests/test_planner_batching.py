"""The planner's batch dimension (issue 17 item 4): the decode step cost model, the batch it
picks per goal, where the numbers come from (estimate, --tune measurement, override,
backend capability), sessions = streams x batch, and the plan -> serve / Synthesizer path."""

from __future__ import annotations

import numpy as np
import pytest

import planner_trees as trees
from conftest import TINY_A
from cosyvino.families import get_family
from cosyvino.families.cosyvoice1 import presets
from cosyvino.planner import PlanError, make_plan
from cosyvino.planner.batching import (DEFAULT_PROFILE, LATENCY_STEP_RATIO, StepCost,
                                       choose_llm_batch, estimate_step_cost, fit_step_cost)
from cosyvino.planner.planfile import Plan, load_plan
from cosyvino.planner.topology import probe_topology


def _probe(builder, tmp_path, *, backends=trees.BOTH, model=None):
    p = probe_topology(str(builder(tmp_path)))
    p.backends = dict(backends)
    p.model = model if model is not None else trees.model_with_irs()
    return p


def test_v1_decode_profile_of_the_300m_preset_is_the_default():
    profile = get_family("cosyvoice1").decode_profile(presets.full_300m())
    assert profile == DEFAULT_PROFILE
    # 14 blocks of 1024-d (5 d^2 + 2 d 4096) + the 1024 x 4097 head; fp32 K and V, 14 layers
    assert profile.params == 14 * (5 * 1024 ** 2 + 2 * 1024 * 4096) + 1024 * 4097
    assert profile.kv_bytes_per_position == 2 * 14 * 1024 * 4


def test_estimate_prices_weights_once_and_cache_and_flops_per_row():
    c = estimate_step_cost(DEFAULT_PROFILE, "int8", 2, ["avx2", "fma", "avx512f"])
    # 2 cores x 10 GB/s; 195 MB of int8 weights -> 9.75 ms shared
    assert c.shared_ms == pytest.approx(195.036160 / 20.0, rel=1e-9)
    # 300 positions x 114688 B at 20 GB/s + 0.39 GFLOP at 2 x 2.5 GHz x 64 x 0.2 = 64 GFLOP/s
    per_row = 300 * 114688 / 20e6 + 2 * 195_036_160 / 64e6
    assert c.per_row_ms == pytest.approx(per_row, rel=1e-9)
    fp32 = estimate_step_cost(DEFAULT_PROFILE, "fp32", 2, ["avx2", "fma", "avx512f"])
    assert fp32.shared_ms == pytest.approx(4 * c.shared_ms)
    assert fp32.per_row_ms == pytest.approx(c.per_row_ms)
    u8 = estimate_step_cost(DEFAULT_PROFILE, "int8", 2, ["avx2", "fma", "avx512f"],
                            kv_cache="u8")
    assert u8.per_row_ms == pytest.approx(c.per_row_ms - 0.75 * 300 * 114688 / 20e6)
    # AVX2 only: half the FLOP per cycle -> the compute term doubles
    avx2 = estimate_step_cost(DEFAULT_PROFILE, "int8", 2, ["avx2", "fma"])
    assert avx2.per_row_ms == pytest.approx(300 * 114688 / 20e6 + 2 * 195_036_160 / 32e6)
    # 200 cores on one socket: bandwidth is the socket's 150 GB/s, not 2000
    big = estimate_step_cost(DEFAULT_PROFILE, "int8", 200, ["avx512f"])
    assert big.shared_ms == pytest.approx(195.036160 / 150.0)
    with pytest.raises(ValueError, match="weight precision"):
        estimate_step_cost(DEFAULT_PROFILE, "int3", 2, [])
    with pytest.raises(ValueError, match="K/V cache"):
        estimate_step_cost(DEFAULT_PROFILE, "int8", 2, [], kv_cache="int2")
    with pytest.raises(ValueError, match="cores"):
        estimate_step_cost(DEFAULT_PROFILE, "int8", 0, [])


def test_choose_latency_keeps_the_step_within_the_ratio():
    cost = StepCost(10.0, 2.0, "test")          # ratio(2) 1.17, (4) 1.50, (8) 2.17
    b, why = choose_llm_batch(cost, "latency", 64)
    assert b == 4 and cost.ratio(4) <= LATENCY_STEP_RATIO < cost.ratio(8)
    assert "8 rows: ~2.17x" in why and "test" in why
    assert choose_llm_batch(cost, "latency", 2)[0] == 2        # the backend's cap
    assert choose_llm_batch(cost, "latency", 1)[0] == 1
    b, why = choose_llm_batch(StepCost(1.0, 5.0, "t"), "latency", 64)   # compute-bound
    assert b == 1 and "1 row per step (2 rows: ~" in why
    assert "1 rows" not in why  # no "a step of 1 rows ~1.00x a 1-row step"
    with pytest.raises(ValueError, match="goal"):
        choose_llm_batch(cost, "fastest", 4)


def test_choose_throughput_stops_when_a_doubling_gains_little():
    cost = StepCost(10.0, 2.0, "test")
    gains = {b: cost.request_gain(b) for b in (1, 2, 4, 8, 16)}
    b, _ = choose_llm_batch(cost, "throughput", 64)
    # doubled while requests/s rose >= 15 %: the first doubling that gains less stops it
    assert gains[b] >= 1.15 * gains[b // 2] if b > 1 else True
    assert b == 16 or gains[2 * b] < 1.15 * gains[b]
    assert b == 4 and gains[8] / gains[4] == pytest.approx(1.0957, abs=1e-3)
    # Amdahl: with all work in the LLM the gain is the token rate's
    assert cost.request_gain(4, llm_fraction=1.0) == pytest.approx(
        cost.tokens_per_s(4) / cost.tokens_per_s(1))


def test_fit_recovers_a_line_and_rejects_too_little():
    c = fit_step_cost({"1": 12.0, "2": 14.0, "4": 18.0, "8": 26.0})
    assert (c.shared_ms, c.per_row_ms) == (pytest.approx(10.0), pytest.approx(2.0))
    assert c.basis.startswith("measured by --tune: 1 rows 12.0 ms")
    with pytest.raises(ValueError, match=">= 2 batch sizes"):
        fit_step_cost({1: 3.0})
    with pytest.raises(ValueError, match="> 0"):
        fit_step_cost({1: 3.0, 2: 0.0})


def test_plan_batches_where_the_backend_can_and_sizes_sessions(tmp_path):
    p = _probe(trees.this_machine, tmp_path)
    plan = make_plan(p)
    assert plan.llm_batch == 2 and plan.max_sessions == plan.streams * 2
    assert "stream(s) x llm_batch 2" in plan.decision("max_sessions")["reason"]
    assert "estimated" in plan.decision("llm_batch")["reason"]
    assert plan.decision("llm_batch_window_ms")["value"] == 0
    # an explicit --sessions wins over streams x batch; --llm-batch is an override
    plan = make_plan(_probe(trees.this_machine, tmp_path / "b"), sessions=4, llm_batch=3)
    assert (plan.max_sessions, plan.llm_batch) == (4, 3)
    assert plan.decision("llm_batch")["reason"] == "set by --llm-batch (override)"
    # one session cannot batch: the batch follows the sessions
    plan = make_plan(_probe(trees.this_machine, tmp_path / "d"), sessions=1, llm_batch=3)
    assert (plan.max_sessions, plan.llm_batch) == (1, 1)
    assert plan.decision("llm_batch_capped")["value"] == 1
    with pytest.raises(PlanError, match="llm-batch"):
        make_plan(_probe(trees.this_machine, tmp_path / "c"), llm_batch=0)


def _caps_with(monkeypatch, **fields):
    """Every backend candidate's Capabilities with ``fields`` replaced."""
    from cosyvino.planner import rules

    real = rules._candidates

    def replaced(*a, **k):
        return {n: type(c)(**{**c.__dict__, **fields}) for n, c in real(*a, **k).items()}

    monkeypatch.setattr(rules, "_candidates", replaced)


def test_a_backend_that_cannot_batch_plans_batch_1(tmp_path, monkeypatch):
    _caps_with(monkeypatch, max_llm_batch=1)
    plan = make_plan(_probe(trees.this_machine, tmp_path))
    assert plan.llm_batch == 1 and plan.max_sessions == plan.streams
    assert "cannot batch" in plan.decision("llm_batch")["reason"]
    assert plan.decision("llm_batch_window_ms")["reason"] == "no batching"


def test_tuned_step_times_replace_the_estimate(tmp_path):
    tuned = {"llm_batch_steps": {"1": 20.0, "2": 22.0, "4": 26.0, "8": 34.0}}
    plan = make_plan(_probe(trees.this_machine, tmp_path), tuned=tuned)
    # 20 + 2 per row past the first: 8 rows cost 1.7x (> 1.5), 4 rows 1.3x
    assert plan.llm_batch == 4
    assert "measured by --tune" in plan.decision("llm_batch")["reason"]
    bad = make_plan(_probe(trees.this_machine, tmp_path / "b"),
                    tuned={"llm_batch_steps": {"1": 20.0}})
    assert "estimated" in bad.decision("llm_batch")["reason"]
    assert any("llm_batch_steps unusable" in w for w in bad.warnings)


def test_memory_caps_the_batch(tmp_path):
    plan = make_plan(_probe(trees.this_machine, tmp_path), goal="throughput",
                     memory_limit=int(4.5 * 2**30))
    # unlimited: 2 streams x 4 rows; 4.5 GiB hold 4 sessions
    assert plan.decision("max_sessions_memory")["value"] == 4
    assert (plan.max_sessions, plan.llm_batch) == (4, 2)
    assert plan.decision("llm_batch_capped")["value"] == 2


def test_llm_batch_round_trips_through_the_plan_file_and_reaches_serve(tmp_path):
    from cosyvino.server.config import settings_from_plan

    plan = make_plan(_probe(trees.this_machine, tmp_path))
    path = plan.save(str(tmp_path / "plan.toml"))
    assert load_plan(path).llm_batch == 2
    assert settings_from_plan(path)["llm_batch"] == 2
    # a plan written before the batch dimension existed loads as batch 1
    old = plan.to_dict()
    old.pop("llm_batch")
    assert Plan.from_dict(old).llm_batch == 1


def test_synthesizer_from_plan_passes_the_batch():
    from cosyvino.planner.auto import synthesizer_from_plan

    seen = {}

    class Fake:
        def __init__(self, model_dir, backend, **opts):
            seen.update(opts, backend=backend)

    plan = Plan(backend="torch", backend_options={"num_threads": 2}, streams=1,
                threads_per_stream=2, pinning=False, max_sessions=4, queue_size=8, llm_batch=4)
    synthesizer_from_plan(Fake, None, plan)
    assert seen == {"backend": "torch", "num_threads": 2, "llm_batch": 4}
    seen.clear()
    synthesizer_from_plan(Fake, None, Plan(**{**plan.__dict__, "llm_batch": 1}))
    assert "llm_batch" not in seen


def test_tune_measures_batched_steps_on_real_stages():
    from cosyvino.planner.tune import measure_llm_batch_steps
    from cosyvino.plugins import get_backend

    stages = get_backend("torch").load(str(TINY_A), num_threads=1)
    try:
        steps = measure_llm_batch_steps(stages, rows=(1, 2, 4), prefix=12, steps=2)
    finally:
        stages.close()
    assert sorted(steps) == [1, 2, 4] and all(np.isfinite(v) and v > 0 for v in steps.values())

    class NoBatch:
        max_llm_batch = 1

    assert measure_llm_batch_steps(NoBatch()) == {}


# ---- estimator batch ---------------------------------------------------------------------------
def test_estimator_batch_follows_sessions_per_stream_backend_cap_and_override(tmp_path):
    plan = make_plan(_probe(trees.this_machine, tmp_path), sessions=4, streams=1)
    assert plan.estimator_batch == 4  # 4 requests per stream, OpenVINO holds 4 per call
    assert "requests per stream" in plan.decision("estimator_batch")["reason"]
    plan = make_plan(_probe(trees.this_machine, tmp_path / "b"), sessions=1, streams=1)
    assert plan.estimator_batch == 1
    assert "nothing to batch" in plan.decision("estimator_batch")["reason"]
    plan = make_plan(_probe(trees.this_machine, tmp_path / "c"), sessions=4, streams=1,
                     estimator_batch=2)
    assert plan.estimator_batch == 2
    assert plan.decision("estimator_batch")["reason"] == "set by --estimator-batch (override)"
    with pytest.raises(PlanError, match="estimator-batch"):
        make_plan(_probe(trees.this_machine, tmp_path / "d"), estimator_batch=0)


def test_estimator_batch_from_a_backend_that_takes_one_request_per_call(tmp_path, monkeypatch):
    _caps_with(monkeypatch, max_estimator_batch=1)
    plan = make_plan(_probe(trees.this_machine, tmp_path), sessions=4, streams=1)
    assert plan.estimator_batch == 1
    assert "max_estimator_batch 1" in plan.decision("estimator_batch")["reason"]


def test_tuned_estimator_ratio_decides(tmp_path):
    gain = {"estimator_batch": {"frames": 64, "concurrent_ms": 400.0, "batched_ms": 300.0,
                                "ratio": 0.75}}
    plan = make_plan(_probe(trees.this_machine, tmp_path), sessions=2, streams=1, tuned=gain)
    assert plan.estimator_batch == 2
    assert "--tune" in plan.decision("estimator_batch")["reason"]
    none = {"estimator_batch": {"frames": 64, "ratio": 0.97}}
    plan = make_plan(_probe(trees.this_machine, tmp_path / "b"), sessions=2, streams=1,
                     tuned=none)
    assert plan.estimator_batch == 1 and "no gain" in plan.decision("estimator_batch")["reason"]


def test_estimator_batch_round_trips_and_reaches_the_synthesizer(tmp_path):
    from cosyvino.planner.auto import synthesizer_from_plan
    from cosyvino.server.config import settings_from_plan

    plan = make_plan(_probe(trees.this_machine, tmp_path), sessions=2, streams=1)
    path = plan.save(str(tmp_path / "plan.toml"))
    assert load_plan(path).estimator_batch == 2
    assert settings_from_plan(path)["estimator_batch"] == 2
    old = plan.to_dict()
    old.pop("estimator_batch")
    assert Plan.from_dict(old).estimator_batch == 1
    seen = {}

    class Fake:
        def __init__(self, model_dir, backend, **opts):
            seen.update(opts)

    synthesizer_from_plan(Fake, None, load_plan(path))
    assert seen["estimator_batch"] == 2


def test_tune_measures_the_estimator_batch_on_real_stages():
    from cosyvino.planner.tune import measure_estimator_batch
    from cosyvino.plugins import get_backend

    stages = get_backend("torch").load(str(TINY_A), num_threads=1)
    try:
        got = measure_estimator_batch(stages, frames=16, repeats=1)
    finally:
        stages.close()
    assert got["frames"] == 16 and got["concurrent_ms"] > 0 and got["batched_ms"] > 0
    assert got["ratio"] == pytest.approx(got["batched_ms"] / got["concurrent_ms"], abs=1e-3)

    class OnePerCall:
        max_estimator_batch = 1
        thread_safe = True

    assert measure_estimator_batch(OnePerCall()) is None
