"""First-chunk priority and hold under concurrency: the scheduler's orders side by side
in one process, on one loaded model.

``clients`` closed-loop clients each stream one request after another (the load test's text mix
and seeds, ``latency`` hop schedule; client ``c``'s requests are ``tokens x (1 + c x spread)``
speech tokens long, so the clients drift apart and requests arrive while others stream) through :meth:`cosyvino.Synthesizer.submit`, with the
plan's backend options and ``--llm-batch`` / ``--sessions``. Rounds alternate first come, first
served (``fifo``), first-chunk priority (``priority``) and priority with the first-chunk hold
(``hold``: streaming requests' steps wait while a new request makes its first chunk) by
flipping :attr:`cosyvino.engine.Scheduler.first_chunk_priority` and ``first_chunk_hold``
between rounds; a round's requests are those that started in it. A lone request (median of 3,
before the rounds) is the baseline. Printed: per order, aggregate audio seconds per wall
second, first-chunk p50/p95, p95 over lone, latency p50/p95; the last lines give each order's
p95 first chunk and throughput over the first order's.

    python benchmarks/first_chunk_priority.py --plan plan.toml [--orders fifo,priority,hold]
        [--clients 4] [--llm-batch 4] [--sessions 4] [--round 45] [--rounds 2] [--tokens 100]
        [--spread 0.5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from load_test import TEXTS, pct, seed_for  # noqa: E402  (benchmarks/ is on the path)


def one_request(tts, client: int, n: int, tokens: int | None) -> dict:
    """Stream client ``client``'s ``n``-th request; seconds to first chunk and to the end."""
    from cosyvino.request import StreamingOptions, SynthesisRequest

    voice, text = TEXTS[(client + n) % len(TEXTS)]
    req = SynthesisRequest(text, voice, seed=seed_for(client, n), num_speech_tokens=tokens,
                           streaming=StreamingOptions("latency"))
    start = time.perf_counter()
    first, audio = None, 0.0
    for chunk in tts.submit(req):
        if first is None:
            first = time.perf_counter() - start
        audio += len(chunk.samples) / chunk.sample_rate
    return {"start": start, "first": first, "latency": time.perf_counter() - start,
            "audio": audio}


def run_round(tts, clients: int, seconds: float, tokens: int | None, spread: float,
              counter: list) -> dict:
    """``clients`` closed-loop clients for ``seconds``; the requests that started in it."""
    rows: list[dict] = []
    lock = threading.Lock()
    stop_at = time.perf_counter() + seconds

    def client(c: int) -> None:
        while time.perf_counter() < stop_at:
            with lock:
                n = counter[c]
                counter[c] += 1
            r = one_request(tts, c, n, None if tokens is None else round(tokens * (1 + c * spread)))
            with lock:
                rows.append(r)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return {"rows": rows, "wall": wall}


def split_by_overlap(rows: list[dict]) -> tuple[list[float], list[float]]:
    """First-chunk seconds of the requests whose wait for their first chunk overlapped
    another request's wait, and of the others."""
    spans = [(x["start"], x["start"] + x["first"]) for x in rows if x["first"] is not None]
    both, alone = [], []
    for i, (a, b) in enumerate(spans):
        hit = any(c < b and a < d for j, (c, d) in enumerate(spans) if j != i)
        (both if hit else alone).append(b - a)
    return both, alone


#: order -> (first_chunk_priority, first_chunk_hold)
ORDERS = {"fifo": (False, False), "priority": (True, False), "hold": (True, True)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("--plan", required=True, default=argparse.SUPPRESS,
                    help="plan file (cosyvino plan)")
    ap.add_argument("--clients", type=int, default=4,
                    help="closed-loop clients, each streaming one request after another")
    ap.add_argument("--llm-batch", type=int, default=4,
                    help="decode rows per LLM call (replaces the plan's llm_batch)")
    ap.add_argument("--sessions", type=int, default=4,
                    help="requests stepped at once (replaces the plan's max_sessions)")
    ap.add_argument("--round", type=float, default=45.0,
                    help="seconds in which a round starts requests (it then waits for them "
                         "to end, so a round takes longer)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds per order (alternating)")
    ap.add_argument("--tokens", type=int, default=100,
                    help="speech tokens per request of client 0 (fixed length; 0 = until EOS)")
    ap.add_argument("--spread", type=float, default=0.5,
                    help="client c's requests are tokens x (1 + c x spread) long (0 = equal: "
                         "closed-loop clients then start their requests in step)")
    ap.add_argument("--orders", default="fifo,priority,hold",
                    help="orders to alternate, comma-separated: fifo, priority, hold")
    args = ap.parse_args(argv)
    orders = [o.strip() for o in args.orders.split(",") if o.strip()]
    if not orders or set(orders) - set(ORDERS) or len(set(orders)) != len(orders):
        ap.error(f"--orders: distinct names among {', '.join(ORDERS)}")

    from cosyvino import Synthesizer
    from cosyvino.bench_extras import cpu_summary
    from cosyvino.planner.planfile import load_plan

    plan = load_plan(args.plan)
    tokens = args.tokens or None
    tts = Synthesizer(plan.model_dir, backend=plan.backend, **plan.backend_options,
                      max_parallel=args.sessions, llm_batch=args.llm_batch)
    counter = [0] * args.clients
    one_request(tts, 0, 0, tokens)  # warm-up (also starts the scheduler)
    lone = [one_request(tts, 0, 1 + i, tokens) for i in range(3)]
    lone_first = statistics.median(r["first"] for r in lone)
    scheduler = tts._scheduler
    results = {o: {"rows": [], "wall": 0.0} for o in orders}
    for i in range(len(orders) * args.rounds):
        order = orders[i % len(orders)]
        scheduler.first_chunk_priority, scheduler.first_chunk_hold = ORDERS[order]
        r = run_round(tts, args.clients, args.round, tokens, args.spread, counter)
        results[order]["rows"] += r["rows"]
        results[order]["wall"] += r["wall"]
        print(f"round {i + 1}: {order}, {len(r['rows'])} requests in {r['wall']:.1f} s",
              file=sys.stderr)
    holds = scheduler.hold_stats
    tts.close()

    print(f"# CPU: {cpu_summary()}; plan {args.plan}: {plan.backend}, "
          f"{plan.backend_options.get('num_threads')} threads; {args.clients} clients, "
          f"LLM batch {args.llm_batch}, {args.sessions} sessions, {tokens or 'EOS'} tokens "
          f"per request x (1 + client x {args.spread}), {args.rounds} x {args.round:.0f} s per order (alternating)")
    print(f"# lone first chunk (median of 3): {lone_first:.3f} s; held steps: "
          f"{holds['holds']} waits, {holds['held_seconds']:.1f} s in all\n")
    print("| order | requests | audio s / wall s | first chunk p50 (s) | first chunk p95 (s) "
          "| p95 / lone | latency p50 (s) | latency p95 (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    p95, rate = {}, {}
    for order, r in results.items():
        rows = r["rows"]
        first = [x["first"] for x in rows if x["first"] is not None]
        lat = [x["latency"] for x in rows]
        audio = sum(x["audio"] for x in rows)
        p95[order] = pct(first, 0.95)
        rate[order] = audio / r["wall"]
        print(f"| {order} | {len(rows)} | {audio / r['wall']:.3f} | {pct(first, 0.5):.2f} | "
              f"{p95[order]:.2f} | {p95[order] / lone_first:.1f}x | {pct(lat, 0.5):.2f} | "
              f"{pct(lat, 0.95):.2f} |")
    print("\nFirst chunks that overlapped another request's first chunk (both making their "
          "first audio at once) vs the rest:\n")
    print("| order | overlapped: requests | p50 (s) | p95 (s) | alone: requests | p50 (s) | "
          "p95 (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for order, r in results.items():
        both, alone = split_by_overlap(r["rows"])
        cells = [f"{len(g)} | {pct(g, 0.5):.2f} | {pct(g, 0.95):.2f}" if g else "0 | - | -"
                 for g in (both, alone)]
        print(f"| {order} | {cells[0]} | {cells[1]} |")
    base = orders[0]
    print()
    for order in orders[1:]:
        print(f"{order} / {base}: p95 first chunk {p95[order] / p95[base]:.2f}x, "
              f"audio s per wall s {rate[order] / rate[base]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
