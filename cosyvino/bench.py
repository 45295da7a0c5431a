"""Side-by-side backend benchmark (``cosyvino bench``): one subprocess per backend, so peak RSS
and load time are per backend. Must not import torch (the torch backend's worker does).

Fixed texts, forced speech-token counts (250 tokens = 5 s of audio per text), seed 0. Per
backend: model load time, per-stage ms, LLM ms/token, estimator ms/call, vocoder ms, RTF,
first-segment latency, peak RSS; streamed (:func:`measure_stream`): first-chunk latency
p50/p95, streaming RTF and underrun per hop schedule for a one- and a five-sentence text. Plus the LLM decode roofline: weight (+ mean KV cache) bytes
read per generated token divided by a measured memory bandwidth (numpy copy). On a model with
the prompt models (voice cloning, :func:`measure_prompt`): the processing cost of a 5 s prompt
(intake, speaker embedding, speech tokens, prompt mel) and a zero-shot request with the prompt
per request vs the same prompt as a registered voice (which skips that processing).

Worker entry point: ``python -m cosyvino.bench --worker BACKEND ...`` prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time

import numpy as np

from .measurement_voice import MEASUREMENT_VOICE, STAND_IN_TEXT, measurement_voice, stand_in_clip

#: (language, preferred built-in speaker, text): the speaker where the model has it, else
#: :func:`bench_voice` picks one (models without built-in speakers: a registered prompt voice)
TEXTS = (
    ("zh", "中文女", "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。"),
    ("en", "英文女", "CosyVoice is a multilingual speech synthesis model that runs on ordinary servers."),
)

#: streaming texts (``cosyvino bench`` streaming rows): one sentence, and five sentences (the
#: frontend merges them into a few segments); speech tokens are forced per segment
STREAM_TEXTS = (
    ("1 sentence", "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。", 1.0),
    ("5 sentences", "今天的天气非常好。我们一起去公园散步吧。公园里有很多美丽的花。孩子们在草地上快乐地"
                    "玩耍。傍晚的时候我们再回家吃饭。", 2.0),
)
#: hop schedules compared by the streaming rows ("segment" = what a non-streaming player gets)
STREAM_SCHEDULES = ("latency", "official", "segment")

#: (label, key in a backend result, format)
ROWS = (
    ("model load (s)", "load_s", "{:.2f}"),
    ("peak RSS (MiB)", "peak_rss_mb", "{:.0f}"),
    ("peak RSS by end of load (MiB)", "load_peak_rss_mb", "{:.0f}"),
    ("text encoder + spk (ms)", "text_encoder_ms", "{:.1f}"),
    ("LLM prefill (ms)", "llm_prefill_ms", "{:.1f}"),
    ("LLM decode (ms)", "llm_decode_ms", "{:.0f}"),
    ("LLM ms/token", "llm_ms_per_token", "{:.2f}"),
    ("LLM sampling (ms)", "llm_sampling_ms", "{:.0f}"),
    ("flow encoder + LR (ms)", "flow_encoder_ms", "{:.1f}"),
    ("estimator (ms, all calls)", "flow_estimator_ms", "{:.0f}"),
    ("estimator ms/call", "estimator_ms_per_call", "{:.1f}"),
    ("vocoder (ms)", "vocoder_ms", "{:.0f}"),
    ("total (s)", "total_s", "{:.2f}"),
    ("audio (s)", "audio_s", "{:.2f}"),
    ("RTF", "rtf", "{:.3f}"),
    ("first-segment latency (s)", "first_segment_latency_s", "{:.2f}"),
)
#: streaming rows per (text, schedule): (label, key in a stream result, format)
STREAM_ROWS = (
    ("first chunk p50 (s)", "first_chunk_p50_s", "{:.2f}"),
    ("first chunk p95 (s)", "first_chunk_p95_s", "{:.2f}"),
    ("streaming RTF", "rtf", "{:.3f}"),
    ("underrun after first chunk (s)", "underrun_s", "{:.2f}"),
)


#: voice-cloning rows (models with prompt models): (label, key in a prompt result, format)
PROMPT_ROWS = (
    ("prompt models on", "backend", "{}"),
    ("5 s prompt: intake (decode + resample, ms)", "intake_ms", "{:.1f}"),
    ("5 s prompt: speaker embedding (ms)", "embedding_ms", "{:.1f}"),
    ("5 s prompt: speech tokens (ms)", "tokens_ms", "{:.1f}"),
    ("5 s prompt: prompt mel (ms)", "mel_ms", "{:.1f}"),
    ("5 s prompt: total (ms)", "total_ms", "{:.1f}"),
    ("zero-shot, prompt per request (s)", "zero_shot_prompt_s", "{:.2f}"),
    ("zero-shot, registered voice (s)", "zero_shot_voice_s", "{:.2f}"),
)
#: length of the benchmark prompt, seconds
PROMPT_SECONDS = 5.0
#: transcript of ``examples/zero_shot_prompt.wav`` (the official zero-shot example; the cost
#: does not depend on the text)
PROMPT_TEXT = STAND_IN_TEXT


def default_prompt_wav() -> str | None:
    """``examples/zero_shot_prompt.wav`` of a source checkout, or None (installed package)."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "examples", "zero_shot_prompt.wav")
    return path if os.path.isfile(path) else None


def prompt_clip(path: str | None, seconds: float = PROMPT_SECONDS) -> tuple[np.ndarray, int]:
    """(float32 [N] mono samples, rate) exactly ``seconds`` long: the recording at ``path``
    looped (or cut) to that length at its own rate; without a file, a speech-like stand-in
    (noise with a 4 Hz syllable envelope at -20 dBFS, 16 kHz): the prompt models' cost
    depends on the length only."""
    if path is None:
        return stand_in_clip(seconds)
    import soundfile as sf

    x, rate = sf.read(path, dtype="float32", always_2d=True)
    x = x.mean(axis=1)
    n = int(round(seconds * rate))
    return np.resize(x, n).astype(np.float32), int(rate)


def measure_prompt(tts, clip: tuple[np.ndarray, int], tokens: int, runs: int = 3) -> dict:
    """The voice-cloning cost on ``tts`` (a Synthesizer with prompt models): per step of the
    prompt processing of ``clip`` (median of ``runs``, after one warm-up): intake
    (:func:`cosyvino.prompt_audio.load_prompt_audio`: checks and soxr to 16 kHz and the
    encoder's mel rate: 22.05 kHz v1, 24 kHz CosyVoice2),
    speaker embedding (fbank + CAM++), speech tokens (whisper log-mel + tokenizer), prompt
    mel; then the wall seconds of a zero-shot synthesis of ``TEXTS[0]`` (``tokens`` forced)
    with the prompt passed per request and with it registered (median of ``runs``)."""
    from .families.cosyvoice1.prompt_models import default_prompt_backend
    from .frontend.features import campplus_fbank, prompt_mel, prompt_mel_of, whisper_log_mel
    from .prompt_audio import MEL_RATE, load_prompt_audio

    encoder = tts.prompt_encoder
    models = encoder.models
    mel = getattr(encoder, "mel", None)  # the family's prompt mel (None: v1's)
    rate = MEL_RATE if mel is None else mel.sampling_rate

    def steps() -> dict:
        t0 = time.perf_counter()
        audio = load_prompt_audio(clip, mel_rate=rate)
        t1 = time.perf_counter()
        models.embedding(campplus_fbank(audio.wav_16k))
        t2 = time.perf_counter()
        models.speech_tokens(whisper_log_mel(audio.wav_16k))
        t3 = time.perf_counter()
        if mel is None:
            prompt_mel(audio.wav_mel, sample_rate=MEL_RATE)
        else:
            prompt_mel_of(audio.wav_mel, mel)
        t4 = time.perf_counter()
        return {"intake_ms": 1e3 * (t1 - t0), "embedding_ms": 1e3 * (t2 - t1),
                "tokens_ms": 1e3 * (t3 - t2), "mel_ms": 1e3 * (t4 - t3),
                "total_ms": 1e3 * (t4 - t0)}

    steps()  # warm-up (first inference compiles)
    samples = [steps() for _ in range(runs)]
    out = {k: float(np.median([s[k] for s in samples])) for k in samples[0]}
    text = TEXTS[0][2]

    def wall(**inputs) -> float:
        t = time.perf_counter()
        tts.synthesize(text, seed=0, num_speech_tokens=tokens, **inputs)
        return time.perf_counter() - t

    tts.add_voice(BENCH_VOICE, clip, PROMPT_TEXT, overwrite=True)
    wall(speaker=BENCH_VOICE)  # warm-up of the zero-shot path
    out["zero_shot_prompt_s"] = float(np.median(
        [wall(prompt_audio=clip, prompt_text=PROMPT_TEXT) for _ in range(runs)]))
    out["zero_shot_voice_s"] = float(np.median([wall(speaker=BENCH_VOICE)
                                                for _ in range(runs)]))
    out.update(backend=default_prompt_backend(encoder.backend), seconds=PROMPT_SECONDS,
               runs=runs)
    return out


def play_underrun(arrivals: list[tuple[float, float]]) -> float:
    """Seconds a real-time player starting at the first chunk waits for later chunks.

    ``arrivals``: (arrival time s, chunk duration s) in order. The player starts at the first
    arrival and plays chunks back to back; whenever the next chunk arrives after the previous
    one has finished playing, it waits (underrun) and resumes at the arrival."""
    if not arrivals:
        return 0.0
    cursor, wait = arrivals[0][0], 0.0
    for t, d in arrivals:
        if t > cursor:
            wait += t - cursor
            cursor = t
        cursor += d
    return wait


def measure_stream(tts, text: str, speaker: str, tokens: int, schedule: str,
                   runs: int) -> dict:
    """``runs`` streamed syntheses of ``text`` (seeds 0..runs-1, ``tokens`` forced speech
    tokens per segment): first-chunk latency p50/p95, streaming RTF (wall / audio, mean) and
    mean underrun seconds (:func:`play_underrun`)."""
    firsts, rtfs, unders, chunks, audio = [], [], [], 0, 0.0
    for seed in range(runs):
        t0 = time.perf_counter()
        arrivals = []
        for chunk in tts.stream(text, speaker, seed=seed, num_speech_tokens=tokens,
                                hop_schedule=schedule):
            arrivals.append((time.perf_counter() - t0, chunk.duration))
        wall = time.perf_counter() - t0
        audio = sum(d for _, d in arrivals)
        chunks = len(arrivals)
        firsts.append(arrivals[0][0])
        rtfs.append(wall / audio if audio else float("nan"))
        unders.append(play_underrun(arrivals))
    return {"schedule": schedule, "runs": runs, "chunks": chunks, "audio_s": audio,
            "first_chunk_p50_s": float(np.percentile(firsts, 50)),
            "first_chunk_p95_s": float(np.percentile(firsts, 95)),
            "rtf": float(np.mean(rtfs)), "underrun_s": float(np.mean(unders))}


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB (``ru_maxrss`` is in KiB on Linux); the
    ``*_mb`` result keys keep their names for JSON readers."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def memory_bandwidth_gbs(mb: int = 256, repeats: int = 5, threads: int = 1) -> float:
    """Best-of-``repeats`` numpy copy bandwidth in GB/s (bytes read + bytes written) of
    ``mb`` MiB split over ``threads`` threads copying at once (``np.copyto`` releases the
    GIL). One thread need not saturate the bus, so a roofline for a decode on N threads
    samples with N (docs/performance.md, "Stages against their bounds")."""
    threads = max(1, int(threads))
    n = mb * (1 << 20) // 4 // threads
    srcs = [np.ones(n, dtype=np.float32) for _ in range(threads)]
    dsts = [np.empty_like(a) for a in srcs]
    best = float("inf")
    for _ in range(repeats):
        workers = [threading.Thread(target=np.copyto, args=(d, a)) for d, a in zip(dsts, srcs)]
        t = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        best = min(best, time.perf_counter() - t)
    return 2 * sum(a.nbytes for a in srcs) / best / 1e9


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity set), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def llm_decode_bytes(config, mean_cache_len: float, weight_bytes: int = 4,
                     kv_bytes: int = 4) -> dict:
    """Bytes read per decode step: every LLM weight once (layers, input layer, head) plus the
    KV cache at ``mean_cache_len`` positions."""
    lc = config.llm
    e = lc.llm
    d, u, nl = e.output_size, e.linear_units, e.num_blocks
    per_layer = (4 * (d * d + d) + d * d + 2 * d   # q k v out (+bias), linear_pos, pos biases
                 + d * u + u + u * d + d            # FFN
                 + 4 * d)                           # 2 LayerNorms
    params = nl * per_layer + (e.input_size * d + 3 * d) + 2 * d  # input layer, after_norm
    params += lc.llm_output_size * (lc.speech_token_size + 1) + lc.speech_token_size + 1
    kv = nl * 2 * mean_cache_len * d * kv_bytes
    return {"params": params, "weight_bytes": params * weight_bytes, "kv_bytes": kv,
            "total_bytes": params * weight_bytes + kv}


def profile_decode_bytes(profile, mean_cache_len: float, weight_bytes: float = 4,
                         kv_bytes: float = 4) -> dict:
    """Bytes read per decode step from a family's
    :class:`~cosyvino.families.base.DecodeProfile` (what any family's
    :meth:`~cosyvino.families.base.ModelFamily.decode_profile` gives): ``params`` weights at
    ``weight_bytes`` each plus ``mean_cache_len`` cached positions at ``kv_bytes`` per value
    (the profile prices an fp32 cache)."""
    kv = profile.kv_bytes_per_position * mean_cache_len * kv_bytes / 4
    weights = profile.params * weight_bytes
    return {"params": profile.params, "weight_bytes": weights, "kv_bytes": kv,
            "total_bytes": weights + kv}


#: name of the voice :func:`bench_voice` registers on a model without built-in speakers
BENCH_VOICE = MEASUREMENT_VOICE


def bench_voice(tts, preferred: str | None = None, prompt_wav: str | None = None):
    """The voice the benchmark speaks with on ``tts``
    (:func:`cosyvino.measurement_voice.measurement_voice`): ``preferred`` when the model has
    it, else its first built-in speaker, else (no built-in speakers, e.g. an official
    CosyVoice2 dir without ``spk2info.pt``) a prompt voice named :data:`BENCH_VOICE` made once
    from a 5 s clip of ``prompt_wav`` (:func:`prompt_clip`; the stand-in without a file).

    Raises:
        cosyvino.errors.CosyvinoError: no built-in speakers and no prompt models."""
    if list(tts.speakers):
        return measurement_voice(tts, preferred)
    return measurement_voice(tts, preferred, prompt_clip(prompt_wav or default_prompt_wav()),
                             PROMPT_TEXT)


def _row(tts, audio) -> dict:
    st = audio.stats["stages"]

    def ms(name):
        return 1000 * st.get(name, {}).get("seconds", 0.0)

    decode_calls = max(1, st.get("llm_decode", {}).get("calls", 1))
    # the calls the run made (ODE steps x segments), whatever the family's step count
    est_calls = max(1, st.get("flow_estimator", {}).get("calls", 1))
    return {
        "speech_tokens": audio.stats["speech_tokens"], "audio_s": audio.stats["audio_seconds"],
        "text_encoder_ms": ms("text_encoder"), "llm_prefill_ms": ms("llm_prefill"),
        "llm_decode_ms": ms("llm_decode"), "llm_ms_per_token": ms("llm_decode") / decode_calls,
        "llm_sampling_ms": ms("llm_sampling"), "flow_encoder_ms": ms("flow_encoder"),
        "flow_estimator_ms": ms("flow_estimator"),
        "estimator_ms_per_call": ms("flow_estimator") / est_calls,
        "vocoder_ms": ms("vocoder"), "total_s": audio.stats["wall_seconds"],
        "rtf": audio.stats["rtf"],
        "first_segment_latency_s": audio.stats.get("first_segment_latency"),
    }


def run_worker(backend: str, model_dir: str, tokens: int, threads: int | None,
               options: dict, stream_runs: int = 3, prompt_wav: str | None = None,
               prompt_runs: int = 3, ode_steps=()) -> dict:
    """Load ``backend``, warm up, synthesize TEXTS with ``tokens`` forced tokens; averages.
    Then, unless ``stream_runs`` is 0, the streaming rows (:func:`measure_stream`) for
    STREAM_TEXTS x STREAM_SCHEDULES; and, on a model offering ``zero_shot`` and unless
    ``prompt_runs`` is 0, the voice-cloning rows (:func:`measure_prompt` on a 5 s clip of
    ``prompt_wav``, None: :func:`default_prompt_wav` or the stand-in); for ``ode_steps``
    (CFM step counts), :func:`cosyvino.bench_extras.measure_ode_steps`. The kernels the
    backend ran, when its stages report them (``kernel_isas()``)."""
    from .synthesizer import Synthesizer

    t0 = time.perf_counter()
    # registered voices in memory: the benchmark's voice is not written into the model dir
    tts = Synthesizer(model_dir, backend=backend, num_threads=threads, voices_dir=False,
                      **options)
    load_s = time.perf_counter() - t0
    load_peak = peak_rss_mb()  # compile-time transients: was the overall peak reached here?
    voice = bench_voice(tts, TEXTS[1][1], prompt_wav)
    tts.synthesize(TEXTS[1][2], voice, seed=0, num_speech_tokens=10)  # warm-up
    rows = []
    for lang, speaker, text in TEXTS:
        speaker = bench_voice(tts, speaker, prompt_wav)
        audio = tts.synthesize(text, speaker, seed=0, num_speech_tokens=tokens)
        row = _row(tts, audio)
        row["lang"] = lang
        row["text_tokens"] = len(tts.frontend.segments(text)[0].token_ids)
        rows.append(row)
    mean = {k: float(np.mean([r[k] for r in rows])) for k in rows[0]
            if isinstance(rows[0][k], (int, float)) and rows[0][k] is not None}
    # what the runtime compiled the LLM with (stages that report it: OpenVINO's property
    # names) and the LLM's stored weight precision from a converted dir's manifest
    info = getattr(tts.stages, "compile_info", None)
    manifest = getattr(tts.stages, "manifest", None) or {}
    llm_weights = llm_weight_precision(manifest)
    estimator_weights = stage_weight_precision(manifest, "estimator")
    streaming = []
    if stream_runs > 0:
        speaker = bench_voice(tts, TEXTS[0][1], prompt_wav)
        for label, text, share in STREAM_TEXTS:
            for schedule in STREAM_SCHEDULES:
                row = measure_stream(tts, text, speaker, max(1, int(tokens * share)), schedule,
                                     stream_runs)
                row["text"] = label
                streaming.append(row)
    prompt = None
    if prompt_runs > 0 and "zero_shot" in tts.modes:
        source = prompt_wav or default_prompt_wav()
        prompt = measure_prompt(tts, prompt_clip(source), tokens, prompt_runs)
        prompt["source"] = source or "stand-in"
    ode = []
    if ode_steps:
        from .bench_extras import measure_ode_steps

        speaker = bench_voice(tts, TEXTS[0][1], prompt_wav)
        ode = measure_ode_steps(tts, TEXTS[0][2], speaker, tokens, ode_steps)
    kernels = getattr(tts.stages, "kernel_isas", None)
    peak = peak_rss_mb()
    # a bandwidth sample for the roofline, taken while this worker's model is loaded and after
    # its peak RSS was read (the copy's buffers would raise it); 64 MB each, past any LLC
    bw_threads = threads or usable_cpus()  # the backends default to every usable core
    bandwidth = memory_bandwidth_gbs(mb=64, threads=bw_threads)
    return {"backend": backend, "streaming": streaming, "prompt": prompt, "ode_steps": ode,
            "kernels": kernels() if kernels else None,
            "options": options, "threads": threads, "bandwidth_gbs": bandwidth,
            "bandwidth_threads": bw_threads,
            "load_s": load_s, "peak_rss_mb": peak, "load_peak_rss_mb": load_peak,
            "rows": rows, "mean": mean,
            "compile_info": info.get("llm") if info else None, "llm_weights": llm_weights,
            "estimator_weights": estimator_weights,
            "torch_imported": "torch" in sys.modules}


def llm_weight_precision(manifest: dict) -> str | None:
    """The stored precision of the LLM step graph's weights in a converted dir's manifest
    (``fp32``, ``int8-weights`` after ``cosyvino quantize``...); see
    :func:`stage_weight_precision`."""
    return stage_weight_precision(manifest, "llm")


def stage_weight_precision(manifest: dict, stage: str) -> str | None:
    """The stored precision of ``stage``'s weights in a converted dir's manifest (``fp32``,
    ``int8-weights``, ``int8-static``...): the one recorded for the largest file of that stage
    (the file holding its weights: an IR's ``.bin``, an ONNX file or its external data); None
    when none is recorded (e.g. the torch backend)."""
    files = [rec for rec in manifest.get("files", {}).values()
             if isinstance(rec, dict) and rec.get("stage") == stage and rec.get("precision")]
    if not files:
        return None
    return max(files, key=lambda rec: rec.get("size", 0))["precision"]


def module_subprocess_env() -> dict:
    """Environment for ``python -m cosyvino...`` children: ``-m`` puts the current directory
    first on ``sys.path``, so a folder named ``cosyvino`` there (e.g. the directory a clone was
    made into) would be imported instead of the installed package — PYTHONSAFEPATH=1 (Python
    >= 3.11) leaves it off."""
    return dict(os.environ, PYTHONSAFEPATH="1")


def run_backend_subprocess(backend: str, model_dir: str, tokens: int, threads: int | None,
                           options: dict, timeout: float = 3600, stream_runs: int = 3,
                           prompt_wav: str | None = None, prompt_runs: int = 3,
                           ode_steps=()) -> dict:
    cmd = [sys.executable, "-m", "cosyvino.bench", "--worker", backend, "--model-dir",
           model_dir, "--tokens", str(tokens), "--options", json.dumps(options),
           "--stream-runs", str(stream_runs), "--prompt-runs", str(prompt_runs)]
    if ode_steps:
        cmd += ["--ode-steps", ",".join(str(n) for n in ode_steps)]
    if prompt_wav:
        cmd += ["--prompt-wav", os.path.abspath(prompt_wav)]
    if threads:
        cmd += ["--threads", str(threads)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                         env=module_subprocess_env())
    if out.returncode != 0:
        msg = (out.stderr or out.stdout).strip()[-2000:]
        return {"backend": backend,
                "error": f"worker exited with status {out.returncode}" + (f": {msg}" if msg
                                                                         else "")}
    return json.loads(out.stdout.strip().splitlines()[-1])


def roofline(config, results: list[dict], tokens: int,
             bandwidth_gbs: float | None = None, profile=None) -> dict:
    """LLM decode roofline per backend column: bytes read per token at the column's weight
    and KV-cache precision and the run's mean cache length: :func:`profile_decode_bytes` of
    ``profile`` (the family's :class:`~cosyvino.families.base.DecodeProfile`; what
    ``cosyvino bench`` passes), or without one :func:`llm_decode_bytes` of a v1 ``config``) over the best copy bandwidth sampled during the run: ``bandwidth_gbs`` (None:
    measured now, with as many threads as the columns ran) and each worker's own sample
    (``bandwidth_gbs`` in its result, with its backend's threads). The best, not the latest:
    a VM's bandwidth drifts with its neighbours, and a single low sample made the printed
    measured/roofline ratio look better than the decode was (docs/performance.md, "Stages
    against their bounds"); the best sample is what the memory bus gave during this run."""
    if bandwidth_gbs is None:
        used = [r.get("bandwidth_threads") or r.get("threads") for r in results]
        bandwidth_gbs = memory_bandwidth_gbs(threads=max([t for t in used if t] or [1]))
    samples = [bandwidth_gbs]
    samples += [r["bandwidth_gbs"] for r in results if r.get("bandwidth_gbs")]
    bw = max(samples)
    # the LLM prefix: the text tokens + 3 special positions (v1: sos, speaker, task; a
    # family with one fewer moves the roofline by well under 1 %)
    prefix = np.mean([row["text_tokens"] for r in results if "rows" in r
                      for row in r["rows"]] or [40]) + 3
    mean_len = prefix + tokens / 2
    out = {"bandwidth_gbs": bw, "bandwidth_samples_gbs": samples, "mean_cache_len": mean_len,
           "per_backend": {}}
    for r in results:
        if "mean" not in r:
            continue
        wb = 4
        if r.get("compile_info") and r["compile_info"].get("INFERENCE_PRECISION_HINT") in (
                "bf16", "f16"):
            wb = 2
        if r.get("llm_weights") == "int8-weights":  # `cosyvino quantize`: 1 byte/weight
            wb = 1
        elif r.get("llm_weights") == "int4-weights":  # int4-llm preset: half a byte/weight
            wb = 0.5
        kvb = {"u8": 1, "f16": 2, "bf16": 2}.get(
            (r.get("compile_info") or {}).get("KV_CACHE_PRECISION"), 4)
        b = (llm_decode_bytes(config, mean_len, wb, kvb) if profile is None
             else profile_decode_bytes(profile, mean_len, wb, kvb))
        ms = b["total_bytes"] / (bw * 1e9) * 1e3
        row = {"bytes_per_token": b["total_bytes"], "roofline_ms_per_token": ms,
               "measured_ms_per_token": r["mean"]["llm_ms_per_token"],
               "ratio": r["mean"]["llm_ms_per_token"] / ms}
        if profile is not None:
            # the bounds `cosyvino quantize` aims at: INT8 / INT4 weights, the column's cache
            for name, w in (("int8", 1), ("int4", 0.5)):
                q = profile_decode_bytes(profile, mean_len, w, kvb)["total_bytes"]
                row[f"{name}_roofline_ms_per_token"] = q / (bw * 1e9) * 1e3
        out["per_backend"][r["label"]] = row
    return out


def markdown(results: list[dict], roof: dict | None, estimator: dict | None = None) -> str:
    """The table; ``estimator``: {"gflop_per_call", "peaks"} (rows of the estimator's achieved
    rate and its share of the peak of each column's estimator precision, ``peaks[label]`` =
    {"gops", "peak"}) or None."""
    ok = [r for r in results if "mean" in r]
    head = "| metric | " + " | ".join(r["label"] for r in ok) + " |"
    lines = [head, "|---|" + "---:|" * len(ok)]
    for label, key, fmt in ROWS:
        cells = []
        for r in ok:
            v = r.get(key, r["mean"].get(key))
            cells.append("" if v is None else fmt.format(v))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if len(ok) >= 2:
        base = ok[0]["mean"]["total_s"]
        lines.append("| speed-up vs " + ok[0]["label"] + " | " + " | ".join(
            f"{base / r['mean']['total_s']:.2f}x" for r in ok) + " |")
    if roof:
        samples = roof.get("bandwidth_samples_gbs") or [roof["bandwidth_gbs"]]
        spread = (f", best of {len(samples)} samples {min(samples):.1f}-{max(samples):.1f}"
                  if len(samples) > 1 else "")
        lines.append(f"| LLM roofline ms/token ({roof['bandwidth_gbs']:.1f} GB/s copy{spread}) | "
                     + " | ".join(f"{roof['per_backend'][r['label']]['roofline_ms_per_token']:.2f}"
                                  for r in ok) + " |")
        lines.append("| measured / roofline | " + " | ".join(
            f"{roof['per_backend'][r['label']]['ratio']:.2f}x" for r in ok) + " |")
        for name in ("int8", "int4"):
            key = f"{name}_roofline_ms_per_token"
            if all(key in roof["per_backend"][r["label"]] for r in ok):
                lines.append(f"| LLM {name.upper()}-weight roofline ms/token (measured / it) | "
                             + " | ".join(f"{roof['per_backend'][r['label']][key]:.2f} ("
                                          f"{r['mean']['llm_ms_per_token'] / roof['per_backend'][r['label']][key]:.1f}x)"
                                          for r in ok) + " |")
    if estimator and estimator.get("gflop_per_call"):
        g = estimator["gflop_per_call"]
        rates = [g / (r["mean"]["estimator_ms_per_call"] / 1000.0) for r in ok]
        lines.append(f"| estimator G ops/s ({g:.1f} G ops/call: 2 per multiply-add) | "
                     + " | ".join(f"{x:.0f}" for x in rates) + " |")
        peaks = [estimator.get("peaks", {}).get(r["label"], {}) for r in ok]
        if any(p.get("gops") for p in peaks):
            # each column against the peak of its estimator's precision: an INT8 estimator
            # over the fp32 FMA peak read well above 100 %
            # "cpu MHz" is the nominal clock in most VMs and boost runs above it, so the peak
            # is not a ceiling (docs/performance.md, "Stages against their bounds")
            cells = [f"{p['gops']:.0f} ({p['peak']})" if p.get("gops") else p.get("peak", "")
                     for p in peaks]
            lines.append("| estimator peak G ops/s (its precision, at the nominal clock) | "
                         + " | ".join(cells) + " |")
            lines.append("| estimator / its peak | " + " | ".join(
                f"{100 * x / p['gops']:.0f} %" if p.get("gops") else ""
                for x, p in zip(rates, peaks)) + " |")
    if any(r.get("prompt") for r in ok):
        for label, key, fmt in PROMPT_ROWS:
            cells = [fmt.format(r["prompt"][key]) if r.get("prompt") else "" for r in ok]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    streams = [(r["label"], {(x["text"], x["schedule"]): x for x in r.get("streaming", [])})
               for r in ok]
    keys = [k for k in streams[0][1]] if streams else []
    if keys:
        lines += ["", "Streaming (`Synthesizer.stream`; the `segment` schedule is the "
                  "non-streamed path's first chunk):", "",
                  "| text | schedule | metric | " + " | ".join(n for n, _ in streams) + " |",
                  "|---|---|---|" + "---:|" * len(streams)]
        for text, schedule in keys:
            audio = streams[0][1][(text, schedule)]["audio_s"]
            for label, key, fmt in STREAM_ROWS:
                cells = [fmt.format(m[(text, schedule)][key]) if (text, schedule) in m else ""
                         for _, m in streams]
                lines.append(f"| {text} ({audio:.1f} s) | {schedule} | {label} | "
                             + " | ".join(cells) + " |")
    for r in results:
        if "error" in r:
            lines.append(f"\n{r['label']}: FAILED: {r['error'].splitlines()[-1]}")
    return "\n".join(lines)


def _worker_main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", required=True)
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--tokens", type=int, default=250)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--options", default="{}")
    ap.add_argument("--stream-runs", type=int, default=3)
    ap.add_argument("--prompt-wav", default=None)
    ap.add_argument("--prompt-runs", type=int, default=3)
    ap.add_argument("--ode-steps", default="")
    a = ap.parse_args(argv)
    steps = [int(n) for n in a.ode_steps.split(",") if n.strip()]
    res = run_worker(a.worker, a.model_dir, a.tokens, a.threads, json.loads(a.options),
                     a.stream_runs, a.prompt_wav, a.prompt_runs, steps)
    print(json.dumps(res, ensure_ascii=False))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
