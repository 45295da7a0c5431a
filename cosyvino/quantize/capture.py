"""Calibration capture: real graph inputs recorded from the FP32 OpenVINO pipeline (no torch).

:func:`capture_calibration` synthesizes calibration texts with the fp32 IRs (backend
``openvino``, f32 compute, f32 KV cache, no blob cache) through a normal
:class:`~cosyvino.synthesizer.Synthesizer` built around :class:`RecordingStages`: stages that
delegate every call to the loaded ones and record what the captured graphs receive, keyed by
the graphs' input names in the v1 graph table (:mod:`cosyvino.families.cosyvoice1.graphs`):

* ``estimator``: the batch-2 CFG call (row 0 conditional, row 1 unconditional) at every Euler
  step; kept per step in a reservoir, so a bounded subset still covers every ``t`` value;
* ``flow_encoder``: ``(token, embedding)`` per segment;
* ``llm``: whole utterances (prefix ``inputs_embeds`` [1, T, D], then one [1, 1, D] row per decode
  step, truncated to ``llm_steps``) in order, the first item of each flagged to reset the KV
  state (NNCF's ``nncf_reset_state`` key), so a stateful IR sees a real cache while NNCF collects
  statistics (INT4 AWQ / scale estimation);
* ``vocoder``: the ``hift_decode`` inputs, ``mel`` [1, 80, T] and the NSF ``source``
  [1, 1, 256 T], per segment.

Subsets are chosen by reservoir sampling (Vitter's algorithm R) driven by ``seed``; synthesis
seeds come from the same seed, so a capture is a pure function of (IRs, texts, seed, limits).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..errors import InputError
from ..families import GraphSpec, GraphTable
from ..families.cosyvoice1.graphs import graph_table, reference_table
from ..families.cosyvoice1.stages import CosyVoice1Stages, LLMSession

#: NNCF dataset key that makes its OpenVINO engine reset a stateful model before an item
NNCF_RESET_STATE = "nncf_reset_state"
#: the stateful LLM IR's reorder input (:data:`cosyvino.export.openvino.stateful.BEAM_IDX`;
#: not a graph-table tensor, and that module cannot be imported without torch)
BEAM_IDX = "beam_idx"
#: input names of the estimator / flow encoder graphs (the same in every v1 config), in the
#: order of the Stages call arguments: the keys of :attr:`Capture.estimator` /
#: :attr:`Capture.flow_encoder` items
ESTIMATOR_INPUTS = tuple(reference_table()["estimator"].input_names)
FLOW_ENCODER_INPUTS = tuple(reference_table()["flow_encoder"].input_names)
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
    """Recorded graph inputs (numpy copies in the graph table's dtypes), each a dict keyed by
    the graph's input names (IR input names: what NNCF datasets are keyed by).

    estimator: ``estimator`` inputs, keys :data:`ESTIMATOR_INPUTS` (x/mu/cond float32
        [2, 80, T], mask [2, 1, T], t [2], spks [2, 80]); estimator_steps: the Euler step
        (0-based) of each.
    flow_encoder: ``flow_encoder`` inputs, ``token`` int64 [1, N], ``embedding`` float32
        [1, 192].
    llm: the stateful LLM IR's inputs: ``inputs_embeds`` float32 [1, T, D],
        ``attention_mask`` float32 [1, P+T] (ones: P cached positions before the item),
        ``pos_offset`` / ``pos_keys.{l}`` (:class:`cosyvino.families.cosyvoice1.positional.
        PositionalKeys`; the tables are shared between items, not copies),
        :data:`BEAM_IDX` int32 [1], and :data:`NNCF_RESET_STATE` (True on the first item of
        each utterance).
    vocoder: ``hift_decode`` inputs, ``mel`` float32 [1, 80, T], ``source`` float32
        [1, 1, hop T] (``hift_f0`` takes the ``mel``).
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
        """Bytes of the recorded arrays, each shared array (the LLM's positional tables)
        counted once."""
        seen: dict[int, int] = {}
        for group in (self.estimator, self.flow_encoder, self.llm, self.vocoder):
            for d in group:
                for v in d.values():
                    if isinstance(v, np.ndarray):
                        seen[id(v)] = int(v.nbytes)
        return sum(seen.values())


class _RecordingSession(LLMSession):
    """Wraps an LLM session; records the inputs of the first ``1 + steps`` forwards (one
    utterance: appended to ``sink`` as a list of rows when the session is reset or closed)."""

    def __init__(self, inner: LLMSession, steps: int, sink: list):
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


def _record(spec: GraphSpec, args) -> dict[str, np.ndarray]:
    """Copies of one call's data inputs, keyed by ``spec``'s input names, in its dtypes."""
    return {t.name: np.array(a, dtype=t.dtype, copy=True)
            for t, a in zip(spec.data_inputs, args, strict=True)}


class _Recorder:
    """The reservoirs of one capture and the Euler step counter of the current segment."""

    def __init__(self, table: GraphTable, limits: CaptureLimits, n_steps: int,
                 pick: np.random.Generator):
        self.table = table
        self.n_steps = n_steps
        self.llm_steps = limits.llm_steps
        self.llm_sequences = limits.llm_sequences
        self.estimator = [Reservoir(c, pick) for c in _step_capacities(limits.estimator,
                                                                       n_steps)]
        self.flow_encoder = Reservoir(limits.flow_encoder, pick)
        self.vocoder = Reservoir(limits.vocoder, pick)
        #: finished utterances (lists of LLM input rows), not yet offered to a reservoir
        self.utterances: list[list[np.ndarray]] = []
        self._step = 0

    def on_estimate(self, args) -> None:
        k = min(self._step, self.n_steps - 1)
        self._step += 1
        slot = self.estimator[k].offer()
        if slot is not None:
            self.estimator[k].items[slot] = _record(self.table["estimator"], args)

    def on_flow_encode(self, args) -> None:
        self._step = 0  # a new segment's ODE starts after its flow encoder call
        slot = self.flow_encoder.offer()
        if slot is not None:
            self.flow_encoder.items[slot] = _record(self.table["flow_encoder"], args)

    def on_vocoder_decode(self, args) -> None:
        slot = self.vocoder.offer()
        if slot is not None:
            self.vocoder.items[slot] = _record(self.table["hift_decode"], args)


class RecordingStages(CosyVoice1Stages):
    """CosyVoice v1 stages that delegate every call to ``inner`` (loaded stages) and hand the
    inputs of the captured calls to a recorder: ``estimate`` (graph ``estimator``),
    ``flow_encode`` (``flow_encoder``), ``vocoder_decode`` (``hift_decode``) and the forwards
    of every LLM session (``llm``). Other attributes are looked up on ``inner``. Not
    thread-safe (one recorder, one Euler step counter)."""

    thread_safe = False

    def __init__(self, inner: CosyVoice1Stages, recorder: _Recorder):
        self.inner = inner
        self.recorder = recorder
        self.config = inner.config
        self.speakers = inner.speakers

    def __getattr__(self, name):  # only called for attributes not found on the wrapper
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    # ---- LLM -------------------------------------------------------------------------------
    def encode_text(self, text_token):
        return self.inner.encode_text(text_token)

    def embed_llm_speaker(self, embedding):
        return self.inner.embed_llm_speaker(embedding)

    def embed_speech_tokens(self, tokens):
        return self.inner.embed_speech_tokens(tokens)

    def llm_special_embeddings(self):
        return self.inner.llm_special_embeddings()

    def new_llm_session(self) -> LLMSession:
        if not self.recorder.llm_sequences:  # nothing would be kept: record nothing
            return self.inner.new_llm_session()
        return _RecordingSession(self.inner.new_llm_session(), self.recorder.llm_steps,
                                 self.recorder.utterances)

    # ---- flow ------------------------------------------------------------------------------
    def flow_encode(self, tokens, embedding):
        self.recorder.on_flow_encode((tokens, embedding))
        return self.inner.flow_encode(tokens, embedding)

    def length_regulate(self, h, interp):
        return self.inner.length_regulate(h, interp)

    def estimate(self, x, mask, mu, t, spks, cond):
        self.recorder.on_estimate((x, mask, mu, t, spks, cond))
        return self.inner.estimate(x, mask, mu, t, spks, cond)

    # ---- vocoder ---------------------------------------------------------------------------
    def vocoder_f0(self, mel):
        return self.inner.vocoder_f0(mel)

    def vocoder_source(self, f0, phase, noise):
        return self.inner.vocoder_source(f0, phase, noise)

    def vocoder_decode(self, mel, source):
        self.recorder.on_vocoder_decode((mel, source))
        return self.inner.vocoder_decode(mel, source)

    def close(self) -> None:
        self.inner.close()


def capture_calibration(conv_dir: str, texts: Sequence, *, seed: int = 0,
                        limits: CaptureLimits = CaptureLimits(),
                        num_threads: int | None = None, show_progress: bool = True,
                        speech_tokens: int | None = None, stages=None) -> Capture:
    """Synthesize ``texts`` with the fp32 converted dir ``conv_dir`` and record graph inputs.

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
        stages: already loaded fp32 openvino stages (tests / reuse; left open and unchanged);
            None loads them (closed again at the end).

    Returns:
        :class:`Capture`. Raises :class:`InputError` for no texts or a negative seed.
    """
    from tqdm import tqdm

    from ..plugins import get_backend
    from ..synthesizer import Synthesizer

    if not texts:
        raise InputError("calibration capture needs at least one text")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    own = stages is None
    if own:
        stages = get_backend("openvino").load(conv_dir, num_threads=num_threads,
                                              **F32_OPTIONS)
    try:
        root = np.random.default_rng(seed)
        text_seeds = root.integers(0, 2**31 - 1, size=len(texts))
        pick = np.random.default_rng(root.integers(0, 2**63 - 1))
        table = graph_table(stages.config)
        rec = _Recorder(table, limits, stages.config.flow.cfm.n_timesteps, pick)
        llm = Reservoir(limits.llm_sequences, pick)
        st = RecordingStages(stages, rec)
        tts = Synthesizer.from_stages(st, backend_name="openvino", model_dir=conv_dir)
        cap = Capture(seed=int(seed), text_ids=[t.id for t in texts])
        llm_only = not (limits.estimator or limits.flow_encoder or limits.vocoder)
        speakers = list(st.speakers)
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
            while rec.utterances:
                llm.add(rec.utterances.pop(0))
    finally:
        if own:
            stages.close()
    for k, res in enumerate(rec.estimator):
        cap.estimator += res.items
        cap.estimator_steps += [k] * len(res.items)
    cap.flow_encoder = list(rec.flow_encoder.items)
    cap.vocoder = list(rec.vocoder.items)
    embeds, mask, offset, *key_names = (t.name for t in table["llm"].data_inputs)
    beam = np.zeros(1, np.int32)
    pos = stages.positional_keys  # numpy only: still usable after the stages closed
    for rows in llm.items:
        cached = 0
        for j, row in enumerate(rows):
            start, keys = pos.rows(cached, row.shape[1])
            cached += row.shape[1]
            cap.llm.append({embeds: row, mask: np.ones((1, cached), np.float32), BEAM_IDX: beam,
                            offset: start, **dict(zip(key_names, keys)),
                            NNCF_RESET_STATE: j == 0})
    return cap
