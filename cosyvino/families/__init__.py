"""Model families (CosyVoice v1 built in, :mod:`cosyvino.families.cosyvoice1`): lookup by name and
detection from a model dir. Families register through the ``register_families`` hook, like
backends. Must not import torch.
"""

from __future__ import annotations

import json
import os

from ..errors import ModelDirError
from .base import ROLES, GraphSpec, GraphTable, Mode, ModelFamily, StateSpec, TensorSpec
from .official import FAMILY_TITLES, official_family, official_yaml

#: the family of dirs that record none (converted before families existed; official v1 dirs)
DEFAULT_FAMILY = "cosyvoice1"


def family_classes() -> dict[str, type[ModelFamily]]:
    """Registered families by name."""
    from ..plugins import registered

    return registered("register_families", ModelFamily, "ModelFamily")


def get_family(name: str) -> type[ModelFamily]:
    """The family registered as ``name``.

    Raises:
        ModelDirError: no such family (the message lists the registered ones).
    """
    classes = family_classes()
    if name in classes:
        return classes[name]
    raise ModelDirError(f"unknown model family {name!r}; registered families: "
                        f"{', '.join(sorted(classes)) or 'none'}")


def _manifest_family(model_dir: str) -> str | None:
    path = os.path.join(model_dir, "manifest.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None  # the backend's manifest check reports it properly
    return data.get("family", DEFAULT_FAMILY) if isinstance(data, dict) else None


def detect_family(model_dir) -> type[ModelFamily]:
    """The family of ``model_dir``: a converted dir's manifest ``family`` (``cosyvoice1`` when
    absent), else the first registered family whose :meth:`ModelFamily.detect` accepts the
    official dir (third-party families are asked before the built-in one).

    Raises:
        ModelDirError: ``model_dir`` does not exist or no family recognizes it; an official
            CosyVoice2/3 dir (:func:`cosyvino.families.official.official_family`) that no
            registered family accepts.
    """
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    name = _manifest_family(model_dir)
    if name is not None:
        return get_family(name)
    classes = family_classes()
    for fam_name in sorted(classes, key=lambda n: n == DEFAULT_FAMILY):
        try:
            if classes[fam_name].detect(model_dir):
                return classes[fam_name]
        except Exception:  # a broken third-party detect must not hide the others
            continue
    official = official_family(model_dir)
    if official is not None and official != DEFAULT_FAMILY:
        # an official CosyVoice2/3 dir no registered family serves: say so rather than
        # mis-reading it as v1
        title = FAMILY_TITLES[official]
        raise ModelDirError(
            f"{model_dir} is a {title} model dir ({official_yaml(official)}); this cosyvino "
            f"cannot serve {title} yet (no '{official}' family is registered; `cosyvino info` "
            "summarizes the dir)", model_dir)
    return classes[DEFAULT_FAMILY] if DEFAULT_FAMILY in classes else get_family(DEFAULT_FAMILY)


def recognized_family(model_dir) -> str | None:
    """The name of the registered family whose :meth:`ModelFamily.detect` accepts the
    official dir ``model_dir``, or of a converted dir's manifest ``family``; None when none
    does. Unlike :func:`detect_family` there is no fallback to the default family, so "no
    model there yet" and "a model of family X" can be told apart. Never raises."""
    try:
        model_dir = os.fspath(model_dir)
        if not os.path.isdir(model_dir):
            return None
        name = _manifest_family(model_dir)
        classes = family_classes()
        if name is not None:
            return name if name in classes else None
    except Exception:  # noqa: BLE001 - never raises
        return None
    for fam_name in sorted(classes, key=lambda n: (n == DEFAULT_FAMILY, n)):
        try:
            if classes[fam_name].detect(model_dir):
                return fam_name
        except Exception:  # noqa: BLE001 - a broken third-party detect must not hide others
            continue
    return None


__all__ = ["DEFAULT_FAMILY", "ROLES", "GraphSpec", "GraphTable", "Mode", "ModelFamily", "StateSpec",
           "TensorSpec", "detect_family", "family_classes", "get_family",
           "recognized_family"]
