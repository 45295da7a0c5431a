"""Shared fixtures. The core's tests run with outside plugins disabled (COSYVINO_PLUGINS pins
the built-in ones) so a user's environment cannot break them."""

from __future__ import annotations

import functools
import importlib
import os
import pathlib

import pytest

os.environ.setdefault("COSYVINO_PLUGINS", "torch,openvino,onnxruntime")

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
#: the official-code golden tiny model, shipped inside the package for the conformance suite
#: (cosyvino.testing); one copy, used by the repo's tests too
TINY_A = pathlib.Path(__file__).parent.parent / "cosyvino" / "testing" / "fixtures" / "tiny-a"


#: the official-code golden tiny CosyVoice2 dir (tiny-c), copied from the reference material
TINY_C = FIXTURES / "tiny-c"
#: the official-code golden tiny CosyVoice3 dir (tiny-e)
TINY_E = FIXTURES / "tiny-e"

#: the yaml file that marks each family's official dir (the official ``AutoModel`` looks for these)
FAMILY_YAML = {"cosyvoice1": "cosyvoice.yaml", "cosyvoice2": "cosyvoice2.yaml",
               "cosyvoice3": "cosyvoice3.yaml"}


def extra_golden_dirs() -> list[pathlib.Path]:
    """Every dir in COSYVINO_GOLDEN_DIRS (colon- or comma-separated), of any family: the
    held-back goldens of other sizes."""
    raw = os.environ.get("COSYVINO_GOLDEN_DIRS", "").replace(",", ":")
    return [pathlib.Path(p) for p in raw.split(":") if p]


def golden_dirs_of(family: str) -> list[pathlib.Path]:
    """The shipped golden dir of ``family`` (tiny-a for v1, tiny-c for v2, tiny-e for v3) plus
    the COSYVINO_GOLDEN_DIRS entries that hold that family's yaml, so a held-back dir of one
    family never reaches another family's parity tests."""
    shipped = {"cosyvoice1": [TINY_A], "cosyvoice2": [TINY_C], "cosyvoice3": [TINY_E]}[family]
    marker = FAMILY_YAML[family]
    return [*shipped, *(d for d in extra_golden_dirs() if (d / marker).is_file())]


def golden_dirs() -> list[pathlib.Path]:
    """The CosyVoice v1 golden dirs: TINY_A plus the v1 entries of COSYVINO_GOLDEN_DIRS."""
    return golden_dirs_of("cosyvoice1")


@functools.lru_cache(maxsize=None)
def cpu_has_native_bf16() -> bool:
    """Whether this CPU computes bf16 natively, as the runtime decides it: OpenVINO's CPU plugin
    lists ``BF16`` in ``OPTIMIZATION_CAPABILITIES`` exactly when it runs a bf16
    ``INFERENCE_PRECISION_HINT`` in bf16 (elsewhere, e.g. AVX2-only CPUs, it falls back to f32);
    without openvino, the planner's reading of the CPU flags (AVX512_BF16 or AMX-BF16). The
    one decision for every test whose expectation depends on native bf16 (AVX-512 BF16 / AMX).
    ``cpu_has_native_bf16.__wrapped__`` is the uncached check."""
    try:
        import openvino as ov
    except ImportError:
        from cosyvino.planner.topology import probe_topology

        return bool(probe_topology().bf16)
    return "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A synthetic tiny model made by make-model (random weights, official layout)."""
    from cosyvino.families.cosyvoice1.synthetic import make_model

    return make_model("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=3)


#: conversion format -> (extra ``cosyvino convert`` arguments, exporter module, packages needed)
_FORMATS = {
    "openvino": ([], "cosyvino.export.openvino", ("openvino",)),
    "onnx": (["--format", "onnx"], "cosyvino.export.onnx", ("onnx", "onnxruntime")),
}


def _converter(tmp_path_factory, fmt: str):
    """``get(src) -> str``: ``src`` converted to ``fmt`` once per test session. The tiny-a
    fixture goes through the ``cosyvino convert`` CLI (so the CLI is covered), other dirs
    through the exporter's ``convert_model_dir``."""
    cli_args, module, needs = _FORMATS[fmt]
    for pkg in needs:
        pytest.importorskip(pkg)
    cache: dict[str, str] = {}

    def get(src) -> str:
        src = str(src)
        if src not in cache:
            out = tmp_path_factory.mktemp(fmt) / pathlib.Path(src).name
            if pathlib.Path(src) == TINY_A:
                from click.testing import CliRunner

                from cosyvino.cli.main import main
                res = CliRunner().invoke(main, ["convert", *cli_args, "--model-dir", src,
                                                "--out", str(out)])
                assert res.exit_code == 0, res.output
                assert "wrote" in res.output
            else:
                importlib.import_module(module).convert_model_dir(src, str(out))
            cache[src] = str(out)
        return cache[src]

    return get


@pytest.fixture(scope="session")
def converted_dir(tmp_path_factory):
    """``converted_dir(src) -> str``: ``src`` converted to OpenVINO IR once per test session."""
    return _converter(tmp_path_factory, "openvino")


@pytest.fixture(scope="session")
def onnx_dir(tmp_path_factory):
    """``onnx_dir(src) -> str``: ``src`` converted to ONNX once per test session."""
    return _converter(tmp_path_factory, "onnx")


#: a plan file in the planner's format for the tiny model on the torch backend (2 sessions,
#: queue 3, 1 thread): the server CLI tests' plan
SERVE_PLAN = """# test plan (the planner's format)
backend = "torch"
streams = 1
threads_per_stream = 1
pinning = false
max_sessions = 2
queue_size = 3
model_dir = "{model_dir}"
version = 1

[backend_options]
num_threads = 1
"""


@pytest.fixture
def plan_file(tmp_path, tiny_model_dir):
    """:data:`SERVE_PLAN` written to ``tmp_path/plan.toml``; its path."""
    path = tmp_path / "plan.toml"
    path.write_text(SERVE_PLAN.format(model_dir=tiny_model_dir), encoding="utf-8")
    return str(path)
