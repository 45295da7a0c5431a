#!/usr/bin/env python
"""PyTorch eager fp32 baseline on the full-size synthetic CosyVoice-300M (not a test).

Fixed texts, forced speech-token counts (250 tokens = 5 s of audio), per-stage ms, LLM ms/token,
RTF, peak RSS. Prints a markdown table and writes JSON. Usage:

    python benchmarks/bench_torch.py [--model-dir D] [--tokens 250] [--threads 2] [--json out.json]

Without --model-dir it uses the embedded default model (created once, synthetic 300M).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

TEXTS = (
    ("zh", "中文女", "收到好友从远方寄来的生日礼物，那份意外的惊喜与深深的祝福让我心中充满了甜蜜的快乐。"),
    ("en", "英文女", "CosyVoice is a multilingual speech synthesis model that runs on ordinary servers."),
)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--backend", default="torch")
    ap.add_argument("--tokens", type=int, default=250)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", dest="json_path", default=None)
    args = ap.parse_args()

    from cosyvino import Synthesizer

    t0 = time.perf_counter()
    tts = Synthesizer(args.model_dir, backend=args.backend, num_threads=args.threads)
    load_s = time.perf_counter() - t0
    # warm-up (first calls allocate and pick kernels)
    tts.synthesize(TEXTS[1][2], TEXTS[1][1], seed=0, num_speech_tokens=10)
    rows = []
    for lang, speaker, text in TEXTS:
        audio = tts.synthesize(text, speaker, seed=0, num_speech_tokens=args.tokens)
        st = audio.stats["stages"]

        def ms(name):
            return 1000 * st.get(name, {}).get("seconds", 0.0)

        decode_calls = max(1, st.get("llm_decode", {}).get("calls", 1))
        rows.append({
            "lang": lang, "text_tokens": len(tts.frontend.segments(text)[0].token_ids),
            "speech_tokens": audio.stats["speech_tokens"],
            "audio_s": audio.stats["audio_seconds"],
            "text_encoder_ms": ms("text_encoder"), "llm_prefill_ms": ms("llm_prefill"),
            "llm_decode_ms": ms("llm_decode"),
            "llm_ms_per_token": ms("llm_decode") / decode_calls,
            "llm_sampling_ms": ms("llm_sampling"),
            "flow_encoder_ms": ms("flow_encoder"), "flow_estimator_ms": ms("flow_estimator"),
            "estimator_ms_per_call": ms("flow_estimator") / 10,
            "vocoder_ms": ms("vocoder"), "total_s": audio.stats["wall_seconds"],
            "rtf": audio.stats["rtf"],
        })
    result = {"backend": args.backend, "model_dir": tts.model_dir, "load_s": round(load_s, 2),
              "threads": args.threads, "peak_rss_mb": round(peak_rss_mb(), 1), "rows": rows}
    cols = ["lang", "text_tokens", "speech_tokens", "audio_s", "text_encoder_ms",
            "llm_prefill_ms", "llm_ms_per_token", "llm_sampling_ms", "flow_encoder_ms",
            "flow_estimator_ms", "estimator_ms_per_call", "vocoder_ms", "total_s", "rtf"]
    print(f"backend {args.backend}, load {load_s:.1f} s, peak RSS {result['peak_rss_mb']:.0f} MB")
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        print("| " + " | ".join(f"{r[c]:.1f}" if isinstance(r[c], float) else str(r[c])
                                for c in cols) + " |")
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as f:
            json.dump(result, f, ensure_ascii=False, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
