"""Small file helpers shared by everything that writes user-visible files atomically."""

from __future__ import annotations

import os
import shutil
import tempfile


def publish(tmp_path: str, path: str) -> None:
    """Give ``tmp_path`` (a ``tempfile.mkstemp`` file, mode 0600) the mode a plain ``open()``
    would have under the current umask, then atomically rename it to ``path``."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    os.replace(tmp_path, path)


def replace_dir(tmp_dir: str, out_dir: str) -> None:
    """Atomically put the finished directory ``tmp_dir`` at ``out_dir`` (same filesystem).

    An existing ``out_dir`` is first moved aside (so readers never see a half-written tree)
    and deleted only after the new one is in place."""
    old = None
    if os.path.exists(out_dir):
        parent = os.path.dirname(os.path.abspath(out_dir))
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
        os.rename(out_dir, os.path.join(old, "x"))
    os.rename(tmp_dir, out_dir)
    if old:
        shutil.rmtree(old, ignore_errors=True)
