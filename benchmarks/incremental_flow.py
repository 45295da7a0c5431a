"""Per-hop flow cost of CosyVoice2 streaming: the official re-run against the incremental flow
(issue 36 item 1).

Builds the full-size CosyVoice2-0.5B flow (``presets.full_0_5b``) with random weights (cost
depends only on shapes), draws ``--tokens`` random speech tokens (default 500 = 20 s) after
``--prompt-tokens`` prompt tokens, and walks the official hop schedule (sheet v2 §7.2). For
every hop, interleaved: the official call (the flow over ALL tokens so far, chunk masks; the last
one with full attention) and :class:`IncrementalFlow.hop` (only the new tokens, reading the
per-ODE-step state). The final hop is timed both ways (incremental: chunk masks, no re-run;
official: upstream's full-attention re-run). ``--steps`` ODE steps (default 1: both paths'
estimator work is linear in the step count, the encoder runs once per call in both, so one step
shows the trend in a fraction of the time; the official default is 10). Prints a markdown table
with the CPU named and the incremental state's size after each hop.

    python benchmarks/incremental_flow.py [--threads 2] [--steps 1] [--tokens 500]
"""

from __future__ import annotations

import argparse
import os
import sys
import time


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=1, help="ODE steps (official: 10)")
    ap.add_argument("--tokens", type=int, default=500, help="generated speech tokens (25/s)")
    ap.add_argument("--prompt-tokens", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import numpy as np
    import torch

    from cosyvino.cpu_peaks import cpu_summary
    from cosyvino.families.cosyvoice2.official_stream import hop_schedule
    from cosyvino.families.cosyvoice2.presets import full_0_5b
    from cosyvino.families.cosyvoice2.torch.flow_loading import build_flow
    from cosyvino.families.cosyvoice2.torch.incremental_flow import (
        IncrementalFlow,
        state_bytes_per_second,
    )
    from cosyvino.families.cosyvoice23.fixed_noise import make_cfm_noise_table
    from cosyvino.families.cosyvoice23.torch.flow_inference import flow_inference

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = full_0_5b().flow
    flow = build_flow(cfg).eval().requires_grad_(False)
    noise = make_cfm_noise_table()
    gen = torch.Generator().manual_seed(args.seed)
    p = args.prompt_tokens
    tokens = torch.randint(0, cfg.vocab_size, (1, args.tokens), generator=gen)
    emb = torch.randn(1, cfg.spk_embed_dim, generator=gen)
    prompt = {}
    if p:
        prompt = {"prompt_token": torch.randint(0, cfg.vocab_size, (1, p), generator=gen),
                  "prompt_feat": torch.randn(1, 2 * p, cfg.output_size, generator=gen).numpy()}
    calls = hop_schedule(args.tokens, p)
    inc = IncrementalFlow(flow, noise, n_timesteps=args.steps)
    state = inc.start(emb, **prompt)

    # warm-up outside the table (first-call allocations would be charged to hop 0)
    warm = hop_schedule(40, 0)[0]
    flow_inference(flow, tokens[:, :warm.n_tokens], emb, noise, streaming=True, finalize=False,
                   n_timesteps=1)

    def official(call):
        return flow_inference(flow, tokens[:, :call.n_tokens], emb, noise,
                              streaming=call.streaming, finalize=call.finalize,
                              n_timesteps=args.steps, **prompt)[:, :, 2 * call.token_offset:]

    print(f"CPU: {cpu_summary()}; torch {torch.__version__}, {args.threads} threads; "
          f"full-size CosyVoice2-0.5B flow (random weights), {args.tokens} tokens "
          f"({args.tokens / cfg.input_frame_rate:.0f} s), prompt {p} tokens, "
          f"{args.steps} ODE step(s)")
    print(f"state memory (formula, {args.steps} step(s)): "
          f"{state_bytes_per_second(cfg, args.steps) / 1e6:.1f} MB per audio second; "
          f"10 steps: {state_bytes_per_second(cfg, 10) / 1e6:.1f} MB")
    print()
    print("| hop | new tokens | frames official / incremental | official wall / CPU (s) "
          "| incremental wall / CPU (s) | official / incremental (CPU) | state (MB) | "
          "max abs diff |")
    print("|---:|---|---:|---:|---:|---:|---:|---|")
    tot = np.zeros(4)
    for i, call in enumerate(calls):
        frames_off = 2 * (p + call.n_tokens - call.lookahead)
        t0, c0 = time.perf_counter(), time.process_time()
        want = official(call)
        t1, c1 = time.perf_counter(), time.process_time()
        before = state.committed  # the incremental call computes tokens [before, end)
        got = inc.hop(state, tokens[:, :call.n_tokens], finalize=call.finalize)
        t2, c2 = time.perf_counter(), time.process_time()
        frames_inc = frames_off - 2 * before
        err = float(np.abs(got - want).max())
        row = np.array([t1 - t0, c1 - c0, t2 - t1, c2 - c1])
        tot += row
        kind = " final (official: full attention)" if call.finalize else ""
        print(f"| {i} | [{call.token_offset}, {call.n_tokens - call.lookahead}){kind} | "
              f"{frames_off} / {frames_inc} | {row[0]:.2f} / {row[1]:.2f} | "
              f"{row[2]:.2f} / {row[3]:.2f} | {row[1] / row[3]:.1f}x | "
              f"{state.nbytes() / 1e6:.0f} | {err:.2g} |")
    print(f"| all | [0, {args.tokens}) | | {tot[0]:.2f} / {tot[1]:.2f} | {tot[2]:.2f} / "
          f"{tot[3]:.2f} | {tot[1] / tot[3]:.1f}x | | |")
    print("\nCPU = process CPU time (all threads; less sensitive than wall time to other "
          "processes on a shared machine). max abs diff: incremental vs official mel; the "
          "final row compares chunk-causal with full attention.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
