"""Calibration capture: real stage inputs recorded from the FP32 OpenVINO pipeline (no torch).

:func:`capture_calibration` synthesizes calibration texts with the fp32 IRs (backend
``openvino``, f32 compute, f32 KV cache, no blob cache) and records what each stage receives,
by wrapping methods of the loaded :class:`~cosyvino.backends.Stages` object (the shared
pipeline is not changed):

* ``estimator``: the batch-2 CFG call (row 0 conditional, row 1 unconditional) at every Euler
  step; kept per step in a reservoir, so a bounded subset still covers every ``t`` value;
* ``flow_encoder``: ``(token, embedding)`` per segment;
* ``llm``: whole utterances (prefix ``inputs_embeds`` [1, T, D], then one [1, 1, D] row per decode
  step, truncated to ``llm_steps``) in order, the first item of each flagged to reset the KV
  state (NNCF's ``nncf_reset_state`` key), so a stateful IR sees a real cache while NNCF collects
  statistics (INT4 AWQ / scale estimation);
* ``vocoder``: ``mel`` [1, 80, T] and the NSF ``source`` [1, 1, 256 T] per segment.

Subsets are chosen by reservoir sampling (Vitter's algorithm R) driven by ``seed``; synthesis
seeds come from the same seed, so a capture is a pure function of (IRs, texts, seed, limits).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError

#: NNCF dataset key that makes its OpenVINO engine reset a stateful model before an item
NNCF_RESET_STATE = "nncf_reset_state"
#: IR input names of the stages we capture, in the order of the Stages call arguments
ESTIMATOR_INPUTS = ("x", "mask", "mu", "t", "spks", "cond")
FLOW_ENCODER_INPUTS = ("token", "embedding")
#: exact f32 compute and KV cache, no blob cache (same options as the accuracy report)
F32_OPTIONS = {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}


@dataclass(frozen=True)
class CaptureLimits:
    """Upper bounds on what a capture keeps (memory is bounded by these, not by the texts).

    estimator: batch-2 estimator calls kept in total, spread evenly over the Euler steps
        (step k keeps ``estimator // n + (k < estimator % n)``; fewer than n leaves late steps
        out).
    flow_encoder: flow-encoder calls (one per segment) kept.
    llm_sequences: utterances kept for the LLM; llm_steps: decode rows kept per utterance.
    vocoder: segments whose (mel, source) are kept.
    """

    estimator: int = 120
    flow_encoder: int = 32
    llm_sequences: int = 8
    llm_steps: int = 32
    vocoder: int = 8

    def __post_init__(self):
        for name in ("estimator", "flow_encoder", "llm_sequences", "llm_steps", "vocoder"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise InputError(f"capture limit {name} must be a non-negative integer, "
                                 f"got {v!r}")


class Reservoir:
    """Uniform fixed-size sample of a stream (algorithm R, J. S. Vitter, "Random sampling with
    a reservoir", ACM TOMS 11(1), 1985). ``offer()`` says where the next item goes (or None),
    so the caller copies arrays only for items that are kept."""

    def __init__(self, capacity: int, rng: np.random.Generator):
        self.capacity = capacity
        self.items: list = []
        self.seen = 0
        self._rng = rng

    def offer(self) -> int | None:
        self.seen += 1
        if len(self.items) < self.capacity:
            self.items.append(None)
            return len(self.items) - 1
        j = int(self._rng.integers(self.seen))
        return j if j < self.capacity else None

    def add(self, item) -> None:
        slot = self.offer()
        if slot is not None:
            self.items[slot] = item


@dataclass
class Capture:
    """Recorded stage inputs (float32 / int64 numpy arrays, copies).

    estimator: dicts keyed by :data:`ESTIMATOR_INPUTS` (x/mu/cond [2, 80, T], mask [2, 1, T],
        t [2], spks [2, 80]); estimator_steps: the Euler step (0-based) of each.
    flow_encoder: dicts ``token`` int64 [1, N], ``embedding`` float32 [1, 192].
    llm: dicts ``inputs_embeds`` float32 [1, T, D], ``beam_idx`` int32 [1], and
        :data:`NNCF_RESET_STATE` (True on the first item of each utterance).
    vocoder: dicts ``mel`` float32 [1, 80, T], ``source`` float32 [1, 1, hop T].
    """

    seed: int
    text_ids: list[str]
    estimator: list[dict] = field(default_factory=list)
    estimator_steps: list[int] = field(default_factory=list)
    flow_encoder: list[dict] = field(default_factory=list)
    llm: list[dict] = field(default_factory=list)
    vocoder: list[dict] = field(default_factory=list)
    segments: int = 0

    def summary(self) -> dict:
        """Counts per stage and the Euler steps covered (JSON-able)."""
        return {"seed": self.seed, "texts": len(self.text_ids), "segments": self.segments,
                "estimator": len(self.estimator),
                "estimator_steps": sorted(set(self.estimator_steps)),
                "flow_encoder": len(self.flow_encoder),
                "llm_items": len(self.llm),
                "llm_sequences": sum(bool(d[NNCF_RESET_STATE]) for d in self.llm),
                "vocoder": len(self.vocoder), "bytes": self.nbytes()}

    def nbytes(self) -> int:
        return sum(int(v.nbytes) for group in (self.estimator, self.flow_encoder, self.llm,
                                               self.vocoder)
                   for d in group for v in d.values() if isinstance(v, np.ndarray))


class _RecordingSession:
    """Wraps an LLM session; records the inputs of the first ``1 + steps`` forwards."""

    def __init__(self, inner, steps: int, sink: list):
        self._inner = inner
        self._rows: list[np.ndarray] = []
        self._limit = 1 + steps
        self._sink = sink

    def forward(self, inputs_embeds):
        if len(self._rows) < self._limit:
            self._rows.append(np.array(inputs_embeds, np.float32, copy=True))
        return self._inner.forward(inputs_embeds)

    def reset(self):
        self._flush()
        self._inner.reset()

    def close(self):
        self._flush()
        self._inner.close()

    def _flush(self):
        if self._rows:
            self._sink.append(self._rows)
            self._rows = []


def _step_capacities(total: int, n_steps: int) -> list[int]:
    return [total // n_steps + (1 if k < total % n_steps else 0) for k in range(n_steps)]


def capture_calibration(conv_dir: str, texts: Sequence, *, seed: int = 0,
                        limits: CaptureLimits = CaptureLimits(),
                        num_threads: int | None = None, show_progress: bool = True,
                        speech_tokens: int | None = None, stages=None) -> Capture:
    """Synthesize ``texts`` with the fp32 converted dir ``conv_dir`` and record stage inputs.

    Args:
        conv_dir: an fp32 converted dir (or a model dir with ``openvino/``).
        texts: :class:`cosyvino.quantize.calibration.CalibrationText` items; each is synthesized whole
            (all its segments) with its speaker when the model has it, else the model's
            speakers in turn. When the limits keep no flow or vocoder inputs, only the LLM
            runs (speech tokens are sampled, nothing is vocoded).
        seed: drives the synthesis seeds (one per text) and the subset choice.
        limits: see :class:`CaptureLimits`.
        speech_tokens: force this many speech tokens per segment (bounds capture time on
            models that do not stop early); None = the LLM decides (EOS).
        stages: an already loaded fp32 openvino Stages (tests / reuse); None loads one.

    Returns:
        :class:`Capture`. Raises :class:`InputError` for no texts or a negative seed.
    """
    from tqdm import tqdm

    from ..synthesizer import Synthesizer

    if not texts:
        raise InputError("calibration capture needs at least one text")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    tts = (Synthesizer(conv_dir, backend="openvino", num_threads=num_threads, **F32_OPTIONS)
           if stages is None else synthesizer_for(stages))
    st = tts.stages
    root = np.random.default_rng(seed)
    text_seeds = root.integers(0, 2**31 - 1, size=len(texts))
    pick = np.random.default_rng(root.integers(0, 2**63 - 1))
    n_steps = tts.config.flow.cfm.n_timesteps
    est = [Reservoir(c, pick) for c in _step_capacities(limits.estimator, n_steps)]
    enc = Reservoir(limits.flow_encoder, pick)
    voc = Reservoir(limits.vocoder, pick)
    llm = Reservoir(limits.llm_sequences, pick)
    utterances: list[list[np.ndarray]] = []
    step = [0]

    hooked = ("estimate", "flow_encode", "vocoder_decode", "new_llm_session")
    orig = {name: getattr(st, name) for name in hooked}
    shadowed = {name: vars(st)[name] for name in hooked if name in vars(st)}

    def estimate(*args):
        k = min(step[0], n_steps - 1)
        step[0] += 1
        slot = est[k].offer()
        if slot is not None:
            est[k].items[slot] = {n: np.array(a, copy=True)
                                  for n, a in zip(ESTIMATOR_INPUTS, args)}
        return orig["estimate"](*args)

    def flow_encode(tokens, embedding):
        step[0] = 0  # a new segment's ODE starts after its flow encoder call
        slot = enc.offer()
        if slot is not None:
            enc.items[slot] = {"token": np.array(tokens, np.int64, copy=True),
                               "embedding": np.array(embedding, np.float32, copy=True)}
        return orig["flow_encode"](tokens, embedding)

    def vocoder_decode(mel, source):
        slot = voc.offer()
        if slot is not None:
            voc.items[slot] = {"mel": np.array(mel, np.float32, copy=True),
                               "source": np.array(source, np.float32, copy=True)}
        return orig["vocoder_decode"](mel, source)

    def new_llm_session():
        return _RecordingSession(orig["new_llm_session"](), limits.llm_steps, utterances)

    st.estimate, st.flow_encode = estimate, flow_encode
    st.vocoder_decode, st.new_llm_session = vocoder_decode, new_llm_session
    cap = Capture(seed=int(seed), text_ids=[t.id for t in texts])
    llm_only = not (limits.estimator or limits.flow_encoder or limits.vocoder)
    speakers = list(st.speakers)
    try:
        bar = tqdm(texts, desc="calibration capture", unit="text", file=sys.stderr,
                   disable=not show_progress)
        for i, item in enumerate(bar):
            speaker = (item.speaker if item.speaker in st.speakers
                       else speakers[i % len(speakers)])
            if llm_only:  # nothing downstream is kept: skip flow and vocoder
                rng = np.random.default_rng(int(text_seeds[i]))
                for seg in tts.frontend.segments(item.text):
                    tts.pipeline.generate_speech_tokens(
                        np.asarray(seg.token_ids, np.int64)[None, :], st.speakers[speaker],
                        rng, num_tokens=speech_tokens)
                    cap.segments += 1
            else:
                audio = tts.synthesize(item.text, speaker, seed=int(text_seeds[i]),
                                       num_speech_tokens=speech_tokens)
                cap.segments += int(audio.stats.get("segments", 1))
            # an utterance's rows are complete once its session closed: sample it now
            while utterances:
                llm.add(utterances.pop(0))
    finally:
        for name in hooked:  # the wrappers are instance attributes shadowing the methods
            if name in shadowed:
                setattr(st, name, shadowed[name])
            else:
                delattr(st, name)
    for k, res in enumerate(est):
        cap.estimator += res.items
        cap.estimator_steps += [k] * len(res.items)
    cap.flow_encoder = list(enc.items)
    cap.vocoder = list(voc.items)
    beam = np.zeros(1, np.int32)
    for rows in llm.items:
        for j, row in enumerate(rows):
            cap.llm.append({"inputs_embeds": row, "beam_idx": beam, NNCF_RESET_STATE: j == 0})
    return cap


def synthesizer_for(stages):
    """A :class:`~cosyvino.synthesizer.Synthesizer` around already loaded ``stages`` (no second
    model load; same wiring as its constructor)."""
    from ..frontend import TextFrontend
    from cosyvino.families.cosyvoice1.pipeline import Pipeline
    from ..synthesizer import Synthesizer

    tts = Synthesizer.__new__(Synthesizer)
    tts.model_dir = getattr(stages, "converted_dir", "")
    tts.backend_name = "openvino"
    tts.stages = stages
    tts.load_seconds = 0.0
    tts.config = stages.config
    tts.pipeline = Pipeline(stages)
    tts.frontend = TextFrontend()
    tts.set_max_parallel(1)
    return tts

