"""``cosyvino plan --tune``: a short, bounded benchmark of 2-6 candidate configurations on the
real model with the real :class:`~cosyvino.Synthesizer`, keeping the best.

The candidates are thread counts for every backend plus what the plan's backend proposes
(:meth:`cosyvino.backends.Backend.tuning_candidates`). The synthesizer class is a parameter:
the planner does not import :mod:`cosyvino.synthesizer` (which imports the planner).

The plan's own configuration also times batched LLM decode steps of 1-8 rows
(:func:`measure_llm_batch_steps`), which the planner's ``llm_batch`` decision then uses
instead of its estimate (:mod:`cosyvino.planner.batching`).

Each candidate loads the model, runs one warm-up synthesis (compilation, caches), then timed
syntheses of a short sentence with a forced number of speech tokens (same seed, same work for
every candidate) until its share of the time budget is used. Score: median wall seconds per
synthesis (goal latency) or streams / median wall seconds (goal throughput, an estimate: one
stream is measured). Candidates that fail are recorded with their error, never fatal.
"""

from __future__ import annotations

import gc
import logging
import math
import statistics
import time
from typing import Callable

from ..measurement_voice import measurement_voice
from .planfile import Plan
from .topology import Probe

TUNE_TEXT = "Hello, this is a short tuning sentence."
DEFAULT_TOKENS = 50          # per run: 1 s of audio at 50 tokens/s, 2 s at 25 (the family's rate)
MAX_CANDIDATES = 6


def candidates(plan: Plan, probe: Probe) -> list[dict]:
    """2-6 configurations around ``plan``: the plan itself, the quota's ceiling when
    fractional, fewer threads, then the plan's backend's own variants
    (:meth:`~cosyvino.backends.Backend.tuning_candidates`; OpenVINO: pinning off when the plan
    pins, bf16 where the CPU has it, the reference backend). A backend whose
    ``tuning_candidates`` raises adds none."""
    out = [{"label": "plan", "backend": plan.backend, "options": dict(plan.backend_options),
            "streams": plan.streams}]
    total = plan.total_threads

    def with_threads(n: int, label: str):
        opts = dict(plan.backend_options, num_threads=n)
        if "num_streams" in opts:
            opts["num_streams"] = max(1, min(opts["num_streams"], n))
        out.append({"label": label, "backend": plan.backend, "options": opts,
                    "streams": opts.get("num_streams", 1)})

    if probe.cpu_quota is not None and probe.cpu_quota % 1 > 1e-6:
        ceil_t = min(len(probe.affinity), math.ceil(probe.cpu_quota))
        if ceil_t > total:
            with_threads(ceil_t, f"threads={ceil_t} (quota ceil)")
    if total > 1:
        with_threads(max(1, total // 2) if total > 3 else total - 1,
                     f"threads={max(1, total // 2) if total > 3 else total - 1}")
    from ..plugins import backend_classes

    backend_cls = backend_classes().get(plan.backend)
    if backend_cls is not None:
        try:
            out.extend(dict(c) for c in backend_cls.tuning_candidates(plan, probe))
        except Exception as e:  # a plugin's proposals must not break tuning: measure the rest
            logging.getLogger("cosyvino.planner").warning(
                "backend %r: tuning_candidates raised %s: %s", plan.backend, type(e).__name__, e)
    if len(out) < 2:
        out.append({"label": "threads=1", "backend": plan.backend,
                    "options": dict(plan.backend_options, num_threads=1), "streams": 1})
    return out[:MAX_CANDIDATES]


#: batch sizes whose decode step ``--tune`` times (capped by the stages' ``max_llm_batch``)
BATCH_ROWS = (1, 2, 4, 8)
#: cached positions per row when timing batched steps (prefill length; the rows differ by 7
#: positions each, so the batch is left-padded as in serving)
BATCH_PREFIX = 150
BATCH_STEPS = 5


def measure_llm_batch_steps(stages, rows=BATCH_ROWS, prefix: int = BATCH_PREFIX,
                            steps: int = BATCH_STEPS) -> dict[int, float]:
    """Median ms per batched LLM decode step for each batch size in ``rows`` on loaded
    ``stages`` (the family's ``new_llm_session`` / ``new_llm_batch`` /
    ``embed_speech_tokens``): every row prefills its own session with ``prefix - 7 r``
    speech-token embeddings, joins one batch, then ``steps`` timed steps follow one warm-up
    step. {} when the stages cannot batch. Sizes above ``max_llm_batch`` are skipped."""
    import numpy as np

    cap = int(getattr(stages, "max_llm_batch", 1))
    if cap < 2 or not hasattr(stages, "new_llm_batch"):
        return {}
    out: dict[int, float] = {}
    for b in (r for r in rows if r <= cap):
        sessions, batch = [], stages.new_llm_batch()
        try:
            for r in range(b):
                n = max(2, prefix - 7 * r)
                s = stages.new_llm_session()
                sessions.append(s)
                s.forward(stages.embed_speech_tokens(
                    (np.arange(n, dtype=np.int64) % 97).reshape(1, -1)))
                batch.add(s)
            emb = stages.embed_speech_tokens(np.full((b, 1), 5, np.int64))
            batch.step(emb)
            times = []
            for _ in range(steps):
                t0 = time.perf_counter()
                batch.step(emb)
                times.append((time.perf_counter() - t0) * 1e3)
            out[b] = round(statistics.median(times), 3)
        finally:
            for row in range(len(sessions) - 1, -1, -1):
                try:
                    batch.remove(row)
                except Exception:  # a row that never joined: nothing to take out
                    pass
            for s in sessions:
                s.close()
    return out


#: mel frames of the estimator calls ``--tune`` times batched vs alone (a streaming hop of the
#: ``latency`` schedule is 36-110 frames; docs/performance.md "Batched estimator calls")
ESTIMATOR_FRAMES = 64
ESTIMATOR_REPEATS = 3


def measure_estimator_batch(stages, frames: int = ESTIMATOR_FRAMES,
                            repeats: int = ESTIMATOR_REPEATS) -> dict | None:
    """Two requests' estimator calls (batch 2 each, ``frames`` mel frames) run the way a
    server without estimator batching runs them, at the same time from two threads, against
    one batch-4 call (:class:`cosyvino.engine.rendezvous.CallRendezvous`), interleaved,
    ``repeats`` times after one warm-up each. Returns {frames, concurrent_ms, batched_ms,
    ratio (batched / concurrent; below 1 batching pays)}; None when the stages take one
    request per call (``max_estimator_batch`` < 2) or are not thread-safe."""
    import threading

    import numpy as np

    if int(getattr(stages, "max_estimator_batch", 1)) < 2 or not getattr(
            stages, "thread_safe", False):
        return None
    c = int(stages.config.flow.output_size)
    rng = np.random.default_rng(0)

    def args(batch):
        return (rng.standard_normal((batch, c, frames), dtype=np.float32),
                np.ones((batch, 1, frames), np.float32),
                rng.standard_normal((batch, c, frames), dtype=np.float32),
                np.full((batch,), 0.3, np.float32),
                rng.standard_normal((batch, c), dtype=np.float32),
                np.zeros((batch, c, frames), np.float32))

    a, b, both = args(2), args(2), args(4)

    def concurrent():
        t = threading.Thread(target=stages.estimate, args=b)
        t.start()
        stages.estimate(*a)
        t.join()

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    timed(concurrent)
    timed(lambda: stages.estimate(*both))
    conc, bat = [], []
    for _ in range(repeats):
        conc.append(timed(concurrent))
        bat.append(timed(lambda: stages.estimate(*both)))
    cm, bm = statistics.median(conc), statistics.median(bat)
    return {"frames": frames, "concurrent_ms": round(cm, 2), "batched_ms": round(bm, 2),
            "ratio": round(bm / cm, 3)}


def _measure(synthesizer, cand: dict, model_dir: str | None, tokens: int, deadline: float,
             slice_s: float, batch_steps: bool = False) -> dict:
    res = {k: cand[k] for k in ("label", "backend", "options", "streams")}
    t0 = time.perf_counter()
    synth = synthesizer(model_dir, backend=cand["backend"], **cand["options"])
    try:
        res["load_s"] = round(time.perf_counter() - t0, 3)
        # a built-in speaker, else a stand-in prompt voice, not stored (a model may have none)
        speaker = measurement_voice(synth)
        synth.synthesize(TUNE_TEXT, speaker, seed=0, num_speech_tokens=max(5, tokens // 2))
        walls, audio_s = [], 0.0
        start = time.perf_counter()
        while True:
            a = synth.synthesize(TUNE_TEXT, speaker, seed=0, num_speech_tokens=tokens)
            walls.append(a.stats["wall_seconds"])
            audio_s = a.duration
            now = time.perf_counter()
            if len(walls) >= 5 or now - start >= slice_s or now >= deadline:
                break
        wall = statistics.median(walls)
        res.update(wall_s=round(wall, 4), runs=len(walls), audio_s=round(audio_s, 3),
                   rtf=round(wall / audio_s, 4) if audio_s else None, status="ok")
        if batch_steps:  # part of the first candidate, which always runs (a few steps)
            try:
                res["llm_batch_steps"] = {str(k): v for k, v in
                                          measure_llm_batch_steps(synth.stages).items()}
            except Exception as e:  # a failed batch measurement leaves the estimate in charge
                res["llm_batch_steps_error"] = f"{type(e).__name__}: {e}"
            try:
                est = measure_estimator_batch(synth.stages)
                if est is not None:
                    res["estimator_batch"] = est
            except Exception as e:  # the rule then decides without a measurement
                res["estimator_batch_error"] = f"{type(e).__name__}: {e}"
    finally:
        synth.stages.close()
        del synth
        gc.collect()
    return res


def tune(plan: Plan, probe: Probe, model_dir: str | None, *, synthesizer,
         seconds: float = 120.0, tokens: int = DEFAULT_TOKENS,
         say: Callable[[str], None] | None = None) -> dict:
    """Measure :func:`candidates` within ``seconds`` (the first candidate always runs).

    ``synthesizer`` is the class (or factory) to measure with, called as
    ``synthesizer(model_dir, backend=NAME, **options)``: :class:`cosyvino.Synthesizer`.

    Returns the ``tuning`` record: {seconds, tokens, llm_batch_steps ({rows: ms per batched
    decode step} of the plan's configuration, :func:`measure_llm_batch_steps`; keys are strings
    for TOML), estimator_batch (:func:`measure_estimator_batch` of the plan's configuration,
    when its stages batch estimator calls), goal, candidates: [...], best, best_index, bf16_faster}. ``best`` is None when nothing could be measured.
    """
    say = say or (lambda m: None)
    cands = candidates(plan, probe)
    start = time.perf_counter()
    deadline = start + seconds
    slice_s = max(1.0, seconds / (2 * len(cands)))
    results: list[dict] = []
    for i, cand in enumerate(cands):
        remaining = deadline - time.perf_counter()
        est = (results[0].get("load_s", 0) + 2 * (results[0].get("wall_s") or 0)) \
            if results and results[0].get("status") == "ok" else 0
        if i > 0 and remaining < max(1.0, est):
            results.append({k: cand[k] for k in ("label", "backend", "options", "streams")}
                           | {"status": "skipped: --tune-seconds budget used"})
            continue
        say(f"tune {i + 1}/{len(cands)}: {cand['label']}")
        try:
            r = _measure(synthesizer, cand, model_dir, tokens, deadline, slice_s,
                         batch_steps=(i == 0))
        except Exception as e:  # a failing candidate is a result, not a crash
            r = {k: cand[k] for k in ("label", "backend", "options", "streams")}
            r["status"] = f"failed: {type(e).__name__}: {e}"
        for key in ("bf16", "pinning"):
            if key in cand:
                r[key] = cand[key]
        results.append(r)

    def score(r):
        if r.get("status") != "ok":
            return None
        return r["wall_s"] if plan.goal == "latency" else -r["streams"] / r["wall_s"]

    ok = [(score(r), i) for i, r in enumerate(results) if score(r) is not None]
    best_i = min(ok)[1] if ok else None
    f32 = next((r for r in results if r.get("label") == "plan" and r.get("status") == "ok"), None)
    b16 = next((r for r in results if r.get("bf16") and r.get("status") == "ok"), None)
    steps = results[0].get("llm_batch_steps") if results else None
    est = results[0].get("estimator_batch") if results else None
    return {"seconds": round(time.perf_counter() - start, 2), "tokens": tokens,
            "llm_batch_steps": dict(steps or {}),
            **({"estimator_batch": dict(est)} if est else {}),
            "goal": plan.goal, "candidates": results,
            "best": results[best_i]["label"] if best_i is not None else None,
            "best_index": best_i,
            "bf16_faster": bool(f32 and b16 and b16["wall_s"] < 0.95 * f32["wall_s"])}


#: override keyword -> names of the decisions it sets
_DECISIONS_OF = {"threads": ("threads_override",), "pinning": ("pinning",),
                 "streams": ("streams", "threads_per_stream"),
                 "precision": ("compute_precision",), "sessions": ("max_sessions",),
                 "queue": ("queue_size",), "llm_batch": ("llm_batch",),
                 "estimator_batch": ("estimator_batch",)}


def apply_tuning(plan: Plan, probe: Probe, model_dir: str | None, tuning: dict,
                 **overrides) -> Plan:
    """Re-plan with the measured winner (backend, thread count, precision) and the tuning
    record attached; decisions taken from the measurement say so in their reason."""
    from .rules import make_plan

    best = tuning["candidates"][tuning["best_index"]] if tuning.get("best_index") is not None \
        else None
    kw = dict(overrides)
    if best is not None and best["label"] != "plan":
        if best["backend"] != plan.backend:
            kw.setdefault("backend", best["backend"])
        if best["options"].get("num_threads") != plan.total_threads:
            kw.setdefault("threads", best["options"].get("num_threads"))
        if best.get("bf16"):
            kw.setdefault("precision", "bf16")
        if best.get("pinning") is False:
            kw.setdefault("pinning", False)
    new = make_plan(probe, model_dir=model_dir, goal=plan.goal, tuned=tuning, **kw)
    user = {n for k in overrides if overrides[k] is not None for n in _DECISIONS_OF.get(k, (k,))}
    if best is not None and best["label"] != "plan":
        base = tuning["candidates"][0]
        vs = (f" vs {base['wall_s']:.3f} s for the first plan" if base.get("wall_s") is not None
              else "")
        for d in new.decisions:
            if "(override)" in d["reason"] and d["name"] not in user:
                d["reason"] = (f"--tune: candidate {best['label']!r} measured best "
                               f"({best['wall_s']:.3f} s/run{vs}; see [tuning])")
    return new
