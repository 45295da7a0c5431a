"""Backend conformance suite: the tests every backend plugin passes (pytest).

A plugin author subclasses :class:`BackendConformance` in a test file of their own::

    from cosyvino.testing import BackendConformance

    class TestMyBackend(BackendConformance):
        backend = "mine"                      # the registered Backend.name
        load_options = {"num_threads": 1}     # passed to load(); optional

and runs ``python -m pytest that_file.py``. The suite loads the backend through its entry point,
prepares the bundled tiny golden model (:data:`cosyvino.testing.TINY_MODEL_DIR`) with
``Backend.prepare`` into a temporary dir, loads it with ``Backend.load`` and checks:

* registration: ``cosyvino.plugins.get_backend(name)`` finds it, contributed by a plugin that
  was loaded from an entry point of group ``cosyvino``;
* ``is_available()`` returns ``(bool, str)``; an unavailable backend skips the loaded checks;
* ``capabilities()`` returns a :class:`cosyvino.backends.Capabilities` (ready for the prepared
  dir, not ready and not raising for a missing dir) that agrees with ``Stages.thread_safe``;
* ``prepare()`` returns a str / os.PathLike naming an existing dir and ``load()`` of it a
  :class:`cosyvino.backends.Stages` (otherwise those two tests fail, saying so, and the tests
  needing a loaded model are skipped);
* ``prepare()``/``load()`` of a missing dir raise :class:`cosyvino.errors.ModelDirError`;
* shapes and dtypes of every stage method (the contract in
  :mod:`cosyvino.families.cosyvoice1.stages`; widths and graph input names are read from the
  family's graph table, :meth:`cosyvino.families.base.ModelFamily.graphs`, not written here);
* golden parity with the official implementation: text encoder, LLM input, teacher-forced
  log-prob rows through one session, flow encoder, length regulation, estimator, mel through
  the CFM loop, f0, waveform from mel + NSF source (tolerances :attr:`atol` / :attr:`wav_atol`);
* per-session state isolation (two interleaved sessions give the rows each gives alone;
  ``reset()`` restores an empty cache) and, when ``Stages.thread_safe``, concurrent calls;
* batched decode (``new_llm_batch``): rows of different cache lengths, joining and leaving
  between steps, give each session's own rows; ``capabilities().max_llm_batch`` agrees with
  ``Stages.max_llm_batch``;
* batched estimator calls (``Stages.max_estimator_batch`` >= 2): one call of 2N rows gives
  each request's rows of its own batch-2 call (:attr:`atol`); ``capabilities()
  .max_estimator_batch`` agrees with ``Stages.max_estimator_batch``;
* the input contract for bad shapes and dtypes (raise, or convert and return documented dtypes;
  a session that raised works again after ``reset()``).

Torch is not needed unless the backend's ``prepare`` needs it (converting backends read the
``.pt`` files): goldens come from ``goldens.npz``. Override the ``prepared_dir`` fixture to
reuse a conversion made elsewhere.
"""

from __future__ import annotations

import importlib.metadata
import os
import threading
from typing import ClassVar

import numpy as np
import pytest

from ..backends.base import Backend, Capabilities
from ..families import DEFAULT_FAMILY, GraphSpec, GraphTable, get_family
from ..families.cosyvoice1.stages import CosyVoice1Stages as Stages
from ..families.cosyvoice1.stages import LLMSession
from ..errors import CosyvinoError, ModelDirError
from cosyvino.families.cosyvoice1.length_regulation import interpolation_matrix
from cosyvino.families.cosyvoice1.nsf import draw_source_noise
from cosyvino.families.cosyvoice1.pipeline import Pipeline
from ..plugins import (
    ENTRY_POINT_GROUP,
    backend_classes,
    get_backend,
    get_plugin_manager,
)
from .goldens import TINY_MODEL_DIR, load_goldens


def _maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _check_array(out, shape: tuple, dtype, what: str) -> None:
    assert isinstance(out, np.ndarray), f"{what}: returned {type(out).__name__}, not ndarray"
    assert out.dtype == dtype, f"{what}: dtype {out.dtype}, expected {np.dtype(dtype)}"
    assert out.shape == tuple(shape), f"{what}: shape {out.shape}, expected {tuple(shape)}"


def _raises_or_converts(call, expected: np.ndarray, dtype, atol: float, what: str) -> None:
    """The input contract for a wrong dtype: raise, or return what the right dtype gives."""
    try:
        out = call()
    except Exception:
        return
    _check_array(out, expected.shape, dtype, what)
    assert _maxabs(out, expected) <= atol, f"{what}: result differs from the documented dtype's"


def _prepared_dir_problem(value) -> str | None:
    """None when ``value`` (what ``Backend.prepare`` returned) is a str or os.PathLike naming
    an existing dir, else what is wrong with it, in words a plugin author can act on."""
    if not isinstance(value, (str, os.PathLike)):
        hint = (" (an override whose body is `...` returns None: delete it to keep the "
                "default, which returns model_dir unchanged)" if value is None else "")
        return (f"prepare(model_dir, out_dir) returned {value!r} ({type(value).__name__}), not "
                f"the path (str or os.PathLike) of the dir load() serves{hint}")
    if not os.path.isdir(value):
        return f"prepare(model_dir, out_dir) returned {os.fspath(value)!r}, not an existing dir"
    return None


def _not_stages(value) -> str:
    hint = " (is its body `...`?)" if value is None else ""
    return (f"load(prepared_dir) returned {type(value).__name__}, not a "
            f"cosyvino.backends.Stages subclass instance{hint}")


def _shape(spec: GraphSpec, tensor: str, **sizes: int) -> tuple[int, ...]:
    """The shape the graph table gives ``tensor`` of ``spec`` (an input or output name), with
    its dynamic dims from ``sizes`` (KeyError naming the dim when one is missing)."""
    for t in (*spec.inputs, *spec.outputs):
        if t.name == tensor:
            return tuple(d if isinstance(d, int) else sizes[d] for d in t.shape)
    raise KeyError(f"graph {spec.name!r} has no tensor {tensor!r}")


def _teacher_forced_rows(stages: Stages, session: LLMSession, lm_input, tokens) -> np.ndarray:
    rows = [session.forward(lm_input)]
    for tok in tokens:
        rows.append(session.forward(stages.embed_speech_tokens(np.array([[tok]], np.int64))))
    return np.stack(rows)


class BackendConformance:
    """Subclass as ``Test<Something>`` and set :attr:`backend`; see the module docstring."""

    #: registered name of the backend under test (``Backend.name``)
    backend: str = ""
    #: keyword options for ``Backend.load`` (e.g. fp32 compute for parity)
    load_options: ClassVar[dict] = {}
    #: max abs error for float tensors (LLM, flow, estimator, mel)
    atol: float = 1e-4
    #: max abs error for f0 (Hz) and waveforms (HiFT amplifies rounding differences)
    wav_atol: float = 1e-3
    #: the official-layout model dir to prepare and load
    model_dir: str = str(TINY_MODEL_DIR)
    #: golden arrays for ``model_dir`` (None = the bundled goldens.npz)
    goldens_path: str | None = None

    # ---- fixtures ------------------------------------------------------------------------------
    @pytest.fixture(scope="class")
    @classmethod
    def backend_class(cls) -> type:
        assert cls.backend, f"{cls.__name__}: set the class attribute 'backend'"
        return get_backend(cls.backend)

    @pytest.fixture(scope="class")
    @classmethod
    def available_class(cls, backend_class) -> type:
        ok, why = backend_class.is_available()
        if not ok:
            pytest.skip(f"backend {cls.backend!r} is not available here: {why}")
        return backend_class

    @pytest.fixture(scope="class")
    @classmethod
    def prepared_dir(cls, available_class, tmp_path_factory) -> str:
        """``Backend.prepare`` of :attr:`model_dir` into a fresh temporary dir."""
        out = tmp_path_factory.mktemp(f"prepared-{cls.backend}") / "prepared"
        return available_class.prepare(cls.model_dir, str(out))

    @pytest.fixture(scope="class")
    @classmethod
    def loadable_dir(cls, prepared_dir) -> str:
        """:meth:`prepared_dir` checked (str or os.PathLike naming an existing dir) and as a
        str; a bad one skips the tests needing it: ``test_prepare_returns_loadable_dir`` is
        the one failure that names the problem."""
        problem = _prepared_dir_problem(prepared_dir)
        if problem:
            pytest.skip(f"not loaded: {problem} (see test_prepare_returns_loadable_dir)")
        return os.fspath(prepared_dir)

    @pytest.fixture(scope="class")
    @classmethod
    def loaded(cls, available_class, loadable_dir):
        """What ``Backend.load`` of the prepared dir returns, unchecked (closed afterwards)."""
        st = available_class.load(loadable_dir, **cls.load_options)
        yield st
        close = getattr(st, "close", None)
        if callable(close):
            close()

    @pytest.fixture(scope="class")
    @classmethod
    def stages(cls, loaded) -> Stages:
        if not isinstance(loaded, Stages):
            pytest.skip(f"not loaded: {_not_stages(loaded)} (see test_load_returns_stages)")
        return loaded

    @pytest.fixture(scope="class")
    @classmethod
    def golden(cls) -> dict:
        return load_goldens(cls.goldens_path)

    @pytest.fixture(scope="class")
    @classmethod
    def pipeline(cls, stages) -> Pipeline:
        return Pipeline(stages)

    @pytest.fixture(scope="class")
    @classmethod
    def graphs(cls, stages) -> GraphTable:
        """The graph table of the loaded model's family for its config: where the expected
        widths and graph input names come from."""
        return get_family(getattr(stages, "family", "") or DEFAULT_FAMILY).graphs(stages.config)

    # ---- registration, availability, capabilities, prepare ----------------------------------
    def test_registered_through_entry_point(self, backend_class):
        assert isinstance(backend_class, type) and issubclass(backend_class, Backend)
        assert backend_class.name == self.backend
        assert backend_classes()[self.backend] is backend_class
        pm = get_plugin_manager()
        entry_points = {ep.name for ep in importlib.metadata.entry_points(
            group=ENTRY_POINT_GROUP)}
        owners = set()
        for impl in pm.hook.register_backends.get_hookimpls():
            got: list = []
            try:
                impl.function(register=got.append)
            except Exception:  # another, broken plugin: cosyvino skips it too
                continue
            if backend_class in got:
                owners.add(pm.get_name(impl.plugin))
        assert owners & entry_points, (f"backend {self.backend!r} registered by {owners}, none "
                                       f"of them an entry point of group {ENTRY_POINT_GROUP!r}")

    def test_is_available_returns_flag_and_reason(self, backend_class):
        result = backend_class.is_available()
        assert isinstance(result, tuple) and len(result) == 2
        assert isinstance(result[0], bool) and isinstance(result[1], str)
        if not result[0]:
            assert result[1], "an unavailable backend must say why"

    def test_capabilities(self, available_class, loadable_dir, stages, tmp_path):
        from ..planner.topology import probe_topology

        probe = probe_topology()
        for probe_arg in (None, probe):
            caps = available_class.capabilities(loadable_dir, probe_arg)
            assert isinstance(caps, Capabilities)
            assert caps.ready, f"capabilities() of the prepared dir is not ready: {caps.reason}"
            assert isinstance(caps.reason, str) and caps.relative_speed > 0
            assert caps.precisions and all(isinstance(p, str) for p in caps.precisions)
            assert caps.thread_safe == bool(stages.thread_safe), (
                f"capabilities().thread_safe is {caps.thread_safe} but Stages.thread_safe is "
                f"{bool(stages.thread_safe)}: make them agree")
            assert caps.max_llm_batch == stages.max_llm_batch >= 1, (
                f"capabilities().max_llm_batch is {caps.max_llm_batch} but "
                f"Stages.max_llm_batch is {stages.max_llm_batch}: make them agree")
            assert caps.max_estimator_batch == stages.max_estimator_batch >= 1, (
                f"capabilities().max_estimator_batch is {caps.max_estimator_batch} but "
                f"Stages.max_estimator_batch is {stages.max_estimator_batch}: make them agree")
            if caps.load_dir is not None:
                assert os.path.isdir(caps.load_dir)
        missing = available_class.capabilities(str(tmp_path / "missing"), probe)
        assert isinstance(missing, Capabilities) and not missing.ready and missing.reason

    def test_prepare_returns_loadable_dir(self, prepared_dir):
        problem = _prepared_dir_problem(prepared_dir)
        assert problem is None, problem

    def test_load_returns_stages(self, loaded):
        assert isinstance(loaded, Stages), _not_stages(loaded)
        assert set(loaded.speakers), "load(): Stages.speakers is empty"

    def test_missing_model_dir_is_a_model_dir_error(self, available_class, loadable_dir,
                                                    tmp_path):
        missing = str(tmp_path / "no-such-model")
        with pytest.raises(ModelDirError) as e:
            available_class.prepare(missing, str(tmp_path / "out"))
        assert isinstance(e.value, CosyvinoError)
        with pytest.raises(ModelDirError):
            available_class.load(missing, **self.load_options)

    # ---- stage shapes and dtypes -------------------------------------------------------------
    def test_speakers_and_config(self, stages, graphs):
        from cosyvino.families.cosyvoice1.config import ModelConfig

        assert isinstance(stages.config, ModelConfig)
        assert stages.speakers, "no speakers"
        width = _shape(graphs["flow_encoder"], "embedding")  # (1, 192): the x-vector
        for name, emb in stages.speakers.items():
            assert isinstance(name, str)
            _check_array(emb, width, np.float32, f"speakers[{name!r}]")

    def test_llm_stage_shapes(self, stages, golden, graphs):
        d = _shape(graphs["llm"], "inputs_embeds", batch=1, new=1)[-1]
        v1 = _shape(graphs["llm"], "logp", batch=1)[-1]
        _check_array(stages.encode_text(golden["llm/text_token"]),
                     _shape(graphs["text_encoder"], "text_features", text_len=17), np.float32,
                     "encode_text")
        _check_array(stages.embed_llm_speaker(golden["llm/embedding"]), (1, 1, d), np.float32,
                     "embed_llm_speaker")
        _check_array(stages.embed_speech_tokens(np.array([[1, 2, 3]], np.int64)), (1, 3, d),
                     np.float32, "embed_speech_tokens")
        special = stages.llm_special_embeddings()
        assert isinstance(special, tuple) and len(special) == 2
        for a, what in zip(special, ("sos", "task_id")):
            _check_array(a, (1, 1, d), np.float32, what)
        session = stages.new_llm_session()
        assert isinstance(session, LLMSession)
        _check_array(session.forward(golden["llm/lm_input"]), (v1,), np.float32,
                     "LLMSession.forward (prefill)")
        _check_array(session.forward(golden["llm/lm_input"][:, :1]), (v1,), np.float32,
                     "LLMSession.forward (one step)")
        session.close()

    def test_flow_stage_shapes(self, stages, golden, graphs):
        h, spks = stages.flow_encode(golden["flow/speech_token"], golden["flow/embedding"])
        _check_array(h, _shape(graphs["flow_encoder"], "h", tokens=60), np.float32,
                     "flow_encode h")
        _check_array(spks, _shape(graphs["flow_encoder"], "spks"), np.float32,
                     "flow_encode spks")
        mu = stages.length_regulate(golden["flow/encoder_proj_out"],
                                    interpolation_matrix(0, 60, 0, 103))
        _check_array(mu, _shape(graphs["length_regulator"], "mu", frames=103), np.float32,
                     "length_regulate")
        _check_array(stages.estimate(*self._estimator_args(golden, graphs)),
                     _shape(graphs["estimator"], "velocity", frames=57), np.float32, "estimate")

    def test_vocoder_stage_shapes(self, stages, golden, graphs):
        h = stages.config.hift
        mel = golden["hift/mel"]
        t = mel.shape[-1]
        samples = h.hop_length * t
        _check_array(stages.vocoder_f0(mel), _shape(graphs["hift_f0"], "f0", frames=t),
                     np.float32, "vocoder_f0")
        phase, noise = draw_source_noise(np.random.default_rng(0), t, h.nb_harmonics,
                                         h.hop_length)
        source = stages.vocoder_source(golden["hift/f0"], phase, noise)
        _check_array(source, _shape(graphs["hift_source"], "source", samples=samples),
                     np.float32, "vocoder_source")
        wav = stages.vocoder_decode(mel, golden["hift/source"])
        _check_array(wav, _shape(graphs["hift_decode"], "wav", samples=samples), np.float32,
                     "vocoder_decode")
        assert np.all(np.abs(wav) <= 0.99 + 1e-6), "vocoder_decode: samples beyond ±0.99"

    # ---- golden parity -----------------------------------------------------------------------
    def test_text_encoder_and_lm_input_parity(self, stages, pipeline, golden):
        out = stages.encode_text(golden["llm/text_token"])
        assert _maxabs(out, golden["llm/text_encoder_out"]) <= self.atol
        lm_input = pipeline.build_lm_input(golden["llm/text_token"], golden["llm/embedding"])
        assert _maxabs(lm_input, golden["llm/lm_input"]) <= self.atol

    def test_teacher_forced_logp_parity(self, stages, golden):
        session = stages.new_llm_session()
        rows = _teacher_forced_rows(stages, session, golden["llm/lm_input"],
                                    golden["llm/forced_speech_tokens"].tolist())
        assert rows.shape == golden["llm/logp"].shape
        err = _maxabs(rows, golden["llm/logp"])
        assert err <= self.atol, f"teacher-forced logp max abs error {err:.2e}"

    def test_flow_encoder_and_length_regulator_parity(self, stages, golden):
        h, spks = stages.flow_encode(golden["flow/speech_token"], golden["flow/embedding"])
        assert _maxabs(h, golden["flow/encoder_proj_out"]) <= self.atol
        assert _maxabs(spks, golden["flow/spk_proj"]) <= self.atol
        mu = stages.length_regulate(golden["flow/encoder_proj_out"],
                                    interpolation_matrix(0, 60, 0, 103))
        assert _maxabs(mu, golden["flow/length_regulated"]) <= self.atol

    def test_estimator_parity(self, stages, golden, graphs):
        out = stages.estimate(*self._estimator_args(golden, graphs))
        assert _maxabs(out, golden["estimator/out"]) <= self.atol

    def test_mel_parity(self, pipeline, golden):
        mel = pipeline.tokens_to_mel(golden["flow/speech_token"][0], golden["flow/embedding"],
                                     noise=golden["flow/noise"])
        assert _maxabs(mel, golden["flow/mel"]) <= self.atol

    def test_f0_and_waveform_parity(self, stages, pipeline, golden):
        assert _maxabs(stages.vocoder_f0(golden["hift/mel"]), golden["hift/f0"]) <= self.wav_atol
        wav = pipeline.mel_to_wav(golden["hift/mel"], source=golden["hift/source"])
        assert _maxabs(wav, golden["hift/wav"][0]) <= self.wav_atol

    # ---- sessions and concurrency ------------------------------------------------------------
    def _two_sequences(self, stages, golden):
        tokens = golden["llm/forced_speech_tokens"].tolist()
        return ((golden["llm/lm_input"], tokens[:12]),
                (golden["llm/lm_input"][:, 2:], tokens[::-1][:12]))

    def test_sessions_are_isolated_and_reset(self, stages, golden):
        (in_a, tok_a), (in_b, tok_b) = self._two_sequences(stages, golden)
        alone_a = _teacher_forced_rows(stages, stages.new_llm_session(), in_a, tok_a)
        alone_b = _teacher_forced_rows(stages, stages.new_llm_session(), in_b, tok_b)
        assert _maxabs(alone_a, alone_b) > 10 * self.atol, "test inputs are not distinct"
        sa, sb = stages.new_llm_session(), stages.new_llm_session()
        rows_a, rows_b = [sa.forward(in_a)], [sb.forward(in_b)]
        for ta, tb in zip(tok_a, tok_b):  # interleave the two sessions step by step
            rows_a.append(sa.forward(stages.embed_speech_tokens(np.array([[ta]], np.int64))))
            rows_b.append(sb.forward(stages.embed_speech_tokens(np.array([[tb]], np.int64))))
        assert _maxabs(np.stack(rows_a), alone_a) <= self.atol
        assert _maxabs(np.stack(rows_b), alone_b) <= self.atol
        sa.reset()  # a used session, reset, must behave like a new one
        assert _maxabs(_teacher_forced_rows(stages, sa, in_b, tok_b), alone_b) <= self.atol
        sa.close()
        sb.close()

    def test_llm_batch_rows_equal_sessions(self, stages, golden):
        """Rows of different cache lengths in one :meth:`new_llm_batch`, joining and leaving
        between steps, give the rows each gives in its own session."""
        lm, tokens = golden["llm/lm_input"], golden["llm/forced_speech_tokens"].tolist()
        seqs = [(lm, tokens[:8]), (np.ascontiguousarray(lm[:, 5:]), tokens[::-1][:8]),
                (np.ascontiguousarray(lm[:, 11:]), tokens[3:11])]
        alone = [_teacher_forced_rows(stages, stages.new_llm_session(), *s) for s in seqs]
        batch = stages.new_llm_batch()
        ids, done = {}, {}

        def join(i):
            session = stages.new_llm_session()
            assert _maxabs(session.forward(seqs[i][0]), alone[i][0]) <= self.atol
            ids[i], done[i] = batch.add(session), 0

        join(0)
        join(1)
        for step in range(8):
            if step == 4:
                batch.remove(ids.pop(0))
                join(2)
            order = {row: i for i, row in ids.items()}
            rows = [order[row] for row in batch.rows]
            x = np.concatenate([stages.embed_speech_tokens(
                np.array([[seqs[i][1][done[i]]]], np.int64)) for i in rows])
            out = batch.step(x)
            assert out.shape == (len(rows), alone[0].shape[1]) and out.dtype == np.float32
            for b, i in enumerate(rows):
                done[i] += 1
                err = _maxabs(out[b], alone[i][done[i]])
                assert err <= self.atol, f"row {i} step {done[i]}: batched logp error {err:.2e}"
        batch.close()
        assert len(batch) == 0

    def test_estimator_batch_rows_equal_calls(self, stages, golden, graphs):
        """Where ``max_estimator_batch`` >= 2: requests' batch-2 estimator inputs (different
        x, t, mu, spks) concatenated into one call give each request's own call's rows; at 1
        the batch-2 call is the contract (checked by the shape and parity tests)."""
        cap = int(stages.max_estimator_batch)
        assert cap >= 1
        base = self._estimator_args(golden, graphs)
        names = graphs["estimator"].input_names
        rng = np.random.default_rng(7)
        requests = [base]
        for i in range(1, min(cap, 3)):
            args = dict(zip(names, base))
            for k in ("x", "mu", "spks"):
                args[k] = (args[k] + rng.standard_normal(args[k].shape)).astype(np.float32)
            args["t"] = np.full_like(args["t"], 0.15 * i)
            requests.append(tuple(args[k] for k in names))
        alone = [stages.estimate(*r) for r in requests]
        if len(requests) < 2:
            return
        out = stages.estimate(*(np.concatenate(parts) for parts in zip(*requests)))
        assert out.shape == (2 * len(requests),) + alone[0].shape[1:]
        for i, ref in enumerate(alone):
            err = _maxabs(out[2 * i:2 * i + 2], ref)
            assert err <= self.atol, f"request {i}: batched estimator rows differ by {err:.2e}"

    def test_concurrent_calls_when_thread_safe(self, stages, golden, graphs):
        if not stages.thread_safe:
            pytest.skip(f"{self.backend}: Stages.thread_safe is False")
        seqs = self._two_sequences(stages, golden)
        est_args = self._estimator_args(golden, graphs)
        expected = [_teacher_forced_rows(stages, stages.new_llm_session(), *s) for s in seqs]
        expected_est = stages.estimate(*est_args)
        got: list = [None] * 4
        errors: list = []
        barrier = threading.Barrier(4)

        def worker(i):
            try:
                barrier.wait()
                if i < 2:
                    got[i] = _teacher_forced_rows(stages, stages.new_llm_session(), *seqs[i])
                else:
                    got[i] = stages.estimate(*est_args)
            except Exception as e:  # reported below, in the test's thread
                errors.append(e)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for i in range(2):
            assert _maxabs(got[i], expected[i]) <= self.atol
            assert _maxabs(got[2 + i], expected_est) <= self.atol

    # ---- input contract ----------------------------------------------------------------------
    def test_bad_shapes_raise(self, stages, golden, graphs):
        d = _shape(graphs["llm"], "inputs_embeds", batch=1, new=1)[-1]
        mel_bins = _shape(graphs["estimator"], "x", frames=1)[1]
        bad_calls = {
            "encode_text rank 1": lambda: stages.encode_text(golden["llm/text_token"][0]),
            "embed_llm_speaker width 191": lambda: stages.embed_llm_speaker(
                golden["llm/embedding"][:, :191]),
            "estimate 81 mel bins": lambda: stages.estimate(*(
                np.concatenate([a, a[:, :1]], axis=1) if a.ndim == 3 and a.shape[1] == mel_bins
                else a for a in self._estimator_args(golden, graphs))),
            "vocoder_f0 81 mel bins": lambda: stages.vocoder_f0(
                np.concatenate([golden["hift/mel"], golden["hift/mel"][:, :1]], axis=1)),
            "length_regulate interp width": lambda: stages.length_regulate(
                golden["flow/encoder_proj_out"], interpolation_matrix(0, 61, 0, 103)),
        }
        for what, call in bad_calls.items():
            try:
                out = call()
            except Exception:
                continue
            pytest.fail(f"{what}: returned {getattr(out, 'shape', out)!r} instead of raising")
        session = stages.new_llm_session()
        with pytest.raises(Exception):
            session.forward(np.zeros((1, 1, d + 1), np.float32))
        session.reset()  # usable again: gives the golden rows
        rows = _teacher_forced_rows(stages, session, golden["llm/lm_input"],
                                    golden["llm/forced_speech_tokens"].tolist())
        assert _maxabs(rows, golden["llm/logp"]) <= self.atol

    def test_wrong_dtypes_raise_or_convert(self, stages, golden, graphs):
        tokens = golden["llm/text_token"]
        _raises_or_converts(lambda: stages.encode_text(tokens.astype(np.int32)),
                            stages.encode_text(tokens), np.float32, self.atol,
                            "encode_text(int32)")
        speech = golden["flow/speech_token"][:, :5]
        _raises_or_converts(lambda: stages.embed_speech_tokens(speech.astype(np.int32)),
                            stages.embed_speech_tokens(speech), np.float32, self.atol,
                            "embed_speech_tokens(int32)")
        args = self._estimator_args(golden, graphs)
        _raises_or_converts(lambda: stages.estimate(*(a.astype(np.float64) for a in args)),
                            stages.estimate(*args), np.float32, self.atol, "estimate(float64)")
        mel = golden["hift/mel"]
        _raises_or_converts(lambda: stages.vocoder_f0(mel.astype(np.float64)),
                            stages.vocoder_f0(mel), np.float32, self.wav_atol,
                            "vocoder_f0(float64)")
        session = stages.new_llm_session()
        lm_input = golden["llm/lm_input"]
        _raises_or_converts(lambda: session.forward(lm_input.astype(np.float64)),
                            golden["llm/logp"][0], np.float32, self.atol,
                            "LLMSession.forward(float64)")

    # ---- helpers -----------------------------------------------------------------------------
    @staticmethod
    def _estimator_args(golden, graphs: GraphTable) -> tuple:
        """The golden estimator inputs in the ``estimator`` graph's input order (the goldens
        are keyed ``estimator/<input name>``)."""
        return tuple(golden[f"estimator/{k}"] for k in graphs["estimator"].input_names)
