"""Shared fixtures. The core's tests run with outside plugins disabled (COSYVINO_PLUGINS pins
the built-in ones) so a user's environment cannot break them."""

from __future__ import annotations

import os
import pathlib

import pytest

os.environ.setdefault("COSYVINO_PLUGINS", "torch")

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
TINY_A = FIXTURES / "tiny-a"


def golden_dirs() -> list[pathlib.Path]:
    """tests/fixtures/tiny-a plus every dir in COSYVINO_GOLDEN_DIRS (colon-separated)."""
    extra = [pathlib.Path(p) for p in os.environ.get("COSYVINO_GOLDEN_DIRS", "").split(":") if p]
    return [TINY_A, *extra]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> str:
    """A synthetic tiny model made by make-model (random weights, official layout)."""
    from cosyvino.models.synthetic import make_model

    return make_model("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=3)
