"""Family-neutral pieces of a synthetic model dir maker: the atomic write of the whole dir
(temp dir beside it + rename) and the SYNTHETIC marker test. Every family's ``synthetic``
module writes its own files inside :func:`atomic_model_dir`. No torch.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator

from cosyvino.errors import ModelDirError
from cosyvino.fileutil import replace_dir

#: the comment word :func:`is_synthetic` looks for in the first bytes of the yaml
MARKER = "SYNTHETIC"


def synthetic_comment(preset: str, seed: int) -> str:
    """The first yaml comment of a synthetic dir (carries :data:`MARKER`)."""
    return (f"{MARKER} random-weight checkpoint (preset {preset}, seed {seed}) "
            "made by cosyvino make-model")


def new_model_dir(out_dir: str | os.PathLike, overwrite: bool) -> str:
    """``out_dir`` made absolute, checked to be free.

    Raises:
        ModelDirError: ``out_dir`` exists and not ``overwrite``."""
    out_dir = os.path.abspath(os.fspath(out_dir))
    if os.path.exists(out_dir) and not overwrite:
        raise ModelDirError(f"{out_dir} already exists; pick a new directory or use "
                            "--overwrite (overwrite=True)", out_dir)
    return out_dir


@contextlib.contextmanager
def atomic_model_dir(out_dir: str) -> Iterator[str]:
    """Yield a temp dir beside ``out_dir`` (an absolute path); on a clean exit it replaces
    ``out_dir`` in one rename, on any error it is removed (no half-written model dir).

    Raises:
        ModelDirError: an OSError while writing (naming ``out_dir``); other errors propagate."""
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        yield tmp
        replace_dir(tmp, out_dir)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ModelDirError(f"cannot write model directory {out_dir}: {e}", out_dir) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def is_synthetic(model_dir: str | os.PathLike, yaml_name: str) -> bool:
    """True when ``model_dir``'s ``yaml_name`` starts (first 512 characters) with the
    :data:`MARKER` comment of a synthetic dir; False when it is not readable."""
    try:
        with open(os.path.join(os.fspath(model_dir), yaml_name), encoding="utf-8") as f:
            return MARKER in f.read(512)
    except OSError:
        return False


__all__ = ["MARKER", "atomic_model_dir", "is_synthetic", "new_model_dir", "synthetic_comment"]
