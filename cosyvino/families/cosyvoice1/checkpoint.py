"""Strict loading of the official ``.pt`` checkpoint files and ``spk2info.pt``.

Every failure becomes a typed :mod:`cosyvino.errors` error naming the file: a missing file, a
truncated or non-checkpoint file, missing / unexpected keys, shape mismatches. torch is imported
lazily (only the official-layout loader needs it).
"""

from __future__ import annotations

import collections
import os
import pickle
import zipfile
from typing import Mapping, Sequence

import numpy as np

from cosyvino.errors import CheckpointError, ModelDirError

_MAX_LISTED = 8


def _listing(items: Sequence, what: str) -> str:
    shown = ", ".join(str(x) for x in items[:_MAX_LISTED])
    more = f" (+{len(items) - _MAX_LISTED} more)" if len(items) > _MAX_LISTED else ""
    return f"{len(items)} {what}: {shown}{more}"


def load_torch_file(path: str | os.PathLike, *, mmap: bool = True):
    """``torch.load(path, weights_only=True)`` with typed errors.

    ``mmap=True`` maps tensor storage from the file instead of reading it into memory (the
    300M ``llm.pt`` is 1.24 GB), falling back to a plain read for legacy (non-zip) files.

    Raises:
        ModelDirError: the file is missing or unreadable.
        CheckpointError: the file is truncated, corrupt, or holds non-tensor objects that
            ``weights_only`` refuses.
    """
    import torch

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelDirError(f"checkpoint file not found: {path}", path)
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except RuntimeError as e:
            if mmap and "mmap" in str(e):
                return torch.load(path, map_location="cpu", weights_only=True)
            raise
    except OSError as e:
        raise ModelDirError(f"cannot read {path}: {e}", path) from None
    except Exception as e:  # torch raises RuntimeError/UnpicklingError/EOFError/...
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CheckpointError(
            f"{path} is not a readable PyTorch checkpoint (truncated or corrupt download?): "
            f"{first[:300]}", path) from None


def check_state_dict(state_dict: Mapping[str, object], expected: Mapping[str, Sequence[int]],
                     path: str, *, hint: str = "", config_name: str = "cosyvoice.yaml") -> None:
    """Compare a state_dict's keys and shapes with ``expected`` exactly (``config_name``: the
    config file the architecture came from, named in the message).

    Raises:
        CheckpointError: listing missing keys, unexpected keys and shape mismatches
            (``key: expected [...] found [...]``); ``.missing``/``.unexpected``/``.mismatched``
            carry the full lists.
    """
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    mismatched = []
    for k, shape in expected.items():
        if k in state_dict:
            found = tuple(getattr(state_dict[k], "shape", ()))
            if found != tuple(shape):
                mismatched.append((k, tuple(shape), found))
    if not (missing or unexpected or mismatched):
        return
    parts = []
    if missing:
        parts.append(_listing(missing, "missing keys"))
    if unexpected:
        parts.append(_listing(unexpected, "unexpected keys"))
    if mismatched:
        parts.append(_listing([f"{k}: expected {list(e)} found {list(f)}"
                               for k, e, f in mismatched], "shape mismatches"))
    msg = f"{path} does not match the model architecture in {config_name}: " + "; ".join(parts)
    if hint:
        msg += f". {hint}"
    raise CheckpointError(msg, path, missing=missing, unexpected=unexpected,
                          mismatched=mismatched)


class _NamesOnly(pickle.Unpickler):
    """Unpickles a torch zip checkpoint's ``data.pkl`` without torch: tensors become None
    (their storage is never read) and any class other than the few a tensor dict uses is
    refused, so nothing from the file is executed."""

    _ALLOWED = {("collections", "OrderedDict"): collections.OrderedDict,
                ("torch._utils", "_rebuild_tensor_v2"): lambda *a, **k: None,
                ("torch._utils", "_rebuild_parameter"): lambda *a, **k: None}

    #: the pickle module of torch's storage types (``torch.FloatStorage``, ...): a module path
    #: inside the file, not a backend
    _STORAGE_MODULE = "torch"

    def find_class(self, module, name):
        if (module, name) in self._ALLOWED:
            return self._ALLOWED[(module, name)]
        if module == self._STORAGE_MODULE and name.endswith("Storage"):
            return None
        raise pickle.UnpicklingError(f"{module}.{name} is not allowed in spk2info.pt")

    def persistent_load(self, pid):
        return None


def read_speaker_names(path: str | os.PathLike) -> list[str]:
    """Speaker names of ``spk2info.pt`` without importing torch or reading any embedding
    (the pickle inside the zip checkpoint, tensors skipped): for validating ``-s NAME`` and
    listing voices before the model loads. A legacy (non-zip) or unexpected file falls back
    to :func:`load_spk2info` (torch).

    Raises:
        ModelDirError: the file is missing or unreadable; CheckpointError: as
        :func:`load_spk2info`."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ModelDirError(f"checkpoint file not found: {path}", path)
    try:
        with zipfile.ZipFile(path) as z:
            entry = next(n for n in z.namelist() if n.endswith("/data.pkl") or n == "data.pkl")
            with z.open(entry) as f:
                data = _NamesOnly(f).load()
        if isinstance(data, Mapping) and data and all(isinstance(k, str) for k in data):
            return list(data)
    except (zipfile.BadZipFile, StopIteration, pickle.UnpicklingError, EOFError, ValueError,
            TypeError, AttributeError, KeyError):
        pass  # not a zip checkpoint we can read without torch: let torch decide
    except OSError as e:
        raise ModelDirError(f"cannot read {path}: {e}", path) from None
    return list(load_spk2info(path))


def load_spk2info(path: str | os.PathLike, embed_dim: int = 192) -> dict[str, np.ndarray]:
    """Read ``spk2info.pt``: speaker name -> speaker embedding, float32 [1, embed_dim].

    Only ``['embedding']`` is used; extra per-speaker keys (zero-shot prompt bundles) are
    ignored. Raises ModelDirError / CheckpointError (malformed content names the speaker).
    """
    path = os.fspath(path)
    data = load_torch_file(path, mmap=False)
    if not isinstance(data, Mapping):
        raise CheckpointError(f"{path}: expected a dict speaker -> {{'embedding': tensor}}, got "
                              f"{type(data).__name__}", path)
    speakers: dict[str, np.ndarray] = {}
    for name, info in data.items():
        emb = info.get("embedding") if isinstance(info, Mapping) else None
        if emb is None:
            raise CheckpointError(f"{path}: speaker {name!r} has no 'embedding'", path)
        arr = np.asarray(emb.detach().float().cpu().numpy() if hasattr(emb, "detach") else emb,
                         dtype=np.float32).reshape(1, -1)
        if arr.shape != (1, embed_dim):
            raise CheckpointError(f"{path}: speaker {name!r} embedding has shape "
                                  f"{list(arr.shape)}, expected [1, {embed_dim}]", path)
        speakers[str(name)] = arr
    if not speakers:
        raise CheckpointError(f"{path} holds no speakers", path)
    return speakers
