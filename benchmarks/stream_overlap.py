"""Overlapped lanes vs one after the other: first-chunk latency, streaming RTF and underrun of
a streamed request, per thread count, measured side by side in one process.

The LLM lane (speech tokens) and the audio lane (flow + vocoder hops) of a request may run at
the same time on thread-safe stages (``Synthesizer(overlap_stages=True)``, the default); this
prints what that buys on this machine for each ``num_threads``, the columns interleaved run by
run so machine noise hits both alike.

    python benchmarks/stream_overlap.py --model-dir DIR/openvino --backend openvino \
        [--threads 1,2] [--tokens 250] [--runs 3] [--schedule latency]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from cosyvino import Synthesizer
from cosyvino.bench import STREAM_TEXTS, play_underrun


def one(tts: Synthesizer, text: str, tokens: int, schedule: str, seed: int) -> tuple:
    t0 = time.perf_counter()
    arrivals = []
    for chunk in tts.stream(text, tts.speakers[0], seed=seed, num_speech_tokens=tokens,
                            hop_schedule=schedule):
        arrivals.append((time.perf_counter() - t0, chunk.duration))
    wall = time.perf_counter() - t0
    audio = sum(d for _, d in arrivals)
    return arrivals[0][0], wall / audio, play_underrun(arrivals), audio


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--backend", default="openvino")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--tokens", type=int, default=250)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--schedule", default="latency")
    ap.add_argument("--options", default="{}",
                    help="JSON backend options for every column, e.g. the served preset's")
    ap.add_argument("--llm-threads", type=int, default=None,
                    help="also a column 'overlapped, LLM on N threads' (OpenVINO "
                         "stage_threads: the llm stage gets N, the others num_threads)")
    a = ap.parse_args(argv)
    import json

    options = json.loads(a.options)
    text = STREAM_TEXTS[0][1]
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo")
                if ln.startswith("model name")), "unknown CPU")
    print(f"{cpu}; {a.backend} {a.model_dir}; {a.tokens} tokens; schedule {a.schedule}; "
          f"{a.runs} runs per cell")
    print("| threads | lanes | first chunk p50 (s) | streaming RTF | underrun (s) | audio (s) |")
    print("|---:|---|---:|---:|---:|---:|")
    for threads in [int(t) for t in a.threads.split(",")]:
        columns = [("overlapped", True, {}), ("sequential", False, {})]
        if a.llm_threads:
            columns.append((f"overlapped, LLM {a.llm_threads} thread(s)", True,
                            {"stage_threads": {"llm": a.llm_threads}}))
        synths = {name: Synthesizer(a.model_dir, backend=a.backend, num_threads=threads,
                                    overlap_stages=overlap, **options, **extra)
                  for name, overlap, extra in columns}
        for tts in synths.values():  # warm-up (compiles shapes)
            one(tts, text, 30, a.schedule, 99)
        cells = {name: [] for name in synths}
        for run in range(a.runs):
            for name, tts in synths.items():
                cells[name].append(one(tts, text, a.tokens, a.schedule, run))
        for name, rows in cells.items():
            r = np.array(rows)
            print(f"| {threads} | {name} | {np.median(r[:, 0]):.2f} | {r[:, 1].mean():.3f} | "
                  f"{r[:, 2].mean():.2f} | {r[0, 3]:.2f} |")
        for tts in synths.values():
            tts.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
