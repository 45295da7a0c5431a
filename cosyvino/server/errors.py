"""HTTP errors of the server: :class:`APIError` (the OpenAI error body) and the mapping of
library and pool errors onto it (status, ``code``, ``param``)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from ..errors import EmptyTextError, InputError, UnknownSpeakerError
from .pool import Busy, NotReady, TooLong


class APIError(Exception):
    """Answered as ``{"error": {"message", "type", "param", "code"}}`` with ``status``.

    Args:
        status: HTTP status.
        message: human-readable message (also ``str(err)``).
        type_: OpenAI error type (``invalid_request_error``, ``server_error``).
        param: the request field at fault, if any.
        code: machine-readable code (``invalid_value``, ``server_busy``...), if any.
        headers: extra response headers (``Retry-After``, ``WWW-Authenticate``).
    """

    def __init__(self, status: int, message: str, *, type_: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (status, message, type_,
                                                                      param, code)
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def busy_error(e: Busy) -> APIError:
    """503 ``server_busy`` with the pool's Retry-After estimate (``Connection: close`` while
    draining, so the client's next request goes to a fresh connection)."""
    headers = {"Retry-After": str(e.retry_after)}
    if getattr(e, "reason", None) == "draining":
        headers["Connection"] = "close"
    return APIError(503, str(e), type_="server_error", code="server_busy", headers=headers)


def too_long_error(e: TooLong, text_param: str) -> APIError:
    """400 ``input_too_long``: the request alone cannot finish within the request timeout."""
    return APIError(400, str(e), param=text_param, code="input_too_long")


def not_ready_error(e: NotReady) -> APIError:
    """503 ``not_ready`` (model loading or failed to load)."""
    return APIError(503, str(e), type_="server_error", code="not_ready",
                    headers={"Retry-After": "5"})


def input_error(e: InputError, text_param: str, voice_param: str) -> APIError:
    """400 for a request the engine rejected; ``text_param`` / ``voice_param`` are the
    endpoint's names of the text and voice fields (``input``/``voice`` or
    ``tts_text``/``spk_id``)."""
    if isinstance(e, UnknownSpeakerError):
        return APIError(400, str(e), param=voice_param, code="unknown_voice")
    if isinstance(e, EmptyTextError):
        return APIError(400, str(e), param=text_param, code="empty_input")
    msg = str(e)
    param = "speed" if "speed" in msg else "seed" if "seed" in msg else text_param
    return APIError(400, msg, param=param, code="invalid_value")


def timeout_error(seconds: float) -> APIError:
    """504: the request did not finish within the server's request timeout."""
    return APIError(504, f"synthesis did not finish within {seconds:g} s",
                    type_="server_error", code="timeout")


def synthesis_error(e: BaseException, text_param: str = "input",
                    voice_param: str = "voice") -> APIError:
    """What a failure reported by the engine becomes: 400 for bad input, else 500."""
    if isinstance(e, InputError):
        return input_error(e, text_param, voice_param)
    return APIError(500, f"synthesis failed: {e}", type_="server_error",
                    code="synthesis_failed")
