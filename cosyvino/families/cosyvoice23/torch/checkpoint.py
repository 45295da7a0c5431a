"""Strict loading of an official checkpoint into one of our modules, with fp16 -> fp32 upcast.

The key set and every shape must equal the module's (v1's
:func:`cosyvino.families.cosyvoice1.checkpoint.check_state_dict`, which names the file and the
keys); floating tensors are upcast to float32 as the official load does on copy (the tiny
goldens store float16, real checkpoints float32). Depends on torch.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from cosyvino.errors import CheckpointError
from cosyvino.families.cosyvoice1.checkpoint import check_state_dict, load_torch_file


def load_strict(module: nn.Module, path: str | os.PathLike, *, config_name: str,
                strip_prefix: str = "") -> None:
    """Load ``path`` into ``module`` (exact keys and shapes; float16/bfloat16 -> float32).

    Args:
        module: the module whose ``state_dict()`` keys/shapes the file must match.
        path: the ``.pt`` file.
        config_name: the yaml the module was built from (named in the error message).
        strip_prefix: only keys starting with this are loaded, the prefix removed (e.g.
            ``"decoder.estimator."``); ``""`` = the whole file.
    Raises:
        ModelDirError: the file is missing or unreadable.
        CheckpointError: truncated/corrupt file, a value that is not a tensor, missing /
            unexpected keys or shape mismatches (named, in the file's spelling).
    """
    path = os.fspath(path)
    raw = load_torch_file(path)
    if not isinstance(raw, dict):
        raise CheckpointError(f"{path}: expected a state_dict (key -> tensor), got "
                              f"{type(raw).__name__}", path)
    sd = {k[len(strip_prefix):]: v for k, v in raw.items() if k.startswith(strip_prefix)}
    bad = [k for k, v in sd.items() if not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(f"{path}: '{strip_prefix}{bad[0]}' is not a tensor", path)
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items()}
    check_state_dict(sd, expected, path, config_name=config_name)
    module.load_state_dict({k: v.float() if v.is_floating_point() else v
                            for k, v in sd.items()}, strict=True, assign=True)
