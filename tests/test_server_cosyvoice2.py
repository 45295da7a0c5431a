"""The server on a CosyVoice2 model (issue 35 item 7) against real uvicorn servers on 127.0.0.1,
on the golden official dir tiny-c (24 kHz; built-in SFT speaker ``中文女``, spk2info prompt
voices ``alice`` and ``bob``; no prompt models, so recordings are refused with a typed 400).

* ``/v1/audio/speech`` in every response format at 24 kHz (``X-Sample-Rate``, read back with
  soundfile / PyAV; wav, pcm and flac are exactly the library's int16 samples), streamed (SSE)
  equal to whole for a seed, the SFT speaker, a spk2info voice (zero-shot), a registered voice,
  ``instructions`` selecting ``instruct2`` (the family's mode with ``needs_instruction``), the
  OpenAI voice aliases on a model without the v1 speaker names;
* the official endpoints ``/inference_sft``, ``_zero_shot``, ``_cross_lingual``, ``_instruct2``
  (official v2 fields; ``spk_id`` naming a voice instead of ``prompt_wav``) and ``_vc``, raw
  int16 equal to the library's audio with ``X-Sample-Rate: 24000``;
* ``/v1/models``, ``/v1/audio/models`` and ``/v1/audio/voices`` listing the v2 modes and voices;
* typed 4xx: unknown voice, a mode the model lacks (v1's ``/inference_instruct``; a model
  restricted to fewer modes), empty text, an SFT speaker for ``instruct2``, recordings the
  model cannot process;
* admission at the model's token rate (25 tokens/s).
"""

from __future__ import annotations

import base64
import io
import json

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
sf = pytest.importorskip("soundfile")
pytest.importorskip("torch")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.request import SynthesisRequest  # noqa: E402
from cosyvino.server import ServerConfig  # noqa: E402
from cosyvino.server.aliases import DEFAULT_ALIASES, resolve_aliases  # noqa: E402
from cosyvino.server.encoding import join_segments, to_int16, wire_rate  # noqa: E402
from cosyvino.server.pool import TOKENS_PER_SECOND, token_rate  # noqa: E402
from cosyvino.voices import Voice  # noqa: E402
from conftest import FIXTURES, TINY_C  # noqa: E402
from server_harness import RunningServer  # noqa: E402

RATE = 24000
TOKENS = 8
TEXT = "Hello world."
#: two sentences long enough to be two text segments (two chunks with forced token counts)
TWO = "第一句话说完了。" * 12 + "Then an English sentence follows here."
SPEAKER = "中文女"
INSTRUCTION = "用四川话说这句话<|endofprompt|>"
PROMPT = (FIXTURES / "zero_shot_prompt.wav").read_bytes()


@pytest.fixture(scope="module")
def tts(tmp_path_factory):
    t = Synthesizer(str(TINY_C), backend="torch", num_threads=1,
                    voices_dir=str(tmp_path_factory.mktemp("voices")))
    # a registered voice (the v2 prompt models are not run yet: made from alice's bundle)
    alice = t.voice("alice")
    t.voice_store.add(Voice(name="carol", embedding=alice.embedding,
                            prompt_speech_tokens=alice.prompt_speech_tokens,
                            prompt_mel=alice.prompt_mel, prompt_text=alice.prompt_text))
    yield t
    t.close()


@pytest.fixture(scope="module")
def server(tts):
    s = RunningServer(ServerConfig(num_speech_tokens=TOKENS, request_timeout=120,
                                   cache_memory_mb=0, max_upload_bytes=2 << 20), [tts])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def fewer_modes(tts):
    """The same loaded model offering only cross_lingual and zero_shot (no sft, no
    instruct2), with no registered voices."""
    t = Synthesizer.from_stages(tts.stages, backend_name="torch", model_dir=str(TINY_C),
                                modes=["zero_shot", "cross_lingual"], voices_dir=False)
    s = RunningServer(ServerConfig(num_speech_tokens=TOKENS, request_timeout=120,
                                   cache_memory_mb=0), [t])
    yield s
    s.stop()


def expected(tts, text="", voice=None, seed=0, hop_schedule="latency", **inputs) -> np.ndarray:
    """What the server must send: the library's stream, joined with the server's fades."""
    chunks = list(tts.stream(text, voice, seed=seed, num_speech_tokens=TOKENS,
                             hop_schedule=hop_schedule, **inputs))
    assert all(c.sample_rate == RATE for c in chunks)
    return to_int16(join_segments(chunks, RATE))


def speech(server, **body) -> httpx.Response:
    return httpx.post(server.url + "/v1/audio/speech", json={"input": TEXT, **body},
                      timeout=120)


def post(server, path, data=None, files=None, **kw) -> httpx.Response:
    return httpx.post(server.url + path, data=data, files=files, timeout=120, **kw)


def raw(r) -> np.ndarray:
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["x-sample-rate"] == str(RATE)
    return np.frombuffer(r.content, "<i2")


def assert_error(r, status, param=None, code=None, match=()):
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    if code is not None:
        assert err["code"] == code, err
    for text in ([match] if isinstance(match, str) else match):
        assert text in err["message"], err
    return err


def av_decode(data: bytes) -> tuple[np.ndarray, int]:
    """PyAV (FFmpeg): mono float32 samples (int formats scaled) and the stream's rate."""
    import av

    with av.open(io.BytesIO(data)) as f:
        frames = [fr.to_ndarray().reshape(-1) for fr in f.decode(audio=0)]
        rate = f.streams.audio[0].rate
    x = np.concatenate(frames)
    return (x.astype(np.float32) / 32768 if x.dtype == np.int16 else x.astype(np.float32)), rate


# ---- /v1/audio/speech: formats at 24 kHz -----------------------------------------------------
@pytest.mark.parametrize("fmt,ctype", [("wav", "audio/wav"), ("pcm", "audio/pcm"),
                                       ("flac", "audio/flac"), ("mp3", "audio/mpeg"),
                                       ("opus", "audio/ogg"), ("aac", "audio/aac")])
def test_every_format_is_24k(server, tts, fmt, ctype):
    want = expected(tts, TEXT, SPEAKER, seed=5)
    r = speech(server, voice=SPEAKER, response_format=fmt, seed=5)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == ctype
    assert r.headers["x-sample-rate"] == str(RATE) == str(wire_rate(fmt, tts.sample_rate))
    if fmt == "pcm":  # OpenAI's pcm is 24 kHz: the v2 model's own samples, not resampled
        np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), want)
        return
    if fmt in ("wav", "flac"):
        got, rate = sf.read(io.BytesIO(r.content), dtype="int16")
        assert rate == RATE
        np.testing.assert_array_equal(got, want)
    y, av_rate = av_decode(r.content)
    n = want.size
    if fmt == "opus":  # soundfile reads the Ogg Opus input rate; FFmpeg decodes at 48 kHz
        samples, rate = sf.read(io.BytesIO(r.content), dtype="float32")
        assert rate == RATE and abs(samples.size - n) <= 1
        assert av_rate == 48000 and abs(y.size - 2 * n) <= 2
    elif fmt == "mp3":
        assert av_rate == RATE and abs(y.size - n) <= 1152
        assert sf.read(io.BytesIO(r.content))[1] == RATE
    elif fmt == "aac":  # ADTS: the documented 1024-sample priming first
        assert av_rate == RATE and n + 1024 <= y.size < n + 2048
    else:
        assert av_rate == RATE and y.size == n
    assert np.abs(y).max() > 1e-3


@pytest.mark.parametrize("schedule", ["latency", "official"])
def test_streamed_equals_whole_for_a_seed(server, tts, schedule):
    want = expected(tts, TWO, "alice", seed=7, hop_schedule=schedule)
    body = {"input": TWO, "voice": "alice", "seed": 7, "hop_schedule": schedule,
            "response_format": "pcm"}
    whole = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=120)
    assert whole.status_code == 200, whole.text
    sse = httpx.post(server.url + "/v1/audio/speech", json={**body, "stream_format": "sse"},
                     timeout=120)
    assert sse.status_code == 200 and sse.headers["x-sample-rate"] == str(RATE)
    events = [json.loads(line[6:]) for line in sse.text.splitlines()
              if line.startswith("data: ")]
    deltas = [base64.b64decode(e["audio"]) for e in events
              if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2 and events[-1]["type"] == "speech.audio.done"
    assert b"".join(deltas) == whole.content
    np.testing.assert_array_equal(np.frombuffer(whole.content, "<i2"), want)


@pytest.mark.parametrize("flow, final", [("official", "official"),
                                         ("incremental", "incremental")])
def test_flow_streaming_fields_reach_the_stream(server, tts, flow, final):
    """The JSON extensions ``flow_streaming`` / ``final_hop`` select the library's options:
    the server sends exactly the library's stream for them (issue 36)."""
    from cosyvino.request import StreamingOptions
    from cosyvino.server.schemas import parse_speech_request

    body = {"input": TWO, "flow_streaming": flow, "final_hop": final,
            "vocoder_streaming": "official", "hop_schedule": "official"}
    assert parse_speech_request(body, "alice").request().streaming == StreamingOptions(
        "official", flow_streaming=flow, final_hop=final, vocoder_streaming="official")
    want = expected(tts, TWO, "alice", seed=7, hop_schedule="official",
                    flow_streaming=flow, final_hop=final)
    r = speech(server, input=TWO, voice="alice", seed=7, hop_schedule="official",
               flow_streaming=flow, final_hop=final, response_format="pcm")
    assert r.status_code == 200, r.text
    np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"), want)


def test_bad_streaming_fields_are_a_typed_400(server):
    assert_error(speech(server, voice="alice", flow_streaming="fast"), 400, "flow_streaming",
                 "invalid_value", "unsupported flow_streaming 'fast'")
    assert_error(speech(server, voice="alice", final_hop="auto"), 400, "final_hop",
                 "invalid_value")


# ---- voices and modes through /v1/audio/speech ----------------------------------------------
def test_sft_speaker_spk2info_voice_and_registered_voice(server, tts):
    sft = speech(server, voice=SPEAKER, response_format="pcm", seed=1)
    default = speech(server, response_format="pcm", seed=1)  # no voice: the SFT speaker
    assert sft.content == default.content
    np.testing.assert_array_equal(np.frombuffer(sft.content, "<i2"),
                                  expected(tts, TEXT, SPEAKER, seed=1, mode="sft"))
    # a spk2info prompt voice with its transcript: zero-shot
    alice = speech(server, voice={"id": "alice"}, response_format="pcm", seed=1)
    np.testing.assert_array_equal(np.frombuffer(alice.content, "<i2"),
                                  expected(tts, TEXT, "alice", seed=1, mode="zero_shot"))
    assert alice.content != sft.content
    carol = speech(server, voice="carol", response_format="pcm", seed=1)
    np.testing.assert_array_equal(np.frombuffer(carol.content, "<i2"),
                                  expected(tts, TEXT, "carol", seed=1, mode="zero_shot"))


def test_instructions_select_instruct2(server, tts):
    r = speech(server, voice="alice", instructions=INSTRUCTION, response_format="wav", seed=2)
    assert r.status_code == 200, r.text
    got, rate = sf.read(io.BytesIO(r.content), dtype="int16")
    assert rate == RATE
    np.testing.assert_array_equal(got, expected(tts, TEXT, "alice", seed=2, mode="instruct2",
                                                instruction=INSTRUCTION))
    plain = speech(server, voice="alice", response_format="wav", seed=2)
    assert plain.content != r.content
    # no voice: the model's first voice with a prompt (instruct2 needs one)
    default = speech(server, instructions=INSTRUCTION, response_format="wav", seed=2)
    assert default.content == r.content
    # an SFT speaker has no prompt: a 400 on the voice, naming the mode
    assert_error(speech(server, voice=SPEAKER, instructions=INSTRUCTION), 400, "voice",
                 "invalid_value", ["instruct2", SPEAKER])


def test_openai_aliases_on_a_model_without_the_v1_speaker_names(server, tts):
    aliases = httpx.get(server.url + "/v1/audio/voices", timeout=30).json()["aliases"]
    assert aliases == {name: SPEAKER for name in DEFAULT_ALIASES}
    r = speech(server, voice="alloy", response_format="pcm", seed=3)
    np.testing.assert_array_equal(np.frombuffer(r.content, "<i2"),
                                  expected(tts, TEXT, SPEAKER, seed=3))
    # the targets are the model's own voices, whatever their names; none: no aliases
    assert resolve_aliases(["alice", "bob"]) == {name: "alice" for name in DEFAULT_ALIASES}
    assert resolve_aliases([]) == {}
    assert resolve_aliases([], {"alloy": "bob"}) == {"alloy": "bob"}


# ---- the official endpoints ------------------------------------------------------------------
def test_inference_sft(server, tts):
    want = expected(tts, TEXT, SPEAKER, seed=4, mode="sft")
    np.testing.assert_array_equal(raw(post(server, "/inference_sft",
                                           {"tts_text": TEXT, "spk_id": SPEAKER,
                                            "seed": "4"})), want)
    # the official client sends its form with GET; no spk_id: the first SFT speaker
    r = httpx.get(server.url + "/inference_sft", params={"tts_text": TEXT, "seed": "4"},
                  timeout=120)
    np.testing.assert_array_equal(raw(r), want)


def test_inference_zero_shot_and_cross_lingual_with_a_voice(server, tts):
    alice = tts.voice("alice")
    r = post(server, "/inference_zero_shot", {"tts_text": TEXT, "prompt_text": alice.prompt_text,
                                              "spk_id": "alice", "seed": "5"})
    np.testing.assert_array_equal(raw(r), expected(tts, TEXT, "alice", seed=5,
                                                   mode="zero_shot"))
    r = post(server, "/inference_cross_lingual", {"tts_text": TEXT, "spk_id": "bob",
                                                  "seed": "5"})
    np.testing.assert_array_equal(raw(r), expected(tts, TEXT, "bob", seed=5,
                                                   mode="cross_lingual"))


def test_inference_instruct2(server, tts):
    want = expected(tts, TEXT, "alice", seed=6, mode="instruct2", instruction=INSTRUCTION)
    fields = {"tts_text": TEXT, "instruct_text": INSTRUCTION, "spk_id": "alice", "seed": "6"}
    np.testing.assert_array_equal(raw(post(server, "/inference_instruct2", fields)), want)
    r = httpx.get(server.url + "/inference_instruct2", params=fields, timeout=120)
    np.testing.assert_array_equal(raw(r), want)
    # the official v2 fields: a prompt recording, which this dir cannot process (no prompt
    # models): a 400 on prompt_wav saying so, not a crash
    r = post(server, "/inference_instruct2", {"tts_text": TEXT, "instruct_text": INSTRUCTION},
             {"prompt_wav": ("p.wav", PROMPT)})
    assert_error(r, 400, "prompt_wav", "prompt_models_unavailable", "campplus.onnx")
    assert_error(post(server, "/inference_instruct2", {"tts_text": TEXT, "spk_id": "alice"}),
                 400, "instruct_text", "missing_required_parameter")
    assert_error(post(server, "/inference_instruct2", {"tts_text": TEXT,
                                                       "instruct_text": INSTRUCTION}),
                 400, "prompt_wav", "missing_required_parameter")
    assert_error(post(server, "/inference_instruct2",
                      {"tts_text": TEXT, "instruct_text": INSTRUCTION, "spk_id": "alice"},
                      {"prompt_wav": ("p.wav", PROMPT)}), 400, "spk_id", "invalid_value",
                 "not both")


def test_inference_vc_names_the_recording_it_cannot_process(server):
    r = post(server, "/inference_vc", {"spk_id": "alice"}, {"source_wav": ("s.wav", PROMPT)})
    assert_error(r, 400, "source_wav", "prompt_models_unavailable", "speech_tokenizer_v2.onnx")
    r = post(server, "/inference_zero_shot", {"tts_text": TEXT, "prompt_text": "hi"},
             {"prompt_wav": ("p.wav", PROMPT)})
    assert_error(r, 400, "prompt_wav", "prompt_models_unavailable")


def test_v1_instruct_endpoint_says_which_mode_takes_instructions(server):
    r = post(server, "/inference_instruct", {"tts_text": TEXT, "spk_id": SPEAKER,
                                             "instruct_text": "calm"})
    assert_error(r, 400, None, "unsupported_mode",
                 ["mode 'instruct' is not supported", "cosyvoice2 family has no mode",
                  "'instruct2'", "/inference_instruct2"])


def test_modes_the_model_lacks(fewer_modes):
    assert_error(post(fewer_modes, "/inference_instruct2",
                      {"tts_text": TEXT, "instruct_text": INSTRUCTION, "spk_id": "alice"}),
                 400, None, "unsupported_mode",
                 ["mode 'instruct2' is not supported", "supported: zero_shot, cross_lingual"])
    assert_error(post(fewer_modes, "/inference_sft", {"tts_text": TEXT, "spk_id": SPEAKER}),
                 400, None, "unsupported_mode", "mode 'sft' is not supported")
    assert_error(speech(fewer_modes, voice="alice", instructions=INSTRUCTION), 400,
                 "instructions", "unsupported_mode", ["'instructions' needs", "zero_shot"])
    models = httpx.get(fewer_modes.url + "/v1/models", timeout=30).json()["data"]
    assert models[0]["modes"] == ["zero_shot", "cross_lingual"]
    assert models[0]["instruction_mode"] is None


# ---- listings --------------------------------------------------------------------------------
def test_models_and_voices_list_the_v2_modes_and_voices(server, tts):
    modes = ["zero_shot", "cross_lingual", "vc", "instruct2", "sft"]
    for path, key in (("/v1/models", "data"), ("/v1/audio/models", "models")):
        objects = httpx.get(server.url + path, timeout=30).json()[key]
        assert [m["id"] for m in objects][0] == "tiny-c"
        for m in objects:
            assert (m["modes"], m["instruction_mode"], m["family"], m["sample_rate"]) == \
                (modes, "instruct2", "cosyvoice2", RATE)
    body = httpx.get(server.url + "/v1/audio/voices", timeout=30).json()
    assert [v["id"] for v in body["data"]] == [SPEAKER, "alice", "bob", "carol"]
    assert body["voices"] == body["data"]
    by_id = {v["id"]: v for v in body["data"]}
    assert by_id[SPEAKER] == {"id": SPEAKER, "name": SPEAKER, "object": "voice",
                              "builtin": True}
    alice = by_id["alice"]
    assert alice["builtin"] is True and alice["has_prompt"] is True
    assert alice["prompt_text"] == tts.voice("alice").prompt_text
    assert alice["prompt_tokens"] == tts.voice("alice").prompt_speech_tokens.size
    assert by_id["carol"]["builtin"] is False and by_id["carol"]["prompt_text"]
    assert httpx.get(server.url + "/v1/audio/voices/bob", timeout=30).json() == by_id["bob"]


# ---- bad input -------------------------------------------------------------------------------
def test_bad_input_is_a_typed_400(server):
    err = assert_error(speech(server, voice="nobody"), 400, "voice", "unknown_voice",
                       ["'nobody'", "alice", "bob"])
    assert SPEAKER in err["message"]
    assert_error(speech(server, input="  。 ", voice="alice"), 400, "input", "empty_input")
    assert_error(post(server, "/inference_sft", {"tts_text": "", "spk_id": SPEAKER}), 400,
                 "tts_text", "empty_input")
    assert_error(post(server, "/inference_cross_lingual", {"tts_text": TEXT, "spk_id": "x"}),
                 400, "spk_id", "unknown_voice")
    assert_error(speech(server, voice="alice", response_format="ogg"), 400,
                 "response_format", "invalid_value")


# ---- admission -------------------------------------------------------------------------------
def test_admission_uses_the_models_token_rate(server, tts):
    assert tts.speech_token_rate == 25.0
    pool = server.state.pool
    assert pool.estimator.tokens_per_second == 25.0
    ready = httpx.get(server.url + "/ready", timeout=30).json()
    assert ready["admission"]["speech_tokens_per_second"] == 25.0
    # 8 forced tokens per segment are 0.32 s of v2 speech (v1's rate would say 0.16 s)
    req = SynthesisRequest(text=TEXT, voice=SPEAKER, num_speech_tokens=TOKENS)
    assert pool.estimator.speech_seconds(req, segments=2) == pytest.approx(2 * TOKENS / 25)
    # a stand-in without a model rate keeps v1's
    assert token_rate(object()) == TOKENS_PER_SECOND == 50.0


# ---- the same server code on a CosyVoice v1 model --------------------------------------------
def test_a_v1_model_keeps_its_rate_and_refuses_instruct2(tiny_model_dir):
    t = Synthesizer(tiny_model_dir, backend="torch", num_threads=1, voices_dir=False)
    s = RunningServer(ServerConfig(num_speech_tokens=TOKENS, request_timeout=120,
                                   cache_memory_mb=0), [t])
    try:
        model = httpx.get(s.url + "/v1/models", timeout=30).json()["data"][0]
        assert (model["family"], model["sample_rate"], model["instruction_mode"]) == \
            ("cosyvoice1", 22050, None)
        assert s.state.pool.estimator.tokens_per_second == 50.0 == t.speech_token_rate
        r = post(s, "/inference_sft", {"tts_text": TEXT, "spk_id": t.speakers[0], "seed": "1"})
        assert r.status_code == 200 and r.headers["x-sample-rate"] == "22050"
        assert speech(s, response_format="pcm", seed=1).headers["x-sample-rate"] == "24000"
        assert_error(post(s, "/inference_instruct2", {"tts_text": TEXT, "instruct_text": "x",
                                                      "spk_id": t.speakers[0]}),
                     400, None, "unsupported_mode",
                     ["mode 'instruct2' is not supported", "cosyvoice1 family has no mode"])
        assert_error(speech(s, instructions="calm"), 400, "instructions", "unsupported_mode")
    finally:
        s.stop()
        t.close()
