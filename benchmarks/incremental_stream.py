"""CosyVoice2 streaming through the serving path: official re-run flow against the incremental
flow (issue 36 items 1 and 6).

``Synthesizer.stream`` on the torch backend over a CosyVoice2 model dir (e.g. the synthetic
full-size one: ``cosyvino make-model --family cosyvoice2 --preset 0.5b DIR``; cost depends only
on shapes), one text, ``--tokens`` forced speech tokens (default 500 = 20 s), the official hop
schedule (25 + pad, 50, 100, ... tokens + 3 look-ahead). Modes, one after the other in one
process: ``official`` (``flow_streaming="official"``: every hop re-runs the flow over all tokens
so far, the last with full attention), ``incremental`` (only the new tokens; the last hop
re-runs as upstream: ``final_hop="official"``, the default) and ``incremental-final`` (no re-run
at all: ``final_hop="incremental"``); plus the non-streamed computation (``segment``: the flow
once over all tokens) as the cost reference.

Prints, per hop, the flow seconds (``flow_encoder`` + ``flow_estimator`` of the chunk's stats:
wall time of those stage calls) per mode, then per mode: first chunk (s after the request),
total wall, streaming RTF (wall / audio), underrun of a real-time player
(:func:`cosyvino.bench.play_underrun`), the summed flow seconds and their ratio to the
non-streamed flow, and the chunks' max sample difference to the official stream's. The LLM decodes in the same process (lanes overlap), so the hop times
include contention with it, as when serving. Name the load (``uptime``) next to the numbers.

    python benchmarks/incremental_stream.py --model-dir DIR [--tokens 500] [--steps 10]
        [--threads 2] [--modes official,incremental,incremental-final]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

MODES = {"official": ("official", "official"), "incremental": ("incremental", "official"),
         "incremental-final": ("incremental", "incremental")}


def _flow_seconds(stats: dict) -> float:
    st = stats.get("stages", {})
    return sum(st.get(k, {}).get("seconds", 0.0) for k in ("flow_encoder", "flow_estimator"))


def _run(tts, text, voice, tokens, steps, **options) -> dict:
    t0 = time.perf_counter()
    arrivals, flows, news, modes, samples = [], [], [], [], []
    for chunk in tts.stream(text, voice, seed=0, num_speech_tokens=tokens, n_timesteps=steps,
                            **options):
        arrivals.append((time.perf_counter() - t0, chunk.duration))
        flows.append(_flow_seconds(chunk.stats))
        news.append(int(chunk.speech_tokens.size))
        modes.append(chunk.stats.get("flow_streaming", "?"))
        samples.append(chunk.samples)
    wall = time.perf_counter() - t0
    audio = sum(d for _, d in arrivals)
    return {"arrivals": arrivals, "flows": flows, "news": news, "modes": modes, "wall": wall,
            "audio": audio, "samples": samples}


def _max_diff(a: dict, b: dict, last: bool) -> str:
    """Max |a - b| over the chunks' samples (all but the last chunk, or the last one)."""
    import numpy as np

    pairs = list(zip(a["samples"], b["samples"]))
    pairs = pairs[-1:] if last else pairs[:-1]
    if not pairs or any(x.shape != y.shape for x, y in pairs):
        return "n/a"
    return f"{max(float(np.abs(x - y).max()) for x, y in pairs):.2g}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--tokens", type=int, default=500, help="forced speech tokens (25/s)")
    ap.add_argument("--steps", type=int, default=None, help="ODE steps (None: the model's)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--voice", default=None, help="default: the model's first speaker")
    ap.add_argument("--modes", default="official,incremental,incremental-final")
    ap.add_argument("--text", default="Hello world, this is a streaming benchmark.")
    args = ap.parse_args(argv)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from cosyvino import Synthesizer
    from cosyvino.bench import play_underrun
    from cosyvino.cpu_peaks import cpu_summary

    modes = [m for m in args.modes.split(",") if m]
    unknown = set(modes) - set(MODES)
    if unknown:
        ap.error(f"unknown modes {sorted(unknown)}; choose from {list(MODES)}")
    tts = Synthesizer(args.model_dir, backend="torch", num_threads=args.threads,
                      voices_dir=False)
    voice = args.voice or tts.speakers[0]
    load = os.getloadavg()
    print(f"CPU: {cpu_summary()}; {args.threads} threads; model {args.model_dir}; "
          f"{args.tokens} tokens ({args.tokens / 25:.0f} s), ODE steps "
          f"{args.steps or 'model default'}, voice {voice!r}; load average at start "
          f"{load[0]:.1f} {load[1]:.1f} {load[2]:.1f}")
    _run(tts, args.text, voice, 40, 1, hop_schedule="official")  # warm-up
    seg = _run(tts, args.text, voice, args.tokens, args.steps, hop_schedule="segment")
    results = {}
    for m in modes:
        flow, final = MODES[m]
        results[m] = _run(tts, args.text, voice, args.tokens, args.steps,
                          hop_schedule="official", flow_streaming=flow, final_hop=final)
    tts.close()
    print()
    print("| hop | new tokens | " + " | ".join(f"{m} flow (s)" for m in modes) +
          (f" | official / {modes[1]} |" if modes[:1] == ["official"] and len(modes) > 1
           else " |"))
    print("|---:|---:|" + "---:|" * len(modes) + ("---:|" if modes[:1] == ["official"]
                                                  and len(modes) > 1 else ""))
    first = results[modes[0]]
    for i, n in enumerate(first["news"]):
        cells = [f"{results[m]['flows'][i]:.2f} ({results[m]['modes'][i][:3]})" for m in modes]
        ratio = ""
        if modes[:1] == ["official"] and len(modes) > 1:
            ratio = f" {results['official']['flows'][i] / max(results[modes[1]]['flows'][i], 1e-9):.1f}x |"
        print(f"| {i} | {n} | " + " | ".join(cells) + " |" + ratio)
    seg_flow = sum(seg["flows"])
    print()
    print(f"non-streamed (segment): flow {seg_flow:.2f} s, wall {seg['wall']:.2f} s, audio "
          f"{seg['audio']:.2f} s")
    print()
    ref = results.get("official")
    print("| mode | first chunk (s) | wall (s) | streaming RTF | underrun (s) | flow (s) | "
          "flow / non-streamed | max abs diff vs official: chunks before the last / last |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for m in modes:
        r = results[m]
        flow = sum(r["flows"])
        print(f"| {m} | {r['arrivals'][0][0]:.2f} | {r['wall']:.2f} | "
              f"{r['wall'] / r['audio']:.2f} | {play_underrun(r['arrivals']):.2f} | "
              f"{flow:.2f} | {flow / seg_flow:.2f}x | "
              + (f"{_max_diff(r, ref, False)} / {_max_diff(r, ref, True)} |" if ref else "|"))
    load = os.getloadavg()
    print(f"\nload average at end {load[0]:.1f} {load[1]:.1f} {load[2]:.1f}. Flow (s): wall "
          "seconds of the chunk's flow_encoder + flow_estimator stage calls (off/inc: how the "
          "hop's flow ran).")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
