"""The backend stage interface (what a backend plugin implements). Must not import torch."""

from .base import Backend, Capabilities, LLMSession, Stages

__all__ = ["Backend", "Capabilities", "LLMSession", "Stages"]
