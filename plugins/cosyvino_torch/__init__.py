"""cosyvino's built-in PyTorch (eager, fp32) backend, registered through the ``cosyvino`` entry
point group exactly like a third-party backend plugin would be.

Discovery must stay cheap and torch-free (other backends serve without torch), so torch and the
model code are imported only when the backend is loaded.
"""

from __future__ import annotations

import importlib.util
import os

from cosyvino.backends.base import Backend, Capabilities, Stages
from cosyvino.errors import BackendError
from cosyvino.hookspecs import hookimpl

#: checkpoint files this backend loads (with ``cosyvoice.yaml``)
TORCH_FILES = ("llm.pt", "flow.pt", "hift.pt")
#: decode rows one batched LLM call advances (``Capabilities.max_llm_batch``, the stages'
#: ``max_llm_batch``): a bound for the scheduler, not a measured optimum (benchmarks/llm_batch.py
#: measures the step cost per batch size)
MAX_LLM_BATCH = 64
#: requests one estimator call can hold (``Capabilities.max_estimator_batch``): eager torch runs
#: any batch; a bound for the rendezvous, the planner's ``estimator_batch`` picks the size
MAX_ESTIMATOR_BATCH = 4


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


class TorchBackend(Backend):
    """PyTorch eager fp32 on CPU: the reference backend (parity with the official code)."""

    name = "torch"
    description = "PyTorch eager fp32 (reference implementation)"
    install_hint = "pip install 'cosyvino[torch]'"
    reference = True

    @classmethod
    def is_available(cls):
        if importlib.util.find_spec("torch") is None:
            return False, f"torch is not installed ({cls.install_hint})"
        return True, ""

    @classmethod
    def inventory(cls, model_dir: str | None) -> dict:
        """{files, bytes[, summary]}: the :data:`TORCH_FILES` present in ``model_dir`` and
        their total size."""
        files = [f for f in TORCH_FILES
                 if model_dir and os.path.isfile(os.path.join(model_dir, f))]
        size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in files)
        out = {"files": files, "bytes": size}
        if size:
            out["summary"] = f"torch {_size(size)}"
        return out

    @classmethod
    def capabilities(cls, model_dir: str | None, probe=None) -> Capabilities:
        """Ready when ``model_dir`` holds ``cosyvoice.yaml`` and the three ``.pt`` files; the
        speed reference (1.0); resident memory ~ the ``.pt`` sizes (fp32 weights, mmap'ed)."""
        other = _other_family(model_dir)
        if other is not None:  # a family other than v1: its own official files
            missing = [f for f in other.source_files(model_dir)
                       if not os.path.isfile(os.path.join(model_dir, f))]
            if missing:
                return Capabilities(ready=False, reason=f"no {', '.join(missing)} in "
                                    f"{model_dir} ({other.name} checkpoint)")
            # resident memory ~ the family's .pt checkpoint files (fp32 weights)
            weights = [f for f in other.source_files(model_dir) if f.endswith(".pt")]
            size = sum(os.path.getsize(os.path.join(model_dir, f)) for f in weights)
            return Capabilities(ready=True, thread_safe=True, precisions=("fp32",),
                                reason=f"PyTorch checkpoint of {other.name} in {model_dir} "
                                "(generic graph runner)",
                                resident_bytes=size or None,
                                resident_basis=" + ".join(weights) + f" of {other.name}")
        inv = cls.inventory_of(model_dir, probe)
        model = getattr(probe, "model", None) or {}
        described = bool(model) and model.get("dir", "") == (model_dir or "")
        if not inv and described:
            # inventories recorded before per-backend sections kept these at the top level
            inv = {"files": model.get("torch_files"), "bytes": model.get("torch_bytes", 0)}
        present = inv.get("files")
        if present is None:  # an inventory from before the file list was recorded
            present = list(TORCH_FILES) if inv.get("bytes") else []
        missing = [f for f in TORCH_FILES if f not in present]
        has_config = (model.get("exists") if described else
                      bool(model_dir) and os.path.isfile(os.path.join(model_dir,
                                                                      "cosyvoice.yaml")))
        if not has_config:
            missing.insert(0, "cosyvoice.yaml")
        where = model_dir or "the model dir"
        common = dict(relative_speed=1.0, thread_safe=True, precisions=("fp32",),
                      max_llm_batch=MAX_LLM_BATCH, max_estimator_batch=MAX_ESTIMATOR_BATCH,
                      resident_bytes=inv.get("bytes") or None,
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

        from .stages import load_stages

        if num_threads is not None:
            if num_threads < 1:
                raise BackendError(f"num_threads must be >= 1, got {num_threads}")
            torch.set_num_threads(int(num_threads))
        # denormal floats (values below ~1e-38, e.g. decaying activations of random-weight or
        # quantized models) take a slow microcode path on x86: a fresh-user trial measured one
        # seed's estimator 15 s instead of 0.17 s. Flushing them to zero (FTZ/DAZ, the
        # calling thread's MXCSR, inherited by threads it starts: the scheduler's workers)
        # changes results only below float32's normal range (OpenVINO's CPU plugin has the
        # same switch, CPU_DENORMALS_OPTIMIZATION)
        torch.set_flush_denormal(True)
        return load_stages(model_dir)


def _other_family(model_dir: str | None):
    """The family of ``model_dir`` when it is a registered family other than CosyVoice v1."""
    if not model_dir or not os.path.isdir(model_dir):
        return None
    from cosyvino.families import detect_family

    try:
        family = detect_family(model_dir)
    except Exception:  # noqa: BLE001 - capabilities must not raise; v1's reasons apply
        return None
    return None if family.name == "cosyvoice1" else family


@hookimpl
def register_backends(register):
    register(TorchBackend)
