"""Where an LLM decode step goes: OpenVINO per-node counters of the served
``llm`` IR, grouped by node type and by the part of the layer a node belongs to, beside the
step's wall time (the gap = time outside nodes: dynamic-shape bookkeeping, host round trip).

Prefills ``--prompt`` positions, decodes to ``--past`` cached positions, then times
``--steps`` further single-token steps with profiling on (the counters are the last step's;
wall times are medians over the steps). Feeds random embeddings: cost depends on shapes only.

    python benchmarks/llm_profile.py --model-dir DIR [--past 300] [--steps 20] [--threads 2]
        [--top 25] [--kv-cache-precision u8|f32 (default: as served)] [--precision f32|bf16]

``DIR``: a converted dir (``.../openvino-int8-llm``) or a model dir (its served conversion is
found as the backend finds it).
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import statistics
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from llm_ir_ab import _Side  # noqa: E402  (benchmarks/ is on the path)


#: node-name patterns -> the part of the LLM step they belong to (first match wins)
PARTS = (
    ("positional", re.compile(r"pos_|Sin|Cos|stack|aten::slice|aten::pad", re.I)),
    ("q/k/v/out projections", re.compile(r"linear_(qkv|q|k|v|out)\b", re.I)),
    ("attention", re.compile(r"ScaledDotProduct|sdpa|attn|softmax|SDPA", re.I)),
    ("feed-forward", re.compile(r"feed_forward|w_1|w_2", re.I)),
    ("norms", re.compile(r"norm", re.I)),
    ("decoder head", re.compile(r"llm_decoder|log_softmax|LogSoftmax", re.I)),
)


def part_of(name: str, node_type: str) -> str:
    for part, pat in PARTS:
        if pat.search(name) or pat.search(node_type):
            return part
    return "other"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True,
                    help="a converted dir (e.g. MODEL/openvino-int8) or a model dir (its served "
                         "OpenVINO conversion is used)")
    ap.add_argument("--past", type=int, default=300,
                    help="cached positions before the profiled steps (default 300)")
    ap.add_argument("--prompt", type=int, default=60,
                    help="positions of the first (prefill) call (default 60)")
    ap.add_argument("--steps", type=int, default=20,
                    help="profiled decode steps; wall times are their medians (default 20)")
    ap.add_argument("--threads", type=int, default=2,
                    help="INFERENCE_NUM_THREADS (default 2)")
    ap.add_argument("--top", type=int, default=25, help="slowest nodes listed (default 25)")
    ap.add_argument("--precision", default="f32",
                    help="INFERENCE_PRECISION_HINT (the planner serves the LLM in f32; the "
                         "plugin's own default is bf16 on AVX512_BF16/AMX CPUs)")
    ap.add_argument("--kv-cache-precision", default=None,
                    help="KV_CACHE_PRECISION (default: u8 for a quantized dir, f32 otherwise, "
                         "as the planner serves them on CPUs with AVX-512 VNNI/BF16)")
    args = ap.parse_args(argv)

    import openvino as ov

    from cosyvino.bench_extras import cpu_summary
    from cosyvino.converted import find_converted_dir, read_manifest

    conv_dir, _ = find_converted_dir(args.model_dir, runtime="openvino")
    if args.kv_cache_precision is None:
        quantized = "quantization" in read_manifest(conv_dir, "openvino")
        args.kv_cache_precision = "u8" if quantized else "f32"
    core = ov.Core()
    d = core.read_model(os.path.join(conv_dir, "llm.xml")).input(
        "inputs_embeds").get_partial_shape()[2].get_length()
    # the served feed (positional tables + offset as inputs), as llm_ir_ab.py feeds it
    side = _Side(core, conv_dir, {
        "PERF_COUNT": True, "INFERENCE_NUM_THREADS": args.threads, "NUM_STREAMS": 1,
        "PERFORMANCE_HINT": "LATENCY", "DYNAMIC_QUANTIZATION_GROUP_SIZE": 128,
        "KV_CACHE_PRECISION": args.kv_cache_precision,
        "INFERENCE_PRECISION_HINT": args.precision})
    req = side.req
    rng = np.random.default_rng(0)

    def step(n_new: int) -> float:
        x = rng.standard_normal((1, n_new, d), dtype=np.float32) * 0.1
        return side.step(x)[0]

    def node_ms(infos) -> float:
        return sum(p.real_time.total_seconds() for p in infos
                   if p.status == p.Status.EXECUTED) * 1e3

    step(args.prompt)
    while side.length < args.past:
        step(1)
    # each step's wall beside that same step's node counters (the counters describe the last
    # inference only), so the time outside nodes is a per-step difference, medians over steps
    walls, nodes, outside = [], [], []
    for _ in range(args.steps):
        w = step(1) * 1e3
        infos = req.get_profiling_info()
        n = node_ms(infos)
        walls.append(w)
        nodes.append(n)
        outside.append(w - n)
    wall_ms = statistics.median(walls)

    by_type: dict[str, float] = collections.Counter()
    by_part: dict[str, float] = collections.Counter()
    by_node = []
    isa: dict[str, float] = collections.Counter()
    for p in infos:
        if p.status != p.Status.EXECUTED:
            continue
        us = p.real_time.total_seconds() * 1e6
        by_type[p.node_type] += us
        by_part[part_of(p.node_name, p.node_type)] += us
        by_node.append((us, p.node_name, p.node_type, p.exec_type))
        isa[p.exec_type.split("_")[0] if p.exec_type else "?"] += us
    total_ms = sum(by_type.values()) / 1e3

    print(f"# CPU: {cpu_summary()}, {args.threads} threads, {args.precision} activations, "
          f"KV cache {args.kv_cache_precision}, dynamic quantization group 128")
    print(f"# LLM IR: {conv_dir}; cached positions before the last step {side.length - 1}")
    gap = statistics.median(outside)
    print(f"medians of {args.steps} steps: step wall {wall_ms:.2f} ms; sum of node times "
          f"{statistics.median(nodes):.2f} ms; "
          + (f"outside nodes {gap:.2f} ms" if gap >= 0 else
             "outside nodes not measurable here (the node counters add up to more than the "
             "wall: they overlap or include their own overhead, e.g. on a busy machine)")
          + f" (tables below: the last step, {total_ms:.2f} ms of nodes)")
    print("\n| part | ms | share of nodes |\n|---|---:|---:|")
    for part, us in sorted(by_part.items(), key=lambda kv: -kv[1]):
        print(f"| {part} | {us / 1e3:.2f} | {us / 1e3 / total_ms:.0%} |")
    print("\n| node type | ms | share |\n|---|---:|---:|")
    for t, us in sorted(by_type.items(), key=lambda kv: -kv[1]):
        if us / 1e3 / total_ms >= 0.005:
            print(f"| {t} | {us / 1e3:.2f} | {us / 1e3 / total_ms:.1%} |")
    print(f"\n| top {args.top} nodes | type | exec | us |\n|---|---|---|---:|")
    for us, name, t, ex in sorted(by_node, reverse=True)[:args.top]:
        print(f"| {name[:70]} | {t} | {ex} | {us:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
