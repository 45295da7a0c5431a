"""A/B of the exported LLM step's query-side positional projection (issues 16, 17).

A = the block-diagonal 2-D MatMul (:func:`cosyvino.export.openvino.model_patcher.
_query_pos_projection`), B = one 2-D MatMul per head (:func:`per_head`),
C = the eager batched MatMul against the 3-D weight (fp32 only: after
``nncf.compress_weights`` it keeps a decompressed f32 copy, docs/performance.md "INT8"),
D = the block-diagonal form per group of 4 heads (:func:`grouped`).
Full-size 300M LLM, random weights from ``--config`` (``pos_bias_u/v`` random too), stateful
IRs as ``cosyvino convert`` writes them; ``--int8`` compresses each IR with NNCF ``INT8_ASYM``
first. Reports each IR's remaining large f32 constants and the RSS its compile adds. One
process, all variants and batch sizes (1 and 4) stepped round-robin with the order alternating
every round; median ms per step after ``--warmup``; max |logp| difference vs A over all steps.

    python benchmarks/pos_projection_ab.py [--int8] [--steps 120] [--threads 2] [--variants ABCD]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llm_batch import cpu_line  # noqa: E402


def per_head(self, q_v):
    """``q_v [B, H, T, d_k] -> [B, H, T, d]`` as ``H`` plain 2-D MatMuls ``[B, T, d_k] x
    [d_k, d]``, head ``h`` against rows ``h*d_k:(h+1)*d_k`` of the ``linear_pos`` weight (each a
    2-D constant NNCF compresses), stacked on the head axis: ``1/H`` of the block-diagonal
    form's multiply-adds, ``H`` MatMul nodes per layer."""
    import torch
    import torch.nn.functional as F
    h, dk = q_v.shape[1], q_v.shape[3]
    w = self.linear_pos.weight
    return torch.stack([F.linear(q_v[:, i], w[i * dk:(i + 1) * dk].t()) for i in range(h)],
                       dim=1)


def grouped(self, q_v, groups: int = 4):
    """The block-diagonal form per group of ``H/groups`` heads: ``groups`` 2-D MatMuls, each
    ``H/groups`` times the needed multiply-adds."""
    import torch
    import torch.nn.functional as F
    b, h, t, dk = q_v.shape
    g = h // groups
    w = self.linear_pos.weight
    eye = torch.eye(g, dtype=q_v.dtype, device=q_v.device).reshape(g, 1, g, 1)
    outs = []
    for i in range(groups):
        blocks = (eye * q_v[:, i * g:(i + 1) * g].unsqueeze(3)).reshape(b, g, t, g * dk)
        outs.append(F.linear(blocks, w[i * g * dk:(i + 1) * g * dk].t()))
    return torch.cat(outs, dim=1)


def rss_mb() -> float:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def big_f32_constants(model, min_elems: int = 65536) -> int:
    return sum(1 for op in model.get_ops() if op.get_type_name() == "Constant"
               and op.get_element_type().get_type_name() == "f32"
               and int(np.prod(list(op.get_output_shape(0)))) >= min_elems)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default="/work/models/full/cosyvoice.yaml")
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--variants", default="ABD", help="letters of the variants to run (A first)")
    ap.add_argument("--steps", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--prefix", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()

    import openvino as ov
    import torch

    import cosyvino.export.openvino.model_patcher as mp
    from cosyvino.export.openvino.convert import convert_llm
    from cosyvino.families.cosyvoice1.torch.loading import TorchModel, build_modules
    from cosyvino.families.cosyvoice1.yaml_config import read_model_config

    cfg = read_model_config(a.config)
    torch.manual_seed(0)
    llm, flow, hift = build_modules(cfg)
    llm.eval().requires_grad_(False)
    model = TorchModel(os.path.dirname(os.path.abspath(a.config)), cfg, llm, flow, hift, {})
    with torch.no_grad():  # random biases so u/v are not zero
        for m in llm.modules():
            if hasattr(m, "pos_bias_v"):
                m.pos_bias_u.normal_(0, 0.1)
                m.pos_bias_v.normal_(0, 0.1)

    def eager(self, q_v):
        return torch.matmul(q_v, self.linear_pos.weight.reshape(self.h, self.d_k, -1))

    block = mp._query_pos_projection
    variants = {"A block-diagonal": block, "B per-head": per_head,
                "C eager 3-D": eager, "D 4 groups of 4 heads": grouped}
    variants = {k: v for k, v in variants.items() if k[0] in a.variants.upper()}
    irs = {}
    for name, fn in variants.items():
        mp._query_pos_projection = fn
        irs[name] = convert_llm(model)
    mp._query_pos_projection = block
    if a.int8:
        import nncf
        for name in irs:
            irs[name] = nncf.compress_weights(irs[name], mode=nncf.CompressWeightsMode.INT8_ASYM)
    core = ov.Core()
    props = {"INFERENCE_PRECISION_HINT": "f32", "INFERENCE_NUM_THREADS": str(a.threads),
             "PERFORMANCE_HINT": "LATENCY", "KV_CACHE_PRECISION": "u8"}
    compiled = {}
    for name, ir in irs.items():
        before = rss_mb()
        compiled[name] = core.compile_model(ir, "CPU", props)
        print(f"{name}: big f32 constants {big_f32_constants(ir)}, "
              f"compile adds {rss_mb() - before:.0f} MB RSS", flush=True)

    d = cfg.llm.llm_input_size
    rng = np.random.default_rng(0)
    runs = []
    for b in (1, 4):
        pre = rng.standard_normal((1, a.prefix, d), dtype=np.float32)
        for name, c in compiled.items():
            runs.append({"name": name, "b": b, "req": c.create_infer_request(), "n": 0,
                         "t": [], "pre": pre})
    def feed(r, x):
        b = x.shape[0]
        r["n"] += x.shape[1]
        r["req"].infer({"inputs_embeds": x, "attention_mask": np.ones((b, r["n"]), np.float32),
                        "beam_idx": np.arange(b, dtype=np.int32)})
        return r["req"].get_output_tensor(0).data.copy()

    diff = {}
    ref = {}
    for r in runs:
        out = feed(r, r["pre"])  # one row prefilled, its cache repeated to B rows
        for st in r["req"].query_state():
            st.state = ov.Tensor(np.ascontiguousarray(np.repeat(st.state.data, r["b"], 0)))
        ref.setdefault(r["b"], out)
        diff[(r["name"], r["b"])] = float(np.abs(out - ref[r["b"]]).max())
    for k in range(a.warmup + a.steps):
        xs = {b: rng.standard_normal((b, 1, d), dtype=np.float32) for b in (1, 4)}
        order = runs if k % 2 == 0 else runs[::-1]
        outs = {}
        for r in order:
            t = time.perf_counter()
            outs[(r["name"], r["b"])] = feed(r, xs[r["b"]])
            if k >= a.warmup:
                r["t"].append(time.perf_counter() - t)
        for (name, b), o in outs.items():
            base = outs[(runs[0]["name"], b)]
            diff[(name, b)] = max(diff[(name, b)], float(np.abs(o - base).max()))
    print(f"\nCPU: {cpu_line()}, {a.threads} threads, {'INT8_ASYM' if a.int8 else 'fp32'}, "
          f"prefix {a.prefix}, {a.steps} steps")
    print("| variant | batch | ms/step (median) | vs A | max abs logp diff vs A |")
    print("|---|---|---|---|---|")
    base = {}
    for r in sorted(runs, key=lambda r: (r["b"], r["name"])):
        med = 1e3 * statistics.median(r["t"])
        base.setdefault(r["b"], med)
        print(f"| {r['name']} | {r['b']} | {med:.2f} | {med / base[r['b']]:.3f} | "
              f"{diff[(r['name'], r['b'])]:.2e} |")


if __name__ == "__main__":
    main()
