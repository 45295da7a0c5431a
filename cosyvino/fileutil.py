"""Small file helpers shared by everything that writes user-visible files atomically."""

from __future__ import annotations

import os


def publish(tmp_path: str, path: str) -> None:
    """Give ``tmp_path`` (a ``tempfile.mkstemp`` file, mode 0600) the mode a plain ``open()``
    would have under the current umask, then atomically rename it to ``path``."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp_path, 0o666 & ~umask)
    os.replace(tmp_path, path)
