"""cosyvino's built-in PyTorch (eager, fp32) backend, registered through the ``cosyvino`` entry
point group exactly like a third-party backend plugin would be.

Discovery must stay cheap and torch-free (other backends serve without torch), so torch and the
model code are imported only when the backend is loaded.
"""

from __future__ import annotations

import importlib.util

import cosyvino
from cosyvino.backends.base import Backend, Stages
from cosyvino.errors import BackendError


class TorchBackend(Backend):
    """PyTorch eager fp32 on CPU: the reference backend (parity with the official code)."""

    name = "torch"
    description = "PyTorch eager fp32 (reference implementation)"

    @classmethod
    def is_available(cls):
        if importlib.util.find_spec("torch") is None:
            return False, "torch is not installed (pip install 'cosyvino[torch]')"
        return True, ""

    @classmethod
    def load(cls, model_dir: str, *, num_threads: int | None = None, **options) -> Stages:
        if options:
            raise BackendError(f"torch backend: unknown options {sorted(options)}")
        ok, why = cls.is_available()
        if not ok:
            raise BackendError(why)
        import torch

        from .stages import TorchStages

        if num_threads is not None:
            if num_threads < 1:
                raise BackendError(f"num_threads must be >= 1, got {num_threads}")
            torch.set_num_threads(int(num_threads))
        return TorchStages(model_dir)


@cosyvino.hookimpl
def register_backends(register):
    register(TorchBackend)
