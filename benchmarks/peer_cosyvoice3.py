"""CosyVoice3 side by side with a peer runtime on the same checkpoint (issue 37 item 4).

Runs, on one official-layout CosyVoice3 dir (e.g. a synthetic full-size one from
``cosyvino make-model --family cosyvoice3 --preset 0.5b``) and with the same thread count:

* our torch backend on the dir, and our OpenVINO backend on its converted dir (``--ov-dir``,
  from ``cosyvino convert``; the served plan's backend): per stage (LLM prefill, LLM ms per
  token, DiT estimator, vocoder), wall time, RTF, and the first chunk of a stream (``latency``
  hop schedule);
* the peer ``cosyvoice.cpp`` (Lourdle/cosyvoice.cpp, C++/GGML): its ``cosyvoice-cli`` binary
  (``--peer-bin``, built by the user; not part of cosyvino) on its GGUF conversion of the SAME
  dir (``--peer-model``, made by the peer's own ``convert_model_to_gguf.py``), wall time and RTF
  of a one-shot run (its non-interactive CLI does not stream), its own log lines kept.

The peer needs a ``prompt_speech`` GGUF (its ONNX frontend is not built here): this script
writes one (``feat`` [frames, 80] f32, ``embedding`` [1, 192] f32 = the dir's first SFT
speaker, ``tokens`` int32, ``text`` int8; the layout of the peer's
``cosyvoice_prompt_speech_save_to_file``) with a short random prompt, and runs the peer in
``cross-lingual`` mode (the prompt's tokens and mel condition the flow, not the LLM). Our runs
use the SFT speaker (no prompt). Audio differs (random weights, different samplers); what is
compared is time per second of audio.

    python benchmarks/peer_cosyvoice3.py --model-dir /tmp/v3-0.5b --ov-dir /tmp/v3-0.5b/openvino \\
        --peer-bin /path/to/cosyvoice-cli --peer-model /tmp/v3-0.5b.gguf [--threads 2]

Prints markdown tables with the CPU and the load average; a peer that fails is reported with
its exit status and the tail of its output (not skipped silently).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TEXT = ("CosyVoice is a multilingual speech synthesis model that runs on ordinary servers, "
        "and this sentence is long enough for a few seconds of audio.")


def write_prompt_speech(path: str, embedding: np.ndarray, *, tokens: int = 25,
                        seed: int = 0) -> None:
    """The peer's prompt_speech GGUF (module docstring) with ``tokens`` random speech tokens
    and ``2 * tokens`` mel frames of a quiet random log-mel."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "cosyvoice-prompt-speech")
    w.add_tensor("feat", (rng.standard_normal((2 * tokens, 80)) - 6).astype(np.float32))
    w.add_tensor("embedding", embedding.reshape(1, -1).astype(np.float32))
    w.add_tensor("tokens", rng.integers(0, 6561, tokens).astype(np.int32))
    w.add_tensor("text", np.frombuffer(b"Hello.", dtype=np.int8).copy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def ours(model_dir: str, backend: str, threads: int, seed: int, options: dict,
         tokens: int | None = None) -> dict:
    from cosyvino import Synthesizer

    t0 = time.perf_counter()
    tts = Synthesizer(model_dir, backend=backend, num_threads=threads, voices_dir=False,
                      **options)
    load_s = time.perf_counter() - t0
    try:
        speaker = tts.speakers[0]
        tts.synthesize("Warm up.", speaker, seed=seed)
        audio = tts.synthesize(TEXT, speaker, seed=seed, num_speech_tokens=tokens)
        st = audio.stats["stages"]

        def ms(name):
            return 1000 * st.get(name, {}).get("seconds", 0.0)

        calls = max(1, st.get("llm_decode", {}).get("calls", 1))
        t0 = time.perf_counter()
        first = None
        streamed = 0.0
        for chunk in tts.stream(TEXT, speaker, seed=seed, hop_schedule="latency",
                                num_speech_tokens=tokens):
            if first is None:
                first = time.perf_counter() - t0
            streamed += chunk.samples.size / chunk.sample_rate
        return {"load_s": load_s, "tokens": audio.stats["speech_tokens"],
                "audio_s": audio.stats["audio_seconds"], "llm_prefill_ms": ms("llm_prefill"),
                "llm_ms_per_token": ms("llm_decode") / calls,
                "estimator_ms": ms("flow_estimator"), "vocoder_ms": ms("vocoder"),
                "wall_s": audio.stats["wall_seconds"], "rtf": audio.stats["rtf"],
                "first_chunk_s": first, "stream_audio_s": streamed}
    finally:
        tts.close()


def peer(binary: str, model: str, prompt: str, threads: int, seed: int, out_dir: str) -> dict:
    import soundfile as sf

    out = os.path.join(out_dir, "peer.wav")
    cmd = [binary, "--model", model, "--prompt-speech", prompt, "--text", TEXT, "--output", out,
           "--cpu", "--threads", str(threads), "--seed", str(seed), "--mode", "cross-lingual"]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False)
    wall = time.perf_counter() - t0
    log = (proc.stdout + proc.stderr).strip().splitlines()
    row = {"cmd": " ".join(cmd), "rc": proc.returncode, "wall_s": wall, "log": log[-25:]}
    if proc.returncode == 0 and os.path.isfile(out):
        info = sf.info(out)
        row["audio_s"] = info.frames / info.samplerate
        row["rtf"] = wall / row["audio_s"] if row["audio_s"] else float("nan")
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--ov-dir", default=None, help="the dir converted by `cosyvino convert`")
    ap.add_argument("--peer-bin", default=None, help="cosyvoice.cpp's cosyvoice-cli")
    ap.add_argument("--peer-model", default=None, help="the peer's GGUF of --model-dir")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--tokens", type=int, default=None,
                    help="force this many speech tokens in our runs (the peer samples its own)")
    args = ap.parse_args(argv)

    from cosyvino.bench_extras import cpu_summary

    print(f"CPU: {cpu_summary()}; threads {args.threads}; load average {os.getloadavg()}")
    rows = {}
    if not args.skip_torch:
        rows["cosyvino torch (fp32)"] = ours(args.model_dir, "torch", args.threads, args.seed, {},
                                               args.tokens)
    if args.ov_dir:
        rows["cosyvino OpenVINO (f32 IRs, plan defaults)"] = ours(
            args.ov_dir, "openvino", args.threads, args.seed, {}, args.tokens)
    peer_row = None
    if args.peer_bin:
        from cosyvino.families.cosyvoice23.speakers import load_spk2info

        spk = next(s for s in load_spk2info(os.path.join(args.model_dir, "spk2info.pt")).values()
                   if s.embedding is not None)
        with tempfile.TemporaryDirectory() as tmp:
            prompt = os.path.join(tmp, "prompt_speech.gguf")
            write_prompt_speech(prompt, np.asarray(spk.embedding, np.float32))
            peer_row = peer(args.peer_bin, args.peer_model, prompt, args.threads, args.seed, tmp)
    print()
    print("| runtime | load s | speech tokens | audio s | LLM prefill ms | LLM ms/token "
          "| DiT estimator ms | vocoder ms | wall s | RTF | first chunk s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['load_s']:.1f} | {r['tokens']} | {r['audio_s']:.2f} | "
              f"{r['llm_prefill_ms']:.0f} | {r['llm_ms_per_token']:.1f} | "
              f"{r['estimator_ms']:.0f} | {r['vocoder_ms']:.0f} | {r['wall_s']:.2f} | "
              f"{r['rtf']:.2f} | {r['first_chunk_s']:.2f} |")
    if peer_row is not None:
        if "rtf" in peer_row:
            print(f"| cosyvoice.cpp (GGUF f32) | - | - | {peer_row['audio_s']:.2f} | - | - | - | - "
                  f"| {peer_row['wall_s']:.2f} (incl. load) | {peer_row['rtf']:.2f} | "
                  "not streamed (CLI) |")
        else:
            print(f"| cosyvoice.cpp | failed: exit {peer_row['rc']} | | | | | | | "
                  f"{peer_row['wall_s']:.1f} | | |")
        print()
        print(f"peer command: `{peer_row['cmd']}`")
        print("peer output (tail):")
        for line in peer_row["log"]:
            print(f"    {line}")
    print()
    print(f"load average after: {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
