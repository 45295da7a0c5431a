"""Fewer CFM Euler steps for the first streamed hop only (issue 14, first-chunk latency):
time to the first chunk, and what it costs the audio.

The ``latency`` hop schedule's first hop (21 speech tokens) is what a listener waits for; its
flow is 10 estimator calls. ``StreamConstants.first_hop_n_timesteps`` solves only that hop's
ODE with fewer steps (later hops and a lone final hop keep the model's 10). Per variant
(``--steps``, e.g. ``10,5,3``), interleaved run by run on one loaded Synthesizer:

* first chunk: ``Synthesizer.stream`` of a one-sentence text, wall seconds to the first chunk
  (median of ``--runs``), LLM included;
* audio: the same fixed speech tokens and draws streamed with each variant (token-to-wav, no
  LLM): log-mel L1 and log-spectral distance (:mod:`cosyvino.quantize.metrics`, the bench's
  ODE-step measures) against the 10-step stream over the first chunk and over the whole
  utterance (random-weight models give relative numbers only).

    python benchmarks/first_hop_steps.py --model-dir D/openvino-int8 --backend openvino \\
        [--plan plan.toml] [--steps 10,5,3] [--runs 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import numpy as np

from cosyvino import Synthesizer
from cosyvino.bench_extras import cpu_summary
from cosyvino.families.cosyvoice1 import streaming
from cosyvino.frontend.features import prompt_mel
from cosyvino.quantize.metrics import log_spectral_distance, mel_l1
from cosyvino.request import StreamingOptions, SynthesisRequest

TEXT = "收到好友从远方寄来的生日礼物，那份意外的惊喜让我心中充满了甜蜜的快乐。"


def set_first_hop_steps(n: int | None) -> None:
    streaming.LATENCY = dataclasses.replace(streaming.LATENCY, first_hop_n_timesteps=n)


def log_mel(wav: np.ndarray, sr: int) -> np.ndarray:
    return np.asarray(prompt_mel(wav, sr), np.float64)[0].T  # [T, 80]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--backend", default="openvino")
    ap.add_argument("--plan", help="plan file: its backend options (threads, precisions)")
    ap.add_argument("--steps", default="10,5,3")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=200, help="speech tokens of the audio check")
    a = ap.parse_args(argv)
    opts = {}
    if a.plan:
        from cosyvino.planner import load_plan

        plan = load_plan(a.plan)
        a.backend, opts = plan.backend, dict(plan.backend_options)
    tts = Synthesizer(a.model_dir, backend=a.backend, **opts)
    spk, sr = tts.speakers[0], tts.sample_rate
    variants = [int(s) for s in a.steps.split(",")]
    default = tts.config.flow.cfm.n_timesteps
    first: dict[int, list[float]] = {v: [] for v in variants}
    for n in variants:  # warm-up, each variant once
        set_first_hop_steps(n)
        with tts.stream(TEXT, spk, seed=0, hop_schedule="latency") as s:
            next(iter(s))
    for r in range(a.runs):
        for n in variants:
            set_first_hop_steps(n)
            t0 = time.perf_counter()
            with tts.stream(TEXT, spk, seed=r, hop_schedule="latency") as s:
                next(iter(s))
                first[n].append(time.perf_counter() - t0)
    tokens = np.random.default_rng(0).integers(0, 4096, a.tokens)
    audio = {}
    for n in variants:
        set_first_hop_steps(n)
        req = SynthesisRequest(speech_tokens=tokens, voice=spk, seed=1,
                               streaming=StreamingOptions("latency"))
        chunks = list(tts.submit(req))
        audio[n] = (chunks[0].samples.size, np.concatenate([c.samples for c in chunks]))
    ref_first, ref = audio[default] if default in audio else audio[variants[0]]
    ref_mel = log_mel(ref, sr)
    print(f"CPU: {cpu_summary()}; {a.backend} {a.model_dir}; "
          f"{a.runs} runs per variant, interleaved")
    print()
    print("| first-hop ODE steps | first chunk p50 (s) | min (s) | first chunk: mel L1 / LSD (dB) "
          "| whole utterance: mel L1 / LSD (dB) |")
    print("|---:|---:|---:|---:|---:|")
    n_first = max(1, ref_first // 256)
    for n in variants:
        mel = log_mel(audio[n][1], sr)
        t = min(len(mel), len(ref_mel))
        r, m = ref_mel[:t].T, mel[:t].T  # [80, T]
        f = min(n_first, t)
        print(f"| {n} | {statistics.median(first[n]):.3f} | {min(first[n]):.3f} | "
              f"{mel_l1(r[:, :f], m[:, :f]):.4f} / {log_spectral_distance(r[:, :f], m[:, :f]):.2f}"
              f" | {mel_l1(r, m):.4f} / {log_spectral_distance(r, m):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
