"""CPU pinning on and off side by side in one process: the evidence behind the planner's
``pinning`` decision when calls share a stream's cores (docs/planner.md, ``pinning``).

Two Synthesizers are loaded from one plan file, identical but for the backend's
``cpu_pinning`` (on / off), and measured alternately (the side that goes first alternates):

* ``whole``: a lone request synthesized whole (one segment: its stages run one after the
  other, one call at a time);
* ``stream``: a lone request streamed with the ``latency`` hop schedule (``overlap_stages``:
  the LLM decodes while the flow/vocoder turn the due hop into audio, two calls at once);
* ``clients``: ``--clients`` closed-loop streaming clients on ``--sessions`` sessions with
  ``--llm-batch`` rows, in rounds of ``--round`` seconds (several calls at once).

Printed: per case and side the medians (first chunk, total, RTF) or the round aggregates
(audio s per wall s, first-chunk p50/p95, latency p95); the last line gives the off/on ratios
(below 1: unpinned faster). A round stops starting requests after ``--round`` seconds and
lasts until they end. The concurrent case uses its own ``--sessions`` / ``--llm-batch`` (not
the plan's), to load the cores with calls at once. With the defaults it takes ~8 minutes on 2
cores; measure on a quiet host (the A/B alternates the sides, but load adds noise).

    python benchmarks/pinning_ab.py --plan plan.toml [--runs 4] [--tokens 250]
        [--clients 4] [--sessions 4] [--llm-batch 4] [--round 40] [--rounds 1]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from first_chunk_priority import run_round  # noqa: E402  (benchmarks/ is on the path)
from load_test import pct  # noqa: E402

TEXT = "The quick brown fox jumps over the lazy dog, and then it runs far away into the woods."
SIDES = ("on", "off")


def lone(tts, speaker: str, tokens: int, stream: bool) -> dict:
    """One request alone: seconds to the first chunk and to the end, seconds of audio."""
    t0 = time.perf_counter()
    first, audio = None, 0.0
    chunks = (tts.stream(TEXT, speaker, seed=7, num_speech_tokens=tokens) if stream else
              [tts.synthesize(TEXT, speaker, seed=7, num_speech_tokens=tokens)])
    for chunk in chunks:
        if first is None:
            first = time.perf_counter() - t0
        audio += len(chunk.samples) / chunk.sample_rate
    return {"first": first, "total": time.perf_counter() - t0, "audio": audio}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0] + " With the defaults: ~8 minutes on 2 cores.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    # SUPPRESS: a required option has no default to show
    ap.add_argument("--plan", required=True, default=argparse.SUPPRESS,
                    help="plan file (cosyvino plan)")
    ap.add_argument("--runs", type=int, default=4,
                    help="lone requests per side and mode, after one warm-up each")
    ap.add_argument("--tokens", type=int, default=250,
                    help="speech tokens of a lone request (50 = 1 s of audio)")
    ap.add_argument("--clients", type=int, default=4,
                    help="closed-loop streaming clients of the concurrent case (0 skips it)")
    ap.add_argument("--sessions", type=int, default=4,
                    help="requests stepped at once in the concurrent case (not the plan's)")
    ap.add_argument("--llm-batch", type=int, default=4,
                    help="decode rows per LLM call in the concurrent case (not the plan's)")
    ap.add_argument("--client-tokens", type=int, default=100,
                    help="speech tokens per request of client 0 in the concurrent case "
                         "(client c: x (1 + 0.5 c))")
    ap.add_argument("--round", type=float, default=40.0,
                    help="seconds per concurrent round")
    ap.add_argument("--rounds", type=int, default=1,
                    help="concurrent rounds per side (alternating)")
    args = ap.parse_args(argv)

    from cosyvino import Synthesizer
    from cosyvino.bench_extras import cpu_summary
    from cosyvino.planner.planfile import load_plan

    plan = load_plan(args.plan)
    if "cpu_pinning" not in plan.backend_options:
        ap.error(f"the plan's backend {plan.backend!r} has no cpu_pinning option")
    concurrent = args.clients > 0
    tts = {}
    for side in SIDES:
        opts = dict(plan.backend_options, cpu_pinning=side == "on")
        extra = {"max_parallel": args.sessions, "llm_batch": args.llm_batch} if concurrent else {}
        tts[side] = Synthesizer(plan.model_dir, backend=plan.backend, **opts, **extra)
    speaker = tts["on"].speakers[0]

    rows: dict = {}
    for mode in ("whole", "stream"):
        for side in SIDES:
            lone(tts[side], speaker, args.tokens, mode == "stream")  # warm-up
        res = {side: [] for side in SIDES}
        for i in range(args.runs):
            for side in (SIDES if i % 2 == 0 else SIDES[::-1]):
                res[side].append(lone(tts[side], speaker, args.tokens, mode == "stream"))
        rows[mode] = res

    rounds = {side: {"rows": [], "wall": 0.0} for side in SIDES}
    if concurrent:
        counter = [0] * args.clients
        for i in range(2 * args.rounds):
            side = SIDES[i % 2]
            r = run_round(tts[side], args.clients, args.round, args.client_tokens, 0.5, counter)
            rounds[side]["rows"] += r["rows"]
            rounds[side]["wall"] += r["wall"]
            print(f"round {i + 1}: pinning {side}, {len(r['rows'])} requests in "
                  f"{r['wall']:.1f} s", file=sys.stderr)
    for t in tts.values():
        t.close()

    print(f"# CPU: {cpu_summary()}; plan {args.plan}: {plan.backend}, "
          f"{plan.backend_options.get('num_threads')} threads, overlap_stages "
          f"{plan.backend_options.get('overlap_stages', False)}; lone requests: {args.tokens} "
          f"tokens, medians of {args.runs} per side, sides alternating")
    print("\n| case | pinning | first chunk (s) | total (s) | RTF |\n|---|---|---:|---:|---:|")
    med = {}
    for mode, res in rows.items():
        for side in SIDES:
            first = statistics.median(x["first"] for x in res[side])
            total = statistics.median(x["total"] for x in res[side])
            audio = statistics.median(x["audio"] for x in res[side])
            med[mode, side] = total
            print(f"| lone, {mode} | {side} | {first:.3f} | {total:.2f} | {total / audio:.3f} |")
    if concurrent:
        print(f"\n{args.clients} clients, {args.sessions} sessions, LLM batch "
              f"{args.llm_batch}, {args.rounds} x {args.round:.0f} s per side:\n")
        print("| pinning | requests | audio s / wall s | first chunk p50 (s) | p95 (s) "
              "| latency p95 (s) |\n|---|---:|---:|---:|---:|---:|")
        for side in SIDES:
            r = rounds[side]
            first = [x["first"] for x in r["rows"] if x["first"] is not None]
            lat = [x["latency"] for x in r["rows"]]
            audio = sum(x["audio"] for x in r["rows"])
            print(f"| {side} | {len(r['rows'])} | {audio / max(r['wall'], 1e-9):.3f} | "
                  f"{pct(first, 0.5):.2f} | {pct(first, 0.95):.2f} | {pct(lat, 0.95):.2f} |")
    line = (f"\nwhole total off / on: {med['whole', 'off'] / med['whole', 'on']:.3f}x; "
            f"streamed total off / on: {med['stream', 'off'] / med['stream', 'on']:.3f}x")
    if concurrent:
        rate = {side: sum(x["audio"] for x in rounds[side]["rows"]) /
                max(rounds[side]["wall"], 1e-9) for side in SIDES}
        line += (f"; {args.clients} clients' audio per second off / on: "
                 f"{rate['off'] / max(rate['on'], 1e-9):.3f}x")
    print(line + " (time ratios below 1 and audio ratios above 1: unpinned better)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
