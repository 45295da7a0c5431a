"""The HTTP app (kept for imports): the code lives in :mod:`.routes` (app factory, endpoints),
:mod:`.schemas` (request bodies), :mod:`.streaming` (the streaming response) and
:mod:`.errors` (error bodies)."""

from __future__ import annotations

from ..errors import CosyvinoError
from .errors import APIError
from .routes import OPENAI_MODEL_ALIASES, AppState, create_app
from .schemas import SpeechParams, normalize_for_key, parse_speech_request
from .streaming import SynthesisResponse

__all__ = ["create_app", "APIError", "AppState", "CosyvinoError", "OPENAI_MODEL_ALIASES",
           "SpeechParams", "SynthesisResponse", "normalize_for_key", "parse_speech_request"]
