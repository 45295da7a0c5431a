"""Request bodies of the synthesis endpoints: the OpenAI ``/v1/audio/speech`` JSON body and the
CosyVoice ``/inference_sft`` / ``_zero_shot`` / ``_cross_lingual`` / ``_instruct`` /
``_instruct2`` (CosyVoice2) / ``_vc`` fields, each a pydantic model, all turned into one
:class:`SpeechParams`; and the fields of ``POST /v1/audio/voices`` (:class:`VoiceForm`).

Every field check raises its own error (``code`` + message, as the API has always answered);
:func:`parse` turns the first one, in field order, into an :class:`~.errors.APIError` (400).
What needs the loaded model (voice names, speakable text, seed fixing) is checked later by
:meth:`cosyvino.request.SynthesisRequest.validated`, through the pool.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Annotated, Any, Callable

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, ValidationError,
                      ValidationInfo, WithJsonSchema, model_validator)
from pydantic_core import PydanticCustomError

from ..request import (FINAL_HOPS, FLOW_STREAMING, HOP_SCHEDULES, MAX_SPEED, MAX_TIMESTEPS,
                       MIN_SPEED, MIN_TIMESTEPS, StreamingOptions, SynthesisRequest)
from .config import MAX_INPUT_CHARS
from .encoding import SPEECH_FORMATS
from .errors import APIError

STREAM_FORMATS = ("audio", "sse")
#: error types that are not a field's fault: answered with ``code`` null
_BODY_ERRORS = ("invalid_body",)


@dataclass(frozen=True)
class SpeechParams:
    """One synthesis request as the server runs it, whichever endpoint it came from.

    Attributes:
        text: the text to speak.
        voice: speaker id / voice name (the model's first speaker when the client gave none).
        fmt: response format: an OpenAI ``response_format`` or ``raw`` (CosyVoice wire format).
        speed: 0.25..4.0.
        seed: non-negative int, or None (random; such requests are not cached).
        stream_format: ``audio`` (the bytes) or ``sse`` (OpenAI server-sent events).
        hop_schedule: how audio is cut into chunks (:data:`cosyvino.request.HOP_SCHEDULES`;
            ``latency`` = the earliest first chunk).
        n_timesteps: CFM ODE steps (None: the model's), :class:`cosyvino.request.SynthesisRequest`.
            text_param / voice_param: the endpoint's names of the text and voice fields, for errors.
        mode: the synthesis mode the endpoint asks for (None: the first that fits the inputs,
            :class:`cosyvino.request.SynthesisRequest`).
        prompt_audio / source_audio: the uploaded prompt / source recording (the file's bytes;
            any format :mod:`cosyvino.prompt_audio` reads), or None.
        prompt_text / instruction: the prompt transcript / the instruction, or None.
        fields: the endpoint's names of the mode inputs (``prompt_audio``, ``source_audio``,
            ``prompt_text``, ``instruction`` -> field name), for errors.
        flow_streaming / final_hop / vocoder_streaming: how CosyVoice2/3 token hops compute
            the flow and vocoder (:class:`cosyvino.request.StreamingOptions`).
    """

    text: str
    voice: str | None
    fmt: str
    speed: float
    seed: int | None
    stream_format: str = "audio"
    text_param: str = "input"
    voice_param: str = "voice"
    hop_schedule: str = "latency"
    mode: str | None = None
    prompt_audio: bytes | None = None
    prompt_text: str | None = None
    source_audio: bytes | None = None
    instruction: str | None = None
    fields: tuple[tuple[str, str], ...] = ()
    n_timesteps: int | None = None
    flow_streaming: str = "auto"
    final_hop: str = "official"
    vocoder_streaming: str = "auto"

    @property
    def sse(self) -> bool:
        return self.stream_format == "sse"

    def field(self, name: str) -> str:
        """The endpoint's name of mode input ``name`` (default: ``name`` itself)."""
        return dict(self.fields).get(name, name)

    def request(self, num_speech_tokens: int | None = None) -> SynthesisRequest:
        """The engine request (``num_speech_tokens``: the server's forced count, if any)."""
        return SynthesisRequest(text=self.text, voice=self.voice, speed=self.speed,
                                seed=self.seed, num_speech_tokens=num_speech_tokens,
                                n_timesteps=self.n_timesteps,
                                streaming=StreamingOptions(
                                    self.hop_schedule, flow_streaming=self.flow_streaming,
                                    final_hop=self.final_hop,
                                    vocoder_streaming=self.vocoder_streaming), mode=self.mode,
                                prompt_audio=self.prompt_audio, prompt_text=self.prompt_text,
                                source_audio=self.source_audio, instruction=self.instruction)


# ---- field checks ----------------------------------------------------------------------------
def _fail(code: str, message: str) -> PydanticCustomError:
    # the message is the context, not the template: a message is never re-formatted
    return PydanticCustomError(code, "{message}", {"message": message})


def _typed(kinds: tuple, check: Callable[[Any, str], Any] | None = None):
    """A before-validator: the value must be an instance of ``kinds`` (bool is never a
    number), then ``check(value, field name)`` (returns the value or raises :func:`_fail`)."""
    what = "a number" if float in kinds else "an integer" if int in kinds else "a string"

    def validate(value, info: ValidationInfo):
        name = info.field_name
        if isinstance(value, bool) or not isinstance(value, kinds):
            raise _fail("invalid_type", f"'{name}' must be {what}, got {type(value).__name__}")
        return check(value, name) if check is not None else value

    return BeforeValidator(validate)


def _max_length(value: str, name: str) -> str:
    if len(value) > MAX_INPUT_CHARS:
        raise _fail("string_above_max_length", f"'{name}' is {len(value)} characters; the "
                    f"limit is {MAX_INPUT_CHARS}")
    return value


def _speed_range(value, name: str, shown=None):
    try:
        ok = MIN_SPEED <= float(value) <= MAX_SPEED
    except OverflowError:  # an integer beyond float range
        ok = False
    if not ok:
        raise _fail("invalid_value", f"'{name}' must be between {MIN_SPEED} and {MAX_SPEED}, "
                    f"got {value if shown is None else shown}")
    return value


def _one_of(choices: tuple, message: str):
    def check(value: str, name: str) -> str:
        if value not in choices:
            raise _fail("invalid_value", message.format(value=value))
        return value

    return check


def _non_negative(value: int, name: str) -> int:
    if value < 0:
        raise _fail("invalid_value", f"'{name}' must be a non-negative integer, got {value}")
    return value


def _timesteps_range(value: int, name: str) -> int:
    if not MIN_TIMESTEPS <= value <= MAX_TIMESTEPS:
        raise _fail("invalid_value", f"'{name}' must be an integer between {MIN_TIMESTEPS} and "
                    f"{MAX_TIMESTEPS}, got {value}")
    return value


def _first_error(e: ValidationError) -> APIError:
    """The first failed check (fields in declaration order) as a 400."""
    err = e.errors(include_url=False)[0]
    param = str(err["loc"][0]) if err["loc"] else None
    kind = err["type"]
    if kind == "missing":
        return APIError(400, f"missing required parameter '{param}'", param=param,
                        code="missing_required_parameter")
    if kind in _BODY_ERRORS:
        return APIError(400, err["msg"])
    if isinstance(err.get("ctx"), dict) and "message" in err["ctx"]:  # one of our checks
        return APIError(400, err["msg"], param=param, code=kind)
    return APIError(400, f"'{param}': {err['msg']}", param=param, code="invalid_value")


def parse(model: type[BaseModel], data) -> BaseModel:
    """``model`` validated from ``data``.

    Raises:
        APIError: 400 for the first failed check.
    """
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise _first_error(e) from None


# ---- OpenAI /v1/audio/speech -----------------------------------------------------------------
Str = Annotated[str, _typed((str,))]


def _voice_id(value):
    """``voice``: a string, or an object ``{"id": string, ...}`` (OpenAI's voice objects)."""
    if isinstance(value, dict):
        if "id" not in value:
            raise _fail("invalid_value", "'voice' as an object needs an 'id' (e.g. "
                        '{"id": "alice"})')
        value = value["id"]
    if not isinstance(value, str):
        raise _fail("invalid_type", "'voice' must be a voice id (a string) or {\"id\": ...}, "
                    f"got {type(value).__name__}")
    return value


class SpeechBody(BaseModel):
    """The JSON body of ``POST /v1/audio/speech`` (OpenAI's fields; unknown ones are ignored,
    ``null`` means absent)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    #: any model id is accepted: one model per server
    model: Str | None = Field(None, description="Any id (one model per server), e.g. tts-1")
    input: Annotated[str, _typed((str,), _max_length)] = Field(
        description="The text to speak", json_schema_extra={"maxLength": MAX_INPUT_CHARS})
    #: a voice id (built-in speaker or registered voice) or ``{"id": ...}``
    voice: Annotated[str, BeforeValidator(_voice_id), WithJsonSchema({
        "anyOf": [{"type": "string"},
                  {"type": "object", "properties": {"id": {"type": "string"}},
                   "required": ["id"]}]})] | None = Field(
        None, description="A voice id of GET /v1/audio/voices, an OpenAI voice name (an "
        "alias, docs/server.md) or {\"id\": ...}; default: the model's first speaker")
    response_format: Annotated[str, _typed((str,), _one_of(
        SPEECH_FORMATS, "unsupported response_format {value!r}; choose one of "
        + ", ".join(SPEECH_FORMATS)))] = Field(
        "mp3", json_schema_extra={"enum": list(SPEECH_FORMATS)})
    speed: Annotated[float, _typed((int, float), _speed_range)] = Field(
        1.0, json_schema_extra={"minimum": MIN_SPEED, "maximum": MAX_SPEED})
    stream_format: Annotated[str, _typed((str,), _one_of(
        STREAM_FORMATS, "unsupported stream_format {value!r}; choose audio or sse"))] = Field(
        "audio", description="audio: the encoded bytes; sse: OpenAI server-sent events",
        json_schema_extra={"enum": list(STREAM_FORMATS)})
    #: selects the instruct mode (an Instruct model; a 400 on any other); empty = absent
    instructions: Annotated[str, _typed((str,), _max_length)] | None = Field(
        None, description="Instruct models only (a 400 on any other)")
    seed: Annotated[int, _typed((int,), _non_negative)] | None = Field(
        None, description="Reproducible audio (and a cacheable result)",
        json_schema_extra={"minimum": 0})
    #: cosyvino extension: the token-hop schedule (first-chunk latency vs official parity)
    hop_schedule: Annotated[str, _typed((str,), _one_of(
        HOP_SCHEDULES, "unsupported hop_schedule {value!r}; choose one of "
        + ", ".join(HOP_SCHEDULES)))] = Field(
        "latency", description="cosyvino extension: how the audio is cut into chunks",
        json_schema_extra={"enum": list(HOP_SCHEDULES)})
    #: cosyvino extension: CFM ODE steps (speed vs fidelity to the official audio)
    n_timesteps: Annotated[int, _typed((int,), _timesteps_range)] | None = Field(
        None, description="cosyvino extension: flow-matching ODE steps (default: the "
        "model's, 10); fewer is faster and further from the official audio",
        json_schema_extra={"minimum": MIN_TIMESTEPS, "maximum": MAX_TIMESTEPS})
    #: cosyvino extensions: incremental streaming of the CosyVoice2 flow / CosyVoice3 vocoder
    flow_streaming: Annotated[str, _typed((str,), _one_of(
        FLOW_STREAMING, "unsupported flow_streaming {value!r}; choose one of "
        + ", ".join(FLOW_STREAMING)))] = Field(
        "auto", description="cosyvino extension (CosyVoice2): official = each hop re-runs "
        "the flow over all tokens so far; incremental = only the new tokens (same audio); "
        "auto = incremental where the backend runs it",
        json_schema_extra={"enum": list(FLOW_STREAMING)})
    final_hop: Annotated[str, _typed((str,), _one_of(
        FINAL_HOPS, "unsupported final_hop {value!r}; choose one of "
        + ", ".join(FINAL_HOPS)))] = Field(
        "official", description="cosyvino extension: the last hop of an incremental stream "
        "re-runs with full attention (official) or not (incremental: cheaper, not upstream's "
        "audio)", json_schema_extra={"enum": list(FINAL_HOPS)})
    vocoder_streaming: Annotated[str, _typed((str,), _one_of(
        FLOW_STREAMING, "unsupported vocoder_streaming {value!r}; choose one of "
        + ", ".join(FLOW_STREAMING)))] = Field(
        "auto", description="cosyvino extension (CosyVoice3): the causal vocoder re-runs "
        "over all mel so far (official) or decodes a window per hop (incremental, same audio)",
        json_schema_extra={"enum": list(FLOW_STREAMING)})

    @model_validator(mode="before")
    @classmethod
    def _object_without_nulls(cls, data):
        if not isinstance(data, dict):
            raise PydanticCustomError("invalid_body", "request body must be a JSON object")
        return {k: v for k, v in data.items() if v is not None}

    def params(self, default_voice: str | None) -> SpeechParams:
        voice = default_voice if self.voice is None else self.voice
        instruction = self.instructions if self.instructions and self.instructions.strip() \
            else None
        return SpeechParams(self.input, voice, self.response_format,
                            float(self.speed), self.seed, self.stream_format,
                            hop_schedule=self.hop_schedule, instruction=instruction,
                            fields=(("instruction", "instructions"), ("prompt_audio", "voice")),
                            n_timesteps=self.n_timesteps, flow_streaming=self.flow_streaming,
                            final_hop=self.final_hop,
                            vocoder_streaming=self.vocoder_streaming)


def parse_speech_request(body, default_voice: str | None) -> SpeechParams:
    """The :class:`SpeechParams` of a decoded ``/v1/audio/speech`` body. Raises APIError
    (400)."""
    return parse(SpeechBody, body).params(default_voice)


# ---- CosyVoice /inference_sft ----------------------------------------------------------------
def _sft_text(value):
    if value is None:
        raise _fail("missing_required_parameter", "missing required parameter 'tts_text'")
    if not isinstance(value, str):
        raise _fail("invalid_type", "'tts_text' must be a string")
    return _max_length(value, "tts_text")


def _sft_speed(value, info: ValidationInfo):
    # form fields are strings: anything float() takes is a number (upstream's FastAPI Form)
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise _fail("invalid_type", f"'{info.field_name}' must be a number, got {value!r}"
                    ) from None
    _speed_range(number, info.field_name, shown=value)
    return number


def _sft_seed(value):
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        raise _fail("invalid_type", "'seed' must be a non-negative integer") from None


def _sft_timesteps(value):
    if value is None or value == "":
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise _fail("invalid_type", f"'n_timesteps' must be an integer, got {value!r}"
                    ) from None
    return _timesteps_range(number, "n_timesteps")


def _sft_schedule(value):
    if value not in HOP_SCHEDULES:
        raise _fail("invalid_value", f"unsupported hop_schedule {value!r}; choose one of "
                    + ", ".join(HOP_SCHEDULES))
    return value


class _CosyVoiceForm(BaseModel):
    """Fields every CosyVoice-compatible endpoint takes besides its own (extensions of the
    official server: ``speed``, ``seed``, ``hop_schedule``, ``n_timesteps``)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    speed: Annotated[float, BeforeValidator(_sft_speed)] = 1.0
    seed: Annotated[int | None, BeforeValidator(_sft_seed)] = None
    hop_schedule: Annotated[str, BeforeValidator(_sft_schedule)] = "latency"
    n_timesteps: Annotated[int | None, BeforeValidator(_sft_timesteps)] = None

    def _params(self, text: str, voice: str | None, **mode_inputs) -> SpeechParams:
        return SpeechParams(text, voice, "raw", self.speed, self.seed, "audio",
                            text_param="tts_text", voice_param="spk_id",
                            hop_schedule=self.hop_schedule, n_timesteps=self.n_timesteps,
                            **mode_inputs)


class SftForm(_CosyVoiceForm):
    """The fields of ``/inference_sft`` (query string, form, multipart or JSON, merged; the
    official client's names). A negative seed is left to the engine's validation."""

    tts_text: Annotated[str, BeforeValidator(_sft_text)]
    spk_id: Annotated[str, BeforeValidator(str)] | None = None

    def params(self, default_voice: str | None) -> SpeechParams:
        # always the sft mode, as upstream's inference_sft: a registered voice's embedding
        # alone (a registered voice named elsewhere runs zero-shot / cross-lingual)
        voice = default_voice if self.spk_id is None else self.spk_id
        return self._params(self.tts_text, voice, mode="sft")


def _required(name: str):
    """A before-validator: field ``name`` must be a non-empty string (form fields are
    strings)."""
    def check(value):
        if value is None:
            raise _fail("missing_required_parameter", f"missing required parameter '{name}'")
        if not isinstance(value, str):
            raise _fail("invalid_type", f"'{name}' must be a string")
        if not value.strip():
            raise _fail("invalid_value", f"'{name}' is empty")
        return _max_length(value, name)

    return BeforeValidator(check)


#: the upload fields of the CosyVoice-compatible endpoints (mode input -> field name)
UPLOAD_FIELDS = (("prompt_audio", "prompt_wav"), ("source_audio", "source_wav"),
                 ("prompt_text", "prompt_text"), ("instruction", "instruct_text"))


def _need_file(files: dict, name: str) -> bytes:
    data = files.get(name)
    if data is None:
        raise APIError(400, f"missing required file '{name}' (a multipart/form-data upload)",
                       param=name, code="missing_required_parameter")
    return data


def _target_voice(files: dict, spk_id: str | None) -> dict:
    """The voice of a prompt endpoint: the file ``prompt_wav`` (upstream's field), or instead
    (cosyvino extension) ``spk_id`` naming a voice with a prompt (a registered voice, or one
    of a CosyVoice2 model's ``spk2info.pt`` voices). Returns the :class:`SpeechParams` fields
    (``voice``, ``prompt_audio``).

    Raises:
        APIError: 400 ``missing_required_parameter`` without either, ``invalid_value`` with
            both.
    """
    if spk_id is None:
        return {"voice": None, "prompt_audio": _need_file(files, "prompt_wav")}
    if files.get("prompt_wav") is not None:
        raise APIError(400, "give the target voice as 'prompt_wav' or as 'spk_id' (a "
                       "registered voice), not both", param="spk_id", code="invalid_value")
    return {"voice": spk_id, "prompt_audio": None}


#: ``spk_id`` of the prompt endpoints (extension): a voice with a prompt, instead of prompt_wav
SpkId = Annotated[str, BeforeValidator(str)] | None


class ZeroShotForm(_CosyVoiceForm):
    """``/inference_zero_shot``: ``tts_text``, ``prompt_text`` and the file ``prompt_wav`` (or
    ``spk_id``, :func:`_target_voice`)."""

    tts_text: Annotated[str, BeforeValidator(_sft_text)]
    prompt_text: Annotated[str, _required("prompt_text")]
    spk_id: SpkId = None

    def params(self, files: dict) -> SpeechParams:
        voice = _target_voice(files, self.spk_id)
        return self._params(self.tts_text, voice["voice"], mode="zero_shot",
                            prompt_audio=voice["prompt_audio"], prompt_text=self.prompt_text,
                            fields=UPLOAD_FIELDS)


class CrossLingualForm(_CosyVoiceForm):
    """``/inference_cross_lingual``: ``tts_text`` and the file ``prompt_wav`` (or ``spk_id``,
    :func:`_target_voice`)."""

    tts_text: Annotated[str, BeforeValidator(_sft_text)]
    spk_id: SpkId = None

    def params(self, files: dict) -> SpeechParams:
        voice = _target_voice(files, self.spk_id)
        return self._params(self.tts_text, voice["voice"], mode="cross_lingual",
                            prompt_audio=voice["prompt_audio"], fields=UPLOAD_FIELDS)


class InstructForm(_CosyVoiceForm):
    """``/inference_instruct``: ``tts_text``, ``spk_id`` and ``instruct_text`` (Instruct
    models)."""

    tts_text: Annotated[str, BeforeValidator(_sft_text)]
    spk_id: Annotated[str, _required("spk_id")]
    instruct_text: Annotated[str, _required("instruct_text")]

    def params(self, files: dict | None = None) -> SpeechParams:
        return self._params(self.tts_text, self.spk_id, mode="instruct",
                            instruction=self.instruct_text, fields=UPLOAD_FIELDS)


class Instruct2Form(_CosyVoiceForm):
    """``/inference_instruct2`` (CosyVoice2; the official v2 server's fields, sheet v2 §7.1):
    ``tts_text``, ``instruct_text`` (e.g. ``用四川话说这句话<|endofprompt|>``; the end marker is
    appended when missing) and the file ``prompt_wav`` (the voice), or ``spk_id``
    (:func:`_target_voice`)."""

    tts_text: Annotated[str, BeforeValidator(_sft_text)]
    instruct_text: Annotated[str, _required("instruct_text")]
    spk_id: SpkId = None

    def params(self, files: dict) -> SpeechParams:
        voice = _target_voice(files, self.spk_id)
        return self._params(self.tts_text, voice["voice"], mode="instruct2",
                            prompt_audio=voice["prompt_audio"],
                            instruction=self.instruct_text, fields=UPLOAD_FIELDS)


class VcForm(_CosyVoiceForm):
    """``/inference_vc``: the file ``source_wav`` (what is said) and the voice: the file
    ``prompt_wav``, or (extension) ``spk_id`` naming a registered voice; no text.

    Raises (from :meth:`params`): APIError 400 ``missing_required_parameter`` without
    ``source_wav`` or without any voice, ``invalid_value`` with both ``prompt_wav`` and
    ``spk_id``."""

    spk_id: SpkId = None

    def params(self, files: dict) -> SpeechParams:
        source = _need_file(files, "source_wav")
        voice = _target_voice(files, self.spk_id)
        return self._params("", voice["voice"], mode="vc", source_audio=source,
                            prompt_audio=voice["prompt_audio"], fields=UPLOAD_FIELDS)


# ---- POST /v1/audio/voices -------------------------------------------------------------------
def _flag(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0",
                                                            "false", "no", "off", ""):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise _fail("invalid_value", f"'overwrite' must be true or false, got {value!r}")


def _optional_text(value):
    if value is None or (isinstance(value, str) and not value.strip()):
        return None  # an empty transcript field = no transcript (cross-lingual voice)
    if not isinstance(value, str):
        raise _fail("invalid_type", "'text' must be a string")
    return _max_length(value, "text")


class VoiceForm(BaseModel):
    """The fields of ``POST /v1/audio/voices`` (multipart): ``name``, the file ``file`` (checked
    by the route), ``text`` (its transcript, optional: without it the voice runs
    cross-lingual) and ``overwrite`` (replace a registered voice of that name)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: Annotated[str, _required("name")]
    text: Annotated[str | None, BeforeValidator(_optional_text)] = None
    overwrite: Annotated[bool, BeforeValidator(_flag)] = False


def parse_sft_request(fields: dict, default_voice: str) -> SpeechParams:
    """The :class:`SpeechParams` of ``/inference_sft``'s merged fields. Raises APIError
    (400)."""
    return parse(SftForm, fields).params(default_voice)


def normalize_for_key(text: str) -> str:
    """Cache-key text: NFC, whitespace runs collapsed, stripped."""
    return " ".join(unicodedata.normalize("NFC", text).split())


# ---- OpenAPI ---------------------------------------------------------------------------------
def openapi_json_body(model: type[BaseModel]) -> dict:
    """``openapi_extra`` of a route that reads ``model`` as its JSON body by hand (the routes
    read the body themselves, within the size and depth limits): the request body schema
    /openapi.json and /docs show."""
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": model.model_json_schema()}}}}


def openapi_form_body(model: type[BaseModel], files: tuple[str, ...] = (),
                      required_files: tuple[str, ...] = ()) -> dict:
    """``openapi_extra`` of an endpoint taking ``model``'s fields as a form (multipart when it
    takes the uploads ``files``, else also urlencoded); ``required_files`` must be sent."""
    schema = model.model_json_schema()
    props = dict(schema.get("properties", {}))
    for name in files:
        props[name] = {"type": "string", "format": "binary",
                       "description": "a recording (WAV, FLAC, MP3, ...; docs/server.md)"}
    form = {"type": "object", "properties": props,
            "required": [*schema.get("required", ()), *required_files]}
    if schema.get("description"):
        form["description"] = schema["description"]
    content = {"multipart/form-data": {"schema": form}}
    if not files:
        content["application/x-www-form-urlencoded"] = {"schema": form}
    return {"requestBody": {"required": bool(form["required"]), "content": content}}
