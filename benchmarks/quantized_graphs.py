"""Side-by-side speed of quantized converted dirs against their fp32 source, per graph role:
the LLM decode step (ms/token: one prefix, then forced decode rows of the ``speech_embedding``
graph) and the flow estimator (ms per batch-2 call at a fixed length), rounds interleaved so
the machine's load hits every dir alike. Any family whose stages run on the OpenVINO graph
runner (CosyVoice2). Prints a markdown table; numbers go to docs/performance.md with the CPU
and the load named.

    python benchmarks/quantized_graphs.py D/openvino D/openvino-int8 D/openvino-int4-llm \\
        --tokens 64 --frames 200 --rounds 3 --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np


def _load(conv_dir: str, threads: int):
    from cosyvino.plugins import get_backend

    return get_backend("openvino").load(conv_dir, num_threads=threads, precision="f32",
                                        kv_cache_precision="f32", cache_dir="")


def llm_ms_per_token(stages, tokens: int, prefix: int = 32) -> float:
    """Mean ms of one decode step after a ``prefix``-row prefill (rows of the text embedding
    of ids 0..prefix-1), ``tokens`` steps of forced token 1."""
    run = stages.runner
    table = run.table
    llm, = table.with_role("llm")
    text, = table.with_role("text_encoder")
    embed, = table.with_role("speech_embedding")
    rows = run.run(text, [np.arange(prefix, dtype=np.int64)[None, :]])[0]
    step = run.run(embed, [np.array([[1]], np.int64)])[0]
    session = run.new_session(llm)
    try:
        session.run([rows])
        session.run([step])  # the plugin repacks some weights at the first 1-row step
        t0 = time.perf_counter()
        for _ in range(tokens):
            session.run([step])
        return (time.perf_counter() - t0) / tokens * 1e3
    finally:
        session.close()


def estimator_ms(stages, frames: int, calls: int = 3) -> float:
    """Mean ms of one batch-2 estimator call of ``frames`` mel frames, full attention."""
    est, = stages.runner.table.with_role("estimator")
    spec = stages.runner.table[est]
    sizes = dict(spec.example_sizes, frames=frames)
    rng = np.random.default_rng(0)
    inputs = [t.example(sizes, rng) for t in spec.inputs]
    names = [t.name for t in spec.inputs]
    inputs[names.index("mask")][:] = 1.0
    inputs[names.index("t")][:] = 0.5
    if "chunk" in names:
        from cosyvino.families.cosyvoice23.graph_specs import FULL_ATTENTION

        inputs[names.index("chunk")][:] = FULL_ATTENTION
    stages.runner.run(est, inputs)  # warm-up
    t0 = time.perf_counter()
    for _ in range(calls):
        stages.runner.run(est, inputs)
    return (time.perf_counter() - t0) / calls * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", help="converted dirs; the first is the baseline")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    args = ap.parse_args()
    stages = {d: _load(d, args.threads) for d in args.dirs}
    llm = {d: [] for d in args.dirs}
    est = {d: [] for d in args.dirs}
    for _ in range(args.rounds):
        for d, st in stages.items():
            llm[d].append(llm_ms_per_token(st, args.tokens))
            est[d].append(estimator_ms(st, args.frames))
    base = args.dirs[0]
    print(f"load: {os.getloadavg()[0]:.2f}; threads {args.threads}; {args.tokens} decode "
          f"steps, estimator {args.frames} frames; medians of {args.rounds} interleaved rounds")
    print("| dir | LLM ms/token | vs fp32 | estimator ms/call | vs fp32 |")
    print("|---|---:|---:|---:|---:|")
    for d in args.dirs:
        lm, em = statistics.median(llm[d]), statistics.median(est[d])
        lb, eb = statistics.median(llm[base]), statistics.median(est[base])
        print(f"| {os.path.basename(d)} | {lm:.2f} | {lb / lm:.2f}x | {em:.1f} | "
              f"{eb / em:.2f}x |")


if __name__ == "__main__":
    main()
