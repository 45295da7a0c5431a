"""Same-run A/B of two converted dirs' ``llm`` IRs (issue 16): both compiled in one process,
one prefill each, then single-token decode steps interleaved with the order alternating every
step, so a noisy machine slows both alike. Prints the prefill time, the median/mean ms per step
after ``--warmup`` and the largest logp difference between the two over all steps.

An IR without ``pos_offset`` / ``pos_keys`` inputs (converted before 2026-12-02) is fed the old
way, so an old dir can be the A side; the positional tables of a new-layout IR come from its
own dir's ``llm_tables.npz``.

    python benchmarks/llm_ir_ab.py A_DIR B_DIR [--steps 250] [--prefill 60] [--threads 2]
        [--kv-cache-precision f32|u8] [--dynamic-quantization 128,0]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np


class _Side:
    def __init__(self, core, conv_dir: str, props: dict):
        from cosyvino.export.openvino.model_patcher import POS_BUCKET
        from cosyvino.families.cosyvoice1.positional import PositionalKeys

        compiled = core.compile_model(core.read_model(os.path.join(conv_dir, "llm.xml")),
                                      "CPU", props)
        self.req = compiled.create_infer_request()
        names = {n for p in compiled.inputs for n in p.get_names()}
        self.pos = None
        if "pos_offset" in names:
            weights = np.load(os.path.join(conv_dir, "llm_tables.npz"))["pos_weight"]
            heads = compiled.input("pos_keys.0").get_partial_shape()[0].get_length()
            self.pos = PositionalKeys(weights, heads, POS_BUCKET)
        self.length = 0
        self.times: list[float] = []

    def step(self, x: np.ndarray) -> tuple[float, np.ndarray]:
        n = x.shape[1]
        feed = {"inputs_embeds": x, "attention_mask": np.ones((1, self.length + n), np.float32),
                "beam_idx": np.zeros(1, np.int32)}
        if self.pos is not None:
            offset, tables = self.pos.rows(self.length, n)
            feed["pos_offset"] = offset
            feed.update({f"pos_keys.{i}": t for i, t in enumerate(tables)})
        t0 = time.perf_counter()
        self.req.infer(feed, share_inputs=True)
        dt = time.perf_counter() - t0
        self.length += n
        return dt, self.req.get_tensor("logp").data[0].copy()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a_dir")
    ap.add_argument("b_dir")
    ap.add_argument("--steps", type=int, default=250)
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--prefill", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kv-cache-precision", default="f32",
                    help="KV_CACHE_PRECISION (the planner serves u8 for a quantized dir on "
                         "CPUs with AVX-512 VNNI/BF16, f32 otherwise)")
    ap.add_argument("--dynamic-quantization", default="128,128", metavar="A,B",
                    help="DYNAMIC_QUANTIZATION_GROUP_SIZE of side A and side B (0 = off): the "
                         "same INT8 IR twice with 128,0 measures the OpenVINO backend option "
                         "llm_dynamic_quantization=0")
    args = ap.parse_args(argv)
    dq = [int(g) for g in args.dynamic_quantization.split(",")]
    if len(dq) != 2:
        ap.error("--dynamic-quantization takes two group sizes, A,B")

    import openvino as ov

    from cosyvino.bench_extras import cpu_summary

    props = {"INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1,
             "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
             "KV_CACHE_PRECISION": args.kv_cache_precision}
    core = ov.Core()
    sides = {k: _Side(core, d, dict(props, DYNAMIC_QUANTIZATION_GROUP_SIZE=g))
             for k, d, g in (("A", args.a_dir, dq[0]), ("B", args.b_dir, dq[1]))}
    rng = np.random.default_rng(0)
    width = core.read_model(os.path.join(args.a_dir, "llm.xml")).input(
        "inputs_embeds").get_partial_shape()[2].get_length()
    x0 = rng.standard_normal((1, args.prefill, width)).astype(np.float32) * 0.1
    pre = {k: s.step(x0) for k, s in sides.items()}
    max_diff = float(np.abs(pre["A"][1] - pre["B"][1]).max())
    for i in range(args.warmup + args.steps):
        x = rng.standard_normal((1, 1, width)).astype(np.float32) * 0.1
        out = {}
        for k in (("A", "B") if i % 2 == 0 else ("B", "A")):
            dt, out[k] = sides[k].step(x)
            if i >= args.warmup:
                sides[k].times.append(dt)
        max_diff = max(max_diff, float(np.abs(out["A"] - out["B"]).max()))
    print(f"# CPU: {cpu_summary()}, {args.threads} threads, KV cache "
          f"{args.kv_cache_precision}; OpenVINO {ov.get_version()}")
    print(f"# A = {args.a_dir} (dynamic quantization {dq[0]})\n"
          f"# B = {args.b_dir} (dynamic quantization {dq[1]})")
    print(f"# prefill {args.prefill}, {args.steps} decode steps after {args.warmup} warm-up, "
          f"final cache {sides['A'].length} positions")
    print("\n| IR | prefill ms | decode ms/step median | mean |\n|---|---:|---:|---:|")
    for k, s in sides.items():
        print(f"| {k} | {pre[k][0] * 1e3:.1f} | {statistics.median(s.times) * 1e3:.2f} | "
              f"{statistics.mean(s.times) * 1e3:.2f} |")
    ratio = statistics.median(sides["B"].times) / statistics.median(sides["A"].times)
    print(f"\nmax |logp A - logp B| over all steps: {max_diff:.2e}")
    print(f"B / A decode median: {ratio:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
