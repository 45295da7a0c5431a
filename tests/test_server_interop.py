"""Issue 18 item 4, OpenAI / chat-UI interop, against a real uvicorn server on 127.0.0.1: the
OpenAI Python client (``audio.speech.create`` and ``with_streaming_response``), an Open
WebUI-style voice listing (``voices[].id``), OpenAI voice names through the alias table, the
request bodies in /openapi.json, and CORS (off by default; a preflight when enabled). Tiny
synthetic model, forced small speech-token counts."""

from __future__ import annotations

import io
import pathlib

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
                 "shimmer", "verse", "marin", "cedar")
KEY = "interop-k3y"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROMPT_WAV = pathlib.Path(__file__).parent.parent / "examples" / "zero_shot_prompt.wav"
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"


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


def test_openai_newer_voices_are_aliases(server):
    """marin and cedar (OpenAI's voices of 2025) work like the older names: marin is 英文女,
    cedar 英文男 (the reading of aliases.DEFAULT_ALIASES)."""
    assert speech(server.url, voice="marin", response_format="pcm", seed=6) \
        == speech(server.url, voice="英文女", response_format="pcm", seed=6)
    assert speech(server.url, voice="cedar", response_format="pcm", seed=6) \
        == speech(server.url, voice="英文男", response_format="pcm", seed=6)


def test_audio_models_lists_the_model_ids_open_webui_reads(server):
    """Open WebUI asks a custom TTS base URL for GET {base}/audio/models and reads
    ``models[].id`` (it falls back to tts-1 / tts-1-hd on an error); the ids are those of
    /v1/models."""
    r = httpx.get(server.url + "/v1/audio/models", timeout=10)
    assert r.status_code == 200, r.text
    body = r.json()
    ids = [m["id"] for m in body["models"]]
    assert ids == [m["id"] for m in httpx.get(server.url + "/v1/models",
                                               timeout=10).json()["data"]]
    assert {"tts-1", "tts-1-hd", "gpt-4o-mini-tts"} <= set(ids)
    assert body["data"] == body["models"] and body["object"] == "list"
    assert all(m["object"] == "model" and m["modes"] for m in body["models"])


@pytest.fixture(scope="module")
def keyed_servers(tiny_model_dir, tmp_path_factory):
    """(server with --api-key, the same with --public-voice-list) sharing one synthesizer
    that has a registered voice ``alice`` (zero-shot, with its transcript)."""
    pytest.importorskip("onnx")  # the synthetic prompt models of the tiny model
    synth = Synthesizer(tiny_model_dir, backend="torch", num_threads=1,
                        voices_dir=str(tmp_path_factory.mktemp("voices")))
    synth.add_voice("alice", PROMPT_WAV.read_bytes(), PROMPT_TEXT)
    cfg = dict(num_speech_tokens=TOKENS, cache_memory_mb=0, request_timeout=60, api_key=KEY)
    private = RunningServer(ServerConfig(**cfg), [synth])
    public = RunningServer(ServerConfig(**cfg, public_voice_list=True), [synth])
    yield private, public
    private.stop()
    public.stop()


def test_voice_and_model_lists_need_the_key_by_default(keyed_servers):
    """With --api-key, Open WebUI's calls (no Authorization header) get 401: it then shows
    OpenAI's voice names instead of the server's (docs/server.md, "Open WebUI")."""
    private, _ = keyed_servers
    for path in ("/v1/audio/voices", "/v1/audio/models", "/v1/models"):
        r = httpx.get(private.url + path, timeout=10)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", path
        assert httpx.get(private.url + path, headers=AUTH, timeout=10).status_code == 200
    full = httpx.get(private.url + "/v1/audio/voices", headers=AUTH, timeout=10).json()
    alice = next(v for v in full["voices"] if v["id"] == "alice")
    assert alice["prompt_text"] == PROMPT_TEXT and alice["builtin"] is False


def test_public_voice_list_opens_only_the_lists(keyed_servers):
    private, public = keyed_servers
    body = httpx.get(public.url + "/v1/audio/voices", timeout=10).json()
    synth = public.state.pool.synth
    assert [v["id"] for v in body["voices"]] == synth.speakers + ["alice"]
    # ids and names only: a registered voice's transcript, hash and sizes need the key
    assert all(set(v) == {"id", "name", "object", "builtin"} for v in body["voices"])
    assert body["data"] == body["voices"] and body["aliases"]["marin"] == "英文女"
    # with the key the same call gives the full objects
    keyed = httpx.get(public.url + "/v1/audio/voices", headers=AUTH, timeout=10).json()
    assert keyed == httpx.get(private.url + "/v1/audio/voices", headers=AUTH,
                              timeout=10).json()
    # a wrong key is not refused on the public list (Open WebUI sends none), but gets no more
    wrong = httpx.get(public.url + "/v1/audio/voices", timeout=10,
                      headers={"Authorization": "Bearer nope"}).json()
    assert wrong == body
    models = httpx.get(public.url + "/v1/audio/models", timeout=10)
    assert models.status_code == 200 and "tts-1" in [m["id"] for m in models.json()["models"]]
    # everything else still needs the key
    for method, path in (("GET", "/v1/models"), ("GET", "/v1/audio/voices/alice"),
                         ("DELETE", "/v1/audio/voices/alice"), ("POST", "/v1/audio/speech")):
        r = httpx.request(method, public.url + path, timeout=10,
                          json={"input": TEXT} if method == "POST" else None)
        assert r.status_code == 401, (method, path)
    r = httpx.post(public.url + "/v1/audio/speech", headers=AUTH, timeout=60,
                   json={"input": TEXT, "voice": "alice", "response_format": "pcm", "seed": 1})
    assert r.status_code == 200 and len(r.content) > 0


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
