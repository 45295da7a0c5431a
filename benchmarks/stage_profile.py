"""Where a flow/vocoder stage call goes (issue 16 item 2): OpenVINO per-node counters of one
graph of a converted dir, run on the graph table's example inputs at the sizes you give,
grouped by node type (with the kernel's ISA/implementation) and the top nodes, beside the
call's wall time; the achieved GFLOP/s of the convolutions and MatMuls is computed from their
shapes (2 x MACs).

    python benchmarks/stage_profile.py --model-dir DIR --graph estimator --size frames=431
        [--precision f32|bf16] [--threads 2] [--runs 5] [--top 15]

``DIR``: a converted dir or a model dir (its served conversion is found as the backend does).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import sys
import time

import numpy as np


def _macs(op) -> int:
    """Multiply-adds of a Convolution / GroupConvolution / MatMul node from its static output
    and weight shapes (0 when a shape is dynamic or the op is something else)."""
    kind = op.get_type_name()
    try:
        out = [int(d) for d in op.get_output_shape(0)]
        if kind in ("Convolution", "GroupConvolution"):
            w = [int(d) for d in op.get_input_shape(1)]
            per_out = int(np.prod(w[2:])) * (w[1] if kind == "Convolution" else w[2])
            return int(np.prod(out)) * per_out
        if kind == "MatMul":
            a = [int(d) for d in op.get_input_shape(0)]
            k = a[-2] if op.get_transpose_a() else a[-1]
            return int(np.prod(out)) * k
    except (RuntimeError, ValueError, AttributeError, IndexError):
        return 0
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--graph", default="estimator")
    ap.add_argument("--size", action="append", default=[],
                    help="NAME=VALUE for a dynamic dim of the graph (e.g. frames=431)")
    ap.add_argument("--precision", default="f32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)

    import openvino as ov

    from cosyvino.bench_extras import cpu_summary
    from cosyvino.converted import find_converted_dir
    from cosyvino.families.cosyvoice1.graphs import graph_table
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    conv_dir, _ = find_converted_dir(args.model_dir, runtime="openvino")
    spec = graph_table(read_model_config(os.path.join(conv_dir, "cosyvoice.yaml")))[args.graph]
    sizes = dict(spec.example_sizes)
    for item in args.size:
        name, _, value = item.partition("=")
        sizes[name] = int(value)
    spec = dataclasses.replace(spec, example_sizes=sizes)
    inputs = spec.example_inputs()
    core = ov.Core()
    model = core.read_model(os.path.join(conv_dir, spec.stem + ".xml"))
    model.reshape({model.input(t.name): ov.PartialShape(list(a.shape))
                   for t, a in zip(spec.inputs, inputs)})
    macs = sum(_macs(op) for op in model.get_ordered_ops())
    compiled = core.compile_model(model, "CPU", {
        "PERF_COUNT": True, "INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": args.precision})
    req = compiled.create_infer_request()
    req.infer(inputs)  # warm-up (lazy repacking)
    walls = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        req.infer(inputs)
        walls.append(time.perf_counter() - t0)
    wall = statistics.median(walls)

    by_type: dict[tuple[str, str], float] = collections.Counter()
    nodes = []
    for p in req.get_profiling_info():
        if p.status != p.Status.EXECUTED:
            continue
        us = p.real_time.total_seconds() * 1e6
        by_type[(p.node_type, p.exec_type)] += us
        nodes.append((us, p.node_name, p.node_type, p.exec_type))
    total = sum(by_type.values())
    print(f"# CPU: {cpu_summary()}, {args.threads} threads, {args.precision}; "
          f"OpenVINO {ov.get_version()}")
    print(f"# {conv_dir}/{spec.stem}.xml at {sizes}")
    print(f"call wall (median of {args.runs}): {wall * 1e3:.1f} ms; sum of node times "
          f"{total / 1e3:.1f} ms (last call); conv + MatMul work {2 * macs / 1e9:.1f} GFLOP "
          f"-> {2 * macs / wall / 1e9:.0f} GFLOP/s over the wall time")
    print("\n| node type | kernel | ms | share |\n|---|---|---:|---:|")
    for (t, ex), us in sorted(by_type.items(), key=lambda kv: -kv[1]):
        if us / total >= 0.005:
            print(f"| {t} | {ex} | {us / 1e3:.1f} | {us / total:.1%} |")
    print(f"\n| top {args.top} nodes | type | kernel | ms |\n|---|---|---|---:|")
    for us, name, t, ex in sorted(nodes, reverse=True)[:args.top]:
        print(f"| {name[:70]} | {t} | {ex} | {us / 1e3:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
