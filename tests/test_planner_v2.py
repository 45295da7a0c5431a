"""Plans for a CosyVoice2 dir: every reason is about the v2 model (its files, its sizes, its
stages' batch limits), none names v1 files, rates or sizes; the v1 plans are unchanged
(tests/test_planner_rules.py)."""

from __future__ import annotations

import os
import shutil

import pytest

import planner_trees as trees
from cosyvino.planner import make_plan
from cosyvino.planner.inventory import model_inventory
from cosyvino.planner.topology import probe_topology

#: v1 facts a v2 plan must not state (files, sizes, rates, speakers)
V1_WORDS = ("cosyvoice.yaml", "300M", "300m", "CosyVoice-300M", "22050", "22.05", "50 Hz",
            "50 tokens", "speech_tokenizer_v1", "英文女")


def _v1_free(plan):
    text = "\n".join(f"{d['name']} {d['value']} {d['reason']}" for d in plan.decisions)
    text += "\n".join(plan.warnings)
    hits = [w for w in V1_WORDS if w in text]
    assert not hits, f"v1 words {hits} in the plan:\n{text}"


def test_inventory_of_a_v2_dir(tiny_v2_model_dir, tmp_path):
    inv = model_inventory(tiny_v2_model_dir)
    assert inv["exists"] is True and inv["family"] == "cosyvoice2"
    assert inv["torch"]["files"] == ["llm.pt", "flow.pt", "hift.pt"]
    empty = model_inventory(str(tmp_path))
    assert empty["exists"] is False and "family" not in empty  # nothing there yet
    (tmp_path / "manifest.json").write_text('{"family": "cosyvoice2"}')
    conv = model_inventory(str(tmp_path))  # a converted dir: its manifest names the family
    assert conv["exists"] is True and conv["converted_dir"] is True
    assert conv["family"] == "cosyvoice2"


def test_plan_of_a_v2_dir_with_torch(tiny_v2_model_dir, tmp_path):
    p = probe_topology(str(trees.this_machine(tmp_path)))
    p.backends = dict(trees.TORCH_ONLY)
    plan = make_plan(p, model_dir=tiny_v2_model_dir)
    assert plan.backend == "torch"
    assert "PyTorch checkpoint of cosyvoice2" in plan.decision("backend")["reason"]
    mem = plan.decision("memory")["reason"]
    # the v2 checkpoint's own files and size, not the 300M default
    assert "llm.pt + flow.pt + hift.pt + spk2info.pt of cosyvoice2" in mem
    weights = sum(os.path.getsize(os.path.join(tiny_v2_model_dir, f))
                  for f in ("llm.pt", "flow.pt", "hift.pt", "spk2info.pt"))
    assert plan.memory["weights_bytes"] == weights
    assert (plan.llm_batch, plan.estimator_batch, plan.max_sessions) == (1, 1, 1)
    _v1_free(plan)


def test_plan_of_a_converted_v2_dir_keeps_the_familys_batch_limits(tiny_v2_model_dir,
                                                                    tmp_path):
    """OpenVINO could batch 64 decode rows and 4 estimator requests for v1; the CosyVoice2
    stages step one request per call on every backend, and the plan says so."""
    p = probe_topology(str(trees.this_machine(tmp_path)))
    p.backends = dict(trees.BOTH)
    p.model = dict(trees.model_with_irs(), dir=tiny_v2_model_dir, family="cosyvoice2")
    plan = make_plan(p)
    assert plan.backend == "openvino"
    assert (plan.llm_batch, plan.estimator_batch) == (1, 1)
    assert plan.max_sessions == plan.streams
    assert plan.decision("llm_batch")["reason"].startswith(
        "the cosyvoice2 stages decode one request's row per step on every backend "
        "(max_llm_batch 1)")
    assert plan.decision("estimator_batch")["reason"] == (
        "the cosyvoice2 stages take one request per estimator call on every backend "
        "(max_estimator_batch 1)")
    forced = make_plan(p, llm_batch=4)
    assert any("--llm-batch 4: the cosyvoice2 stages decode one request's row" in w
               for w in forced.warnings)
    _v1_free(plan)


def test_v1_dir_keeps_its_batching(tmp_path):
    """The same inventory as v1 (no family recorded, no dir on disk): the backend decides."""
    p = probe_topology(str(trees.this_machine(tmp_path)))
    p.backends = dict(trees.BOTH)
    p.model = trees.model_with_irs()
    assert make_plan(p).llm_batch == 2


def test_plan_without_built_in_speakers_tunes_with_a_stand_in_voice(tiny_v2_model_dir,
                                                                     tmp_path):
    """`plan --tune` on a v2 dir without spk2info.pt: measured with a prompt voice, nothing
    written into the model dir (speakers[0] raised IndexError)."""
    pytest.importorskip("torch")
    from cosyvino import Synthesizer
    from cosyvino.planner import probe
    from cosyvino.planner.tune import tune

    d = tmp_path / "v2"
    shutil.copytree(tiny_v2_model_dir, d)
    (d / "spk2info.pt").unlink()
    p = probe(model_dir=str(d))
    p.backends = dict(trees.TORCH_ONLY)
    plan = make_plan(p, model_dir=str(d))
    rec = tune(plan, p, str(d), synthesizer=Synthesizer, seconds=30, tokens=10)
    first = rec["candidates"][0]
    assert first["status"] == "ok", first
    assert first["audio_s"] == pytest.approx(0.4)  # 10 tokens at 25 tokens/s
    assert not (d / "voices").exists()


def test_synthesizer_from_a_v2_plan_loads_the_plans_dir(tiny_v2_model_dir):
    """A plan for a v2 dir serves that dir (it was taken for a v1 dir only when it had a
    cosyvoice.yaml, so the embedded default model was loaded instead)."""
    from cosyvino.planner.auto import synthesizer_from_plan
    from cosyvino.planner.planfile import Plan

    seen = {}

    class Fake:
        def __init__(self, model_dir, backend, **opts):
            seen.update(opts, model_dir=model_dir, backend=backend)

    plan = Plan(backend="torch", backend_options={"num_threads": 2}, streams=1,
                threads_per_stream=2, pinning=False, max_sessions=1, queue_size=2,
                model_dir=tiny_v2_model_dir)
    synthesizer_from_plan(Fake, None, plan)
    assert seen["model_dir"] == tiny_v2_model_dir
    seen.clear()
    synthesizer_from_plan(Fake, None, Plan(**{**plan.__dict__, "model_dir": "/nonexistent"}))
    assert seen["model_dir"] is None  # nothing there: the default model
