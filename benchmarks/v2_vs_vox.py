"""CosyVoice2 side by side: cosyvino (torch eager, and what `cosyvino plan` serves) against the
peer `vox-tts` (PyPI; a C++ engine with its own converter, `python -m vox.build_cosyvoice`) on
the SAME official-layout CosyVoice2 dir, the same voice, the same text and the same threads.

Per column, one subprocess (so peak RSS is the column's): load, one warm-up, then

* whole: one zero-shot synthesis of TEXT with TOKENS forced speech tokens (vox: ``max_frames``,
  it may stop earlier at an EOS; every cost is also given per second of audio): LLM ms/token,
  flow and vocoder ms per second of audio, total, RTF;
* streamed: the time to the first audio chunk (cosyvino: the ``official`` and ``latency`` hop
  schedules; vox: its own chunking);
* peak RSS.

The voice is the same for both: cosyvino's prompt processing of a 5 s speech-like stand-in clip
(speaker x-vector [192], 125 prompt speech tokens, 250 prompt mel frames, transcript), handed
to vox as a voice profile with those features (``feat.cosy_xvec``, ``feat.cosy_tokens``,
``feat.cosy_mel``): vox cannot make one from a recording of a synthetic dir, its converter
refuses the stand-in ``campplus.onnx`` (it walks the real CAM++ graph) and without CAM++ it
builds no voice cloning.

Also printed: the LLM decode roofline at INT8 and INT4 weights (the family's decode profile,
numpy copy bandwidth on the same threads). Random-weight models: speed only, not quality.

    python benchmarks/v2_vs_vox.py --model-dir DIR --vox-python /tmp/vox-venv/bin/python \\
        --tmod DIR.q8.tmod [--tokens 125] [--threads 2] [--columns torch,plan,vox]

Build the .tmod first (its q8 LLM is vox's fast CPU path): ``/tmp/vox-venv/bin/python -m
vox.build_cosyvoice --model DIR -o DIR.q8.tmod --quant q8 --no-clone``. This file runs under
both interpreters: ``--vox-worker`` imports only numpy and vox.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np

TEXT = "CosyVoice is a multilingual speech synthesis model that runs on ordinary servers."
PROMPT_TEXT = "希望你以后能够做的比我还好呦。"


def _peak_rss_mib() -> float:
    """This process's peak RSS: ``VmHWM`` of /proc/self/status (per address space, so it
    starts afresh at exec; ``ru_maxrss`` carries the parent's peak across fork + exec, which
    made every column read the driver's 4114 MiB in the first run)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---- the shared voice (cosyvino interpreter) -----------------------------------------------
def make_voice(model_dir: str, out: str) -> None:
    """Prompt bundle of a 5 s stand-in clip on ``model_dir`` -> ``out`` (.npz)."""
    import soundfile as sf

    from cosyvino import Synthesizer
    from cosyvino.measurement_voice import stand_in_clip

    tts = Synthesizer(model_dir, backend="torch", voices_dir=False)
    clip = stand_in_clip(5.0)
    v = tts.prompt_voice(clip, PROMPT_TEXT, name="bench")
    ids = tts.frontend.segments(PROMPT_TEXT)[0].token_ids
    buf = io.BytesIO()
    sf.write(buf, clip[0], clip[1], format="WAV", subtype="PCM_16")
    np.savez(out, emb=v.embedding.reshape(-1), tokens=v.prompt_speech_tokens, mel=v.prompt_mel,
             wav=np.frombuffer(buf.getvalue(), np.uint8), text_ids=np.asarray(ids, np.int32),
             clip=clip[0], rate=clip[1])


# ---- cosyvino column ------------------------------------------------------------------------
def cosyvino_worker(model_dir: str, backend: str, options: dict, threads: int, tokens: int,
                    voice_npz: str) -> dict:
    from cosyvino import Synthesizer

    d = np.load(voice_npz)
    t0 = time.perf_counter()
    tts = Synthesizer(model_dir, backend=backend, num_threads=threads, voices_dir=False,
                      **options)
    load_s = time.perf_counter() - t0
    voice = tts.prompt_voice((d["clip"], int(d["rate"])), PROMPT_TEXT, name="bench")
    tts.synthesize(TEXT, voice, seed=0, num_speech_tokens=10)  # warm-up
    a = tts.synthesize(TEXT, voice, seed=0, num_speech_tokens=tokens)
    st = a.stats["stages"]

    def ms(name):
        return 1e3 * st.get(name, {}).get("seconds", 0.0)

    audio = a.stats["audio_seconds"]
    calls = max(1, st.get("llm_decode", {}).get("calls", 1))
    out = {"load_s": load_s, "audio_s": audio, "speech_tokens": a.stats["speech_tokens"],
           "total_s": a.stats["wall_seconds"], "rtf": a.stats["rtf"],
           "llm_ms": ms("text_encoder") + ms("llm_prefill") + ms("llm_decode")
           + ms("llm_sampling"),
           "llm_ms_per_token": ms("llm_decode") / calls,
           "flow_ms": ms("flow_encoder") + ms("flow_estimator"), "vocoder_ms": ms("vocoder")}
    for schedule in ("official", "latency"):
        t = time.perf_counter()
        for _chunk in tts.stream(TEXT, voice, seed=0, num_speech_tokens=tokens,
                                 hop_schedule=schedule):
            out[f"first_chunk_{schedule}_s"] = time.perf_counter() - t
            break
    out["peak_rss_mib"] = _peak_rss_mib()
    return out


# ---- vox column (vox interpreter) ---------------------------------------------------------
def vox_worker(tmod: str, threads: int, tokens: int, voice_npz: str, tvoice: str) -> dict:
    import vox
    from vox.formats import VoiceProfile

    d = np.load(voice_npz)
    t0 = time.perf_counter()
    e = vox.Engine(tmod, device="cpu", threads=threads)
    load_s = time.perf_counter() - t0
    m = e.info["manifest"]["model"]
    feats = {"feat.cosy_mel": d["mel"].astype(np.float32),
             "feat.cosy_tokens": d["tokens"].astype(np.int32),
             "feat.cosy_xvec": d["emb"].astype(np.float32)}
    VoiceProfile(speaker_emb=d["emb"], name="bench", mode="icl", ref_text=PROMPT_TEXT,
                 language="zh", ref_codes=d["tokens"].reshape(-1, 1).astype(np.int16),
                 ref_text_tokens=d["text_ids"], ref_audio=d["wav"].tobytes(),
                 model={k: m[k] for k in ("family", "variant", "weights_sha256")},
                 kv_cache=feats).save(tvoice)
    v = e.load_voice(tvoice)
    e.synthesize(TEXT, v, seed=0, max_frames=10)  # warm-up
    before = e.stats()["backend"]
    t = time.perf_counter()
    # a random-weight LM samples EOS as soon as the length rule allows (at 2 speech tokens
    # per text token, upstream's minimum): a higher minimum ratio lets it reach TOKENS
    force = {"extra": {"min_token_text_ratio": 10}}
    wav = e.synthesize(TEXT, v, seed=0, max_frames=tokens, **force)
    total = time.perf_counter() - t
    after = e.stats()["backend"]
    audio = len(wav) / e.sample_rate
    n = round(audio * 25)  # speech tokens at CosyVoice2's 25 Hz
    out = {"load_s": load_s, "audio_s": audio, "speech_tokens": n, "total_s": total,
           "rtf": total / audio if audio else None,
           "llm_ms": after["llm_ms"] - before["llm_ms"],
           "llm_ms_per_token": (after["llm_ms"] - before["llm_ms"]) / max(1, n),
           "flow_ms": after["flow_ms"] - before["flow_ms"],
           "vocoder_ms": after["hift_ms"] - before["hift_ms"]}
    t = time.perf_counter()
    for _chunk in e.stream(TEXT, v, seed=0, max_frames=tokens, **force):
        out["first_chunk_vox_s"] = time.perf_counter() - t
        break
    out["peak_rss_mib"] = max(_peak_rss_mib(), e.stats()["memory"]["peak_rss"] / 2**20)
    return out


# ---- driver ---------------------------------------------------------------------------------
def _run(cmd: list[str], timeout: float) -> dict:
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    lines = p.stdout.strip().splitlines()
    if lines and lines[-1].startswith("{"):
        return json.loads(lines[-1])
    return {"error": (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]}


def _emit(result: dict) -> int:
    """Print the worker's result and leave at once: a stream abandoned after its first chunk
    leaves engine threads running, which would abort the interpreter's shutdown."""
    print(json.dumps(result), flush=True)
    os._exit(0)


ROWS = (("load (s)", "load_s", "{:.1f}"), ("speech tokens", "speech_tokens", "{:d}"),
        ("audio (s)", "audio_s", "{:.2f}"), ("LLM ms/token (decode)", "llm_ms_per_token",
                                             "{:.1f}"),
        ("LLM, all (ms)", "llm_ms", "{:.0f}"), ("flow (ms)", "flow_ms", "{:.0f}"),
        ("vocoder (ms)", "vocoder_ms", "{:.0f}"),
        ("flow ms per s of audio", "flow_per_s", "{:.0f}"),
        ("vocoder ms per s of audio", "vocoder_per_s", "{:.0f}"),
        ("total (s)", "total_s", "{:.2f}"), ("RTF", "rtf", "{:.2f}"),
        ("first chunk, official schedule (s)", "first_chunk_official_s", "{:.2f}"),
        ("first chunk, latency schedule (s)", "first_chunk_latency_s", "{:.2f}"),
        ("first chunk, vox chunking (s)", "first_chunk_vox_s", "{:.2f}"),
        ("peak RSS (MiB)", "peak_rss_mib", "{:.0f}"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir")
    ap.add_argument("--vox-python", default="/tmp/vox-venv/bin/python")
    ap.add_argument("--tmod")
    ap.add_argument("--tokens", type=int, default=125)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--columns", default="torch,plan,vox")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json-out", default="v2-vs-vox.json")
    # internal entry points
    ap.add_argument("--cosyvino-worker", nargs=2, metavar=("BACKEND", "OPTIONS_JSON"))
    ap.add_argument("--vox-worker", action="store_true")
    ap.add_argument("--voice-npz")
    a = ap.parse_args(argv)
    if a.vox_worker:
        return _emit(vox_worker(a.tmod, a.threads, a.tokens, a.voice_npz,
                                a.voice_npz + ".tvoice"))
    if a.cosyvino_worker:
        return _emit(cosyvino_worker(a.model_dir, a.cosyvino_worker[0],
                                     json.loads(a.cosyvino_worker[1]), a.threads, a.tokens,
                                     a.voice_npz))

    from cosyvino.bench import memory_bandwidth_gbs, profile_decode_bytes
    from cosyvino.bench_extras import cpu_summary
    from cosyvino.families import detect_family

    model_dir = os.path.abspath(a.model_dir)
    voice_npz = os.path.join(os.path.dirname(os.path.abspath(a.json_out)), "v2-vs-vox-voice.npz")
    make_voice(model_dir, voice_npz)
    me = [sys.executable, os.path.abspath(__file__), "--model-dir", model_dir, "--tokens",
          str(a.tokens), "--threads", str(a.threads), "--voice-npz", voice_npz]
    cols: dict[str, dict] = {}
    for col in [c.strip() for c in a.columns.split(",") if c.strip()]:
        print(f"bench: {col} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        if col == "vox":
            cols[col] = _run([a.vox_python, os.path.abspath(__file__), "--vox-worker",
                              "--tmod", a.tmod, "--tokens", str(a.tokens), "--threads",
                              str(a.threads), "--voice-npz", voice_npz], a.timeout)
        elif col == "plan":
            from cosyvino.planner import make_plan, probe

            plan = make_plan(probe(model_dir=model_dir), model_dir=model_dir)
            opts = dict(plan.backend_options)
            opts.pop("num_threads", None)
            cols[f"plan ({plan.backend})"] = _run(
                [*me, "--cosyvino-worker", plan.backend, json.dumps(opts)]
                + ["--model-dir", plan.model_dir], a.timeout)
        else:
            cols[col] = _run([*me, "--cosyvino-worker", col, "{}"], a.timeout)
        print(f"bench: {col} done in {time.perf_counter() - t:.0f} s", file=sys.stderr)
    for r in cols.values():
        if "error" not in r and r.get("audio_s"):
            r["flow_per_s"] = r["flow_ms"] / r["audio_s"]
            r["vocoder_per_s"] = r["vocoder_ms"] / r["audio_s"]
    family = detect_family(model_dir)
    profile = family.decode_profile(family.read_config(model_dir))
    bw = memory_bandwidth_gbs(mb=64, threads=a.threads)
    cache = 30 + 125 + a.tokens / 2  # prefix + prompt speech tokens + half the new tokens
    roof = {w: profile_decode_bytes(profile, cache, b)["total_bytes"] / (bw * 1e9) * 1e3
            for w, b in (("INT8", 1), ("INT4", 0.5))}
    load = os.getloadavg()
    lines = [f"CPU: {cpu_summary()}", f"load average at the end: {load[0]:.2f} {load[1]:.2f} "
             f"{load[2]:.2f}; {a.threads} threads per column; {a.tokens} tokens forced",
             f"LLM roofline ({bw:.1f} GB/s copy, {a.threads} threads): INT8 weights "
             f"{roof['INT8']:.1f} ms/token, INT4 {roof['INT4']:.1f} ms/token", "",
             "| metric | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for label, key, fmt in ROWS:
        cells = []
        for r in cols.values():
            v = r.get(key)
            cells.append("" if v is None else fmt.format(v))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    for name, r in cols.items():
        if "error" in r:
            lines.append(f"\n{name}: FAILED: {r['error']}")
    table = "\n".join(lines)
    print(table)
    with open(a.json_out, "w", encoding="utf-8") as f:
        json.dump({"columns": cols, "roofline_ms_per_token": roof, "bandwidth_gbs": bw,
                   "loadavg": load, "markdown": table}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
