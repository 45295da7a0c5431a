#!/usr/bin/env python
"""Resident memory of the OpenVINO backend, per stage (not a test; Linux: reads /proc/self).

Every configuration runs in its own subprocess (so peak RSS is its own): load the converted dir
with the OpenVINO backend (f32 compute, f32 KV cache), synthesize fixed texts with forced token
counts, and record RSS split into anonymous memory (the plugin's repacked weights, activations,
numpy tables) and file-backed pages (mapped IR ``.bin`` / blob-cache files, shared libraries)
after loading and after each stage's calls, plus the peak (``ru_maxrss``). Usage:

    python benchmarks/ov_memory.py [--model-dir D] [--subdirs openvino,openvino-int8-llm]
        [--cache off,on] [--stages-file OLD_STAGES.py] [--tokens 250] [--threads 2] [--json F]

``--stages-file`` also runs every configuration with another version of the backend's
``stages.py`` (e.g. ``git show HEAD:plugins/cosyvino_openvino/stages.py > /tmp/old.py``), so a
before/after comparison comes from one run of one script.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

TEXTS = (
    ("中文女", "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。"),
    ("英文女", "CosyVoice is a multilingual speech synthesis model that runs on ordinary servers."),
)
#: Stages methods measured, in pipeline order; the LLM runs between encode_text and flow_encode.
WATCHED = ("encode_text", "flow_encode", "estimate", "vocoder_source", "vocoder_decode")


def rss_mb() -> dict[str, float]:
    """{"rss", "anon", "file"} in MB from /proc/self/smaps_rollup (file = Rss - Anonymous)."""
    fields = {}
    with open("/proc/self/smaps_rollup", encoding="ascii") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024.0
    rss, anon = fields.get("Rss", 0.0), fields.get("Anonymous", 0.0)
    return {"rss": rss, "anon": anon, "file": rss - anon}


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _use_stages_file(path: str) -> None:
    """Make the backend's ``from .stages import OpenVINOStages`` load ``path`` instead."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("cosyvino_openvino.stages", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)


def _watch(stages, after: dict) -> None:
    """Wrap the stage methods of this instance: RSS after each call (max over the calls of the
    first utterance; ``after["frozen"]`` set by the caller stops recording)."""
    for name in WATCHED:
        fn = getattr(stages, name)

        def wrapped(*a, _fn=fn, _name=name, **k):
            if _name == "flow_encode":  # the LLM has just finished
                _record(after, "llm", rss_mb())
            out = _fn(*a, **k)
            _record(after, _name, rss_mb())
            return out

        setattr(stages, name, wrapped)


def _record(after: dict, key: str, m: dict) -> None:
    if after.get("frozen"):
        return
    if key not in after or m["rss"] > after[key]["rss"]:
        after[key] = m


def child(cfg: dict) -> dict:
    if cfg.get("stages_file"):
        _use_stages_file(cfg["stages_file"])
    from cosyvino import Synthesizer

    start = rss_mb()
    t0 = time.perf_counter()
    tts = Synthesizer(cfg["model_dir"], backend="openvino", num_threads=cfg["threads"],
                      precision="f32", kv_cache_precision="f32",
                      cache_dir=cfg["cache_dir"])
    load_s = time.perf_counter() - t0
    loaded = dict(rss_mb(), peak=peak_mb())
    after: dict = {}
    _watch(tts.stages, after)
    t0 = time.perf_counter()
    for speaker, text in TEXTS:
        tts.synthesize(text, speaker, seed=0, num_speech_tokens=cfg["tokens"])
        after["frozen"] = True
    synth_s = time.perf_counter() - t0
    return {"start": start, "loaded": loaded, "after": after, "end": rss_mb(),
            "peak_mb": peak_mb(), "load_s": load_s, "synth_s": synth_s}


def _run(cfg: dict) -> dict:
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(cfg), out.name]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            return {"error": proc.stderr.strip().splitlines()[-1:]}
        return json.load(open(out.name, encoding="utf-8"))


def _fmt(m: dict | None) -> str:
    return "-" if not m else f"{m['rss']:.0f} ({m['anon']:.0f}+{m['file']:.0f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--subdirs", default="openvino,openvino-int8-llm")
    ap.add_argument("--cache", default="off", help="comma list of off/on (CACHE_DIR blobs)")
    ap.add_argument("--stages-file", default=None)
    ap.add_argument("--tokens", type=int, default=250)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", dest="json_path", default=None)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        result = child(json.loads(args.child[0]))
        with open(args.child[1], "w", encoding="utf-8") as f:
            json.dump(result, f)
        return 0

    model_dir = args.model_dir
    if model_dir is None:
        from cosyvino.defaults import ensure_default_model
        model_dir = ensure_default_model()
    cache_root = tempfile.mkdtemp(prefix="ov_memory_cache_")
    impls = [("current", None)] + ([("other", os.path.abspath(args.stages_file))]
                                   if args.stages_file else [])
    rows = []
    try:
        _run_all(args, model_dir, cache_root, impls, rows)
    finally:
        shutil.rmtree(cache_root, ignore_errors=True)
    _print_table(rows)
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


def _run_all(args, model_dir: str, cache_root: str, impls: list, rows: list) -> None:
    for sub in args.subdirs.split(","):
        for cache in args.cache.split(","):
            for impl, stages_file in impls:
                cfg = {"model_dir": os.path.join(model_dir, sub), "threads": args.threads,
                       "tokens": args.tokens, "stages_file": stages_file,
                       "cache_dir": os.path.join(cache_root, impl) if cache == "on" else ""}
                if cache == "on":  # first run writes the blobs; measure the import
                    _run(dict(cfg, tokens=5))
                res = _run(cfg)
                rows.append({"subdir": sub, "cache": cache, "impl": impl, **res})
                print(f"done: {sub} cache={cache} {impl}", file=sys.stderr, flush=True)


def _print_table(rows: list) -> None:
    print("RSS in MB as total (anonymous + file-backed); 'after' a stage = max over its calls in "
          "the first utterance; end = after all utterances; peak = ru_maxrss")
    cols = ["subdir", "cache", "impl", "load s", "loaded", "peak in load", "after text_encoder",
            "after llm", "after estimator", "after vocoder", "end", "peak"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        if "error" in r:
            print(f"| {r['subdir']} | {r['cache']} | {r['impl']} | error: {r['error']} |")
            continue
        a = r["after"]
        cells = [r["subdir"], r["cache"], r["impl"], f"{r['load_s']:.1f}", _fmt(r["loaded"]),
                 f"{r['loaded']['peak']:.0f}",
                 _fmt(a.get("encode_text")), _fmt(a.get("llm")), _fmt(a.get("estimate")),
                 _fmt(a.get("vocoder_decode")), _fmt(r["end"]), f"{r['peak_mb']:.0f}"]
        print("| " + " | ".join(cells) + " |")


if __name__ == "__main__":
    sys.exit(main())
