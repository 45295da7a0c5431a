"""The web page of ``cosyvino serve`` (issue 18 item 5).

Without a browser: the routes (redirects, content types, security headers, ETag, public while
an API key guards the API, no reference to anything outside the page's own files). In a real
headless Chromium driven by Selenium against a live server on 127.0.0.1 (tiny synthetic model,
with an API key): the voice picker lists the server's voices once the key is entered; Speak
streams over SSE and schedules exactly the samples of the non-streamed response (pcm and wav
played as they arrive, with the same int16 sum; mp3 when complete); errors show the server's
message, in view at a laptop's window size (1366x768) wherever the button was; without the
key the header says it is needed (not a green "ready"), also when the voice list is public
(``--public-voice-list``: the keyed model list tells), and a failed Speak says where to type
it; a recording uploaded on the page
registers a voice, speaks once with it (zero-shot, raw stream) and the registered voice is
deleted again; the real-time factor reads as RTF, faster or slower; a load logs no console
error (no favicon.ico 404). On a CosyVoice2 model (tiny-c): the page shows its family, 24 kHz
and modes, groups its spk2info prompt voices, plays wav at 24 kHz, and its Instructions field
(shown only for a model with an instruction mode) runs instruct2.

The browser tests need Chromium and its driver (Debian: ``apt-get install chromium
chromium-driver``) and selenium (the ``dev`` extra); they are skipped without them, and fail
without them in CI (``CI=true``; ``.ci/run`` installs them).
"""

from __future__ import annotations

import base64
import io
import json
import os
import pathlib
import re
import shutil

import numpy as np
import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from cosyvino.server import ServerConfig, create_app  # noqa: E402
from cosyvino.server import webpage  # noqa: E402
from ci_required import require_module, skip_or_fail  # noqa: E402

KEY = "web-s3cret"
TOKENS = 8
TWO = "第一句话说完了。" * 12 + "Then an English sentence follows here."
EXAMPLES = pathlib.Path(__file__).parent.parent / "examples"
PROMPT_WAV = EXAMPLES / "zero_shot_prompt.wav"
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"
CHROMEDRIVER = os.environ.get("COSYVINO_CHROMEDRIVER", "/usr/bin/chromedriver")
#: the browser's window: a common laptop screen (about 1366x625 of page in headless Chromium)
WINDOW = "1366,768"


# ---- routes, no browser ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def client():
    from fastapi.testclient import TestClient

    # no lifespan (no `with`): the model is never loaded; the page does not need it
    return TestClient(create_app(ServerConfig(api_key=KEY)))


def test_root_and_ui_redirect_to_the_page(client):
    for path in ("/", "/ui"):
        r = client.get(path, follow_redirects=False)
        assert r.status_code == 307 and r.headers["location"] == "ui/"
    r = client.get("/")
    assert r.status_code == 200 and str(r.url).endswith("/ui/")
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    assert '<select id="voice">' in r.text and 'id="speak"' in r.text


@pytest.mark.parametrize("name,ctype", [("index.html", "text/html; charset=utf-8"),
                                        ("app.js", "text/javascript; charset=utf-8"),
                                        ("app.css", "text/css; charset=utf-8"),
                                        ("favicon.svg", "image/svg+xml")])
def test_assets_have_their_content_types_and_security_headers(client, name, ctype):
    r = client.get("/ui/" + name)
    assert r.status_code == 200
    assert r.headers["content-type"] == ctype
    assert r.content == (pathlib.Path(webpage.__file__).parent / "web" / name).read_bytes()
    csp = r.headers["content-security-policy"]
    assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    etag = r.headers["etag"]
    again = client.get("/ui/" + name, headers={"If-None-Match": f'W/{etag}, "other"'})
    assert again.status_code == 304 and again.content == b""
    assert client.get("/ui/" + name, headers={"If-None-Match": '"other"'}).status_code == 200


def test_page_is_public_while_the_api_needs_the_key(client):
    assert client.get("/ui/").status_code == 200
    r = client.get("/v1/audio/voices")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert client.head("/ui/app.js").status_code == 200


def test_favicon_is_served_not_a_404(client):
    """Browsers ask for /favicon.ico on every page of the origin that links no icon; the page
    links its own (favicon.svg, allowed by its Content-Security-Policy)."""
    icon = (pathlib.Path(webpage.__file__).parent / "web" / "favicon.svg").read_bytes()
    for path in ("/favicon.ico", "/ui/favicon.svg"):
        r = client.get(path)  # no API key: public like the page
        assert r.status_code == 200, path
        assert r.headers["content-type"] == "image/svg+xml" and r.content == icon
    assert icon.startswith(b"<svg ") and b"viewBox" in icon
    html = client.get("/ui/").text
    assert '<link rel="icon" href="favicon.svg" type="image/svg+xml">' in html


def test_unknown_page_file_is_a_404_in_the_error_shape(client):
    r = client.get("/ui/secret.txt")
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "not_found"
    assert client.get("/ui/..%2Fwebpage.py").status_code == 404


def test_page_loads_nothing_from_elsewhere_and_is_not_in_the_api_schema(client):
    html = client.get("/ui/").text
    refs = re.findall(r'(?:src|href)="([^"]*)"', html)
    assert sorted(refs) == ["app.css", "app.js", "favicon.svg"]
    for name in webpage.ASSETS:
        # an SVG names its XML namespace by URL (an identifier, never fetched)
        text = client.get("/ui/" + name).text.replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), name
    schema = client.get("/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/v1/audio/speech" in paths
    assert not any(p == "/" or p.startswith("/ui") for p in paths)


def test_a_missing_asset_is_a_500_naming_it(monkeypatch):
    from fastapi.testclient import TestClient

    shipped = webpage.load_assets()
    assert set(shipped) == set(webpage.ASSETS)  # the package has all of them
    monkeypatch.setattr(webpage, "load_assets",
                        lambda: {k: v for k, v in shipped.items() if k != "app.js"})
    c = TestClient(create_app(ServerConfig()))
    r = c.get("/ui/app.js")
    assert r.status_code == 500
    assert r.json()["error"]["code"] == "web_page_missing" and "app.js" in r.text
    assert c.get("/ui/").status_code == 200


def test_a_missing_browser_fails_in_ci_and_skips_elsewhere(monkeypatch):
    pytest.importorskip("selenium")  # CI has it (the dev extra); a lack of it: ci_required
    monkeypatch.setattr(shutil, "which", lambda name: None)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no Chromium.*CI must run this test"):
        _browser_or_skip()
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception, match="no Chromium"):
        _browser_or_skip()


# ---- in a real browser -----------------------------------------------------------------------
def _browser_or_skip():
    """A headless Chromium under Selenium; skipped without one, failed in CI (.ci/run
    installs it: ci_required)."""
    webdriver = require_module("selenium.webdriver", "pip install -e '.[dev]'")
    binary = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                   if shutil.which(n)), None)
    if binary is None:
        skip_or_fail("no Chromium on PATH (Debian: apt-get install chromium chromium-driver)")
    if not os.path.exists(CHROMEDRIVER):
        skip_or_fail(f"no chromedriver at {CHROMEDRIVER} (Debian: apt-get install "
                     "chromium-driver; or set COSYVINO_CHROMEDRIVER)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = binary
    # a laptop's window (the page must work there: messages in view, not below the fold);
    # no background connections (this machine's network is closed)
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--autoplay-policy=no-user-gesture-required", f"--window-size={WINDOW}",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})  # the console, for 404s
    try:
        return webdriver.Chrome(service=Service(CHROMEDRIVER), options=opts)
    except Exception as e:  # noqa: BLE001 - selenium's WebDriverException and OS errors
        skip_or_fail(f"Chromium does not start here: {e}")


@pytest.fixture(scope="module")
def tts(tiny_model_dir, tmp_path_factory):
    from cosyvino import Synthesizer

    return Synthesizer(tiny_model_dir, backend="torch", num_threads=1,
                       voices_dir=str(tmp_path_factory.mktemp("voices")))


@pytest.fixture(scope="module")
def browser():
    driver = _browser_or_skip()
    yield driver
    driver.quit()


@pytest.fixture(scope="module")
def server(browser, tts):
    from server_harness import RunningServer

    s = RunningServer(ServerConfig(num_speech_tokens=TOKENS, request_timeout=60,
                                   cache_memory_mb=0, api_key=KEY,
                                   max_upload_bytes=2 << 20), [tts])
    yield s
    s.stop()


AUTH = {"Authorization": f"Bearer {KEY}"}


def _wait(driver, condition, timeout=60):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, timeout, poll_frequency=0.05).until(condition)


def _js(driver, expr):
    return driver.execute_script("return " + expr)


def _server_voices(server) -> list[str]:
    r = httpx.get(server.url + "/v1/audio/voices", headers=AUTH, timeout=30)
    assert r.status_code == 200, r.text
    return [v["id"] for v in r.json()["data"]]


def _open(driver, server, key=KEY):
    """The page, loaded, with ``key`` typed into the API-key field (and its voices listed)."""
    driver.get(server.url + "/")
    _wait(driver, lambda d: _js(d, "document.body.dataset.state") == "idle")
    driver.execute_script("sessionStorage.clear()")
    if key:
        field = driver.find_element("id", "api-key")
        field.clear()
        field.send_keys(key + "\t")  # the change event reloads the voices
        _wait(driver, lambda d: _js(d, "window.cosyvinoWeb.voices.length") > 0)


def _set(driver, element_id, value):
    el = driver.find_element("id", element_id)
    el.clear()
    if value:
        el.send_keys(value)


def _select(driver, element_id, value):
    from selenium.webdriver.support.ui import Select

    Select(driver.find_element("id", element_id)).select_by_value(value)


def _click_and_wait(driver, button_id, timeout=120) -> dict:
    """Clicks a button that runs a synthesis and returns the page's record of it."""
    runs = _js(driver, "window.cosyvinoWeb.runs")
    driver.find_element("id", button_id).click()
    _wait(driver, lambda d: _js(d, "window.cosyvinoWeb.runs") > runs
          and _js(d, "window.cosyvinoWeb.last.status") != "running", timeout)
    return _js(driver, "window.cosyvinoWeb.last")


def _in_view(driver, element_id) -> bool:
    """Whether the element is entirely inside the browser's viewport (not below the fold)."""
    return _js(driver, f"""(() => {{
        const r = document.getElementById({json.dumps(element_id)}).getBoundingClientRect();
        return r.height > 0 && r.top >= 0 && r.bottom <= window.innerHeight; }})()""")


def _error_text(driver) -> str:
    """The error message shown; it must be where the user looks (in the viewport)."""
    box = driver.find_element("id", "error")
    _wait(driver, lambda d: box.is_displayed())
    assert _in_view(driver, "error"), _js(driver, "[window.scrollY, window.innerHeight, "
                                          "document.getElementById('error')"
                                          ".getBoundingClientRect().top]")
    return box.text


def _status(driver) -> tuple[str, str]:
    el = driver.find_element("id", "server-status")
    return el.text, el.get_attribute("class")


def test_voice_picker_needs_the_key_and_then_lists_the_servers_voices(browser, server):
    _open(browser, server, key=None)
    shown = _error_text(browser)
    assert "invalid or missing API key" in shown and "API key field at the top" in shown
    assert _js(browser, "window.cosyvinoWeb.voices") == []
    # not a green "ready" over an empty picker: the header and the picker say a key is needed
    _wait(browser, lambda d: _status(d)[0].endswith("API key needed"))
    text, cls = _status(browser)
    assert text.startswith("ready · ") and cls == "warn"
    assert _js(browser, "window.cosyvinoWeb.key") == "needed"
    options = browser.find_element("id", "voice").find_elements("tag name", "option")
    assert [(o.get_attribute("value"), o.text, o.get_attribute("disabled")) for o in options] \
        == [("", "(API key needed)", "true")]
    field = browser.find_element("id", "api-key")
    assert field.is_displayed() and _in_view(browser, "api-key")
    assert field.get_attribute("aria-invalid") == "true"
    # a wrong key: said so
    field.send_keys("wrong\t")
    _wait(browser, lambda d: _status(d)[0].endswith("API key rejected"))
    assert "invalid or missing API key" in _error_text(browser)
    field.clear()
    field.send_keys(KEY + "\t")
    _wait(browser, lambda d: _js(d, "window.cosyvinoWeb.voices.length") > 0)
    want = _server_voices(server)
    assert _js(browser, "window.cosyvinoWeb.voices") == want
    options = [o.get_attribute("value") for o in
               browser.find_element("id", "voice").find_elements("tag name", "option")]
    assert options == want
    assert not browser.find_element("id", "error").is_displayed()
    _wait(browser, lambda d: _status(d) == (_status(d)[0], "ok"))
    text, _ = _status(browser)
    assert text.startswith("ready · ") and "API key" not in text
    assert _js(browser, "window.cosyvinoWeb.key") is None
    assert field.get_attribute("aria-invalid") == "false"


@pytest.fixture(scope="module")
def public_server(browser, tts):
    """A server with an API key whose voice and model lists are public
    (``--public-voice-list``, for Open WebUI)."""
    from server_harness import RunningServer

    s = RunningServer(ServerConfig(num_speech_tokens=TOKENS, request_timeout=60,
                                   cache_memory_mb=0, api_key=KEY, public_voice_list=True),
                      [tts])
    yield s
    s.stop()


def test_a_public_voice_list_does_not_hide_that_the_key_is_needed(browser, public_server):
    """Issue 33 (trial 2, item 5): with --public-voice-list the voices answer without the key,
    so the page showed a green "ready" and every voice, and said "API key needed" only after
    Speak failed with 401. The model list (always keyed) tells it on load; a failed Speak keeps
    the hint of where to type the key."""
    server = public_server
    _open(browser, server, key=None)
    _wait(browser, lambda d: _status(d)[0].endswith("API key needed"))
    text, cls = _status(browser)
    assert text.startswith("ready · ") and cls == "warn"
    assert _js(browser, "window.cosyvinoWeb.key") == "needed"
    assert _js(browser, "window.cosyvinoWeb.voices") == _server_voices(server)  # public
    shown = _error_text(browser)
    assert "invalid or missing API key" in shown and "API key field at the top" in shown
    assert browser.find_element("id", "api-key").get_attribute("aria-invalid") == "true"
    # Speak without the key: the 401 says where to type it, as on load
    _set(browser, "text", "Hello.")
    _select(browser, "format", "pcm")
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "error" and rec["error"]["status"] == 401
    shown = _error_text(browser)
    assert shown.startswith("401 invalid_api_key")
    assert "type it in the API key field at the top of the page" in shown
    # a wrong key: rejected, on load of the lists already
    field = browser.find_element("id", "api-key")
    field.send_keys("wrong\t")
    _wait(browser, lambda d: _status(d)[0].endswith("API key rejected"))
    assert "API key typed at the top of the page was refused" in _error_text(browser)
    # the right key: green, and Speak plays
    field.clear()
    field.send_keys(KEY + "\t")
    _wait(browser, lambda d: _status(d)[1] == "ok")
    assert "API key" not in _status(browser)[0] and _js(browser, "window.cosyvinoWeb.key") is None
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done" and rec["samples"] > 0


def test_speak_without_the_key_keeps_the_hint(browser, server):
    """After a failed Speak with no key the error keeps the hint the page shows on load."""
    _open(browser, server, key=None)
    browser.refresh()  # without the key an earlier test left in this origin's sessionStorage
    _wait(browser, lambda d: _status(d)[0].endswith("API key needed"))
    browser.execute_script(  # a voice to ask for (the list needs the key here)
        "const o = document.createElement('option'); o.value = o.textContent = '中文女';"
        "document.getElementById('voice').append(o);")
    _select(browser, "voice", "中文女")
    _set(browser, "text", "Hello.")
    rec = _click_and_wait(browser, "speak")
    assert rec["error"]["status"] == 401
    shown = _error_text(browser)
    assert "invalid or missing API key" in shown
    assert "type it in the API key field at the top of the page" in shown


def test_page_loads_without_console_errors(browser, server):
    """No 404 (favicon.ico on every load), CSP violation or script error in the console."""
    _open(browser, server)
    browser.get_log("browser")  # drained: the entries of a fresh load only
    browser.refresh()
    _wait(browser, lambda d: _js(d, "window.cosyvinoWeb.voices.length") > 0)
    assert _js(browser, "document.querySelector('link[rel=icon]').href").endswith(
        "/ui/favicon.svg")
    severe = [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert severe == []


def _audio_request(server, body) -> httpx.Response:
    r = httpx.post(server.url + "/v1/audio/speech", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r


@pytest.mark.parametrize("fmt,rate", [("pcm", 24000), ("wav", 22050)])
def test_speak_plays_the_stream_as_it_arrives(browser, server, fmt, rate):
    _open(browser, server)
    voice = _server_voices(server)[1]
    _set(browser, "text", TWO)
    _select(browser, "voice", voice)
    _select(browser, "format", fmt)
    _set(browser, "seed", "3")
    _set(browser, "speed", "1")
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done", rec
    body = {"input": TWO, "voice": voice, "response_format": fmt, "seed": 3, "speed": 1.0,
            "hop_schedule": "latency"}
    whole = _audio_request(server, body).content
    if fmt == "wav":
        import soundfile as sf

        samples, sr = sf.read(io.BytesIO(whole), dtype="int16")
        assert sr == rate
    else:
        samples = np.frombuffer(whole, "<i2")
    sse = _audio_request(server, {**body, "stream_format": "sse"}).text
    events = [json.loads(line[6:]) for line in sse.splitlines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert len(deltas) >= 2  # two segments: the page got the audio in pieces
    assert rec["chunks"] == len(deltas)
    assert rec["bytes"] == sum(len(base64.b64decode(e["audio"])) for e in deltas) == len(whole)
    assert rec["sampleRate"] == rate
    assert rec["samples"] == samples.shape[0]
    assert rec["sampleSum"] == int(samples.astype(np.int64).sum())
    assert rec["tokens"] == events[-1]["usage"]["output_tokens"]
    assert 0 < rec["firstChunkMs"] <= rec["totalMs"]
    assert rec["playStartMs"] >= rec["firstChunkMs"]
    rows = browser.find_element("id", "chunk-table").find_elements("css selector", "tbody tr")
    assert len(rows) == len(deltas)
    assert browser.find_element("id", "stat-first").text.endswith(" ms")
    link = browser.find_element("id", "download")
    assert link.is_displayed() and link.get_attribute("href").startswith("blob:")


def test_a_compressed_format_plays_when_complete(browser, server):
    _open(browser, server)
    _set(browser, "text", "Hello from the browser test.")
    _select(browser, "format", "mp3")
    _set(browser, "seed", "2")
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done", rec
    assert rec["chunks"] >= 1 and rec["sampleSum"] is None
    seconds = np.frombuffer(_audio_request(server, {
        "input": "Hello from the browser test.", "voice": _server_voices(server)[0],
        "response_format": "pcm", "seed": 2}).content, "<i2").shape[0] / 24000
    # decoded by the browser at its own rate, with the mp3's encoder delay and padding
    assert abs(rec["samples"] / rec["sampleRate"] - seconds) < 0.15


@pytest.mark.parametrize("case", ["empty text", "unknown voice", "bad speed"])
def test_errors_show_the_servers_message(browser, server, case):
    _open(browser, server)
    voice = _server_voices(server)[0]
    text, speed = "Hello.", "1"
    if case == "empty text":
        text = ""
    elif case == "unknown voice":
        browser.execute_script(
            "const o = document.createElement('option'); o.value = o.textContent = 'nobody';"
            "document.getElementById('voice').append(o);")
        voice = "nobody"
    else:
        speed = "9"
    _set(browser, "text", text)
    _select(browser, "voice", voice)
    _select(browser, "format", "pcm")
    _set(browser, "seed", "")
    _set(browser, "speed", speed)
    rec = _click_and_wait(browser, "speak")
    r = httpx.post(server.url + "/v1/audio/speech", headers=AUTH, timeout=30, json={
        "model": "tts-1", "input": text, "voice": voice, "response_format": "pcm",
        "stream_format": "sse", "speed": json.loads(speed), "hop_schedule": "latency"})
    assert r.status_code == 400
    err = r.json()["error"]
    assert rec["status"] == "error" and rec["chunks"] == 0 and rec["samples"] == 0
    assert rec["error"] == {"status": 400, "message": err["message"], "code": err["code"],
                            "param": err["param"]}
    shown = _error_text(browser)
    assert err["message"] in shown and shown.startswith(f"400 {err['code']}")
    assert _js(browser, "document.body.dataset.state") == "error"
    assert not browser.find_element("id", "speak").get_attribute("disabled")


def test_voice_cloning_from_an_uploaded_recording(browser, server, tts):
    pytest.importorskip("onnx")  # the synthetic prompt models of the tiny model
    _open(browser, server)
    name = "webvoice"
    _set(browser, "text", "今天天气很好。")
    _select(browser, "format", "pcm")
    _set(browser, "seed", "4")
    browser.find_element("id", "prompt-file").send_keys(str(PROMPT_WAV))
    _set(browser, "prompt-text", PROMPT_TEXT)
    _set(browser, "voice-name", name)

    # speak once with the recording (zero-shot, raw int16 stream at the model rate)
    rec = _click_and_wait(browser, "speak-prompt")
    assert rec["status"] == "done", rec
    assert rec["endpoint"] == "/inference_zero_shot" and rec["sampleRate"] == tts.sample_rate
    r = httpx.post(server.url + "/inference_zero_shot", headers=AUTH, timeout=120,
                   data={"tts_text": "今天天气很好。", "prompt_text": PROMPT_TEXT, "seed": "4"},
                   files={"prompt_wav": ("p.wav", PROMPT_WAV.read_bytes())})
    assert r.status_code == 200, r.text
    want = np.frombuffer(r.content, "<i2")
    assert rec["chunks"] >= 1 and rec["samples"] == want.shape[0] > 0
    assert rec["sampleSum"] == int(want.astype(np.int64).sum())

    # register it, then speak with the registered voice
    browser.find_element("id", "register").click()
    notice = browser.find_element("id", "notice")
    _wait(browser, lambda d: notice.is_displayed())
    assert f"registered voice '{name}'" in notice.text and "zero-shot" in notice.text
    assert _in_view(browser, "notice")
    assert name in _js(browser, "window.cosyvinoWeb.voices") and name in _server_voices(server)
    assert browser.find_element("id", "voice").get_attribute("value") == name
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done", rec
    same = _audio_request(server, {"input": "今天天气很好。", "voice": name,
                                   "response_format": "pcm", "seed": 4}).content
    assert rec["samples"] == len(same) // 2
    assert rec["sampleSum"] == int(np.frombuffer(same, "<i2").astype(np.int64).sum())

    # registering the name again without "replace" shows the server's 409
    browser.find_element("id", "register").click()
    assert "409 voice_exists" in _error_text(browser)

    # delete it (after the confirmation dialog)
    browser.find_element("id", "delete-voice").click()
    _wait(browser, lambda d: d.switch_to.alert).accept()
    _wait(browser, lambda d: name not in _js(d, "window.cosyvinoWeb.voices"))
    assert name not in _server_voices(server)


def test_speak_once_without_a_recording_says_so(browser, server):
    _open(browser, server)
    runs = _js(browser, "window.cosyvinoWeb.runs")
    # clicked from the bottom of the page: the message is scrolled into view
    browser.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    browser.execute_script("document.getElementById('speak-prompt').click()")
    assert "choose a recording first" in _error_text(browser)
    assert _js(browser, "window.cosyvinoWeb.runs") == runs


# A stand-in for the server's SSE answer to /v1/audio/speech, installed in the page: the events
# are sent in `piece`-byte pieces (default 7: events split anywhere), the stream ends `delayMs`
# after the last piece (default at once) or stays open when `hang`.
FAKE_SPEECH = """
const [events, hang, delayMs = 0, piece = 7] = arguments;
const realFetch = window.fetch;
window.fetch = (url, opts) => {
  if (!String(url).endsWith("/v1/audio/speech")) return realFetch(url, opts);
  const text = events.map((e) => "data: " + JSON.stringify(e) + "\\n\\n").join("");
  const bytes = new TextEncoder().encode(text);
  const body = new ReadableStream({start(c) {
    for (let i = 0; i < bytes.length; i += piece) c.enqueue(bytes.slice(i, i + piece));
    if (!hang) setTimeout(() => c.close(), delayMs);
    const stop = () => c.error(new DOMException("aborted", "AbortError"));
    opts.signal.addEventListener("abort", stop);
  }});
  return Promise.resolve(new Response(body, {headers: {"content-type": "text/event-stream"}}));
};
"""


def _delta(samples) -> dict:
    data = np.asarray(samples, "<i2").tobytes()
    return {"type": "speech.audio.delta", "audio": base64.b64encode(data).decode()}


def test_stage_timings_cut_streams_and_stop_on_a_stand_in_stream(browser, server):
    """What the page does with SSE the live server does not send today: stage timings in
    ``speech.audio.done`` (shown as a table), an ``error`` event after audio (a cut stream:
    shown, the audio so far counted) and a stream that does not end (Stop)."""
    a, b = np.arange(-300, 301, dtype=np.int16), np.full(1001, 7, np.int16)
    stages = {"llm_decode": {"seconds": 0.25, "calls": 40}, "vocoder": {"seconds": 0.125,
                                                                        "calls": 2}}
    _open(browser, server)
    _select(browser, "format", "pcm")
    browser.execute_script(FAKE_SPEECH, [_delta(a), _delta(b), {
        "type": "speech.audio.done", "usage": {"output_tokens": 40, "total_tokens": 40},
        "stages": stages}], False)
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done" and rec["chunks"] == 2 and rec["tokens"] == 40
    assert rec["samples"] == a.size + b.size and rec["sampleSum"] == 7 * b.size
    assert rec["stages"] == stages
    table = browser.find_element("id", "stage-table")
    assert table.is_displayed()
    rows = [[td.text for td in tr.find_elements("tag name", "td")]
            for tr in table.find_elements("css selector", "tbody tr")]
    assert rows == [["llm_decode", "0.250", "40"], ["vocoder", "0.125", "2"]]

    _open(browser, server)
    _select(browser, "format", "pcm")
    cut = {"message": "synthesis did not finish within 60 s", "type": "server_error",
           "param": None, "code": "timeout"}
    browser.execute_script(FAKE_SPEECH, [_delta(a), {"type": "error", "error": cut}], False)
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "error" and rec["samples"] == a.size
    assert rec["error"]["code"] == "timeout"
    assert "stream cut timeout synthesis did not finish within 60 s" in _error_text(browser)

    # an event stream that ends without speech.audio.done is a cut too
    _open(browser, server)
    _select(browser, "format", "pcm")
    browser.execute_script(FAKE_SPEECH, [_delta(a)], False)
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "error" and "without speech.audio.done" in _error_text(browser)

    _open(browser, server)
    _select(browser, "format", "pcm")
    browser.execute_script(FAKE_SPEECH, [_delta(a)], True)
    runs = _js(browser, "window.cosyvinoWeb.runs")
    browser.find_element("id", "speak").click()
    _wait(browser, lambda d: _js(d, "window.cosyvinoWeb.runs") > runs
          and _js(d, "window.cosyvinoWeb.last.samples") == a.size)
    assert _js(browser, "window.cosyvinoWeb.last.status") == "running"
    browser.find_element("id", "stop").click()
    _wait(browser, lambda d: _js(d, "window.cosyvinoWeb.last.status") == "stopped")
    assert not browser.find_element("id", "error").is_displayed()
    assert not browser.find_element("id", "speak").get_attribute("disabled")


def _rtf_shown(driver) -> tuple[float, float, str]:
    """(RTF, factor, "faster" / "slower") as the page's audio line shows them."""
    text = driver.find_element("id", "stat-audio").text
    m = re.search(r"RTF (\d+\.\d\d) \((\d+\.\d)× (faster|slower) than real time\)", text)
    assert m, text
    assert "× real time" not in text  # the old "10.50 × real time", read as 10x faster
    return float(m.group(1)), float(m.group(2)), m.group(3)


def test_real_time_factor_says_faster_or_slower(browser, server):
    """The audio line gives the RTF (wall time / audio duration) and says which way it is: a
    stream slower than its audio reads "slower than real time"."""
    quiet = np.zeros(600, np.int16)  # 25 ms at 24 kHz
    done = {"type": "speech.audio.done", "usage": {"output_tokens": 1, "total_tokens": 1}}
    _open(browser, server)
    _select(browser, "format", "pcm")
    browser.execute_script(FAKE_SPEECH, [_delta(quiet), done], False, 400)
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done" and rec["samples"] == quiet.size
    rtf, factor, how = _rtf_shown(browser)
    want = rec["totalMs"] / 1000 / (quiet.size / 24000)
    assert want > 10 and rec["rtf"] == pytest.approx(want)
    # shown rounded to 2 and 1 decimals
    assert (how, rtf, factor) == ("slower", pytest.approx(want, abs=0.0051),
                                  pytest.approx(want, abs=0.051))

    # 10 s of audio at once: faster than real time, by 1 / RTF
    long = [_delta(np.full(24000, 5, np.int16)) for _ in range(10)]
    _open(browser, server)
    _select(browser, "format", "pcm")
    browser.execute_script(FAKE_SPEECH, long + [done], False, 0, 4096)
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done" and rec["samples"] == 240000
    rtf, factor, how = _rtf_shown(browser)
    want = rec["totalMs"] / 1000 / 10
    assert want < 1 and rec["rtf"] == pytest.approx(want)
    assert (how, rtf, factor) == ("faster", pytest.approx(want, abs=0.0051),
                                  pytest.approx(1 / want, abs=0.051))


# ---- a CosyVoice2 model (issue 35 item 7) ----------------------------------------------------
@pytest.fixture(scope="module")
def v2_server(browser):
    from cosyvino import Synthesizer
    from conftest import TINY_C
    from server_harness import RunningServer

    pytest.importorskip("torch")
    t = Synthesizer(str(TINY_C), backend="torch", num_threads=1, voices_dir=False)
    s = RunningServer(ServerConfig(num_speech_tokens=TOKENS, request_timeout=60,
                                   cache_memory_mb=0, api_key=KEY), [t])
    yield s
    s.stop()
    t.close()


def _model_shown(driver) -> str:
    _wait(driver, lambda d: _js(d, "window.cosyvinoWeb.model") is not None)
    el = driver.find_element("id", "model-info")
    assert el.is_displayed()
    return el.text


def test_a_cosyvoice2_model_shows_its_voices_and_modes_and_plays_24k(browser, server,
                                                                      v2_server):
    # v1 (tiny base model): 22050 Hz, no instruction mode, so no Instructions field
    _open(browser, server)
    assert "22050 Hz" in _model_shown(browser)
    assert not browser.find_element("id", "instructions").is_displayed()

    _open(browser, v2_server)
    shown = _model_shown(browser)
    assert "cosyvoice2" in shown and "24000 Hz" in shown
    assert "modes: zero_shot, cross_lingual, vc, instruct2, sft" in shown
    assert _js(browser, "window.cosyvinoWeb.voices") == _server_voices(v2_server) \
        == ["中文女", "alice", "bob"]
    groups = browser.find_element("id", "voice").find_elements("tag name", "optgroup")
    assert [(g.get_attribute("label"),
             [o.get_attribute("value") for o in g.find_elements("tag name", "option")])
            for g in groups] == [("built-in speakers", ["中文女"]),
                                 ("built-in prompt voices", ["alice", "bob"])]
    assert browser.find_element("id", "instructions").is_displayed()

    # wav streams at the model's 24 kHz; the samples played are those of the whole response
    text = "Hello from a CosyVoice2 model."
    _set(browser, "text", text)
    _select(browser, "voice", "alice")
    _select(browser, "format", "wav")
    _set(browser, "seed", "3")
    _set(browser, "speed", "1")
    _set(browser, "instructions", "")
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done", rec
    import soundfile as sf

    body = {"input": text, "voice": "alice", "response_format": "wav", "seed": 3}
    samples, rate = sf.read(io.BytesIO(_audio_request(v2_server, body).content), dtype="int16")
    assert rate == rec["sampleRate"] == 24000
    assert rec["samples"] == samples.shape[0]
    assert rec["sampleSum"] == int(samples.astype(np.int64).sum())

    # with instructions: the model's instruct2 mode, as the API answers them
    _set(browser, "instructions", "用四川话说这句话")
    _select(browser, "format", "pcm")
    rec = _click_and_wait(browser, "speak")
    assert rec["status"] == "done", rec
    want = np.frombuffer(_audio_request(v2_server, {
        **body, "response_format": "pcm", "instructions": "用四川话说这句话"}).content, "<i2")
    plain = np.frombuffer(_audio_request(v2_server, {**body, "response_format": "pcm"}).content,
                          "<i2")
    assert rec["sampleRate"] == 24000 and rec["samples"] == want.shape[0]
    assert rec["sampleSum"] == int(want.astype(np.int64).sum())
    assert not np.array_equal(want, plain)


# ---- type and hear: text in over the WebSocket (issue 36 item 5) ----------------------------
def test_type_and_hear_starts_before_the_text_is_finished(browser, server, v2_server):
    # v1: no text in, no section
    _open(browser, server)
    _model_shown(browser)
    assert not browser.find_element("id", "live-section").is_displayed()

    _open(browser, v2_server)
    _model_shown(browser)
    assert browser.find_element("id", "live-section").is_displayed()
    _select(browser, "voice", "中文女")
    _set(browser, "seed", "3")
    _set(browser, "speed", "1")
    browser.find_element("id", "live-start").click()
    _wait(browser, lambda d: _js(d, "window.cosyvinoWeb.live.status") == "started")
    box = browser.find_element("id", "live-text")
    first = "Hello there, this is typed while it speaks."
    for i in range(0, len(first), 5):  # typed in bursts, as a person (or a chat model) would
        box.send_keys(first[i:i + 5])
    box.send_keys("\n")  # Enter: a flush
    # audio plays while the connection is still open: before Finish
    _wait(browser, lambda d: _js(d, "window.cosyvinoWeb.live.samples") > 0, 120)
    live = _js(browser, "window.cosyvinoWeb.live")
    assert live["status"] == "started" and live["firstAudioMs"] is not None
    box.send_keys(" Bye now.")
    browser.find_element("id", "live-finish").click()
    _wait(browser, lambda d: _js(d, "window.cosyvinoWeb.live.status") in ("done", "error",
                                                                          "closed"), 120)
    live = _js(browser, "window.cosyvinoWeb.live")
    assert live["status"] == "done" and live["closeCode"] == 1000, live
    assert live["events"][0] == "started" and live["events"].count("utterance_done") == 2
    assert live["sent"] == len(first) + len(" Bye now.")
    # the samples played are the library's for the same text and flush point (the key went in
    # the start message: a browser cannot send the header)
    from cosyvino.text_stream import FLUSH

    synth = v2_server.state.pool.synth
    want = np.concatenate([c.samples for c in synth.stream_text(
        [first, FLUSH, " Bye now."], "中文女", seed=3)])
    from cosyvino.server.encoding import to_int16

    pcm = to_int16(want)
    assert live["samples"] == pcm.size
    assert live["sampleSum"] == int(pcm.astype(np.int64).sum())
