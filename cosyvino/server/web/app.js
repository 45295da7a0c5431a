// The web page of `cosyvino serve` (docs/server.md, "Web page"). Plain browser JavaScript, no
// build step and nothing fetched from elsewhere: the page talks only to the server it came from.
//
// Speak: POST /v1/audio/speech with stream_format "sse"; every speech.audio.delta event carries
// a base64 piece of the encoded stream. pcm (int16 LE mono, 24 kHz) and wav (one
// RIFF header, then int16 mono at the model rate) are decoded as they arrive and each piece is
// scheduled on the Web Audio clock right after the previous one, so playback starts with the
// first chunk. Compressed formats are collected and decoded by the browser when complete.
// "Speak once with this recording": POST /inference_zero_shot (or _cross_lingual without a
// transcript), multipart, answered with raw int16 at the model rate (the X-Sample-Rate header:
// 22050 Hz for CosyVoice v1, 24000 Hz for CosyVoice2), read with a ReadableStream.
// GET /v1/models says the model's family, rate, modes and its instruction mode (CosyVoice v1
// Instruct: instruct, CosyVoice2: instruct2): the Instructions field is shown only then.
//
// Type and hear (a model whose /v1/models says text_in, CosyVoice2): a WebSocket to
// /v1/audio/speech/stream-input; what is typed is sent as it is typed (only text appended at
// the end: an edit before it is not spoken), Enter sends a flush, Finish a close; the pcm
// frames are scheduled like Speak's. window.cosyvinoWeb.live = {status ("connecting",
// "started", "done", "error", "closed"), sent (characters), frames, samples, sampleSum,
// firstAudioMs (from the first text sent), events (types), closeCode, error}.
//
// What the page measured is also kept in window.cosyvinoWeb (tests read it):
//   runs, voices (ids), model (the /v1/models object: id, family, sample_rate, modes,
//   instruction_mode; null before it answered), key (null, "needed": the server wants an API
//   key and none was typed,
//   or "rejected": the typed one was refused), last = {endpoint, format, status ("running",
//   "done", "error", "stopped"), chunks, bytes, samples, sampleSum (sum of the int16 values
//   played, for pcm / wav / raw), sampleRate, firstChunkMs, playStartMs, totalMs, rtf
//   (real-time factor: seconds of wall time per second of audio, totalMs / audio length;
//   below 1 is faster than real time), gaps, tokens, cache, error ({status, message, code,
//   param}), stages}
"use strict";

(() => {
  // The page lives at <root>/ui/; the API is at <root>/ (relative, so a path prefix added by a
  // reverse proxy keeps working).
  const API_ROOT = new URL("../", document.baseURI);
  // Rate of the CosyVoice-compatible endpoints' raw PCM when neither the response's
  // X-Sample-Rate nor /v1/models said it: the model rate of CosyVoice v1 (docs/server.md).
  const RAW_RATE = 22050;
  // Rate of response_format "pcm" (OpenAI's: int16 mono at 24 kHz, docs/server.md).
  const PCM_RATE = 24000;
  const LEAD_SECONDS = 0.05;  // scheduling margin ahead of the audio clock
  const MAX_CHUNK_ROWS = 200;
  const KEY_STORAGE = "cosyvino.apiKey";
  const MIME = {mp3: "audio/mpeg", opus: "audio/ogg", aac: "audio/aac", flac: "audio/flac",
                wav: "audio/wav", pcm: "audio/wav"};

  const $ = (id) => document.getElementById(id);
  const web = window.cosyvinoWeb = {runs: 0, voices: [], model: null, key: null, last: null};
  let readyBody = null;  // the last /ready answer that said ready
  let audioCtx = null;
  let current = null;  // {controller, player}
  let downloadUrl = null;

  const api = (path) => new URL(path, API_ROOT).toString();

  function authHeaders(extra) {
    const headers = Object.assign({}, extra || {});
    const key = $("api-key").value.trim();
    if (key) headers.Authorization = "Bearer " + key;
    return headers;
  }

  // ---- messages ------------------------------------------------------------------------------
  function showError(err) {
    const box = $("error");
    box.textContent = "";
    const head = document.createElement("strong");
    head.textContent = err.status ? `${err.status}${err.code ? " " + err.code : ""}` : "error";
    box.append(head, " ", err.message || "request failed");
    if (err.param) box.append(` (parameter: ${err.param})`);
    box.hidden = false;
    $("notice").hidden = true;
    // the button that failed may be far down the page: bring the message into view
    box.scrollIntoView({block: "nearest"});
  }

  function clearMessages() {
    $("error").hidden = true;
    $("error").textContent = "";
    $("notice").hidden = true;
  }

  function notice(text) {
    $("notice").textContent = text;
    $("notice").hidden = false;
    $("notice").scrollIntoView({block: "nearest"});
  }

  // The OpenAI error body {"error": {message, type, param, code}} of a failed response, or
  // what else came back.
  async function readError(resp) {
    const text = await resp.text().catch(() => "");
    let message = text.trim() || resp.statusText || "request failed";
    let code = null;
    let param = null;
    try {
      const body = JSON.parse(text);
      if (body && body.error) {
        message = body.error.message || message;
        code = body.error.code || body.error.type || null;
        param = body.error.param || null;
      } else if (body && body.detail) {
        message = typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail);
      }
    } catch (e) { /* not JSON: keep the text */ }
    const retry = resp.headers.get("retry-after");
    if (retry) message += ` (retry after ${retry} s)`;
    return {status: resp.status, message, code, param};
  }

  // ---- decoding ------------------------------------------------------------------------------
  // int16 little-endian bytes -> float samples; keeps an odd trailing byte for the next piece.
  class Int16Decoder {
    constructor(rate) {
      this.rate = rate;
      this.carry = null;
      this.streaming = true;
    }

    feed(bytes) {
      if (this.carry) {
        const joined = new Uint8Array(this.carry.length + bytes.length);
        joined.set(this.carry);
        joined.set(bytes, this.carry.length);
        bytes = joined;
        this.carry = null;
      }
      const n = bytes.length >> 1;
      if (bytes.length & 1) this.carry = bytes.slice(bytes.length - 1);
      const view = new DataView(bytes.buffer, bytes.byteOffset, n * 2);
      const out = new Float32Array(n);
      for (let i = 0; i < n; i++) out[i] = view.getInt16(2 * i, true) / 32768;
      return out;
    }

    finish() {
      if (this.carry) throw new Error("the stream ended in the middle of a sample");
      return new Float32Array(0);
    }
  }

  // A streamed WAV: reads the RIFF header (fmt chunk: 16-bit mono PCM; data chunk of unknown
  // length), then int16 samples.
  class WavDecoder {
    constructor() {
      this.head = new Uint8Array(0);
      this.pcm = null;
      this.rate = null;
      this.streaming = true;
    }

    feed(bytes) {
      if (this.pcm) return this.pcm.feed(bytes);
      const joined = new Uint8Array(this.head.length + bytes.length);
      joined.set(this.head);
      joined.set(bytes, this.head.length);
      this.head = joined;
      const start = this._parse();
      if (start === null) return new Float32Array(0);
      this.pcm = new Int16Decoder(this.rate);
      const rest = this.head.slice(start);
      this.head = null;
      return this.pcm.feed(rest);
    }

    _parse() {  // offset of the first sample once the header is complete, else null
      const b = this.head;
      if (b.length < 12) return null;
      const v = new DataView(b.buffer, b.byteOffset, b.length);
      const tag = (o) => String.fromCharCode(b[o], b[o + 1], b[o + 2], b[o + 3]);
      if (tag(0) !== "RIFF" || tag(8) !== "WAVE") throw new Error("not a WAV stream");
      let o = 12;
      while (o + 8 <= b.length) {
        const id = tag(o);
        const size = v.getUint32(o + 4, true);
        if (id === "data") {
          if (!this.rate) throw new Error("WAV data before its fmt chunk");
          return o + 8;
        }
        if (o + 8 + size > b.length) return null;
        if (id === "fmt ") {
          const channels = v.getUint16(o + 10, true);
          const bits = v.getUint16(o + 22, true);
          if (v.getUint16(o + 8, true) !== 1 || channels !== 1 || bits !== 16) {
            throw new Error(`WAV is not 16-bit mono PCM (${channels} channels, ${bits} bits)`);
          }
          this.rate = v.getUint32(o + 12, true);
        }
        o += 8 + size + (size & 1);
      }
      return null;
    }

    finish() {
      if (!this.pcm) throw new Error("the WAV stream ended before its header was complete");
      return this.pcm.finish();
    }
  }

  // Compressed formats: the bytes are kept; the browser decodes the whole file at the end.
  class WholeFileDecoder {
    constructor() {
      this.parts = [];
      this.streaming = false;
      this.rate = null;
    }

    feed(bytes) {
      this.parts.push(bytes);
      return new Float32Array(0);
    }

    finish() {
      return new Float32Array(0);
    }
  }

  function makeDecoder(format, rawRate) {
    if (format === "pcm") return new Int16Decoder(PCM_RATE);
    if (format === "raw") return new Int16Decoder(rawRate);
    if (format === "wav") return new WavDecoder();
    return new WholeFileDecoder();
  }

  // ---- playback ------------------------------------------------------------------------------
  // Schedules pieces of audio back to back on the Web Audio clock.
  class Player {
    constructor(ctx) {
      this.ctx = ctx;
      this.next = 0;
      this.sources = [];
      this.gaps = 0;
    }

    // Plays `buffer` right after what is already scheduled (or now, when playback has run
    // dry: a gap). Returns its start time in seconds from now.
    schedule(buffer) {
      const ctx = this.ctx;
      const now = ctx.currentTime;
      let at = this.next;
      if (at < now + 0.005) {
        if (this.sources.length) this.gaps += 1;
        at = now + LEAD_SECONDS;
      }
      const src = ctx.createBufferSource();
      src.buffer = buffer;
      src.connect(ctx.destination);
      src.start(at);
      this.sources.push(src);
      this.next = at + buffer.duration;
      return at - now;
    }

    samples(data, rate) {
      const buffer = this.ctx.createBuffer(1, data.length, rate);
      buffer.copyToChannel(data, 0);
      return this.schedule(buffer);
    }

    stop() {
      for (const src of this.sources) {
        try { src.stop(); } catch (e) { /* not started yet or already ended */ }
      }
      this.sources = [];
    }
  }

  function context() {
    if (!audioCtx) audioCtx = new (window.AudioContext || window.webkitAudioContext)();
    if (audioCtx.state === "suspended") audioCtx.resume();
    return audioCtx;
  }

  // ---- stats display -------------------------------------------------------------------------
  const ms = (x) => (x === null || x === undefined ? "–" : `${Math.round(x)} ms`);

  function render(rec) {
    $("stat-status").textContent = rec.status + (rec.endpoint ? ` (${rec.endpoint}, ${rec.format})` : "");
    $("stat-first").textContent = ms(rec.firstChunkMs);
    $("stat-play").textContent = ms(rec.playStartMs);
    $("stat-total").textContent = ms(rec.totalMs);
    const seconds = rec.sampleRate ? rec.samples / rec.sampleRate : 0;
    let audio = rec.sampleRate ? `${seconds.toFixed(2)} s (${rec.samples} samples at ${rec.sampleRate} Hz)` : "–";
    rec.rtf = seconds > 0 && rec.totalMs !== null ? rec.totalMs / 1000 / seconds : null;
    if (rec.rtf !== null) audio += `, ${rtfText(rec.rtf)}`;
    $("stat-audio").textContent = audio;
    $("stat-chunks").textContent = `${rec.chunks} (${rec.bytes} bytes)`;
    $("stat-gaps").textContent = String(rec.gaps);
    $("stat-tokens").textContent = rec.tokens === null ? "–" : String(rec.tokens);
    $("stat-cache").textContent = rec.cache || "–";
    document.body.dataset.state = rec.status;
  }

  // The real-time factor as the field writes it (RTF = processing time / audio duration) and
  // what it means, so that 10.50 is not read as "ten times real time".
  function rtfText(rtf) {
    const how = rtf > 1 ? `${rtf.toFixed(1)}× slower than real time`
      : rtf > 0 ? `${(1 / rtf).toFixed(1)}× faster than real time` : "";
    return `RTF ${rtf.toFixed(2)}` + (how ? ` (${how})` : "");
  }

  function resetTables() {
    $("chunk-table").querySelector("tbody").textContent = "";
    $("stage-table").querySelector("tbody").textContent = "";
    $("stage-table").hidden = true;
  }

  function addChunkRow(rec, audioSeconds, playsInMs) {
    if (rec.chunks > MAX_CHUNK_ROWS) return;
    const row = document.createElement("tr");
    for (const cell of [rec.chunks, Math.round(performance.now() - rec.t0),
                        audioSeconds === null ? "–" : audioSeconds.toFixed(3),
                        playsInMs === null ? "–" : Math.round(performance.now() - rec.t0 + playsInMs)]) {
      const td = document.createElement("td");
      td.textContent = String(cell);
      row.append(td);
    }
    $("chunk-table").querySelector("tbody").append(row);
  }

  // Server-reported stage timings, when the server sends them: {stage: {seconds, calls}} or
  // {stage: seconds} (the shape of Audio.stats["stages"], docs/architecture.md).
  function renderStages(stages) {
    if (!stages || typeof stages !== "object") return;
    const body = $("stage-table").querySelector("tbody");
    body.textContent = "";
    for (const [name, value] of Object.entries(stages)) {
      const seconds = typeof value === "number" ? value : value && value.seconds;
      const calls = value && typeof value === "object" ? value.calls : "";
      const row = document.createElement("tr");
      for (const cell of [name, typeof seconds === "number" ? seconds.toFixed(3) : "–", calls ?? ""]) {
        const td = document.createElement("td");
        td.textContent = String(cell);
        row.append(td);
      }
      body.append(row);
    }
    $("stage-table").hidden = body.children.length === 0;
  }

  // ---- one synthesis -------------------------------------------------------------------------
  function setBusy(busy) {
    for (const id of ["speak", "speak-prompt", "register"]) $(id).disabled = busy;
    $("stop").disabled = !busy;
  }

  function wavFile(int16Bytes, rate) {  // a WAV header for downloading raw int16 audio
    const header = new DataView(new ArrayBuffer(44));
    const put = (o, s) => { for (let i = 0; i < 4; i++) header.setUint8(o + i, s.charCodeAt(i)); };
    put(0, "RIFF"); header.setUint32(4, 36 + int16Bytes, true); put(8, "WAVE");
    put(12, "fmt "); header.setUint32(16, 16, true); header.setUint16(20, 1, true);
    header.setUint16(22, 1, true); header.setUint32(24, rate, true);
    header.setUint32(28, rate * 2, true); header.setUint16(32, 2, true);
    header.setUint16(34, 16, true); put(36, "data"); header.setUint32(40, int16Bytes, true);
    return header.buffer;
  }

  function offerDownload(parts, format, rate) {
    if (downloadUrl) URL.revokeObjectURL(downloadUrl);
    const size = parts.reduce((n, p) => n + p.length, 0);
    const raw = format === "pcm" || format === "raw";
    const blob = new Blob(raw ? [wavFile(size, rate), ...parts] : parts,
                          {type: MIME[format] || "audio/wav"});
    downloadUrl = URL.createObjectURL(blob);
    const link = $("download");
    link.href = downloadUrl;
    link.download = `cosyvino.${raw ? "wav" : format}`;
    link.textContent = `download (${link.download})`;
    link.hidden = false;
  }

  // Runs one request: `send(signal)` returns the fetch promise; `sse` says how the body is
  // framed; `format` how the audio is encoded ("raw": int16 at the model rate).
  async function run(endpoint, format, sse, send) {
    clearMessages();
    resetTables();
    $("download").hidden = true;
    if (current) stop();
    const ctx = context();
    const player = new Player(ctx);
    const controller = new AbortController();
    current = {controller, player};
    const rec = web.last = {endpoint, format, status: "running", chunks: 0, bytes: 0,
                            samples: 0, sampleSum: 0, sampleRate: null, firstChunkMs: null, playStartMs: null,
                            totalMs: null, gaps: 0, tokens: null, cache: null, error: null,
                            stages: null, t0: performance.now()};
    web.runs += 1;
    setBusy(true);
    render(rec);
    const parts = [];
    let decoder = null;
    let ended = !sse;  // an SSE stream is complete only with speech.audio.done

    const onAudio = (bytes) => {
      if (!bytes.length) return;
      parts.push(bytes);
      rec.chunks += 1;
      rec.bytes += bytes.length;
      if (rec.firstChunkMs === null) rec.firstChunkMs = performance.now() - rec.t0;
      const samples = decoder.feed(bytes);
      let playsIn = null;
      if (samples.length) {
        rec.sampleRate = decoder.rate;
        playsIn = player.samples(samples, decoder.rate);
        rec.samples += samples.length;
        for (let i = 0; i < samples.length; i++) rec.sampleSum += Math.round(samples[i] * 32768);
        if (rec.playStartMs === null) rec.playStartMs = performance.now() - rec.t0 + playsIn * 1000;
      }
      rec.gaps = player.gaps;
      addChunkRow(rec, samples.length ? samples.length / decoder.rate : null, playsIn === null ? null : playsIn * 1000);
      render(rec);
    };

    const onEvent = (ev) => {
      if (ev.type === "speech.audio.delta") {
        onAudio(base64Bytes(ev.audio || ""));
      } else if (ev.type === "speech.audio.done") {
        ended = true;
        if (ev.usage) rec.tokens = ev.usage.output_tokens ?? null;
        rec.stages = ev.stages || (ev.timings && ev.timings.stages) || null;
        renderStages(rec.stages);
      } else if (ev.type === "error") {  // the stream was cut after it started
        ended = true;
        throw Object.assign(new Error("cut"), {apiError: {
          status: "stream cut", message: (ev.error && ev.error.message) || "stream cut",
          code: ev.error && ev.error.code, param: ev.error && ev.error.param}});
      }
    };

    try {
      const resp = await send(controller.signal);
      if (!resp.ok) {
        rec.error = await readError(resp);
        if (resp.status === 401) rec.error = keyError(rec.error);
        throw Object.assign(new Error(rec.error.message), {apiError: rec.error});
      }
      rec.cache = resp.headers.get("x-cosyvino-cache");
      const rate = Number(resp.headers.get("x-sample-rate"))
        || (web.model && web.model.sample_rate) || RAW_RATE;
      decoder = makeDecoder(format, rate);
      if (sse) await readSse(resp.body, onEvent);
      else await readChunks(resp.body, onAudio);
      if (!ended) {
        throw Object.assign(new Error("cut"), {apiError: {status: "stream cut",
          message: "the event stream ended without speech.audio.done"}});
      }
      decoder.finish();
      if (!decoder.streaming) await playWhole(ctx, player, decoder.parts, rec);
      rec.totalMs = performance.now() - rec.t0;
      rec.status = "done";
      offerDownload(parts, format, decoder.rate || rate);
    } catch (e) {
      rec.totalMs = performance.now() - rec.t0;
      if (controller.signal.aborted) {
        rec.status = "stopped";
      } else {
        rec.status = "error";
        rec.error = e.apiError || {status: null, message: describe(e)};
        showError(rec.error);
      }
    } finally {
      rec.gaps = player.gaps;
      if (current && current.controller === controller) current = null;
      setBusy(false);
      render(rec);
    }
  }

  function describe(e) {
    if (e instanceof TypeError) return `the connection failed or was cut (${e.message})`;
    return e && e.message ? e.message : String(e);
  }

  async function playWhole(ctx, player, parts, rec) {
    const size = parts.reduce((n, p) => n + p.length, 0);
    const all = new Uint8Array(size);
    let o = 0;
    for (const p of parts) { all.set(p, o); o += p.length; }
    let buffer;
    try {
      buffer = await ctx.decodeAudioData(all.buffer);
    } catch (e) {
      throw new Error(`this browser cannot decode the ${rec.format} audio (${describe(e)}); pick pcm or wav`);
    }
    const playsIn = player.schedule(buffer);
    rec.samples = buffer.length;
    rec.sampleSum = null;  // decoded by the browser: not the int16 samples sent
    rec.sampleRate = buffer.sampleRate;
    rec.playStartMs = performance.now() - rec.t0 + playsIn * 1000;
  }

  function base64Bytes(text) {
    const bin = atob(text);
    const out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }

  async function readChunks(body, onBytes) {
    const reader = body.getReader();
    for (;;) {
      const {value, done} = await reader.read();
      if (done) return;
      onBytes(value);
    }
  }

  // Server-sent events over fetch (EventSource cannot POST): blocks separated by a blank line,
  // "data:" lines joined; each data is one JSON event.
  async function readSse(body, onEvent) {
    const text = new TextDecoder();
    let buf = "";
    await readChunks(body, (bytes) => {
      buf += text.decode(bytes, {stream: true}).replace(/\r\n?/g, "\n");
      let cut;
      while ((cut = buf.indexOf("\n\n")) >= 0) {
        const block = buf.slice(0, cut);
        buf = buf.slice(cut + 2);
        const data = block.split("\n").filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data) onEvent(JSON.parse(data));
      }
    });
  }

  function stop() {
    if (!current) return;
    current.controller.abort();
    current.player.stop();
  }

  // ---- the form ------------------------------------------------------------------------------
  function speechBody() {
    const body = {model: "tts-1", input: $("text").value, response_format: $("format").value,
                  stream_format: "sse", hop_schedule: $("hop-schedule").value};
    const voice = $("voice").value;
    if (voice) body.voice = voice;
    const seed = $("seed").value.trim();
    if (seed !== "") body.seed = Number(seed);
    const speed = $("speed").value.trim();
    if (speed !== "") body.speed = Number(speed);
    const instructions = $("instructions").value.trim();
    if (!$("instructions-label").hidden && instructions) body.instructions = instructions;
    return body;
  }

  function speak() {
    const body = speechBody();
    return run("/v1/audio/speech", body.response_format, true, (signal) => fetch(
      api("v1/audio/speech"), {method: "POST", signal, body: JSON.stringify(body),
                               headers: authHeaders({"Content-Type": "application/json"})}));
  }

  function promptFile() {
    const file = $("prompt-file").files[0];
    if (!file) {
      showError({status: null, message: "choose a recording first", param: "file"});
      return null;
    }
    return file;
  }

  function speakWithPrompt() {
    const file = promptFile();
    if (!file) return Promise.resolve();
    const transcript = $("prompt-text").value.trim();
    const endpoint = transcript ? "/inference_zero_shot" : "/inference_cross_lingual";
    const form = new FormData();
    form.append("tts_text", $("text").value);
    if (transcript) form.append("prompt_text", transcript);
    form.append("prompt_wav", file, file.name);
    const seed = $("seed").value.trim();
    if (seed !== "") form.append("seed", seed);
    const speed = $("speed").value.trim();
    if (speed !== "") form.append("speed", speed);
    form.append("hop_schedule", $("hop-schedule").value);
    return run(endpoint, "raw", false, (signal) => fetch(
      api(endpoint.slice(1)), {method: "POST", signal, body: form, headers: authHeaders()}));
  }

  async function registerVoice() {
    clearMessages();
    const file = promptFile();
    if (!file) return;
    const form = new FormData();
    form.append("name", $("voice-name").value.trim());
    form.append("file", file, file.name);
    const transcript = $("prompt-text").value.trim();
    if (transcript) form.append("text", transcript);
    if ($("overwrite").checked) form.append("overwrite", "true");
    setBusy(true);
    try {
      const resp = await fetch(api("v1/audio/voices"), {method: "POST", body: form,
                                                          headers: authHeaders()});
      if (!resp.ok) {
        const err = await readError(resp);
        showError(resp.status === 401 ? keyError(err) : err);
        return;
      }
      const voice = await resp.json();
      await loadVoices(voice.id);
      const how = voice.prompt_text ? "zero-shot with its transcript" : "cross-lingual (no transcript)";
      notice(`registered voice '${voice.id}' from ${voice.prompt_seconds} s of audio: ` +
             `requests naming it run ${how}`);
    } catch (e) {
      showError({status: null, message: describe(e)});
    } finally {
      setBusy(false);
    }
  }

  async function deleteVoice() {
    clearMessages();
    const id = $("voice").value;
    if (!id || !window.confirm(`Delete the registered voice '${id}'?`)) return;
    try {
      const resp = await fetch(api("v1/audio/voices/" + encodeURIComponent(id)),
                               {method: "DELETE", headers: authHeaders()});
      if (!resp.ok) {
        const err = await readError(resp);
        showError(resp.status === 401 ? keyError(err) : err);
        return;
      }
      await loadVoices();
      notice(`deleted voice '${id}'`);
    } catch (e) {
      showError({status: null, message: describe(e)});
    }
  }

  // GET /v1/audio/voices: `data` is the list of voice objects ({id, name, builtin, ...});
  // older servers sent only `voices`, a list of ids (strings or objects).
  async function loadVoices(select) {
    const picker = $("voice");
    const keep = select || picker.value;
    let resp;
    try {
      resp = await fetch(api("v1/audio/voices"), {headers: authHeaders()});
    } catch (e) {
      showError({status: null, message: describe(e)});
      return;
    }
    if (resp.status === 401) {
      const err = keyError(await readError(resp));
      const typed = web.key === "rejected";
      picker.textContent = "";
      const opt = document.createElement("option");
      opt.value = "";
      opt.textContent = typed ? "(API key rejected)" : "(API key needed)";
      opt.disabled = true;
      opt.selected = true;  // shown in the picker (a lone disabled option is not, otherwise)
      picker.append(opt);
      web.voices = [];
      showError(err);
      return;
    }
    if (!resp.ok) { showError(await readError(resp)); return; }
    setKeyState(null);
    const body = await resp.json();
    const list = (Array.isArray(body.data) ? body.data : body.voices || [])
      .map((v) => (typeof v === "string" ? {id: v, name: v} : v))
      .filter((v) => v && typeof v.id === "string");
    picker.textContent = "";
    // the model's own voices: SFT speakers, then (CosyVoice2 spk2info.pt) voices with a prompt
    const own = list.filter((v) => v.builtin !== false);
    const groups = [["built-in speakers", own.filter((v) => !v.has_prompt)],
                    ["built-in prompt voices", own.filter((v) => v.has_prompt)],
                    ["registered voices", list.filter((v) => v.builtin === false)]];
    for (const [label, voices] of groups) {
      if (!voices.length) continue;
      const group = document.createElement("optgroup");
      group.label = label;
      for (const v of voices) {
        const opt = document.createElement("option");
        opt.value = v.id;
        opt.textContent = v.name && v.name !== v.id ? `${v.name} (${v.id})` : v.id;
        group.append(opt);
      }
      picker.append(group);
    }
    if (list.some((v) => v.id === keep)) picker.value = keep;
    web.voices = list.map((v) => v.id);
  }

  // GET /v1/models: the loaded model (its first object names the model dir). Shows its family,
  // rate and modes, and the Instructions field when one of its modes takes an instruction.
  // It always needs the key when the server has one, so it is also how the page learns that a
  // key is needed (or wrong) where the voice list is public (--public-voice-list): a 401 here
  // says so at once, not after Speak fails.
  async function loadModel() {
    let body = null;
    try {
      const resp = await fetch(api("v1/models"), {headers: authHeaders()});
      if (resp.status === 401) {
        if (web.key === null) showError(keyError(await readError(resp)));  // else said already
        return;
      }
      if (!resp.ok) return;
      body = await resp.json();
    } catch (e) {
      return;
    }
    const model = body && Array.isArray(body.data) ? body.data[0] : null;
    if (!model) return;
    web.model = model;
    const parts = [model.id];
    if (model.family) parts.push(model.family);
    if (model.sample_rate) parts.push(`${model.sample_rate} Hz`);
    if (Array.isArray(model.modes)) parts.push(`modes: ${model.modes.join(", ")}`);
    const info = $("model-info");
    info.textContent = "Model " + parts.join(" · ");
    info.hidden = false;
    $("live-section").hidden = !model.text_in;
    const label = $("instructions-label");
    label.hidden = !model.instruction_mode;
    label.dataset.mode = model.instruction_mode || "";
  }

  // What the header says about the API key: null (fine), "needed" (the server answered 401
  // and no key is typed) or "rejected" (401 with the typed key).
  function setKeyState(state) {
    web.key = state;
    $("api-key-label").classList.toggle("needed", state !== null);
    $("api-key").setAttribute("aria-invalid", state === null ? "false" : "true");
    renderReady();
  }

  // A 401: the header says whether the key is missing or wrong. Returns whether one is typed.
  function keyRefused() {
    const typed = $("api-key").value.trim() !== "";
    setKeyState(typed ? "rejected" : "needed");
    return typed;
  }

  // The error of a 401 (readError's), with what to do about it, and the key field focused:
  // every 401 says the same, whichever request got it (on load, Speak, Register, Delete).
  function keyError(err) {
    const typed = keyRefused();
    $("api-key").focus();
    const hint = typed ? "the API key typed at the top of the page was refused; check it"
      : "this server needs its API key; type it in the API key field at the top of the page";
    return {...err, message: `${err.message}: ${hint}`};
  }

  function renderReady() {
    if (!readyBody) return;
    const status = $("server-status");
    let text = `ready · ${readyBody.backend} · ${readyBody.sessions} session(s)`;
    if (web.key === "needed") text += " · API key needed";
    else if (web.key === "rejected") text += " · API key rejected";
    status.textContent = text;
    status.className = web.key === null ? "ok" : "warn";
  }

  // GET /ready (public): shown in the header; polled until the model is loaded.
  async function checkReady() {
    let body = null;
    try {
      const resp = await fetch(api("ready"));
      body = await resp.json();
    } catch (e) {
      $("server-status").textContent = "server unreachable";
      setTimeout(checkReady, 3000);
      return;
    }
    const status = $("server-status");
    if (body.ready) {
      readyBody = body;
      // "ready" is said once the voices answered: a server that wants a key says so instead
      status.textContent = "ready · listing the voices…";
      status.className = "muted";
      await loadVoices();
      await loadModel();
      if (web.key === null) renderReady();
      return;
    }
    status.textContent = body.error ? `model failed to load: ${body.error}`
      : body.draining ? "shutting down" : "loading the model…";
    status.className = "muted";
    if (!body.error) setTimeout(checkReady, 2000);
  }

  // ---- type and hear (text in over a WebSocket) ----------------------------------------------
  let live = null;

  function liveControls() {
    const on = live !== null;
    $("live-start").disabled = on;
    $("live-finish").disabled = !on;
    $("live-text").disabled = !on;
  }

  function liveRender(rec) {
    const first = rec.firstAudioMs === null ? "" : ` · first audio ${Math.round(rec.firstAudioMs)} ms`;
    $("live-status").textContent = `${rec.status} · ${rec.sent} characters sent · `
      + `${(rec.samples / PCM_RATE).toFixed(2)} s of audio${first}`;
  }

  function liveSend(message) {
    if (!live || live.ws.readyState !== WebSocket.OPEN) return;
    live.ws.send(JSON.stringify(message));
  }

  // Sends what was appended to the text since the last send (with ``extra``: flush / close).
  function liveInput(extra) {
    if (!live || live.ws.readyState !== WebSocket.OPEN) return;  // onopen sends what waits
    const text = $("live-text").value;
    const message = {...(extra || {})};
    if (text.length > live.sentText.length && text.startsWith(live.sentText)) {
      message.text = text.slice(live.sentText.length);
      if (live.rec.t0 === null) live.rec.t0 = performance.now();
      live.rec.sent += message.text.length;
    }
    live.sentText = text;  // an edit before the end is not spoken (it was said already)
    if (Object.keys(message).length) liveSend(message);
    liveRender(live.rec);
  }

  function liveStart() {
    clearMessages();
    const ctx = context();
    const player = new Player(ctx);
    const decoder = new Int16Decoder(PCM_RATE);
    const url = new URL("v1/audio/speech/stream-input", API_ROOT);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    const rec = web.live = {status: "connecting", sent: 0, frames: 0, samples: 0, sampleSum: 0,
                            firstAudioMs: null, t0: null, events: [], closeCode: null,
                            error: null};
    const ws = new WebSocket(url);
    ws.binaryType = "arraybuffer";
    $("live-text").value = "";
    live = {ws, rec, sentText: ""};
    liveControls();
    ws.onopen = () => {
      const options = {};
      const seed = $("seed").value.trim();
      if (seed !== "") options.seed = Number(seed);
      const speed = $("speed").value.trim();
      if (speed !== "") options.speed = Number(speed);
      const start = {model: "tts-1", response_format: "pcm", options};
      if ($("voice").value) start.voice = $("voice").value;
      const key = $("api-key").value.trim();
      if (key) start.api_key = key;  // a browser cannot send the Authorization header here
      ws.send(JSON.stringify(start));
      liveInput();
      $("live-text").focus();
    };
    ws.onmessage = (m) => {
      if (typeof m.data === "string") {
        const ev = JSON.parse(m.data);
        rec.events.push(ev.type);
        if (ev.type === "started") rec.status = "started";
        else if (ev.type === "done") rec.status = "done";
        else if (ev.type === "error") {
          rec.status = "error";
          rec.error = {status: ev.status, ...(ev.error || {})};
          showError(ev.status === 401 ? keyError(rec.error) : rec.error);
        }
      } else {
        const samples = decoder.feed(new Uint8Array(m.data));
        rec.frames += 1;
        if (samples.length) {
          player.samples(samples, PCM_RATE);
          rec.samples += samples.length;
          for (let i = 0; i < samples.length; i++) rec.sampleSum += Math.round(samples[i] * 32768);
          if (rec.firstAudioMs === null && rec.t0 !== null) rec.firstAudioMs = performance.now() - rec.t0;
        }
      }
      liveRender(rec);
    };
    ws.onclose = (e) => {
      rec.closeCode = e.code;
      if (rec.status !== "done" && rec.status !== "error") rec.status = "closed";
      if (live && live.ws === ws) live = null;
      liveControls();
      liveRender(rec);
    };
    liveRender(rec);
  }

  function init() {
    $("live-start").addEventListener("click", liveStart);
    $("live-finish").addEventListener("click", () => liveInput({close: true}));
    $("live-text").addEventListener("input", () => liveInput());
    $("live-text").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) {  // the end of a sentence: speak its rest now
        e.preventDefault();
        liveInput({flush: true});
      }
    });
    const key = $("api-key");
    key.value = sessionStorage.getItem(KEY_STORAGE) || "";
    key.addEventListener("change", () => {
      sessionStorage.setItem(KEY_STORAGE, key.value.trim());
      clearMessages();
      loadVoices().then(loadModel);
    });
    $("speak").addEventListener("click", speak);
    $("stop").addEventListener("click", stop);
    $("speak-prompt").addEventListener("click", speakWithPrompt);
    $("register").addEventListener("click", registerVoice);
    $("delete-voice").addEventListener("click", deleteVoice);
    $("reload-voices").addEventListener("click", () => { clearMessages(); loadVoices(); });
    $("text").addEventListener("keydown", (e) => {
      if (e.key === "Enter" && (e.ctrlKey || e.metaKey) && !$("speak").disabled) speak();
    });
    document.body.dataset.state = "idle";
    checkReady();
  }

  init();
})();
