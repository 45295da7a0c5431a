"""Text in (issue 36 item 5): time from the first text piece to the first audio, side by side
with the same text given whole, in one process on one loaded model.

``text-in``: :meth:`cosyvino.Synthesizer.open_text_stream`, the text sent in pieces of
``--piece-chars`` characters (default 15) every ``--interval`` seconds (default 0.1 s: a chat
model streaming ~150 characters per second), then closed; the clock starts at the first
``send``. ``whole``: :meth:`cosyvino.Synthesizer.stream` of the same text (``latency`` hops);
the clock starts at the call. Each mode runs ``--repeats`` times (seeds 0..n-1, alternating
modes), after one warm-up of each. Printed: first audio p50 / max, wall to the last chunk,
audio seconds, and the text-in / whole ratio of the p50s; the CPU, the backend and the machine's
load (``os.getloadavg``) head the table: numbers from a shared machine say so.

    python benchmarks/text_in_latency.py --model-dir DIR [--backend torch] [--threads 2]
        [--voice NAME] [--piece-chars 15] [--interval 0.1] [--repeats 3] [--text "..."]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time

TEXT = ("Sure, I can help you with that. The train leaves at half past seven from platform "
        "two, and the trip takes about forty minutes, so you will arrive well before nine.")


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def text_in(tts, voice: str, text: str, piece_chars: int, interval: float, seed: int) -> dict:
    stream = tts.open_text_stream(voice, seed=seed)
    pieces = [text[i:i + piece_chars] for i in range(0, len(text), piece_chars)]
    first = []
    start = time.perf_counter()

    def feed():
        for i, piece in enumerate(pieces):
            target = start + i * interval
            delay = target - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            stream.send(piece)
        stream.close()

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    audio = 0.0
    for chunk in stream:
        if not first:
            first.append(time.perf_counter() - start)
        audio += chunk.duration
    feeder.join()
    return {"first": first[0], "wall": time.perf_counter() - start, "audio": audio}


def whole(tts, voice: str, text: str, seed: int) -> dict:
    start = time.perf_counter()
    first, audio = None, 0.0
    with tts.stream(text, voice, seed=seed, hop_schedule="latency") as chunks:
        for chunk in chunks:
            if first is None:
                first = time.perf_counter() - start
            audio += chunk.duration
    return {"first": first, "wall": time.perf_counter() - start, "audio": audio}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--voice", default=None, help="default: the model's first voice")
    ap.add_argument("--piece-chars", type=int, default=15)
    ap.add_argument("--interval", type=float, default=0.1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--text", default=TEXT)
    a = ap.parse_args()

    from cosyvino import Synthesizer

    tts = Synthesizer(a.model_dir, backend=a.backend, num_threads=a.threads, voices_dir=False)
    voice = a.voice or (tts.speakers[0] if tts.speakers else sorted(tts.voices)[0])
    text_in(tts, voice, a.text, a.piece_chars, a.interval, 99)  # warm-up
    whole(tts, voice, a.text, 99)
    rows: dict[str, list] = {"text-in": [], "whole": []}
    loads = [os.getloadavg()[0]]
    for seed in range(a.repeats):
        rows["text-in"].append(text_in(tts, voice, a.text, a.piece_chars, a.interval, seed))
        rows["whole"].append(whole(tts, voice, a.text, seed))
        loads.append(os.getloadavg()[0])
    tts.close()
    print(f"# {cpu_name()}, {os.cpu_count()} CPUs, backend {a.backend}, threads {a.threads}, "
          f"model {a.model_dir}, voice {voice}")
    print(f"# load average (1 min) during the runs: {min(loads):.1f}..{max(loads):.1f}; "
          f"{len(a.text)} characters, pieces of {a.piece_chars} every {a.interval} s")
    print("| mode | first audio p50 (s) | first audio max (s) | wall p50 (s) | audio p50 (s) |")
    print("|---|---|---|---|---|")
    p50 = {}
    for mode, rs in rows.items():
        firsts = [r["first"] for r in rs]
        p50[mode] = statistics.median(firsts)
        print(f"| {mode} | {p50[mode]:.3f} | {max(firsts):.3f} | "
              f"{statistics.median(r['wall'] for r in rs):.2f} | "
              f"{statistics.median(r['audio'] for r in rs):.2f} |")
    print(f"text-in / whole first audio (p50): {p50['text-in'] / p50['whole']:.2f}")


if __name__ == "__main__":
    main()
