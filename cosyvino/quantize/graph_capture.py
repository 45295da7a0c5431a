"""Calibration capture for a family whose stages run on a graph runner (CosyVoice2; any family
whose :meth:`~cosyvino.families.ModelFamily.stages_from_runner` builds its stages over a
:class:`cosyvino.backends.graphs.GraphRunner`): the fp32 OpenVINO runner is wrapped, so the
family's own program and stages run unchanged and what the graphs receive is recorded by the
graph's ROLE (:data:`cosyvino.families.ROLES`), never by a family's graph names. No torch.

Recorded, as the v1 capture (:mod:`.capture`) records them:

* role ``estimator``: every call (batch 2, CFG) in a reservoir per Euler step (the step
  counter restarts at each ``flow_encoder`` call: one ODE per flow call);
* role ``flow_encoder``: each call's inputs;
* role ``llm``: whole utterances, the data inputs of each session call (prefix, then one row per
  decode step, cut to ``llm_steps``), the first item flagged with NNCF's reset-state key;
* role ``hift_decode``: the vocoder decoder's inputs per call.

Each item is a dict keyed by the graph's input names (the IR's: what NNCF datasets are keyed
by), copies in the table's dtypes. The same seed gives the same capture (synthesis seeds and
reservoir picks come from it).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import numpy as np

from ..backends.graphs import GraphRunner, GraphSession
from ..errors import InputError
from ..families import GraphTable
from .capture import (
    BEAM_IDX,
    NNCF_RESET_STATE,
    Capture,
    CaptureLimits,
    Reservoir,
    _record,
    _step_capacities,
)


def runner_of(stages) -> GraphRunner | None:
    """The graph runner ``stages`` run on, or None (stages of their own, e.g. v1's OpenVINO
    stages)."""
    runner = getattr(stages, "runner", None)
    return runner if isinstance(runner, GraphRunner) else None


class _Delegating(GraphRunner):
    """A runner that forwards to ``inner`` (attributes too: ``config``, ``model`` ...);
    ``close`` leaves ``inner`` open (it belongs to the loaded stages)."""

    thread_safe = False  # one recorder / one step counter

    def __init__(self, inner: GraphRunner):
        self.inner = inner
        self.config = inner.config

    def __getattr__(self, name):  # only for attributes not found on the wrapper
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def run(self, graph, inputs):
        return self.inner.run(graph, inputs)

    def new_session(self, graph):
        return self.inner.new_session(graph)

    def close(self) -> None:
        pass


class _RecordingSession(GraphSession):
    """A stateful graph's session whose first ``1 + steps`` calls are recorded (their data
    inputs by name); an utterance goes to ``sink`` when the session is reset or closed."""

    def __init__(self, inner: GraphSession, names: list[str], steps: int, sink: list):
        self._inner = inner
        self._names = names
        self._rows: list[dict] = []
        self._limit = 1 + steps
        self._sink = sink

    def run(self, inputs):
        if len(self._rows) < self._limit:
            self._rows.append({n: np.array(a, copy=True) for n, a in zip(self._names, inputs)})
        return self._inner.run(inputs)

    def reset(self):
        self._flush()
        self._inner.reset()

    def close(self):
        self._flush()
        self._inner.close()

    def state_length(self):
        return self._inner.state_length()

    def state_arrays(self):
        return self._inner.state_arrays()

    def _flush(self):
        if self._rows:
            self._sink.append(self._rows)
            self._rows = []


class RecordingRunner(_Delegating):
    """``inner`` with the inputs of the graphs of the captured roles handed to reservoirs
    (:class:`CaptureLimits` bounds them; ``pick`` chooses the kept items)."""

    def __init__(self, inner: GraphRunner, table: GraphTable, limits: CaptureLimits,
                 n_steps: int, pick: np.random.Generator):
        super().__init__(inner)
        self.table = table
        self.limits = limits
        self.n_steps = n_steps
        self.estimator = [Reservoir(c, pick) for c in _step_capacities(limits.estimator,
                                                                       n_steps)]
        self.flow_encoder = Reservoir(limits.flow_encoder, pick)
        self.vocoder = Reservoir(limits.vocoder, pick)
        #: finished utterances (lists of LLM items), not yet offered to a reservoir
        self.utterances: list[list[dict]] = []
        self._step = 0

    def run(self, graph, inputs):
        spec = self.table[graph]
        if spec.role == "estimator":
            k = min(self._step, self.n_steps - 1)
            self._step += 1
            self._offer(self.estimator[k], spec, inputs)
        elif spec.role == "flow_encoder":
            self._step = 0  # a new ODE starts after each flow encoder call
            self._offer(self.flow_encoder, spec, inputs)
        elif spec.role == "hift_decode":
            self._offer(self.vocoder, spec, inputs)
        return self.inner.run(graph, inputs)

    @staticmethod
    def _offer(res: Reservoir, spec, inputs) -> None:
        slot = res.offer()
        if slot is not None:
            res.items[slot] = _record(spec, inputs)

    def new_session(self, graph):
        spec = self.table[graph]
        session = self.inner.new_session(graph)
        if spec.role != "llm" or not self.limits.llm_sequences:
            return session
        return _RecordingSession(session, [t.name for t in spec.data_inputs],
                                 self.limits.llm_steps, self.utterances)


def speaking_voices(tts) -> list[str]:
    """The voice names the capture and the report speak with: the model's built-in speakers
    and ready-made voices (CosyVoice2: ``spk2info.pt``'s). Raises InputError when it has none
    (a calibration text needs a voice)."""
    names = list(tts.engine.builtin_voices)
    if not names:
        raise InputError("the model has no built-in speaker or voice to calibrate with")
    return names


def capture_graph_calibration(conv_dir: str, texts: Sequence, stages, family, *, seed: int = 0,
                              limits: CaptureLimits | None = None,
                              show_progress: bool = True,
                              speech_tokens: int | None = None) -> Capture:
    """Synthesize ``texts`` on the loaded fp32 ``stages`` of ``family`` (stages over a graph
    runner, :func:`runner_of`) and record graph inputs by role.

    Each text is synthesized whole (every segment, ``segment`` hops) with its speaker when the
    model has it, else the model's voices in turn; ``speech_tokens`` forces that many tokens
    per segment (None: the LLM stops). ``stages`` stay open and unchanged.

    Returns :class:`Capture` (its ``llm`` items hold the LLM graph's data inputs,
    :data:`.capture.BEAM_IDX` and :data:`.capture.NNCF_RESET_STATE`). Raises InputError: no
    texts, a bad seed, stages without a graph runner, a model without voices.
    """
    from tqdm import tqdm

    from ..synthesizer import Synthesizer

    if not texts:
        raise InputError("calibration capture needs at least one text")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise InputError(f"seed must be a non-negative integer, got {seed!r}")
    limits = limits or CaptureLimits()
    runner = runner_of(stages)
    if runner is None:
        raise InputError("these stages do not run on a graph runner: nothing to record at")
    root = np.random.default_rng(seed)
    text_seeds = root.integers(0, 2**31 - 1, size=len(texts))
    pick = np.random.default_rng(root.integers(0, 2**63 - 1))
    table = runner.table
    rec = RecordingRunner(runner, table, limits, stages.config.flow.cfm.n_timesteps, pick)
    st = family.stages_from_runner(rec, conv_dir)
    tts = Synthesizer.from_stages(st, backend_name="openvino", model_dir=conv_dir,
                                  voices_dir=False)
    llm = Reservoir(limits.llm_sequences, pick)
    cap = Capture(seed=int(seed), text_ids=[t.id for t in texts])
    bar = tqdm(texts, desc="calibration capture", unit="text", file=sys.stderr,
               disable=not show_progress)
    try:
        voices = speaking_voices(tts)
        for i, item in enumerate(bar):
            voice = item.speaker if item.speaker in voices else voices[i % len(voices)]
            audio = tts.synthesize(item.text, voice, seed=int(text_seeds[i]),
                                   num_speech_tokens=speech_tokens)
            cap.segments += int(audio.stats.get("segments", 1))
            # an utterance's items are complete once its session closed: sample it now
            while rec.utterances:
                llm.add(rec.utterances.pop(0))
    finally:
        tts.close()  # its workers; the wrapped runner (the caller's) stays open
    for k, res in enumerate(rec.estimator):
        cap.estimator += res.items
        cap.estimator_steps += [k] * len(res.items)
    cap.flow_encoder = list(rec.flow_encoder.items)
    cap.vocoder = list(rec.vocoder.items)
    beam = np.zeros(1, np.int32)
    for rows in llm.items:
        for j, row in enumerate(rows):
            cap.llm.append({**row, BEAM_IDX: beam, NNCF_RESET_STATE: j == 0})
    return cap


__all__ = ["RecordingRunner", "capture_graph_calibration", "runner_of", "speaking_voices"]
