"""The per-node profile and same-run A/B scripts of the LLM (benchmarks/llm_profile.py,
llm_ir_ab.py) run against the current export: they feed the step's inputs as the backend does
(positional tables + offset). llm_profile.py once still fed the old inputs and failed on every
dir converted since the positional keys became step inputs; these catch such drift."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from conftest import SERVE_PLAN, TINY_A

pytest.importorskip("openvino")

BENCH = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


def _run(script: str, *args: str) -> str:
    out = subprocess.run([sys.executable, str(BENCH / script), *args], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_llm_profile_runs_on_a_converted_dir(converted_dir):
    out = _run("llm_profile.py", "--model-dir", converted_dir(TINY_A), "--past", "12",
               "--prompt", "5", "--steps", "3", "--threads", "1", "--top", "5")
    assert "cached positions before the last step 14" in out  # 12 + 3 timed steps - 1
    assert "| FullyConnected" in out and "medians of 3 steps: step wall" in out
    assert "KV cache f32," in out  # an fp32 dir is served with an f32 KV cache
    gap = out.split("outside nodes ")[1]
    # a per-step difference; never printed as a negative time
    assert gap.startswith("not measurable") or float(gap.split(" ms")[0]) >= 0


def test_llm_ir_ab_runs_on_a_converted_dir(converted_dir):
    d = converted_dir(TINY_A)
    out = _run("llm_ir_ab.py", d, d, "--steps", "6", "--warmup", "2", "--prefill", "4",
               "--threads", "1")
    assert "final cache 12 positions" in out  # 4 prefilled + 2 warm-up + 6 timed steps
    # the same IR on both sides: the same logits at every step
    assert "max |logp A - logp B| over all steps: 0.00e+00" in out
    assert "B / A decode median:" in out


def _ov_plan(model_dir: str) -> str:
    """The server tests' plan file, on the OpenVINO backend with its pinning option."""
    plan = SERVE_PLAN.format(model_dir=model_dir).replace('backend = "torch"',
                                                          'backend = "openvino"')
    return plan + "cpu_pinning = false\noverlap_stages = true\n"


def test_pinning_ab_runs_both_sides_on_a_converted_dir(converted_dir, tmp_path):
    plan = tmp_path / "plan.toml"
    plan.write_text(_ov_plan(converted_dir(TINY_A)))
    out = _run("pinning_ab.py", "--plan", str(plan), "--runs", "1", "--tokens", "12",
               "--clients", "2", "--sessions", "2", "--llm-batch", "2", "--client-tokens", "8",
               "--round", "1")
    for case in ("lone, whole", "lone, stream"):
        assert f"| {case} | on |" in out and f"| {case} | off |" in out
    rows = [line for line in out.splitlines() if line.startswith(("| on | ", "| off | "))]
    assert len(rows) == 2 and all(int(r.split("|")[2]) >= 1 for r in rows)  # requests ran
    assert out.rstrip().splitlines()[-1].startswith("whole total off / on: ")
    # without the backend option there is nothing to compare
    plan.write_text(SERVE_PLAN.format(model_dir=converted_dir(TINY_A)))
    bad = subprocess.run([sys.executable, str(BENCH / "pinning_ab.py"), "--plan", str(plan)],
                         capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "has no cpu_pinning option" in bad.stderr
