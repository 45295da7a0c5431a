"""HTTP errors of the server: :class:`APIError` (the OpenAI error body) and the mapping of
library and pool errors onto it (status, ``code``, ``param``)."""

from __future__ import annotations

from fastapi.responses import JSONResponse

from ..errors import (EmptyTextError, InputError, PromptModelsUnavailableError,
                      UnknownSpeakerError)
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


def too_long_error(e: TooLong, text_param: str, source_param: str = "source_audio") -> APIError:
    """400 ``input_too_long``: the request alone would take more than
    :data:`~.pool.TOO_LONG_FACTOR` x the request timeout.
    ``param``: the endpoint's text field, or its source recording field (``source_param``)
    for voice conversion, whose length comes from the recording (``e.source``)."""
    param = source_param if getattr(e, "source", "text") == "source audio" else text_param
    return APIError(400, str(e), param=param, code="input_too_long")


def not_ready_error(e: NotReady) -> APIError:
    """503 ``not_ready`` (model loading or failed to load)."""
    return APIError(503, str(e), type_="server_error", code="not_ready",
                    headers={"Retry-After": "5"})


def audio_message(message: str, field: str) -> str:
    """A :class:`~cosyvino.prompt_audio.PromptAudioError` message naming the request field
    the recording came in: ``"prompt audio: ..."`` -> ``"prompt audio 'prompt_wav': ..."``
    (the library names the recording by its role; a client needs the form field)."""
    for role in ("prompt audio", "source audio"):
        if message.startswith(role) and not message.startswith(f"{role} '"):
            return f"{role} '{field}'{message[len(role):]}"
    return message


def input_error(e: InputError, text_param: str, voice_param: str,
                fields: dict | None = None, recording: str = "prompt_audio") -> APIError:
    """400 for a request the engine rejected; ``text_param`` / ``voice_param`` are the
    endpoint's names of the text and voice fields (``input``/``voice`` or
    ``tts_text``/``spk_id``), ``fields`` its names of the mode inputs (``prompt_audio``,
    ``source_audio``, ``prompt_text``, ``instruction`` -> field name), ``recording`` the mode
    input of the recording the request gave (``prompt_audio`` or ``source_audio``).

    Codes: ``unknown_voice``, ``empty_input``, ``invalid_audio`` (bad prompt / source
    recording: :class:`cosyvino.prompt_audio.PromptAudioError`, the message names the problem
    and the limit), ``prompt_models_unavailable`` (the model cannot turn a recording into a
    voice here, :class:`cosyvino.errors.PromptModelsUnavailableError`; the param is the field
    of ``recording``), ``unsupported_mode`` (the model does not offer the mode asked for),
    ``invalid_value``."""
    from ..prompt_audio import PromptAudioError

    fields = fields or {}
    msg = str(e)
    if isinstance(e, UnknownSpeakerError):
        return APIError(400, msg, param=voice_param, code="unknown_voice")
    if isinstance(e, EmptyTextError):
        return APIError(400, msg, param=text_param, code="empty_input")
    if isinstance(e, PromptAudioError):
        key = "source_audio" if msg.startswith("source audio") else "prompt_audio"
        field = fields.get(key, key)
        return APIError(400, audio_message(msg, field), param=field, code="invalid_audio")
    if isinstance(e, PromptModelsUnavailableError):
        return APIError(400, msg, param=fields.get(recording, recording),
                        code="prompt_models_unavailable")
    if msg.startswith("mode ") and "is not supported by this model" in msg:
        return APIError(400, msg, code="unsupported_mode")
    # a mode input that is missing or not taken: the message starts with its library name,
    # or names it as "mode 'x' needs <input>"
    for key in ("source_audio", "prompt_audio", "prompt_text", "instruction"):
        if msg.startswith(key) or f"needs {key}" in msg:
            return APIError(400, msg, param=fields.get(key, key), code="invalid_value")
    param = "speed" if "speed" in msg else "seed" if "seed" in msg else text_param
    return APIError(400, msg, param=param, code="invalid_value")


def voice_error(e: Exception, *, name_param: str = "name",
                file_param: str = "file") -> APIError:
    """What a voice-management failure becomes: 409 ``voice_exists``
    (:class:`~cosyvino.voice_store.VoiceExistsError`), 404 ``voice_not_found``
    (:class:`~cosyvino.voice_store.UnknownVoiceError`), 400 ``invalid_voice_name`` /
    ``invalid_audio`` / ``invalid_value``, 500 ``voice_store_error`` (the store cannot be
    written: a server-side problem)."""
    from ..prompt_audio import PromptAudioError
    from ..voice_store import (InvalidVoiceNameError, UnknownVoiceError, VoiceExistsError,
                               VoiceStoreError)

    msg = str(e)
    if isinstance(e, VoiceExistsError):
        return APIError(409, msg, param=name_param, code="voice_exists")
    if isinstance(e, UnknownVoiceError):
        return APIError(404, msg, param=name_param, code="voice_not_found")
    if isinstance(e, InvalidVoiceNameError):
        return APIError(400, msg, param=name_param, code="invalid_voice_name")
    if isinstance(e, PromptAudioError):
        return APIError(400, audio_message(msg, file_param), param=file_param,
                        code="invalid_audio")
    if isinstance(e, VoiceStoreError):
        return APIError(500, msg, type_="server_error", code="voice_store_error")
    if isinstance(e, InputError):
        param = "text" if "prompt_text" in msg else None
        return APIError(400, msg, param=param, code="invalid_value")
    return APIError(500, f"voice registration failed: {e}", type_="server_error",
                    code="voice_store_error")


def timeout_error(seconds: float) -> APIError:
    """504: the request did not finish within the server's request timeout."""
    return APIError(504, f"synthesis did not finish within {seconds:g} s",
                    type_="server_error", code="timeout")


def synthesis_error(e: BaseException, text_param: str = "input",
                    voice_param: str = "voice", fields: dict | None = None) -> APIError:
    """What a failure reported by the engine becomes: 400 for bad input, else 500."""
    if isinstance(e, InputError):
        return input_error(e, text_param, voice_param, fields)
    return APIError(500, f"synthesis failed: {e}", type_="server_error",
                    code="synthesis_failed")
