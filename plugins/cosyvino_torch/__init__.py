"""cosyvino's built-in PyTorch (eager, fp32) backend, registered through the ``cosyvino`` entry
point group exactly like a third-party backend plugin would be.

Discovery must stay cheap and torch-free (other backends serve without torch), so torch and the
model code are imported only when the backend is loaded.
"""

from __future__ import annotations

import importlib.util

import cosyvino
from cosyvino.backends.base import Backend, Capabilities, Stages
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
    def capabilities(cls, model_dir: str | None, probe=None) -> Capabilities:
        """Ready when ``model_dir`` holds ``cosyvoice.yaml`` and the three ``.pt`` files; the
        speed reference (1.0); resident memory ~ the ``.pt`` sizes (fp32 weights, mmap'ed)."""
        from cosyvino.planner.inventory import TORCH_FILES, inventory_for

        inv = inventory_for(model_dir, probe)
        present = inv.get("torch_files")
        if present is None:  # an inventory from before torch_files was recorded
            present = list(TORCH_FILES) if inv.get("torch_bytes") else []
        missing = [f for f in TORCH_FILES if f not in present]
        if not inv.get("exists"):
            missing.insert(0, "cosyvoice.yaml")
        where = model_dir or "the model dir"
        common = dict(relative_speed=1.0, thread_safe=True, precisions=("fp32",),
                      resident_bytes=inv.get("torch_bytes") or None,
                      resident_basis="llm.pt + flow.pt + hift.pt")
        if missing:
            return Capabilities(ready=False, reason=f"no {', '.join(missing)} in {where} (an "
                                "official CosyVoice-300M checkpoint dir)", **common)
        return Capabilities(ready=True, reason=f"PyTorch checkpoint in {where}", **common)

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
