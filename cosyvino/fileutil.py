"""Small file helpers shared by everything that writes user-visible files atomically."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import BinaryIO, Iterator


def publish(tmp_path: str, path: str) -> None:
    """Give ``tmp_path`` (a ``tempfile.mkstemp`` file, mode 0600) the mode a plain ``open()``
    would have under the current umask, then atomically rename it to ``path``."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    os.replace(tmp_path, path)


@contextlib.contextmanager
def atomic_write(path: str) -> Iterator[BinaryIO]:
    """Write ``path`` atomically: yields a binary file in the same directory; on a clean exit
    it is flushed, fsynced and renamed onto ``path`` (:func:`publish`), on an error removed, so
    readers see the old file or the whole new one, never a part. Raises OSError."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp",
                               dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        publish(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
