"""Step cost of batched LLM decode on OpenVINO (issue 17): ms per decode step for B rows at
once (B = 1, 2, 4, 8) vs the same rows stepped one session at a time, with ~300 cached
positions per row, and the bytes a step moves.

The LLM is the full-size 300M architecture with random weights, built in memory from a config
(default ``/work/models/full/cosyvoice.yaml``; any v1 ``cosyvoice.yaml`` works) and exported
as the stateful IR ``cosyvino convert`` writes (:func:`cosyvino.export.openvino.convert.
convert_llm`); ``--int8`` adds the same LLM weight-compressed with NNCF ``INT8_ASYM`` (what
``cosyvino quantize`` does to the ``llm`` IR). Rows are the real serving classes
(:class:`cosyvino_openvino.stages.OpenVINOLLMSession` / ``OpenVINOLLMBatch``): each row
prefills its own session (lengths ``prefix - 7 b``, all different, so the batch is
left-padded) and joins the batch; the same rows in B sessions stepped in turn are the unbatched
reference. All batch sizes and their loops are stepped round-robin (one step each per round, so
a busy neighbour slows them alike); medians of ``--steps`` rounds after ``--warmup``. Needs
torch, openvino (and nncf for ``--int8``).

Bytes per step: weights = the IR's constant bytes (each read once per call, whatever B);
cache read = every row's K and V over the padded length, all layers (what attention reads);
cache copied = what a step writes besides the new positions: 0 when the CPU plugin fused the
state into its KV-cache SDPA (it appends in place; checked in the compiled model), else the
whole cache (a Concat per layer). A join copies every cache once (read + write back), reported
per join. Prints a markdown table with the CPU named; the last line is the 4-row / 1-row step
cost ratio (issue target <= 1.5).

    python benchmarks/llm_batch.py [--config DIR/cosyvoice.yaml] [--threads 2] [--int8]
        [--kv-cache-precision f32|u8] [--dynamic-quantization 128|0] [--ir-dir DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np


def cpu_line() -> str:
    name, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name") and name == "unknown CPU":
                    name = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "amx_bf16",
                       "amx_int8", "avx_vnni") if f in flags]
    return f"{name} ({os.cpu_count()} logical CPUs; {' '.join(isa) or 'no AVX2'})"


def build_ir(config: str, seed: int):
    import torch

    from cosyvino.export.openvino.convert import convert_llm
    from cosyvino.families.cosyvoice1.torch.loading import TorchModel, build_modules
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    cfg = read_model_config(config)
    torch.manual_seed(seed)
    llm, flow, hift = build_modules(cfg)
    llm.eval().requires_grad_(False)
    model = TorchModel(os.path.dirname(os.path.abspath(config)), cfg, llm, flow, hift, {})
    from cosyvino.families.cosyvoice1.serving_files import llm_tables

    # with the positional projections the sessions' pos_keys inputs are made from
    return cfg, convert_llm(model), llm_tables(model)["pos_weight"]


def weight_bytes(model) -> int:
    return sum(int(op.get_byte_size()) for op in model.get_ops()
               if op.get_type_name() == "Constant")


def fused_kv_cache(compiled) -> bool:
    """The CPU plugin keeps the state inside its SDPA nodes (stateful SDPA: the cache
    ``MemoryInput`` feeds the attention directly, no ``Concat``; it appends in place)."""

    def kind(node) -> str:
        return node.get_rt_info()["layerType"].astype(str)

    sdpa = [op for op in compiled.get_runtime_model().get_ops()
            if kind(op) == "ScaledDotProductAttention"]
    return bool(sdpa) and all(
        any(kind(op.input_value(i).get_node()) == "MemoryInput"
            for i in range(op.get_input_size())) for op in sdpa)


def measure(compiled, cfg, pos_weight, batches, prefix: int, steps: int, warmup: int, rng
            ) -> list[dict]:
    """Every batch size (and its B-sessions loop) stepped round-robin, one step each per
    round, so a busy neighbour slows all of them alike (step-interleaved A/B); medians over
    ``steps`` rounds after ``warmup``."""
    from cosyvino.export.openvino.model_patcher import POS_BUCKET
    from cosyvino.families.cosyvoice1.positional import PositionalKeys
    from cosyvino_openvino.stages import OpenVINOLLMBatch, OpenVINOLLMSession

    d = cfg.llm.llm_input_size
    lcfg = cfg.llm.llm
    layers, heads = lcfg.num_blocks, lcfg.attention_heads
    dk = lcfg.output_size // heads
    pos = PositionalKeys(pos_weight, heads, POS_BUCKET)

    def prefilled(b):
        out = []
        for i in range(b):
            s = OpenVINOLLMSession(compiled, pos)
            s.forward(rng.standard_normal((1, prefix - 7 * i, d), dtype=np.float32))
            out.append(s)
        return out

    runs = []
    for b in batches:
        batch = OpenVINOLLMBatch(compiled, pos)
        sessions = prefilled(b)
        t = time.perf_counter()
        for s in sessions:
            batch.add(s)
        join_ms = 1e3 * (time.perf_counter() - t) / b
        x = rng.standard_normal((b, 1, d), dtype=np.float32)
        loop = prefilled(b)  # the same rows, one session call each (no batching)
        runs.append({"batch": b, "obj": batch, "x": x, "loop": loop, "join_ms": join_ms,
                     "join_bytes": batch.join_bytes / b, "t": [], "t_loop": []})
    for k in range(warmup + steps):
        for r in runs:
            t = time.perf_counter()
            r["obj"].step(r["x"])
            t1 = time.perf_counter()
            for s in r["loop"]:
                s.forward(r["x"][:1])
            t2 = time.perf_counter()
            if k >= warmup:
                r["t"].append(t1 - t)
                r["t_loop"].append(t2 - t1)
    rows = []
    for r in runs:
        b, width = r["batch"], r["obj"]._width  # padded cache length after the timed steps
        rows.append({"batch": b, "step_ms": 1e3 * statistics.median(r["t"]),
                     "loop_ms": 1e3 * statistics.median(r["t_loop"]),
                     "per_row_ms": 1e3 * statistics.median(r["t"]) / b,
                     "cache_read": b * layers * 2 * heads * width * dk * 4,
                     "new_rows": b * layers * 2 * heads * dk * 4, "join_ms": r["join_ms"],
                     "join_bytes": r["join_bytes"], "width": width})
        r["obj"].close()
        for s in r["loop"]:
            s.close()
    return rows


def mb(n: float) -> str:
    return f"{n / 1e6:.1f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="/work/models/full/cosyvoice.yaml")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--prefix", type=int, default=300, help="cached positions of row 0")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--int8", action="store_true", help="also the INT8_ASYM weight-compressed LLM")
    ap.add_argument("--kv-cache-precision", default="f32")
    ap.add_argument("--dynamic-quantization", type=int, default=128,
                    help="the LLM's DYNAMIC_QUANTIZATION_GROUP_SIZE (0 = off; 128 is what the "
                         "OpenVINO backend serves)")
    ap.add_argument("--ir-dir", help="read the IRs (llm_fp32.xml, llm_int8.xml) from here, "
                                     "or build them and save them here")
    args = ap.parse_args(argv)

    import openvino as ov

    batches = [int(b) for b in args.batches.split(",")]
    core = ov.Core()
    labels = ["fp32", "int8"] if args.int8 else ["fp32"]
    paths = {k: os.path.join(args.ir_dir, f"llm_{k}.xml") for k in labels} if args.ir_dir \
        else {}
    pos_path = os.path.join(args.ir_dir, "pos_weight.npy") if args.ir_dir else ""
    if paths and all(os.path.isfile(p) for p in [*paths.values(), pos_path]):
        from cosyvino.families.cosyvoice1.yaml_config import read_model_config

        cfg = read_model_config(args.config)
        pos_weight = np.load(pos_path)
        variants = [(k, core.read_model(p)) for k, p in paths.items()]
    else:
        cfg, model, pos_weight = build_ir(args.config, 0)
        variants = [("fp32", model)]
        if args.int8:
            import nncf

            # what cosyvino.quantize.weights.compress_ir does for the INT8 presets
            variants.append(("int8", nncf.compress_weights(
                model.clone(), mode=nncf.CompressWeightsMode.INT8_ASYM)))
        for k, m in variants if paths else ():
            os.makedirs(args.ir_dir, exist_ok=True)
            ov.save_model(m, paths[k], compress_to_fp16=False)
        if paths:
            np.save(pos_path, pos_weight)
    props = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": args.threads,
             "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
             "KV_CACHE_PRECISION": args.kv_cache_precision,
             "DYNAMIC_QUANTIZATION_GROUP_SIZE": args.dynamic_quantization}
    print(f"CPU: {cpu_line()}; OpenVINO {ov.get_version()}; {args.threads} threads; "
          f"KV cache {args.kv_cache_precision}; dynamic quantization group "
          f"{args.dynamic_quantization}; random-weight LLM of {args.config}")
    print()
    print("| weights | B | ms/step (batched) | ms/step (B sessions in turn) | ms per row | "
          "x 1-row step | weights read MB | cache read MB | cache copied MB | "
          "join: ms, MB copied per row |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratio4 = None
    for label, m in variants:
        compiled = core.compile_model(m, "CPU", props)
        fused = fused_kv_cache(compiled)
        wbytes = weight_bytes(m)
        rng = np.random.default_rng(1)
        rows = measure(compiled, cfg, pos_weight, batches, args.prefix, args.steps, args.warmup,
                       rng)
        one = rows[0]["step_ms"] if rows[0]["batch"] == 1 else None
        for r in rows:
            copied = r["new_rows"] if fused else r["cache_read"]
            rel = f"{r['step_ms'] / one:.2f}" if one else "-"
            print(f"| {label} | {r['batch']} | {r['step_ms']:.1f} | {r['loop_ms']:.1f} | "
                  f"{r['per_row_ms']:.1f} | {rel} | {mb(wbytes)} | {mb(r['cache_read'])} | "
                  f"{mb(copied)} | {r['join_ms']:.1f}, {mb(r['join_bytes'])} |")
            if r["batch"] == 4 and one:
                ratio4 = (label, r["step_ms"] / one)
        print(f"<!-- {label}: KV cache fused into SDPA (in-place append): {fused} -->")
        del compiled
    print()
    if ratio4 is not None:
        print(f"4-row / 1-row step cost ({ratio4[0]}): {ratio4[1]:.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
