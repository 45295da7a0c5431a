"""Skip a test for a missing optional tool on a developer's machine, but fail it in CI.

The browser tests (Chromium, chromedriver, selenium) and the Ray Serve tests (the ``ray``
extra) skip where their tools are not installed; ``.ci/run`` installs them, so in CI (the
environment variable ``CI`` set to ``true``, as the CI runner does) a missing one is a broken
CI setup, and the test fails instead of skipping silently.
"""

from __future__ import annotations

import importlib
import os

import pytest


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` is ``true``, ``1`` or ``yes``, any case)."""
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def skip_or_fail(reason: str) -> None:
    """``pytest.skip(reason)`` (also at module level), or in CI ``pytest.fail``: .ci/run
    installs what these tests need."""
    if in_ci():
        pytest.fail(f"{reason}; CI must run this test (.ci/run installs what it needs)",
                    pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, install: str):
    """The imported module ``name``, else :func:`skip_or_fail` saying how to ``install`` it."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        skip_or_fail(f"{name} is not importable ({e}); {install}")


def optional_module(name: str, install: str):
    """For a test module's top: the imported module ``name``; without it, the whole test
    module is skipped, except in CI, where None is returned (no collection error that would
    stop the whole run): the test module then fails each test with :func:`skip_or_fail`
    (e.g. from an autouse fixture)."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        if in_ci():
            return None
        pytest.skip(f"{name} is not importable ({e}); {install}", allow_module_level=True)
