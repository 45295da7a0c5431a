"""The embedded default model location and the one-time synthetic demo model. No torch import."""

from __future__ import annotations

import os
import sys

DEFAULT_PRESET = "300m"


def default_model_dir() -> str:
    """``$COSYVINO_MODEL_DIR``, else ``$XDG_CACHE_HOME/cosyvino/models/default``
    (``~/.cache/...``)."""
    env = os.environ.get("COSYVINO_MODEL_DIR")
    if env:
        return os.path.abspath(os.path.expanduser(env))
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "cosyvino", "models", "default")


def ensure_default_model(model_dir: str | None = None, *, preset: str = DEFAULT_PRESET,
                         say=None) -> str:
    """Return the default model dir, creating a synthetic ``preset`` checkpoint there once.

    ``say`` receives human-readable notices (default: stderr).

    Raises ModelDirError: there is no model yet and torch (needed to write the synthetic
    checkpoint) is not installed, e.g. in a serving-only install.
    """
    say = say or (lambda msg: print(msg, file=sys.stderr, flush=True))
    path = model_dir or default_model_dir()
    if os.path.isfile(os.path.join(path, "cosyvoice.yaml")):
        return path
    try:
        from cosyvino.families.cosyvoice1.synthetic import make_model
    except ImportError as e:
        from cosyvino.errors import ModelDirError

        raise ModelDirError(
            f"no model at {path}, and creating the synthetic default model there needs "
            f"{e.name or 'torch'}: pip install 'cosyvino[torch]', or pass --model-dir of a "
            "(converted) CosyVoice model dir (`cosyvino download` fetches the real one)",
            path) from e
    say(f"cosyvino: no model at {path}; creating a SYNTHETIC CosyVoice-{preset} checkpoint "
        "there (random weights: it runs the real architecture at real cost but speaks noise).")
    say("cosyvino: for real speech download CosyVoice-300M-SFT and pass --model-dir DIR "
        "(or set COSYVINO_MODEL_DIR).")
    make_model(preset, path, overwrite=os.path.exists(path),
               progress=lambda m: say(f"cosyvino: make-model: {m}"))
    return path
