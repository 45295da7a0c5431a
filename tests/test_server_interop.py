"""Issue 18 item 4, OpenAI / chat-UI interop, against a real uvicorn server on 127.0.0.1: the
OpenAI Python client (``audio.speech.create`` and ``with_streaming_response``), an Open
WebUI-style voice listing (``voices[].id``), OpenAI voice names through the alias table, the
request bodies in /openapi.json, and CORS (off by default; a preflight when enabled). Tiny
synthetic model, forced small speech-token counts."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
sf = pytest.importorskip("soundfile")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.errors import InputError  # noqa: E402
from cosyvino.server import ServerConfig, create_app  # noqa: E402
from cosyvino.server.aliases import (DEFAULT_ALIASES, apply_alias, parse_aliases,  # noqa: E402
                                     resolve_aliases)
from server_harness import RunningServer  # noqa: E402

TOKENS = 8
TEXT = "Hello world."
ORIGIN = "https://chat.example.com"
OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "onyx", "nova", "sage",
                 "shimmer", "verse")


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    synth = Synthesizer(tiny_model_dir, backend="torch", num_threads=1)
    cfg = ServerConfig(num_speech_tokens=TOKENS, cache_memory_mb=0, request_timeout=60,
                       cors_origins=(ORIGIN,), voice_aliases={"echo": "中文男"})
    s = RunningServer(cfg, [synth])
    yield s
    s.stop()


def speech(url, **body) -> httpx.Response:
    r = httpx.post(url + "/v1/audio/speech", json={"input": TEXT, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


@pytest.fixture(scope="module")
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_speech_create(client, server):
    reply = client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT,
                                       response_format="wav", extra_body={"seed": 3})
    samples, rate = sf.read(io.BytesIO(reply.content), dtype="int16")
    assert rate == 22050 and samples.ndim == 1 and samples.shape[0] > 0
    assert np.abs(samples).max() > 0
    # alloy is an alias of 英文女: the same audio as asking for 英文女 with the seed
    assert reply.content == speech(server.url, voice="英文女", response_format="wav", seed=3)


def test_openai_client_streaming_response(client, server):
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="nova", input=TEXT, response_format="pcm",
            extra_body={"seed": 4}) as reply:
        assert reply.http_response.status_code == 200
        pcm = b"".join(reply.iter_bytes())
    assert len(pcm) > 0 and len(pcm) % 2 == 0
    assert pcm == speech(server.url, voice="英文女", response_format="pcm", seed=4)


def test_openai_client_streams_aac(client):
    av = pytest.importorskip("av")
    with client.audio.speech.with_streaming_response.create(
            model="tts-1", voice="onyx", input=TEXT, response_format="aac",
            extra_body={"seed": 5}) as reply:
        assert reply.headers["content-type"] == "audio/aac"
        data = b"".join(reply.iter_bytes())
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert stream.codec_context.name == "aac"
        decoded = sum(frame.samples for frame in container.decode(stream))
    assert decoded > 0


def test_open_webui_style_voice_listing(server):
    """What Open WebUI does: GET {base}/audio/voices, then voice["id"] / voice["name"] of each
    entry of ``voices``; any listed id works as ``voice`` (also as ``{"id": ...}``)."""
    body = httpx.get(server.url + "/v1/audio/voices", timeout=10).json()
    listed = [(v["id"], v["name"]) for v in body["voices"]]
    synth = server.state.pool.synth
    assert [i for i, _ in listed] == synth.speakers and all(i == n for i, n in listed)
    assert body["data"] == body["voices"]
    assert body["aliases"]["alloy"] == "英文女" and body["aliases"]["echo"] == "中文男"
    assert set(body["aliases"]) == set(OPENAI_VOICES)
    first = listed[0][0]
    assert speech(server.url, voice={"id": first}, response_format="pcm", seed=1) \
        == speech(server.url, voice=first, response_format="pcm", seed=1)


def test_voice_alias_override_from_config(server):
    # --voice-alias echo=中文男 replaced the default (英文男)
    assert speech(server.url, voice="echo", response_format="pcm", seed=2) \
        == speech(server.url, voice="中文男", response_format="pcm", seed=2)
    r = httpx.post(server.url + "/v1/audio/speech",
                   json={"input": TEXT, "voice": "not-a-voice"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "voice"


def test_alias_table_rules():
    sft = ["中文女", "中文男", "日语男", "粤语女", "英文女", "英文男", "韩语女"]
    table = resolve_aliases(sft)
    assert set(table) == set(OPENAI_VOICES) == set(DEFAULT_ALIASES)
    assert {table[v] for v in OPENAI_VOICES} == {"英文女", "英文男"}
    assert resolve_aliases(["a", "b"]) == {v: "a" for v in OPENAI_VOICES}  # first speaker
    assert resolve_aliases([]) == {}  # no speakers (CosyVoice-300M): no defaults
    assert resolve_aliases([], {"alloy": "alice"}) == {"alloy": "alice"}
    assert apply_alias("alloy", sft, table) == "英文女"
    assert apply_alias("alloy", sft + ["alloy"], table) == "alloy"  # the model's own voice
    assert apply_alias("中文男", sft, table) == "中文男" and apply_alias(None, sft, table) is None
    assert parse_aliases(["alloy=中文女", " echo = bob ", "alloy=x"]) == {"alloy": "x",
                                                                       "echo": "bob"}
    for bad in ("alloy", "=x", "alloy="):
        with pytest.raises(InputError, match="bad voice alias"):
            parse_aliases([bad])


def test_openapi_describes_the_request_bodies(server):
    r = httpx.get(server.url + "/openapi.json", timeout=10)
    assert r.status_code == 200
    spec = r.json()
    body = spec["paths"]["/v1/audio/speech"]["post"]["requestBody"]
    schema = body["content"]["application/json"]["schema"]
    assert body["required"] is True and schema["required"] == ["input"]
    props = schema["properties"]
    assert {"model", "input", "voice", "response_format", "speed", "stream_format",
            "instructions", "seed"} <= set(props)
    assert "aac" in props["response_format"]["enum"]
    assert {"type": "object", "properties": {"id": {"type": "string"}},
            "required": ["id"]} in props["voice"]["anyOf"]
    assert (props["speed"]["minimum"], props["speed"]["maximum"]) == (0.25, 4.0)
    zs = spec["paths"]["/inference_zero_shot"]["post"]["requestBody"]["content"]
    form = zs["multipart/form-data"]["schema"]
    assert form["properties"]["prompt_wav"]["format"] == "binary"
    assert {"tts_text", "prompt_text", "prompt_wav"} <= set(form["required"])
    voices = spec["paths"]["/v1/audio/voices"]["post"]["requestBody"]["content"]
    assert "file" in voices["multipart/form-data"]["schema"]["required"]
    ops = [op["operationId"] for path in spec["paths"].values() for op in path.values()]
    assert len(ops) == len(set(ops))  # GET and POST of one endpoint: distinct ids
    assert httpx.get(server.url + "/docs", timeout=10).status_code == 200


def test_cors_preflight_when_enabled(server):
    r = httpx.options(server.url + "/v1/audio/speech", timeout=10, headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "POST" in r.headers["access-control-allow-methods"]
    assert "authorization" in r.headers["access-control-allow-headers"].lower()
    # an actual request from that origin may read the audio and the request id
    r = httpx.get(server.url + "/v1/audio/voices", headers={"Origin": ORIGIN}, timeout=10)
    assert r.headers["access-control-allow-origin"] == ORIGIN
    assert "x-request-id" in r.headers["access-control-expose-headers"].lower()
    # another origin: refused preflight, no allow header
    r = httpx.options(server.url + "/v1/audio/speech", timeout=10, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
    assert r.status_code == 400 and "access-control-allow-origin" not in r.headers


def test_cors_off_by_default(tiny_model_dir):
    from fastapi.testclient import TestClient

    app = create_app(ServerConfig(model_dir=tiny_model_dir, cache_memory_mb=0))
    client = TestClient(app)  # no lifespan: no model load, the middleware stack only
    r = client.options("/v1/audio/speech", headers={
        "Origin": ORIGIN, "Access-Control-Request-Method": "POST"})
    assert r.status_code == 405
    assert not any(k.startswith("access-control-") for k in r.headers)
    r = client.get("/health", headers={"Origin": ORIGIN})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_cors_origin_is_checked():
    with pytest.raises(InputError, match="CORS origin"):
        ServerConfig(cors_origins=("chat.example.com",)).validate()
    assert ServerConfig(cors_origins=("*", ORIGIN)).validate().cors_origins == ("*", ORIGIN)
