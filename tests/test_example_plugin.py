"""The example third-party plugin (examples/cosyvino-example-backend) is discovered only through
its entry point after ``pip install``, and passes the conformance suite; a broken installed
plugin is named by ``cosyvino backends`` and skipped. Everything runs in subprocesses (a fresh
interpreter sees a freshly installed distribution's entry points; this one keeps its cache).

Offline and fast: ``pip install --no-deps --no-build-isolation --no-index --target`` into a
temp dir, put on PYTHONPATH (entry points are read from every sys.path dir's dist-info).
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("torch")  # the example wraps the torch backend
# offline build of the example without build isolation: the environment's setuptools builds it
pytest.importorskip("setuptools", minversion="70.1")

EXAMPLE = pathlib.Path(__file__).parent.parent / "examples" / "cosyvino-example-backend"


def _write_broken_plugin(site: pathlib.Path) -> None:
    """An installed distribution (hand-written dist-info, as pip would leave it) whose entry
    point module raises at import."""
    dist = site / "broken_cosyvino_plugin-0.0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-cosyvino-plugin\n"
                                   "Version: 0.0.1\n")
    (dist / "entry_points.txt").write_text("[cosyvino]\nbroken = broken_cosyvino_plugin\n")
    (site / "broken_cosyvino_plugin.py").write_text(
        'raise RuntimeError("this plugin is broken on purpose")\n')


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """PYTHONPATH entries holding the installed example plugin and a broken plugin."""
    tmp = tmp_path_factory.mktemp("example-plugin")
    src = tmp / "src"
    # build from a copy: setuptools leaves build/ and *.egg-info next to the sources
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("build", "*.egg-info",
                                                                "__pycache__"))
    site = tmp / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site), str(src)],
                   check=True, timeout=300)
    assert (site / "cosyvino_example_backend" / "__init__.py").is_file()
    _write_broken_plugin(site)
    return site


def _env(site: pathlib.Path, plugins: str | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(
        os.pathsep)
    if plugins is None:
        env.pop("COSYVINO_PLUGINS", None)  # load every installed plugin, as a user would
    else:
        env["COSYVINO_PLUGINS"] = plugins
    return env


def test_cosyvino_backends_lists_example_and_names_broken_plugin(installed):
    r = subprocess.run([sys.executable, "-m", "cosyvino.cli", "backends"], env=_env(installed,
                       None), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(line.startswith("logging-torch: PyTorch eager fp32 with per-stage timing")
               for line in lines), r.stdout
    assert any(line.startswith("torch: ") for line in lines), r.stdout
    broken = [line for line in lines if line.startswith("broken: FAILED TO LOAD")]
    assert broken and "broken on purpose" in broken[0], r.stdout


def test_example_not_found_without_install_or_when_pinned_out(installed):
    code = ("from cosyvino.plugins import backend_classes; "
            "print(sorted(backend_classes()))")
    r = subprocess.run([sys.executable, "-c", code], env=_env(installed, "torch"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['torch']"
    env = _env(installed, None)
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(str(installed), "")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "logging-torch" not in r.stdout and "torch" in r.stdout


def test_example_passes_its_conformance_suite(installed):
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        "tests/test_conformance.py"],
                       cwd=EXAMPLE, env=_env(installed, "torch,logging-torch"),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    # every conformance test ran (only the thread-safety one skips: thread_safe is False)
    assert " passed, 1 skipped" in r.stdout.splitlines()[-1], r.stdout[-2000:]
