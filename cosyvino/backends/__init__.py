"""The backend plugin surface (:mod:`.base`) and the generic graph runner (:mod:`.graphs`). Must
not import torch. The stage calls of a model family live with the family (CosyVoice v1:
:mod:`cosyvino.families.cosyvoice1.stages`)."""

from .base import Backend, Capabilities, Stages

__all__ = ["Backend", "Capabilities", "Stages"]
