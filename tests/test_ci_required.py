"""tests/ci_required.py: a test whose optional tool is missing skips on a developer's machine
and fails in CI (CI=true), so CI never skips the browser and Ray Serve tests silently."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from ci_required import in_ci, optional_module, require_module, skip_or_fail

MISSING = "cosyvino_no_such_module_xyz"


@pytest.mark.parametrize("value,want", [("true", True), ("TRUE", True), ("1", True),
                                        ("yes", True), ("", False), ("false", False),
                                        ("0", False)])
def test_in_ci_reads_the_ci_variable(monkeypatch, value, want):
    monkeypatch.setenv("CI", value)
    assert in_ci() is want


def test_skips_locally_and_fails_in_ci(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no tool"):
        skip_or_fail("no tool")
    with pytest.raises(pytest.skip.Exception, match=f"{MISSING} is not importable.*pip x"):
        require_module(MISSING, "pip x")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no tool; CI must run this test"):
        skip_or_fail("no tool")
    with pytest.raises(pytest.fail.Exception, match=f"{MISSING} is not importable"):
        require_module(MISSING, "pip x")
    assert optional_module(MISSING, "pip x") is None  # the module's tests fail one by one
    assert require_module("json", "") is optional_module("json", "") is sys.modules["json"]


@pytest.mark.parametrize("ci,outcome", [("", "1 skipped"), ("true", "1 error")])
def test_a_test_module_without_its_tool(tmp_path, ci, outcome):
    """As test_ray_serve.py uses it, in a pytest run of its own: a skipped module locally;
    in CI its test errs at setup (a failure: exit status 1) while the other tests still run
    (no collection error stopping the run)."""
    (tmp_path / "test_needs_tool.py").write_text(textwrap.dedent(f"""
        import pytest
        from ci_required import optional_module, skip_or_fail

        tool = optional_module("{MISSING}", "pip install tool")

        @pytest.fixture(autouse=True)
        def _tool():
            if tool is None:
                skip_or_fail("the tool is missing")

        def test_uses_tool():
            assert tool is not None
        """))
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    path = os.pathsep.join([os.path.dirname(__file__), os.environ.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(tmp_path)], capture_output=True, text=True, cwd=tmp_path, check=False,
                       env={**os.environ, "CI": ci, "PYTHONPATH": path}, timeout=120)
    last = r.stdout.strip().splitlines()[-1]
    assert outcome in last and "1 passed" in last, r.stdout
    if ci:
        assert "the tool is missing; CI must run this test" in r.stdout
        assert r.returncode == 1
    else:
        assert r.returncode == 0
