"""Which official CosyVoice family an official-layout model dir holds, by its yaml file.

The official ``AutoModel(model_dir=...)`` picks ``CosyVoice`` when ``cosyvoice.yaml`` exists, else
``CosyVoice2`` for ``cosyvoice2.yaml``, else ``CosyVoice3`` for ``cosyvoice3.yaml`` (sheet v2 §1);
:func:`official_family` applies the same order. Reads no file content; must not import torch.
"""

from __future__ import annotations

import os

#: (family name, the yaml that marks its official dir), in the official AutoModel order
OFFICIAL_YAMLS: tuple[tuple[str, str], ...] = (
    ("cosyvoice1", "cosyvoice.yaml"),
    ("cosyvoice2", "cosyvoice2.yaml"),
    ("cosyvoice3", "cosyvoice3.yaml"),
)

#: how messages name each family
FAMILY_TITLES = {"cosyvoice1": "CosyVoice v1", "cosyvoice2": "CosyVoice2",
                 "cosyvoice3": "CosyVoice3"}


def official_family(model_dir: str | os.PathLike) -> str | None:
    """``"cosyvoice1"`` | ``"cosyvoice2"`` | ``"cosyvoice3"``: the first family (official order)
    whose yaml is a file in ``model_dir``; None when there is none (or no such dir). Never
    raises."""
    model_dir = os.fspath(model_dir)
    for family, yaml_name in OFFICIAL_YAMLS:
        if os.path.isfile(os.path.join(model_dir, yaml_name)):
            return family
    return None


def official_yaml(family: str) -> str:
    """The yaml file name of ``family`` (``cosyvoice2`` -> ``cosyvoice2.yaml``).

    Raises: KeyError for a name not in :data:`OFFICIAL_YAMLS`."""
    return dict(OFFICIAL_YAMLS)[family]
