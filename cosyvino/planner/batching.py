"""The planner's batch dimension: how many concurrent requests' LLM decode steps one backend
call advances (``llm_batch``, continuous batching in :mod:`cosyvino.engine.batching`).

A decode step reads every LLM weight once, whatever the number of rows, and then does per-row
work (the row's K/V cache reads and its share of the MatMul FLOPs). So a step of ``B`` rows
costs about ``shared + B * per_row`` (:class:`StepCost`). The planner estimates both terms from
the model's decode profile (:meth:`cosyvino.families.base.ModelFamily.decode_profile`), the
served LLM weight precision and the stream's cores (:func:`estimate_step_cost`), or fits them
to step times ``cosyvino plan --tune`` measured (:func:`fit_step_cost`), and picks the largest
power-of-two batch the goal allows (:func:`choose_llm_batch`):

* latency: a batched step may cost at most :data:`LATENCY_STEP_RATIO` x a lone step, so every
  request in the batch still gets its tokens at >= 1/1.5 of its lone rate;
* throughput: double the batch while a doubling still raises the stream's requests per second
  by :data:`THROUGHPUT_MIN_GAIN`. Only the LLM part of a request batches (its flow and vocoder
  hops time-share the stream), so the gain of ``B`` rows is
  ``1 / ((1 - f) + f * ratio(B) / B)`` with ``f`` = :data:`LLM_WORK_FRACTION` (Amdahl's law).

Imports nothing heavy (no torch, no runtime).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..cpu_peaks import FMA_FLOP_PER_CYCLE
from ..families.base import DecodeProfile

#: memory bandwidth one core streams, GB/s: the numpy copy bandwidth ``cosyvino bench`` measures
#: on this project's 2-vCPU machines is ~20 GB/s (docs/performance.md, "LLM roofline")
PER_CORE_BANDWIDTH_GBS = 10.0
#: bandwidth ceiling of one socket, GB/s: 8 channels of DDR4-3200 give 204.8 GB/s in theory,
#: streaming copies reach ~75 % of it
SOCKET_BANDWIDTH_GBS = 150.0
#: fraction of the fp32 FMA peak a decode row's matrix-vector work reaches (the estimator's
#: large convolutions reach 13-22 %, docs/performance.md "estimator GFLOP/s"; a decode row's
#: MatMuls are smaller)
COMPUTE_EFFICIENCY = 0.2
#: clock assumed for the FMA peak (the probe does not read the clock; VMs report nominal ones)
NOMINAL_CLOCK_GHZ = 2.5
#: bytes per LLM weight by the served weight precision
WEIGHT_BYTES = {"int4": 0.5, "int8": 1.0, "fp16": 2.0, "bf16": 2.0, "fp32": 4.0}
#: K/V cache bytes relative to the fp32 cache the decode profile prices
KV_CACHE_SCALE = {"f32": 1.0, "fp32": 1.0, "bf16": 0.5, "f16": 0.5, "u8": 0.25}
#: latency goal: a batched step costs at most this many lone steps (issue 17's step target)
LATENCY_STEP_RATIO = 1.5
#: throughput goal: a doubling of the batch must raise requests per second by at least this
THROUGHPUT_MIN_GAIN = 1.15
#: the LLM decode's share of a request's work at batch 1: 7.0 of 12.1 s for 5 s of speech in
#: the served INT8 configuration (docs/performance.md, "Single-request speed")
LLM_WORK_FRACTION = 0.55
#: the largest batch the planner proposes (a bound on KV-cache memory and on the estimate's
#: validity, not a measured optimum)
MAX_PLANNED_BATCH = 16
#: CosyVoice-300M's decode profile (``CosyVoice1.decode_profile`` of the 300M preset): used
#: when the model is not on disk yet
DEFAULT_PROFILE = DecodeProfile(params=195_036_160, kv_bytes_per_position=114_688,
                                typical_positions=300)


@dataclass(frozen=True)
class StepCost:
    """Cost of one decode step of ``rows`` rows: ``shared_ms + rows * per_row_ms`` (ms).

    ``basis`` says where the numbers come from (an estimate's inputs or "measured")."""

    shared_ms: float
    per_row_ms: float
    basis: str

    def step_ms(self, rows: int) -> float:
        return self.shared_ms + rows * self.per_row_ms

    def ratio(self, rows: int) -> float:
        """Step cost of ``rows`` rows / a 1-row step."""
        return self.step_ms(rows) / self.step_ms(1)

    def tokens_per_s(self, rows: int) -> float:
        return 1e3 * rows / self.step_ms(rows)

    def request_gain(self, rows: int, llm_fraction: float = LLM_WORK_FRACTION) -> float:
        """Requests per second of a stream decoding ``rows`` requests in one batch / one at a
        time, when the LLM is ``llm_fraction`` of a request's work and the rest does not
        batch."""
        return 1.0 / ((1.0 - llm_fraction) + llm_fraction * self.ratio(rows) / rows)


def _fma_gflops_per_core(flags, cpu_model: str) -> float:
    flags = set(flags or ())
    if "avx512f" in flags:
        key = "avx512_amd" if "AMD" in (cpu_model or "") else "avx512"
    elif "avx2" in flags:
        key = "avx2"
    else:
        key = "sse"
    return FMA_FLOP_PER_CYCLE[key] * NOMINAL_CLOCK_GHZ


def estimate_step_cost(profile: DecodeProfile, weight_precision: str, cores: int, flags,
                       cpu_model: str = "", streams_per_socket: int = 1,
                       kv_cache: str = "f32") -> StepCost:
    """Estimated decode step cost on ``cores`` cores of one stream.

    shared = weight bytes / bandwidth; per row = (typical K/V cache bytes / bandwidth) +
    (2 FLOP per weight / (FMA peak x :data:`COMPUTE_EFFICIENCY`)). Bandwidth =
    ``cores`` x :data:`PER_CORE_BANDWIDTH_GBS`, at most the socket's
    :data:`SOCKET_BANDWIDTH_GBS` shared by ``streams_per_socket`` streams. ``kv_cache``: the
    cache precision (``f32``, ``bf16``, ``f16``, ``u8``).

    Raises:
        ValueError: unknown ``weight_precision`` / ``kv_cache``, or ``cores`` < 1.
    """
    if kv_cache not in KV_CACHE_SCALE:
        raise ValueError(f"unknown K/V cache precision {kv_cache!r}; one of "
                         f"{', '.join(KV_CACHE_SCALE)}")
    if weight_precision not in WEIGHT_BYTES:
        raise ValueError(f"unknown weight precision {weight_precision!r}; one of "
                         f"{', '.join(WEIGHT_BYTES)}")
    if cores < 1:
        raise ValueError(f"cores must be >= 1, got {cores}")
    bw = min(cores * PER_CORE_BANDWIDTH_GBS, SOCKET_BANDWIDTH_GBS / max(1, streams_per_socket))
    weights = profile.params * WEIGHT_BYTES[weight_precision]
    cache = profile.kv_bytes_per_position * profile.typical_positions * KV_CACHE_SCALE[kv_cache]
    gflops = cores * _fma_gflops_per_core(flags, cpu_model) * COMPUTE_EFFICIENCY
    shared = weights / (bw * 1e6)
    per_row = cache / (bw * 1e6) + 2 * profile.params / (gflops * 1e6)
    return StepCost(shared, per_row, f"estimated: {_mb(weights)} {weight_precision} weights "
                                     f"and {_mb(cache)} K/V cache per row at {bw:.0f} GB/s, "
                                     f"{2 * profile.params / 1e9:.3g} GFLOP per row at "
                                     f"{gflops:.0f} GFLOP/s")


def _mb(n: float) -> str:
    return f"{n / 1e6:.0f} MB" if n >= 1e7 else f"{n / 1e6:.3g} MB"


def fit_step_cost(step_ms: dict) -> StepCost:
    """Least-squares line through measured ``{rows: ms per step}`` (>= 2 batch sizes).

    Raises:
        ValueError: fewer than 2 distinct batch sizes, or a non-positive time."""
    points = sorted((int(b), float(t)) for b, t in step_ms.items())
    if len({b for b, _ in points}) < 2:
        raise ValueError(f"need step times for >= 2 batch sizes, got {step_ms!r}")
    if any(t <= 0 for _, t in points):
        raise ValueError(f"step times must be > 0 ms, got {step_ms!r}")
    n = len(points)
    mb = sum(b for b, _ in points) / n
    mt = sum(t for _, t in points) / n
    slope = sum((b - mb) * (t - mt) for b, t in points) / sum((b - mb) ** 2 for b, _ in points)
    slope = max(0.0, slope)
    shared = max(0.0, mt - slope * mb)
    if shared + slope <= 0:
        shared = points[0][1]
    shown = ", ".join(f"{b} rows {t:.1f} ms" for b, t in points)
    return StepCost(shared, slope, f"measured by --tune: {shown}")


def choose_llm_batch(cost: StepCost, goal: str, cap: int) -> tuple[int, str]:
    """The largest power-of-two batch <= ``cap`` (and :data:`MAX_PLANNED_BATCH`) the goal
    allows under ``cost`` -> (batch, reason).

    Raises:
        ValueError: unknown ``goal``."""
    if goal not in ("latency", "throughput"):
        raise ValueError(f"goal must be latency or throughput, got {goal!r}")
    limit = max(1, min(int(cap), MAX_PLANNED_BATCH))
    best = 1
    while best * 2 <= limit:
        nxt = best * 2
        if goal == "latency":
            ok = cost.ratio(nxt) <= LATENCY_STEP_RATIO
        else:
            ok = cost.request_gain(nxt) >= THROUGHPUT_MIN_GAIN * cost.request_gain(best)
        if not ok:
            break
        best = nxt
    if best == 1:  # nothing to compare a lone step with
        shape = "1 row per step"
    else:
        shape = (f"a step of {best} rows ~{cost.ratio(best):.2f}x a 1-row step, "
                 f"{cost.tokens_per_s(best) / cost.tokens_per_s(1):.2f}x its tokens/s, "
                 f"~{cost.request_gain(best):.2f}x the requests/s (LLM ~"
                 f"{LLM_WORK_FRACTION:.0%} of a request's work)")
    if goal == "latency":
        why = (f"latency: the largest batch whose step costs <= {LATENCY_STEP_RATIO:g}x a lone "
               f"step: {shape}")
    else:
        why = (f"throughput: doubled while requests/s rose >= {THROUGHPUT_MIN_GAIN:g}x: "
               f"{shape}")
    if best < limit:
        nxt = best * 2
        why += (f" ({nxt} rows: ~{cost.ratio(nxt):.2f}x a 1-row step)" if goal == "latency"
                else f" ({nxt} rows: ~{cost.request_gain(nxt) / cost.request_gain(best):.2f}x "
                     f"the requests/s of {best})")
    return best, f"{why}; {cost.basis}"
