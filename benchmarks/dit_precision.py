"""CosyVoice3 DiT estimator on OpenVINO: f32 against bf16 compute (INFERENCE_PRECISION_HINT)
per call, with a NaN guard and the error against the torch float32 module (issue 37 item 3).

The DiT is the compute-bound part of v3 (sheet v3 §8: ~383 GFLOP per audio second at 10 ODE
steps). This script exports only the ``estimator`` row of the v3 graph table from a model dir's
``flow.pt`` (the same exporter ``cosyvino convert`` uses, nothing else of the dir is loaded),
compiles it once per precision with the same threads, and per frame count times the calls
interleaved (f32, bf16, f32, ...; median), counts non-finite outputs and reports the max abs
and relative-RMS error of each precision against torch float32 on the same inputs (the noise
``x``, ``mu`` from the flow encoder of random tokens, a speaker row, ``t`` at 0.05 / 0.5 /
0.95; full attention, and the streaming chunk of 50 frames). GFLOP per call is counted by
``torch.utils.flop_counter`` on the meta device; G ops/s are set against this CPU's fp32 FMA
peak (bf16: twice it where the CPU has AVX-512 BF16 or AMX-BF16 dot products).

    python benchmarks/dit_precision.py --model-dir /tmp/v3-0.5b [--threads 2] [--frames 56,250,500]

Prints a markdown table with the CPU and the load average. Random-weight checkpoints give the
speed of the real shapes; errors on random weights bound, not equal, a trained model's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def dit_gflop(flow_cfg, frames: int) -> float:
    """One estimator call (batch 2, ``frames``) in GFLOP, counted on the meta device."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from cosyvino.families.cosyvoice3.torch.flow_loading import build_flow
    from cosyvino.families.cosyvoice3.torch.graphs import EstimatorGraph

    module = EstimatorGraph(build_flow(flow_cfg, "meta").decoder.estimator)
    c = flow_cfg.output_size
    with torch.device("meta"):
        args = (torch.zeros(2, c, frames), torch.ones(2, 1, frames), torch.zeros(2, c, frames),
                torch.zeros(2), torch.zeros(2, c), torch.zeros(2, c, frames),
                torch.tensor([1 << 20]))
        with FlopCounterMode(display=False) as counter:
            module(*args)
    return counter.get_total_flops() / 1e9


def make_inputs(flow, frames: int, t: float, rng) -> list[np.ndarray]:
    """Estimator inputs of a no-prompt call: noise ``x``, ``mu`` of random tokens through the
    flow encoder, the projected speaker of a spk2info-scale embedding, zero ``cond``."""
    import torch

    from cosyvino.families.cosyvoice3.torch.graphs import FlowEncoderGraph

    tokens = torch.from_numpy(rng.integers(0, 6561, (1, frames // 2)))
    emb = torch.from_numpy(10 * rng.standard_normal((1, 192)).astype(np.float32))
    with torch.no_grad():
        mu, spks = FlowEncoderGraph(flow)(tokens, torch.zeros(1, 3, dtype=torch.int64),
                                          torch.zeros(1), emb)
    mu = mu.numpy()[..., :frames]
    c = mu.shape[1]
    x = rng.standard_normal((2, c, frames)).astype(np.float32)
    return [x, np.ones((2, 1, frames), np.float32), np.concatenate([mu, np.zeros_like(mu)]),
            np.full((2,), t, np.float32), np.concatenate([spks.numpy(), np.zeros_like(spks)]),
            np.zeros((2, c, frames), np.float32)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True,
                    help="a CosyVoice3 dir (cosyvoice3.yaml, flow.pt)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--frames", default="56,250,500", help="mel frames per call (comma list)")
    ap.add_argument("--calls", type=int, default=5, help="timed calls per precision and size")
    ap.add_argument("--precisions", default="f32,bf16")
    args = ap.parse_args(argv)

    import openvino as ov
    import torch

    from cosyvino.bench_extras import cpu_summary, cpuinfo_field, fma_peak_gflops
    from cosyvino.cpu_peaks import cpu_clock_mhz
    from cosyvino.export.openvino.convert import convert_graph
    from cosyvino.families.cosyvoice3.graphs import FULL_ATTENTION, graph_table
    from cosyvino.families.cosyvoice3.model_config import read_model_config
    from cosyvino.families.cosyvoice3.torch.flow_loading import load_flow
    from cosyvino.families.cosyvoice3.torch.graphs import EstimatorGraph

    torch.set_num_threads(args.threads)
    config = read_model_config(args.model_dir)
    spec = graph_table(config)["estimator"]
    flow = load_flow(args.model_dir)
    module = EstimatorGraph(flow.decoder.estimator).eval()
    t0 = time.perf_counter()
    ir = convert_graph(None, spec, module)
    tmp = tempfile.mkdtemp(prefix="dit-precision-")
    path = os.path.join(tmp, "estimator.xml")
    ov.save_model(ir, path, compress_to_fp16=False)
    del ir
    export_s = time.perf_counter() - t0
    core = ov.Core()
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    compiled = {}
    for prec in precisions:
        compiled[prec] = core.compile_model(path, "CPU", {
            "INFERENCE_PRECISION_HINT": prec, "INFERENCE_NUM_THREADS": args.threads,
            "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1})
    flags = set((cpuinfo_field("flags") or "").split())
    vendor = cpuinfo_field("vendor_id") or ""
    mhz = cpu_clock_mhz()
    fp32_peak, peak_desc = fma_peak_gflops(flags, vendor, mhz, args.threads)
    bf16_dot = bool({"avx512_bf16", "amx_bf16"} & flags)
    rng = np.random.default_rng(0)
    print(f"CPU: {cpu_summary()}")
    print(f"threads {args.threads}; load average {os.getloadavg()}; openvino {ov.get_version()}; "
          f"estimator export {export_s:.0f} s; fp32 peak {peak_desc}; bf16 dot products: "
          f"{'yes' if bf16_dot else 'no'}")
    print()
    print("| frames | attention | GFLOP/call | precision | ms/call (median) | G ops/s | % of peak "
          "| non-finite | max abs err | rel RMS err |")
    print("|---:|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for frames in (int(f) for f in args.frames.split(",")):
        gflop = dit_gflop(config.flow, frames)
        for attention, chunk in (("full", FULL_ATTENTION), ("chunk 50", 50)):
            chunk_in = np.array([chunk], np.int64)
            cases = [make_inputs(flow, frames, t, rng) + [chunk_in] for t in (0.05, 0.5, 0.95)]
            with torch.no_grad():
                ref = [module(*(torch.from_numpy(a) for a in c)).numpy() for c in cases]
            err = {p: [0, 0.0, []] for p in precisions}  # non-finite, max abs, rel rms
            for p in precisions:
                req = compiled[p].create_infer_request()
                for c, r in zip(cases, ref):
                    out = req.infer(dict(zip((t.name for t in spec.inputs), c)))[0]
                    bad = ~np.isfinite(out)
                    err[p][0] += int(bad.sum())
                    good = out[~bad].astype(np.float64)
                    d = good - r[~bad]
                    err[p][1] = max(err[p][1], float(np.max(np.abs(d))) if d.size else np.inf)
                    power = np.mean(r.astype(np.float64) ** 2)
                    err[p][2].append(float(np.sqrt(np.mean(d ** 2) / power)))
            times = {p: [] for p in precisions}
            feed = dict(zip((t.name for t in spec.inputs), cases[1]))
            reqs = {p: compiled[p].create_infer_request() for p in precisions}
            for p in precisions:
                reqs[p].infer(feed)  # warm-up
            for _ in range(args.calls):
                for p in precisions:
                    s = time.perf_counter()
                    reqs[p].infer(feed)
                    times[p].append(time.perf_counter() - s)
            for p in precisions:
                ms = 1000 * statistics.median(times[p])
                gops = gflop / (ms / 1000)
                peak = fp32_peak * (2 if p == "bf16" and bf16_dot else 1) if fp32_peak else None
                pct = f"{100 * gops / peak:.0f} %" if peak else "n/a"
                nonfinite, maxabs, rel = err[p]
                print(f"| {frames} | {attention} | {gflop:.1f} | {p} | {ms:.0f} | {gops:.0f} | "
                      f"{pct} | {nonfinite} | {maxabs:.2e} | {max(rel):.2e} |")
    print()
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
