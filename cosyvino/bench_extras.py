"""Parts of ``cosyvino bench`` beyond the per-stage table (:mod:`cosyvino.bench`): the ODE
step trade-off, the estimator's achieved rate against the CPU's peak for its precision (fp32
FMA, or int8 dot products for a static INT8 estimator; the peaks: :mod:`cosyvino.cpu_peaks`),
and a busy neighbour process. Must not import torch at module level.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys

from .cpu_peaks import (  # noqa: F401  (re-exported: the benchmark scripts import them here)
    AMX_INT8_OPS_PER_CYCLE, FMA_FLOP_PER_CYCLE, HEADER_ISA, VNNI_OPS_PER_FMA_FLOP,
    cpu_clock_mhz, cpu_summary, cpuinfo_field, estimator_peak, fma_peak_gflops, int8_peak_gops)


def estimator_gflop(config, frames: int) -> float | None:
    """FLOP of one estimator call of a CosyVoice v1 config at ``frames`` frames, in GFLOP (kept
    for the callers that hold a v1 config; ``cosyvino bench`` asks every family through
    :meth:`cosyvino.families.base.ModelFamily.estimator_cost`)."""
    from .families.cosyvoice1.flops import estimator_gflop as count

    return count(config, frames)


def measure_ode_steps(tts, text: str, speaker: str, tokens: int, steps,
                      runs: int = 2) -> list[dict]:
    """The speed/quality trade of the CFM step count: ``text`` with ``tokens`` forced speech
    tokens and seed 0 at the model's own step count (the reference) and at each of ``steps``;
    per step count the best (least) of ``runs`` runs' wall s, RTF and estimator ms (the
    machines are noisy), and the distance of the output's log-mel
    (:func:`cosyvino.frontend.features.prompt_mel` of the waveform) to the reference's: mel L1
    (natural-log units) and log-spectral distance (dB), :mod:`cosyvino.quantize.metrics`.
    Same seed and tokens, so only the flow's integration differs."""
    from .frontend.features import prompt_mel
    from .quantize.metrics import log_spectral_distance, mel_l1

    def run(n):
        best = None
        for _ in range(max(1, runs)):
            audio = tts.synthesize(text, speaker, seed=0, num_speech_tokens=tokens,
                                   n_timesteps=n)
            est = audio.stats["stages"].get("flow_estimator", {}).get("seconds", 0.0)
            row = {"total_s": audio.stats["wall_seconds"], "rtf": audio.stats["rtf"],
                   "estimator_ms": 1000 * est, "runs": max(1, runs)}
            if best is None or row["total_s"] < best["total_s"]:
                best = row
        return audio, best

    default = tts.config.flow.cfm.n_timesteps
    ref, ref_row = run(None)
    ref_mel = prompt_mel(ref.samples, ref.sample_rate)
    rows = [dict(ref_row, n_timesteps=default, mel_l1=0.0, lsd_db=0.0)]
    for n in steps:
        if n == default:
            continue
        audio, row = run(int(n))
        mel = prompt_mel(audio.samples, audio.sample_rate)
        rows.append(dict(row, n_timesteps=int(n), mel_l1=mel_l1(ref_mel, mel),
                         lsd_db=log_spectral_distance(ref_mel, mel)))
    return rows


#: frames on each side of a chunk join that count as "near the join" in the streaming
#: audio measures (benchmarks/stream_joins.py, benchmarks/first_hop_steps.py)
JOIN_FRAMES = 5


def log_mel_frames(wav, sample_rate: int):
    """Log-mel of a waveform for audio distances: float64 [80, T]
    (:func:`cosyvino.frontend.features.prompt_mel`, the flow prompt's mel; hop 256)."""
    import numpy as np

    from .frontend.features import prompt_mel

    return np.asarray(prompt_mel(wav, sample_rate), np.float64)[0]


def join_mask(chunk_samples, n_frames: int, width: int = JOIN_FRAMES, hop: int = 256):
    """bool [n_frames]: the mel frames within ``width`` frames of a join between consecutive
    chunks of ``chunk_samples`` samples each (a join at the frame its samples end in)."""
    import numpy as np

    near = np.zeros(n_frames, bool)
    for j in np.cumsum(list(chunk_samples))[:-1] // hop:
        near[max(0, j - width):min(n_frames, j + width)] = True
    return near


@contextlib.contextmanager
def busy_neighbour(cpu: int | None = None, limit_s: float = 3600.0):
    """A bounded busy-loop process (a noisy neighbour) on one CPU while the block runs.

    ``cpu``: the CPU it is pinned to (default: the last CPU this process may use); it spins
    for at most ``limit_s`` seconds and is killed when the block exits. Yields the CPU."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    cpu = allowed[-1] if cpu is None else cpu
    code = ("import os, time\n"
            f"os.sched_setaffinity(0, {{{cpu}}}) if hasattr(os, 'sched_setaffinity') else None\n"
            f"end = time.monotonic() + {float(limit_s)}\n"
            "while time.monotonic() < end:\n    pass\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield cpu
    finally:
        proc.kill()
        proc.wait(10)


def ode_markdown(results: list[dict]) -> str:
    """The "ODE steps" table of the backends that measured it (:func:`measure_ode_steps`)."""
    ok = [r for r in results if r.get("ode_steps")]
    if not ok:
        return ""
    runs = ok[0]["ode_steps"][0].get("runs", 1)
    lines = ["", "", f"ODE steps (`n_timesteps`; times: best of {runs} run(s); distances of the "
             "output's log-mel to the model's own step count, same seed and tokens):", "",
             "| backend | steps | total (s) | RTF | estimator (ms) | mel L1 | LSD (dB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in ok:
        for row in r["ode_steps"]:
            lines.append(f"| {r['label']} | {row['n_timesteps']} | {row['total_s']:.2f} | "
                         f"{row['rtf']:.3f} | {row['estimator_ms']:.0f} | {row['mel_l1']:.4f} | "
                         f"{row['lsd_db']:.3f} |")
    return "\n".join(lines)


def kernels_line(results: list[dict]) -> str:
    """One line per backend that reports its kernels: ``stage: ISA n, ...`` (heavy nodes)."""
    out = []
    for r in results:
        k = r.get("kernels")
        if not k:
            continue
        parts = [f"{stage} " + "/".join(f"{isa} {n}" for isa, n in v.items())
                 for stage, v in k.items() if v]
        out.append(f"kernels ({r['label']}; heavy nodes by ISA): " + "; ".join(parts))
    if out:
        out.append("(heavy nodes = convolutions, matmuls, attention; MLAS = the MLAS GEMM "
                   "library, which picks its ISA at run time; other = a kernel name without an "
                   "ISA; backends that do not report kernels, e.g. torch, have no line)")
    return "\n".join(out)


def neighbour_markdown(results: list[dict]) -> str:
    """Slowdown of each backend with a busy neighbour vs quiet (pairs ``X`` / ``X +neighbour``
    measured one after the other in this run)."""
    by = {r["label"]: r for r in results if "mean" in r}
    lines = []
    for label, r in by.items():
        loud = by.get(label + " +neighbour")
        if loud is None:
            continue
        q, n = r["mean"], loud["mean"]
        lines.append(f"| {label} | {n['total_s'] / q['total_s']:.2f}x | "
                     f"{n['llm_ms_per_token'] / q['llm_ms_per_token']:.2f}x | "
                     f"{n['estimator_ms_per_call'] / q['estimator_ms_per_call']:.2f}x | "
                     f"{n['vocoder_ms'] / q['vocoder_ms']:.2f}x |")
    if not lines:
        return ""
    return "\n".join(["", "", "With one busy neighbour process on one CPU (slowdown vs quiet, same "
                      "run):", "", "| backend | total | LLM ms/token | estimator ms/call | "
                      "vocoder |", "|---|---:|---:|---:|---:|", *lines])
