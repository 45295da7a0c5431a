"""Progressive streaming of every response format from a real uvicorn server on 127.0.0.1, and
streams that are cut after their headers went out (the client can tell; metrics and logs say
so). Tiny synthetic model, forced token counts.

No timing assertions: the synthesizer's vocoder is wrapped (:class:`VocoderGate`) to count the
chunks the engine has finished and to hold or fail one chunk, so "the client had audio before
the engine finished" is a count, not a clock.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import threading
import time

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")
av = pytest.importorskip("av")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.server import ServerConfig  # noqa: E402
from server_harness import RunningServer, metric  # noqa: E402

TOKENS = 25  # forced speech tokens per segment (0.5 s of audio)
TEXT = "第一句话说完了，第二句话也说完了。" * 10  # 3 text segments on the tiny model
VOICE = "中文女"
FORMATS = ("wav", "pcm", "flac", "mp3", "opus", "aac")
RATES = {"wav": 22050, "flac": 22050, "mp3": 22050, "aac": 22050, "opus": 48000}


class VocoderGate:
    """Wraps a synthesizer's ``vocoder_f0`` stage (called once per audio chunk).

    ``done`` counts finished calls; with ``mode`` set, call number ``at`` is held until
    :attr:`release` is set (``"hold"``, at most 60 s) or raises (``"fail"``).
    """

    def __init__(self, stages):
        self.lock = threading.Lock()
        self.release = threading.Event()
        self.reset()
        original = stages.vocoder_f0

        def vocoder_f0(mel):
            with self.lock:
                self.entered += 1
                n = self.entered
            if n == self.at and self.mode == "hold":
                self.release.wait(60)
            elif n == self.at and self.mode == "fail":
                raise RuntimeError("vocoder failed (test)")
            out = original(mel)
            with self.lock:
                self.done += 1
            return out

        stages.vocoder_f0 = vocoder_f0

    def reset(self, mode: str | None = None, at: int = 2) -> None:
        self.mode, self.at = mode, at
        self.entered = self.done = 0
        self.release.clear()


@pytest.fixture(scope="module")
def gated(tiny_model_dir):
    synth = Synthesizer(tiny_model_dir, backend="torch", num_threads=1)
    return synth, VocoderGate(synth.stages)


def _config(**kw) -> ServerConfig:
    return ServerConfig(max_sessions=1, queue_size=4, num_speech_tokens=TOKENS,
                        cache_memory_mb=0, warmup=False, **kw)


@pytest.fixture(scope="module")
def server(gated):
    s = RunningServer(_config(request_timeout=120), [gated[0]])
    yield s
    s.stop()


@pytest.fixture(scope="module")
def short_timeout_server(gated):
    """Times out 8 s after arrival: the first chunk of the tiny model is out long before."""
    s = RunningServer(_config(request_timeout=8), [gated[0]])
    yield s
    s.stop()


@pytest.fixture
def gate(gated):
    g = gated[1]
    g.reset()
    yield g
    g.release.set()  # never leave a worker held
    g.reset()


def body(fmt: str, **kw) -> dict:
    return {"model": "tts-1", "input": TEXT, "voice": VOICE, "response_format": fmt, "seed": 7,
            **kw}


def decoded_samples(fmt: str, data: bytes) -> int:
    """Samples in (a prefix of) a stream; 0 while nothing decodes yet."""
    if fmt == "pcm":
        return len(data) // 2
    if fmt == "wav":
        return max(0, len(data) - 44) // 2
    try:
        with av.open(io.BytesIO(data)) as c:
            return sum(f.samples for f in c.decode(audio=0))
    except (av.error.FFmpegError, ValueError, IndexError):
        return 0


# ---- audio leaves while the engine is still synthesizing ------------------------------------
@pytest.mark.parametrize("fmt", FORMATS)
def test_first_audio_arrives_before_the_engine_has_finished(server, gate, fmt):
    gate.reset(mode="hold", at=2)  # the engine stops before its 2nd chunk until we have audio
    data, done_at_first_audio = b"", None
    with httpx.stream("POST", server.url + "/v1/audio/speech", json=body(fmt),
                      timeout=120) as r:
        assert r.status_code == 200, r.read()
        for part in r.iter_raw():
            data += part
            if done_at_first_audio is None and decoded_samples(fmt, data) > 0:
                done_at_first_audio = gate.done
                gate.release.set()
    total_chunks = gate.done
    assert total_chunks >= 3  # 3 segments, each one chunk or more
    # decodable audio reached the client while at most one of its chunks was synthesized
    assert done_at_first_audio is not None and done_at_first_audio <= 1 < total_chunks
    n = decoded_samples(fmt, data)
    rate = RATES.get(fmt, 24000)
    assert n >= 0.95 * 3 * TOKENS / 50 * rate  # then the whole text (3 segments x 0.5 s)


@pytest.mark.parametrize("fmt", FORMATS)
def test_sse_sends_a_delta_per_chunk_for_every_format(server, gate, fmt):
    audio = httpx.post(server.url + "/v1/audio/speech", json=body(fmt), timeout=120)
    assert audio.status_code == 200
    gate.reset()
    r = httpx.post(server.url + "/v1/audio/speech", json=body(fmt, stream_format="sse"),
                   timeout=120)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    chunks = gate.done
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1]["type"] == "speech.audio.done"
    deltas = [e for e in events[:-1] if e["type"] == "speech.audio.delta"]
    assert len(deltas) == len(events) - 1
    if fmt in ("wav", "pcm"):
        assert len(deltas) == chunks  # one per chunk, exactly
    else:  # one per chunk that completed a frame, plus the encoder's tail at the end
        assert chunks - 1 <= len(deltas) <= chunks + 1, (len(deltas), chunks)
    # the same bytes as the plain audio response (same seed; deterministic encoders)
    assert b"".join(base64.b64decode(e["audio"]) for e in deltas) == audio.content


# ---- streams cut after the headers ----------------------------------------------------------
def _cut_log(caplog, reason):
    return [r for r in caplog.records
            if r.name == "cosyvino.server" and f"stream cut ({reason})" in r.getMessage()]


def _errors(caplog):
    """ERROR records (uvicorn's "ASGI callable returned without completing response." for a
    cut body among them, on the old code)."""
    return [f"{r.name}: {r.getMessage()}" for r in caplog.records if r.levelno >= logging.ERROR]


def _uvicorn_incomplete(caplog):
    return [r for r in caplog.records
            if r.name.startswith("uvicorn") and "without completing response" in r.getMessage()]


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_failure_mid_stream_aborts_the_body(server, gate, fmt, caplog):
    url = server.url
    before = metric(url, "cosyvino_streams_cut_total",
                    'endpoint="/v1/audio/speech",reason="error"')
    gate.reset(mode="fail", at=3)
    data = b""
    with caplog.at_level(logging.WARNING, logger="cosyvino.server"):
        with pytest.raises(httpx.RemoteProtocolError, match="incomplete chunked read"):
            with httpx.stream("POST", url + "/v1/audio/speech", json=body(fmt),
                              timeout=120) as r:
                assert r.status_code == 200  # the headers were out before the failure
                for part in r.iter_raw():
                    data += part
    assert decoded_samples(fmt, data) > 0  # what came before the cut is still audio
    assert metric(url, "cosyvino_streams_cut_total",
                  'endpoint="/v1/audio/speech",reason="error"') == before + 1
    (record,) = _cut_log(caplog, "error")
    assert record.levelno == logging.WARNING
    assert _uvicorn_incomplete(caplog) == []  # the cut is deliberate: not uvicorn's ERROR
    message = record.getMessage()
    assert f"/v1/audio/speech {fmt}, {len(TEXT)} characters" in message
    assert "s of audio sent in 2 chunk(s)" in message and "vocoder failed (test)" in message


def test_failure_mid_stream_ends_sse_with_an_error_event(server, gate):
    gate.reset(mode="fail", at=3)
    r = httpx.post(server.url + "/v1/audio/speech", json=body("mp3", stream_format="sse"),
                   timeout=120)
    assert r.status_code == 200  # a complete response: the error is in band
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[0]["type"] == "speech.audio.delta"
    assert events[-1]["type"] == "error"
    assert events[-1]["error"]["code"] == "synthesis_failed"


def test_raw_inference_sft_cut_fails_the_official_client(server, gate):
    requests = pytest.importorskip("requests")
    gate.reset(mode="fail", at=3)
    # the official CosyVoice client's call (runtime/python/fastapi/client.py)
    r = requests.request("GET", server.url + "/inference_sft",
                         data={"tts_text": TEXT, "spk_id": VOICE}, stream=True, timeout=120)
    assert r.status_code == 200
    data = b""
    with pytest.raises(requests.exceptions.ChunkedEncodingError):
        for part in r.iter_content(chunk_size=16000):
            data += part
    assert len(data) > 0 and len(data) % 2 == 0  # whole int16 samples before the cut


def test_timeout_mid_stream_is_a_cut_the_client_sees(short_timeout_server, gate, caplog):
    url = short_timeout_server.url
    before = metric(url, "cosyvino_streams_cut_total",
                    'endpoint="/v1/audio/speech",reason="timeout"')
    gate.reset(mode="hold", at=2)  # held until the request's 8 s have passed
    data = b""
    with caplog.at_level(logging.WARNING, logger="cosyvino.server"):
        with pytest.raises(httpx.RemoteProtocolError):
            with httpx.stream("POST", url + "/v1/audio/speech", json=body("wav"),
                              timeout=120) as r:
                assert r.status_code == 200
                for part in r.iter_raw():
                    data += part
    gate.release.set()
    assert decoded_samples("wav", data) > 0
    assert metric(url, "cosyvino_streams_cut_total",
                  'endpoint="/v1/audio/speech",reason="timeout"') == before + 1
    assert metric(url, "cosyvino_cancelled_total", 'reason="timeout"') >= 1
    (record,) = _cut_log(caplog, "timeout")
    assert "did not finish within 8 s" in record.getMessage()
    # issue 33 (trial 3, item 2): our WARNING is the whole log of a deliberate cut; uvicorn's
    # "ERROR ASGI callable returned without completing response" read as a crash
    assert record.levelno == logging.WARNING and _errors(caplog) == []


def test_a_cut_frees_its_slot_before_the_client_sees_the_cut(short_timeout_server, gate):
    """Issue 33 (trial 3, item 1): a request cut at the timeout held its slot while its worker
    finished the stage call it was in (~3 s on the trial's loaded machine): /ready said
    in_flight 1 and two vc requests got 503 meanwhile. The slot goes back at the cut; the cut
    request stops at its next stage call and is still accounted for.

    The gate holds the cut request's worker inside its vocoder call (its audio lane's lock
    with it) until the checks are done, so the "meanwhile" lasts as long as the test needs."""
    url, pool = short_timeout_server.url, short_timeout_server.state.pool
    stopped = metric(url, "cosyvino_stopped_early_total")
    cut = metric(url, "cosyvino_streams_cut_total", 'endpoint="/v1/audio/speech",reason="timeout"')
    gate.reset(mode="hold", at=2)  # held past the request's 8 s: cut at the timeout
    with pytest.raises(httpx.RemoteProtocolError):
        with httpx.stream("POST", url + "/v1/audio/speech", json=body("wav"),
                          timeout=120) as r:
            assert r.status_code == 200
            for _ in r.iter_raw():
                pass
    result: dict = {}
    try:
        assert not gate.release.is_set()  # its worker is still in the held stage call
        ready = httpx.get(url + "/ready", timeout=30).json()
        assert ready["in_flight"] == 0 and ready["stopping"] == 1
        assert ready["admission"]["backlog_seconds"] == 0
        # the next request gets the free slot at once (it is submitted to the scheduler while
        # the cut request's worker is still held; before: it waited, or got 503)
        nxt = threading.Thread(target=lambda: result.update(r=httpx.post(
            url + "/v1/audio/speech", json=body("wav", input="你好。"), timeout=120)))
        nxt.start()
        deadline = time.monotonic() + 20
        while len(pool._jobs) < 2 and time.monotonic() < deadline and nxt.is_alive():
            time.sleep(0.02)
        assert len(pool._jobs) == 2 and pool.running == 1 and pool.stopping == 1
    finally:
        gate.release.set()
    nxt.join(60)
    r = result["r"]
    assert r.status_code == 200 and decoded_samples("wav", r.content) > 0
    deadline = time.monotonic() + 20
    while (pool.stopping or pool.running) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.stopping == 0 and pool.running == 0 and pool.admitted == 0
    # the cut request stopped at its next stage call (its third segment never ran)
    assert metric(url, "cosyvino_stopped_early_total") == stopped + 1
    assert metric(url, "cosyvino_streams_cut_total",
                  'endpoint="/v1/audio/speech",reason="timeout"') == cut + 1
    assert metric(url, "cosyvino_in_flight") == 0


def test_a_complete_stream_is_not_counted_as_cut(server, gate):
    url = server.url
    before = sum(metric(url, "cosyvino_streams_cut_total",
                        f'endpoint="/v1/audio/speech",reason="{reason}"')
                 for reason in ("error", "timeout", "shutdown", "cancelled"))
    with httpx.stream("POST", url + "/v1/audio/speech", json=body("wav"), timeout=120) as r:
        data = r.read()  # raises if the chunked body were incomplete
    assert decoded_samples("wav", data) > 0
    after = sum(metric(url, "cosyvino_streams_cut_total",
                       f'endpoint="/v1/audio/speech",reason="{reason}"')
                for reason in ("error", "timeout", "shutdown", "cancelled"))
    assert after == before


def test_a_request_cancelled_by_the_asgi_server_before_its_headers_gets_the_503():
    """uvicorn cancels requests still open when its graceful shutdown runs out: one that has
    sent nothing gets the documented 503 server_busy (not uvicorn's plain-text 500)."""
    import asyncio as _asyncio
    import json as _json

    from cosyvino.server.streaming import SynthesisResponse

    resp = SynthesisResponse.__new__(SynthesisResponse)
    resp.cancel = threading.Event()
    resp._headers_sent = False

    async def never(send, gone):
        raise _asyncio.CancelledError

    resp._run = never
    sent = []

    async def send(message):
        sent.append(message)

    async def receive():
        await _asyncio.sleep(3600)

    async def main():
        with pytest.raises(_asyncio.CancelledError):
            await resp({"type": "http"}, receive, send)

    _asyncio.run(main())
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 503
    headers = dict(sent[0]["headers"])
    assert headers[b"retry-after"] == b"5"
    assert _json.loads(sent[1]["body"])["error"]["code"] == "server_busy"
    assert resp.cancel.is_set()


def test_vc_cut_at_the_timeout_fails_curl(short_timeout_server, gate, caplog, tmp_path):
    """Issue 33 (trial 2, item 2): the README's /inference_vc example ran past the timeout and
    `curl -s ... -o vc.pcm` showed nothing: the 200 body holding 1.32 s of the 13.75 s. A cut
    raw stream must end without its terminating chunk so curl fails (exit 18, which -sS
    prints), and the server logs the cut."""
    import shutil
    import subprocess

    from conftest import FIXTURES

    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("no curl on PATH")
    url = short_timeout_server.url
    before = metric(url, "cosyvino_streams_cut_total",
                    'endpoint="/inference_vc",reason="timeout"')
    gate.reset(mode="hold", at=2)  # held until the request's 8 s have passed
    out = tmp_path / "vc.pcm"
    with caplog.at_level(logging.WARNING, logger="cosyvino.server"):
        proc = subprocess.run(
            [curl, "-sSf", url + "/inference_vc",
             "-F", f"source_wav=@{FIXTURES / 'cross_lingual_prompt.wav'}",
             "-F", f"prompt_wav=@{FIXTURES / 'zero_shot_prompt.wav'}", "-o", str(out)],
            capture_output=True, text=True, timeout=120, check=False)
    gate.release.set()
    assert proc.returncode == 18, (proc.returncode, proc.stderr)
    assert "curl: (18)" in proc.stderr  # what -S shows the user
    data = out.read_bytes()
    assert 0 < len(data) and len(data) % 2 == 0  # whole int16 samples up to the cut
    assert metric(url, "cosyvino_streams_cut_total",
                  'endpoint="/inference_vc",reason="timeout"') == before + 1
    (record,) = _cut_log(caplog, "timeout")
    assert "/inference_vc raw, " in record.getMessage()
    assert "bytes of source audio" in record.getMessage()
    assert "did not finish within 8 s" in record.getMessage()
    assert record.levelno == logging.WARNING and _errors(caplog) == []  # no uvicorn ERROR
