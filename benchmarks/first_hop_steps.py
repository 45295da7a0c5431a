"""The ``latency`` schedule's first hop (issue 14, first-chunk latency): its size in speech
tokens and its CFM Euler steps, against time to the first chunk and what they cost the audio.

A variant is ``HOP+OVERLAP:STEPS`` (e.g. ``15+6:10``): the first hop of ``HOP`` tokens plus
``OVERLAP`` overlap tokens (later hops double from ``HOP``), the mel cross-fade derived from the
overlap (``floor(OVERLAP x 22050 / 256 / 50)`` frames, so the faded frames belong to the overlap
tokens), the HiFT cache of the shipped schedule, and ``STEPS`` Euler steps for the first hop
only (``StreamConstants.first_hop_n_timesteps``; later hops and a lone final hop keep the
model's 10). Per variant, interleaved run by run on one loaded Synthesizer:

* first chunk: ``Synthesizer.stream`` of a one-sentence text, wall seconds to the first chunk
  (median and min of ``--runs``), LLM included;
* audio: the same fixed speech tokens and draws (token-to-wav, no LLM) streamed with the
  variant, against the whole-segment computation of those tokens and draws (``segment``):
  log-mel L1 and log-spectral distance (:mod:`cosyvino.quantize.metrics`) over the first
  chunk, within 5 frames of a join and over the whole utterance. Random-weight models
  (``cosyvino make-model``) give relative numbers only.

    python benchmarks/first_hop_steps.py --model-dir D/openvino-int8 --backend openvino \\
        [--plan plan.toml] [--variants 15+6:10,10+4:5] [--runs 5]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import numpy as np

from cosyvino import Synthesizer
from cosyvino.bench_extras import cpu_summary, join_mask, log_mel_frames
from cosyvino.families.cosyvoice1 import streaming
from cosyvino.quantize.metrics import log_spectral_distance, mel_l1
from cosyvino.request import StreamingOptions, SynthesisRequest

TEXT = "收到好友从远方寄来的生日礼物，那份意外的惊喜让我心中充满了甜蜜的快乐。"
MEL_FRAMES_PER_TOKEN = 22050 / 256 / 50  # v1: 50 speech tokens/s, 22.05 kHz, hop 256


def parse_variant(text: str, base: streaming.StreamConstants) -> streaming.StreamConstants:
    """``"HOP+OVERLAP:STEPS"`` -> the latency constants with that first hop (see the module
    docstring); raises ValueError on another spelling."""
    hops, _, steps = text.partition(":")
    hop, _, overlap = hops.partition("+")
    hop_n, overlap_n, steps_n = int(hop), int(overlap), int(steps or 10)
    if hop_n < 1 or overlap_n < 1 or steps_n < 1:
        raise ValueError(f"variant {text!r}: hop, overlap and steps must be >= 1")
    return dataclasses.replace(base, token_min_hop_len=hop_n, token_overlap_len=overlap_n,
                               mel_overlap_len=int(overlap_n * MEL_FRAMES_PER_TOKEN),
                               first_hop_n_timesteps=steps_n)


def stream_tokens(tts, tokens, spk, schedule):
    req = SynthesisRequest(speech_tokens=tokens, voice=spk, seed=1,
                           streaming=StreamingOptions(schedule))
    return list(tts.submit(req))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--backend", default="openvino")
    ap.add_argument("--plan", help="plan file: its backend options (threads, precisions)")
    ap.add_argument("--variants", default="15+6:10,10+4:10,10+4:5",
                    help="comma-separated HOP+OVERLAP:STEPS first hops")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=200, help="speech tokens of the audio check")
    a = ap.parse_args(argv)
    opts = {}
    if a.plan:
        from cosyvino.planner import load_plan

        plan = load_plan(a.plan)
        a.backend, opts = plan.backend, dict(plan.backend_options)
    shipped = streaming.LATENCY
    variants = {v: parse_variant(v, shipped) for v in a.variants.split(",")}
    tts = Synthesizer(a.model_dir, backend=a.backend, **opts)
    spk, sr = tts.speakers[0], tts.sample_rate
    first: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for name, constants in variants.items():  # warm-up, each variant once
            streaming.LATENCY = constants
            with tts.stream(TEXT, spk, seed=0, hop_schedule="latency") as s:
                next(iter(s))
        for r in range(a.runs):
            for name, constants in variants.items():
                streaming.LATENCY = constants
                t0 = time.perf_counter()
                with tts.stream(TEXT, spk, seed=r, hop_schedule="latency") as s:
                    next(iter(s))
                    first[name].append(time.perf_counter() - t0)
        tokens = np.random.default_rng(0).integers(0, 4096, a.tokens)
        ref = np.concatenate([c.samples for c in stream_tokens(tts, tokens, spk, "segment")])
        ref_mel = log_mel_frames(ref, sr)  # [80, T]
        audio = {}
        for name, constants in variants.items():
            streaming.LATENCY = constants
            audio[name] = stream_tokens(tts, tokens, spk, "latency")
    finally:
        streaming.LATENCY = shipped
    print(f"CPU: {cpu_summary()}; {a.backend} {a.model_dir}; {a.runs} runs per variant, "
          f"interleaved; audio: {a.tokens} fixed speech tokens vs their whole-segment audio")
    print()
    print("| first hop (tokens) | first-hop ODE steps | mel cross-fade (frames) "
          "| first chunk p50 / min (s) | first chunk (ms of audio) | mel L1 / LSD (dB) vs segment:"
          " first chunk | near joins | whole utterance |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, constants in variants.items():
        chunks = audio[name]
        mel = log_mel_frames(np.concatenate([c.samples for c in chunks]), sr)
        t = min(mel.shape[1], ref_mel.shape[1])
        r, m = ref_mel[:, :t], mel[:, :t]
        f = min(max(1, chunks[0].samples.size // 256), t)
        near = join_mask([c.samples.size for c in chunks], t)

        def dist(sel):
            return f"{mel_l1(r[:, sel], m[:, sel]):.4f} / {log_spectral_distance(r[:, sel], m[:, sel]):.2f}"

        hop = f"{constants.token_min_hop_len} + {constants.token_overlap_len}"
        print(f"| {hop} | {constants.first_hop_n_timesteps} | {constants.mel_overlap_len} | "
              f"{statistics.median(first[name]):.3f} / {min(first[name]):.3f} | "
              f"{1000 * chunks[0].samples.size / sr:.0f} | {dist(slice(0, f))} | "
              f"{dist(near)} | {dist(slice(0, t))} |")
    tts.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
