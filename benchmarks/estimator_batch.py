"""Does batching the CFM estimator across requests pay? (issue 17 item 2: "measure first").

One estimator call is batch 2 (the conditional and the unconditional row of classifier-free
guidance). Two concurrent requests with hops of equal length could share one call of batch 4.
This script reshapes the served estimator IR (``estimator.xml`` of an OpenVINO dir) to batch 4
(all other dims as they were), compiles both with the same threads, and times, interleaved
call by call, two batch-2 calls (the two requests alone) against one batch-4 call at several
frame counts; it also checks that the batch-4 rows equal the batch-2 calls (equal lengths, so
no padded frame reaches the GroupNorm statistics). Prints a markdown table with the CPU named;
the last line is the mean time ratio (batch 4) / (2 x batch 2): below ~0.9 batching pays.

``--dynamic`` adds what serving would load: the IR with its batch dim made dynamic (one
compiled model for any number of requests), timed at batch 2 against the static IR and at batch
4; and the alternative the server runs today with two sessions: the two batch-2 calls at the
same time from two threads (each with ``--threads`` threads, so the cores are oversubscribed).

    python benchmarks/estimator_batch.py --dir /work/models/full/openvino-int8 [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np


def cpu_line() -> str:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cosyvino.bench_extras import cpu_summary

    return cpu_summary()


def inputs(batch: int, frames: int, rng) -> dict:
    c = 80
    return {"x": rng.standard_normal((batch, c, frames), dtype=np.float32),
            "mask": np.ones((batch, 1, frames), np.float32),
            "mu": rng.standard_normal((batch, c, frames), dtype=np.float32),
            "t": np.full((batch,), 0.3, np.float32),
            "spks": rng.standard_normal((batch, c), dtype=np.float32),
            "cond": np.zeros((batch, c, frames), np.float32)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dir", required=True, help="OpenVINO dir with estimator.xml")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", default="36,110,431", help="mel frames per call (comma list)")
    ap.add_argument("--calls", type=int, default=6)
    ap.add_argument("--dynamic", action="store_true",
                    help="also time a dynamic-batch compile and two concurrent batch-2 calls")
    args = ap.parse_args(argv)
    import openvino as ov

    core = ov.Core()
    cfg = {"INFERENCE_NUM_THREADS": args.threads, "PERFORMANCE_HINT": "LATENCY",
           "NUM_STREAMS": 1, "INFERENCE_PRECISION_HINT": "f32"}
    path = os.path.join(args.dir, "estimator.xml")
    b2 = core.compile_model(core.read_model(path), "CPU", cfg)
    m4 = core.read_model(path)
    m4.reshape({i.get_any_name(): ov.PartialShape([4] + list(i.get_partial_shape())[1:])
                for i in m4.inputs})
    b4 = core.compile_model(m4, "CPU", cfg)
    r2, r4 = b2.create_infer_request(), b4.create_infer_request()
    if args.dynamic:
        md = core.read_model(path)
        md.reshape({i.get_any_name(): ov.PartialShape([-1] + list(i.get_partial_shape())[1:])
                    for i in md.inputs})
        bd = core.compile_model(md, "CPU", cfg)
        rd = bd.create_infer_request()
        r2b = b2.create_infer_request()
    rng = np.random.default_rng(0)
    rows, dyn = [], []
    for frames in (int(f) for f in args.frames.split(",")):
        a, b = inputs(2, frames, rng), inputs(2, frames, rng)
        both = {k: np.concatenate([a[k], b[k]]) for k in a}
        ref = np.concatenate([r2.infer(a)[0].copy(), r2.infer(b)[0].copy()])
        got = r4.infer(both)[0].copy()
        err = float(np.max(np.abs(got - ref)))
        t2, t4 = [], []
        for _ in range(args.calls):
            s = time.perf_counter()
            r2.infer(a)
            r2.infer(b)
            t2.append((time.perf_counter() - s) * 1e3)
            s = time.perf_counter()
            r4.infer(both)
            t4.append((time.perf_counter() - s) * 1e3)
        m2, m4_ = statistics.median(t2), statistics.median(t4)
        rows.append((frames, m2, m4_, m4_ / m2, err))
        if args.dynamic:
            dyn.append((frames,) + _dynamic(r2, r2b, rd, a, b, both, ref, args.calls))
    print(f"CPU: {cpu_line()}; {args.threads} threads; {path}")
    print()
    print("| frames | 2 requests alone: 2 x batch-2 calls (ms) | together: 1 batch-4 call (ms) "
          "| batch 4 / (2 x batch 2) | max abs diff of the rows |")
    print("|---:|---:|---:|---:|---:|")
    for f, m2, m4_, r, e in rows:
        print(f"| {f} | {m2:.1f} | {m4_:.1f} | {r:.3f} | {e:.1e} |")
    if dyn:
        print()
        print("| frames | static batch 2 (ms) | dynamic-batch IR at batch 2 (ms) "
              "| dynamic at batch 4 (ms) | 2 concurrent batch-2 calls, 2 threads (ms) "
              "| dynamic batch 4 / concurrent | max abs diff dynamic 4 vs static 2 |")
        print("|---:|---:|---:|---:|---:|---:|---:|")
        for f, s2, d2, d4, cc, e in dyn:
            print(f"| {f} | {s2:.1f} | {d2:.1f} | {d4:.1f} | {cc:.1f} | {d4 / cc:.3f} "
                  f"| {e:.1e} |")
    print()
    print(f"mean ratio batch 4 / (2 x batch 2): {statistics.mean(r for *_, r, _ in rows):.3f}")
    return 0


def _dynamic(r2, r2b, rd, a, b, both, ref, calls) -> tuple:
    """Medians (ms) of: static batch 2, dynamic IR at batch 2, dynamic at batch 4, two
    concurrent static batch-2 calls; and the max abs difference of the dynamic batch-4 rows."""
    import threading

    got = rd.infer(both)[0].copy()
    err = float(np.max(np.abs(got - ref)))
    s2, d2, d4, cc = [], [], [], []

    def timed(fn, out):
        s = time.perf_counter()
        fn()
        out.append((time.perf_counter() - s) * 1e3)

    for _ in range(calls):
        timed(lambda: r2.infer(a), s2)
        timed(lambda: rd.infer(a), d2)
        timed(lambda: rd.infer(both), d4)

        def concurrent():
            t = threading.Thread(target=r2b.infer, args=(b,))
            t.start()
            r2.infer(a)
            t.join()
        timed(concurrent, cc)
    med = statistics.median
    return med(s2), med(d2), med(d4), med(cc), err


if __name__ == "__main__":
    sys.exit(main())
