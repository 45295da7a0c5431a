"""Tools for backend plugin authors: the conformance suite and the bundled golden tiny model.

``from cosyvino.testing import BackendConformance`` (needs pytest; see
:mod:`cosyvino.testing.conformance`), :data:`TINY_MODEL_DIR` (official-layout tiny model,
shipped as package data) and :func:`load_goldens` (its golden tensors as numpy arrays).
Importing this package needs neither torch nor pytest; ``BackendConformance`` imports pytest.
"""

from __future__ import annotations

from .goldens import GOLDEN_KEYS, GOLDENS_NPZ, TINY_MODEL_DIR, load_goldens


def __getattr__(name: str):
    if name == "BackendConformance":  # imports pytest: only when asked for
        from .conformance import BackendConformance

        return BackendConformance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GOLDENS_NPZ", "GOLDEN_KEYS", "TINY_MODEL_DIR", "BackendConformance", "load_goldens"]
