"""What the token-hop joins do to the audio: log-mel distance of streamed audio against the
whole-segment computation of the same speech tokens and the same draws.

For a fixed list of speech tokens (token-to-wav, no LLM), the ``segment`` schedule is the
official non-streaming audio; ``official`` and ``latency`` streams cut it into hops whose flow
and vocoder see only part of the segment. The engine draws the CFM noise by mel frame and the
NSF noise by sample on the segment's time line, so the three runs start from the same noise:
what differs is the limited context at the joins. Printed per schedule: mean |log-mel
difference| over the whole utterance and within +-5 frames of each join, chunk count and first
chunk size. Random-weight models (``cosyvino make-model``) give relative numbers only.

    python benchmarks/stream_joins.py [--model-dir DIR] [--backend torch] [--tokens 400]
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from cosyvino import Synthesizer
from cosyvino.bench_extras import JOIN_FRAMES, cpu_summary, join_mask, log_mel_frames
from cosyvino.request import StreamingOptions, SynthesisRequest



def run(tts: Synthesizer, tokens: np.ndarray, schedule: str, speaker: str, seed: int):
    req = SynthesisRequest(speech_tokens=tokens, voice=speaker, seed=seed,
                           streaming=StreamingOptions(schedule))
    chunks = list(tts.submit(req))
    return chunks, np.concatenate([c.samples for c in chunks])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=None,
                    help="model dir (default: the tiny test fixture)")
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--tokens", type=int, default=400)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args(argv)
    if a.model_dir is None:
        import cosyvino.testing  # noqa: PLC0415

        a.model_dir = os.path.join(os.path.dirname(cosyvino.testing.__file__), "fixtures",
                                   "tiny-a")
    tts = Synthesizer(a.model_dir, backend=a.backend)
    sr = tts.sample_rate
    spk = tts.speakers[0]
    rows = {}
    for seed in range(a.seeds):
        tokens = np.random.default_rng(seed).integers(0, 4096, a.tokens)
        _, ref = run(tts, tokens, "segment", spk, seed)
        ref_mel = log_mel_frames(ref, sr).T  # [T, 80]
        for schedule in ("official", "latency", "segment, another seed"):
            if schedule.startswith("segment"):  # the scale: same tokens, other draws
                chunks, wav = run(tts, tokens, "segment", spk, seed + 1000)
            else:
                chunks, wav = run(tts, tokens, schedule, spk, seed)
            mel = log_mel_frames(wav, sr).T
            n = min(len(mel), len(ref_mel))
            diff = np.abs(mel[:n] - ref_mel[:n]).mean(axis=1)
            near = join_mask([c.samples.size for c in chunks], n)
            r = rows.setdefault(schedule, {"all": [], "joins": [], "away": [], "chunks": 0,
                                           "first": 0.0, "len": []})
            r["all"].append(diff.mean())
            r["joins"].append(diff[near].mean() if near.any() else 0.0)
            r["away"].append(diff[~near].mean() if (~near).any() else 0.0)
            r["chunks"] = len(chunks)
            r["first"] = chunks[0].duration
            r["len"].append(wav.size - ref.size)
    print(f"model {a.model_dir}, {a.tokens} tokens, {a.seeds} seeds, backend {a.backend}, "
          f"CPU: {cpu_summary()}")
    print("| schedule | chunks | first chunk (s) | mean abs log-mel diff vs segment: all | "
          f"within {JOIN_FRAMES} frames of a join | away from joins | length diff (samples) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for schedule, r in rows.items():
        print(f"| {schedule} | {r['chunks']} | {r['first']:.2f} | {np.mean(r['all']):.4f} | "
              f"{np.mean(r['joins']):.4f} | {np.mean(r['away']):.4f} | "
              f"{int(np.mean(r['len']))} |")
    tts.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
