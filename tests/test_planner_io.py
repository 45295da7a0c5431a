"""Plan files, machine-drift checks, k8s output, the `cosyvino plan` command,
Synthesizer.auto and --tune (on the tiny synthetic model)."""

from __future__ import annotations

import json
import os
import sys

import pytest
import yaml
from click.testing import CliRunner

import planner_trees as trees
from cosyvino.cli.main import main
from cosyvino.planner import PLAN_VERSION, Plan, PlanError, load_plan, make_plan
from cosyvino.planner.auto import PlanMismatchWarning, resolve_plan
from cosyvino.planner.planfile import _toml_loads, dumps_toml
from cosyvino.planner.report import format_plan, k8s_resources
from cosyvino.planner.topology import probe_topology


def _plan(tmp_path, builder=trees.this_machine, **kw):
    p = probe_topology(str(builder(tmp_path / "root")))
    p.backends, p.model = dict(trees.BOTH), trees.model_with_irs()
    return p, make_plan(p, **kw)


def test_toml_writer_round_trips_awkward_values():
    data = {"a": 1, "b": 2.5, "c": True, "s": 'q"uote\\ \n tab\t 中文', "l": [1, 2],
            "e": [], "t": {"x": "y", "n": {"deep": [0.5]}, "odd key": 1},
            "arr": [{"k": 1, "d": {"i": 2}}, {"k": 2}], "none": None}
    back = _toml_loads(dumps_toml(data, header="hello\nworld"))
    data.pop("none")
    assert back == data


def test_plan_file_round_trip(tmp_path):
    _, plan = _plan(tmp_path)
    path = plan.save(str(tmp_path / "sub" / "plan.toml"))
    text = open(path, encoding="utf-8").read()
    assert text.startswith("# cosyvino deployment plan")
    loaded = load_plan(path)
    assert loaded.path == path and loaded.version == PLAN_VERSION
    for key in ("backend", "backend_options", "streams", "threads_per_stream", "pinning",
                "max_sessions", "queue_size", "precision", "decisions", "goal"):
        assert getattr(loaded, key) == getattr(plan, key), key
    assert loaded.probe["affinity"] == [0, 1] and loaded.probe["flags"] == plan.probe["flags"]


def test_plan_json_and_errors(tmp_path):
    _, plan = _plan(tmp_path)
    (tmp_path / "p.json").write_text(plan.to_json())
    assert load_plan(str(tmp_path / "p.json")).backend == plan.backend
    with pytest.raises(PlanError, match="cannot read plan"):
        load_plan(str(tmp_path / "missing.toml"))
    (tmp_path / "bad.toml").write_text("backend = [\n")
    with pytest.raises(PlanError, match="not valid TOML"):
        load_plan(str(tmp_path / "bad.toml"))
    newer = dict(plan.to_dict(), version=PLAN_VERSION + 1)
    (tmp_path / "new.json").write_text(json.dumps(newer))
    with pytest.raises(PlanError, match="upgrade cosyvino"):
        load_plan(str(tmp_path / "new.json"))
    (tmp_path / "partial.toml").write_text('backend = "torch"\n')
    with pytest.raises(PlanError, match="lacks"):
        load_plan(str(tmp_path / "partial.toml"))


def test_check_machine(tmp_path):
    p, plan = _plan(tmp_path)
    assert plan.check_machine(p) == []
    moved = probe_topology(str(trees.this_machine(tmp_path / "root")), affinity=[0])
    warnings = plan.check_machine(moved)
    assert any("usable CPUs changed" in w for w in warnings)
    assert any("2 threads but only 1" in w for w in warnings)
    other = probe_topology(str(trees.xeon_2s(tmp_path / "xeon")))
    warnings = plan.check_machine(other)
    assert any("CPU flags changed" in w and "amx_tile" in w for w in warnings)
    assert any("CPU model changed" in w for w in warnings)


def test_table_and_k8s(tmp_path):
    _, plan = _plan(tmp_path, trees.container_64)
    table = format_plan(plan)
    assert "AVX-512 VNNI" in table and "AMX             no" in table
    assert "thread_budget" in table and "quota 1.5" in table
    k = k8s_resources(plan)
    assert k["resources"]["requests"]["cpu"] == k["resources"]["limits"]["cpu"] == "1"
    assert k["resources"]["limits"]["memory"].endswith("Mi")
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in k["env"]


def test_cli_plan_on_this_machine(tmp_path):
    out = tmp_path / "plan.toml"
    r = CliRunner().invoke(main, ["plan", "--model-dir", str(tmp_path / "nomodel"),
                                  "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "physical cores" in r.output and "AVX-512 VNNI" in r.output
    assert f"wrote {out}" in r.output
    plan = load_plan(str(out))
    assert plan.total_threads <= len(os.sched_getaffinity(0))
    assert plan.probe["physical_cores"] <= len(plan.probe["affinity"])


def test_cli_plan_writes_an_absolute_model_dir(tmp_path, monkeypatch):
    """A plan made with a relative --model-dir still names that dir when `serve --plan` runs
    from another working directory."""
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["plan", "--model-dir", "nomodel", "--out", "plan.toml"])
    assert r.exit_code == 0, r.output
    assert load_plan(str(tmp_path / "plan.toml")).model_dir == str(tmp_path / "nomodel")


def test_cli_json_k8s_and_refusal(tmp_path):
    r = CliRunner().invoke(main, ["plan", "--model-dir", str(tmp_path), "--no-write", "--json",
                                  "--goal", "throughput"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["goal"] == "throughput" and data["version"] == PLAN_VERSION
    r = CliRunner().invoke(main, ["plan", "--model-dir", str(tmp_path), "--no-write",
                                  "--emit", "k8s", "--threads", "1"])
    assert r.exit_code == 0, r.output
    deploy = next(d for d in yaml.safe_load_all(r.output) if d["kind"] == "Deployment")
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    assert container["resources"]["limits"]["cpu"] == "1"
    r = CliRunner().invoke(main, ["plan", "--model-dir", str(tmp_path), "--no-write",
                                  "--memory-limit", "1Gi"])
    assert r.exit_code == 2 and "not enough memory" in r.output
    # the usable share is what is compared, and the flag the user passed is named
    assert "but --memory-limit leaves 922 MiB usable (90% of 1.0 GiB)" in r.output
    assert "It needs at least 2.7 GiB (--memory-limit)" in r.output


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux only")
def test_cli_under_taskset_picks_one_thread(tmp_path):
    import subprocess

    cmd = [sys.executable, "-c",
           "import os, sys; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}); "
           "from cosyvino.cli import main; sys.argv = ['cosyvino', 'plan', '--no-write', "
           f"'--json', '--model-dir', {str(tmp_path)!r}]; main()"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["streams"] * data["threads_per_stream"] == 1
    assert data["backend_options"]["num_threads"] == 1


def _plan_for(model_dir, tmp_path, **probe_changes) -> str:
    from cosyvino.planner import probe

    p = probe(model_dir=model_dir)
    plan = make_plan(p, model_dir=model_dir, threads=1)
    for k, v in probe_changes.items():
        plan.probe[k] = v
    return plan.save(str(tmp_path / "plan.toml"))


def test_synthesizer_auto_uses_plan(tiny_model_dir, tmp_path, monkeypatch):
    from cosyvino import Synthesizer

    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    path = _plan_for(tiny_model_dir, tmp_path)
    synth = Synthesizer.auto(tiny_model_dir, plan=path)
    assert synth.backend_name == "torch" and synth.plan.path == path
    assert synth.plan.backend_options == {"num_threads": 1, "overlap_stages": False,
                                          "first_chunk_hold": True}
    audio = synth.synthesize("Hello.", synth.speakers[0], seed=0, num_speech_tokens=10)
    assert audio.duration > 0


def test_synthesizer_auto_finds_env_plan_and_warns_on_mismatch(tiny_model_dir, tmp_path,
                                                               monkeypatch):
    from cosyvino import Synthesizer

    path = _plan_for(tiny_model_dir, tmp_path, usable_cpus=96, flags=["amx_tile"])
    monkeypatch.setenv("COSYVINO_PLAN", path)
    with pytest.warns(PlanMismatchWarning, match="usable CPUs changed"):
        synth = Synthesizer.auto(tiny_model_dir)
    assert synth.plan.path == path


def test_auto_plans_on_the_fly(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.delenv("COSYVINO_PLAN", raising=False)
    monkeypatch.chdir(tmp_path)
    plan = resolve_plan(tiny_model_dir)
    assert isinstance(plan, Plan) and plan.path == "" and plan.backend == "torch"
    assert plan.model_dir == tiny_model_dir


def test_auto_replans_for_another_model_dir(tiny_model_dir, tmp_path, monkeypatch):
    _, plan = _plan(tmp_path)          # made for /models/cosyvoice-300m-sft
    monkeypatch.setenv("COSYVINO_PLAN", plan.save(str(tmp_path / "other.toml")))
    with pytest.warns(PlanMismatchWarning, match="was made for"):
        got = resolve_plan(tiny_model_dir)
    assert got.path == "" and got.model_dir == tiny_model_dir


def test_tune_measures_candidates(tiny_model_dir, monkeypatch):
    from cosyvino import Synthesizer
    from cosyvino.planner import probe
    from cosyvino.planner.tune import apply_tuning, candidates, tune

    p = probe(model_dir=tiny_model_dir)
    plan = make_plan(p, model_dir=tiny_model_dir, threads=2) if len(p.affinity) > 1 else \
        make_plan(p, model_dir=tiny_model_dir)
    cands = candidates(plan, p)
    assert 2 <= len(cands) <= 6 and cands[0]["label"] == "plan"
    # generous budget: tuning stops after the last candidate; the budget only bounds a slow host
    rec = tune(plan, p, tiny_model_dir, synthesizer=Synthesizer, seconds=300, tokens=10)
    measured = [c for c in rec["candidates"] if c.get("status") == "ok"]
    assert len(measured) >= 2
    assert all(c["wall_s"] > 0 and c["rtf"] > 0 and c["load_s"] >= 0 for c in measured)
    assert rec["best"] in {c["label"] for c in measured}
    new = apply_tuning(plan, p, tiny_model_dir, rec)
    assert new.tuning["candidates"] == rec["candidates"]
    best = rec["candidates"][rec["best_index"]]
    assert new.backend_options["num_threads"] == best["options"]["num_threads"]
    assert "tuning" in format_plan(new)


def test_tune_candidates_for_openvino_plans(tmp_path):
    from cosyvino.planner.tune import candidates

    p, plan = _plan(tmp_path, trees.xeon_2s)
    labels = [c["label"] for c in candidates(plan, p)]
    # the plan leaves pinning off (sessions share each stream's cores): nothing to turn off
    assert labels == ["plan", "threads=48", "precision=bf16", "torch threads=16"]
    p, plan = _plan(tmp_path / "p", trees.xeon_2s, pinning=True)
    labels = [c["label"] for c in candidates(plan, p)]
    assert labels == ["plan", "threads=48", "pinning=off", "precision=bf16", "torch threads=16"]
    p, plan = _plan(tmp_path / "c", trees.container_64)
    cands = candidates(plan, p)
    assert [c["label"] for c in cands][:2] == ["plan", "threads=2 (quota ceil)"]
    assert all(2 <= len(candidates(pl, pp)) <= 6 for pp, pl in [(p, plan)])
