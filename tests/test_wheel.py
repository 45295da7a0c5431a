"""Issue 18 item 6: the wheel holds every asset cosyvino reads at run time (calibration texts,
frontend assets, the web page, the conformance fixtures), the LICENSE and the one version, and
the calibration set loads from an installed, non-editable copy. Builds the wheel from a copy of
the source tree (setuptools, offline: ``--no-build-isolation``)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import zipfile

import pytest

import cosyvino

ROOT = pathlib.Path(__file__).resolve().parent.parent
TINY_A = ("cosyvoice.yaml", "llm.pt", "flow.pt", "hift.pt", "spk2info.pt", "goldens.npz")


def _package_files(sub: str) -> list[str]:
    """Repository files under cosyvino/``sub`` (what the wheel must hold)."""
    base = ROOT / "cosyvino" / sub
    return sorted(str(p.relative_to(ROOT)) for p in base.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    pytest.importorskip("setuptools")
    src = tmp_path_factory.mktemp("src")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info", "build")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    for name in ("cosyvino", "plugins"):
        shutil.copytree(ROOT / name, src / name, ignore=ignore)
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "-q", "-w", str(out), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = out.glob("cosyvino-*.whl")
    return found


def test_wheel_holds_the_assets(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    calib = _package_files("quantize/calib")
    assert {"cosyvino/quantize/calib/texts.jsonl", "cosyvino/quantize/calib/manifest.json"} \
        <= set(calib)
    frontend = _package_files("frontend/assets")
    web = _package_files("server/web")
    assert frontend and web
    fixtures = [f"cosyvino/testing/fixtures/tiny-a/{n}" for n in TINY_A]
    missing = [f for f in calib + frontend + web + fixtures if f not in names]
    assert not missing, missing
    for plugin in ("cosyvino_torch", "cosyvino_openvino", "cosyvino_onnxruntime"):
        assert f"{plugin}/__init__.py" in names


def test_wheel_metadata_version_and_license(wheel):
    version = cosyvino.__version__
    assert wheel.name.startswith(f"cosyvino-{version}-")
    z = zipfile.ZipFile(wheel)
    info = f"cosyvino-{version}.dist-info"
    meta = z.read(f"{info}/METADATA").decode()
    assert f"\nVersion: {version}\n" in meta
    assert "License-Expression: Apache-2.0" in meta
    licenses = [n for n in z.namelist() if n.startswith(f"{info}/") and n.endswith("LICENSE")]
    assert licenses, z.namelist()
    text = z.read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert text == (ROOT / "LICENSE").read_text(encoding="utf-8")
    entry_points = z.read(f"{info}/entry_points.txt").decode()
    assert "cosyvino = cosyvino.cli:main" in entry_points
    assert "torch = cosyvino_torch" in entry_points


def test_calibration_set_loads_from_an_installed_copy(wheel, tmp_path):
    """Installed with --target (not editable, not the checkout): the shipped set is found
    inside the installed package and is the same set as the checkout's."""
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q",
                           "--target", str(target), str(wheel)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    code = ("import cosyvino, json; "
            "from cosyvino.quantize.calibration import SHIPPED_CALIB_DIR, load_calibration_set; "
            "texts = load_calibration_set(); "
            "print(json.dumps([cosyvino.__file__, str(SHIPPED_CALIB_DIR), len(texts), "
            "sorted({t.language for t in texts})]))")
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    run = subprocess.run([sys.executable, "-c", code], cwd=str(tmp_path), env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    import json

    from cosyvino.quantize.calibration import load_calibration_set

    module, calib_dir, count, languages = json.loads(run.stdout)
    assert module.startswith(str(target)) and calib_dir.startswith(str(target))
    shipped = load_calibration_set()
    assert count == len(shipped) and languages == sorted({t.language for t in shipped})
