"""The v1 graph table is what the exporters write and what the quantizer reads: exported ONNX /
OpenVINO files carry the table's names, dtypes and (dynamic) dims, manifests record the family
and the graph -> file stem map, the capture wrapper delegates every stage call, and the
quantizer's graph names all exist in the table."""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

from conftest import TINY_A
from cosyvino.converted import read_manifest
from cosyvino.families import detect_family
from cosyvino.families.cosyvoice1.graphs import GRAPH_NAMES, graph_table, reference_table
from cosyvino.families.cosyvoice1.stages import CosyVoice1Stages


def _table(conv_dir):
    family = detect_family(conv_dir)
    return family.graphs(family.read_config(conv_dir))


# ---- the table itself ---------------------------------------------------------------------

def test_reference_table_names_and_stems():
    table = reference_table()
    assert tuple(table) == GRAPH_NAMES
    assert table.stems == {n: n for n in GRAPH_NAMES}
    assert table.components == ["llm", "flow", "vocoder"]


def test_example_inputs_have_valid_values_and_are_deterministic():
    table = reference_table()
    est = dict(zip(table["estimator"].input_names, table["estimator"].example_inputs()))
    assert np.all(est["mask"] == 1.0) and np.all((0.0 <= est["t"]) & (est["t"] < 1.0))
    src = dict(zip(table["hift_source"].input_names, table["hift_source"].example_inputs()))
    assert np.all(src["f0"] >= 0.0) and np.any(src["f0"] > 10.0)  # voiced frames exist
    assert np.all(src["phase"][:, 0] == 0.0) and np.all(np.abs(src["phase"]) <= np.pi)
    for spec in table.values():
        a, b = spec.example_inputs(seed=4), spec.example_inputs(seed=4)
        assert len(a) == len(spec.inputs)
        for t, x, y in zip(spec.inputs, a, b):
            np.testing.assert_array_equal(x, y)
            assert x.dtype.name == t.dtype and x.flags.c_contiguous
            assert x.shape == tuple(d if isinstance(d, int) else spec.example_sizes[d]
                                    for d in t.shape)


def test_quantizer_graph_names_are_table_names():
    pytest.importorskip("openvino")
    pytest.importorskip("nncf")
    from cosyvino.quantize import accuracy, model_dir, static

    names = set(reference_table())
    assert set(static.SENSITIVE_NODES) <= names
    assert set(model_dir.CAPTURE_GROUPS) <= names
    assert set(model_dir.HIFT_STAGES) | set(model_dir.FP16_STORAGE_STAGES) <= names
    for recipe in model_dir.PRESETS.values():
        assert set(recipe.weights) | set(recipe.static) | set(recipe.fp16) <= names
    assert set(accuracy.STAGE_GROUP) == names - set(reference_table().component("llm"))


# ---- exported files ------------------------------------------------------------------------

def _onnx_shape(value) -> tuple:
    return tuple(d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim)


def test_onnx_files_carry_the_table(onnx_dir):
    onnx = pytest.importorskip("onnx")
    conv = onnx_dir(TINY_A)
    table = _table(conv)
    for name, spec in table.items():
        model = onnx.load(os.path.join(conv, spec.stem + ".onnx"), load_external_data=False)
        for values, tensors in ((model.graph.input, spec.inputs),
                                (model.graph.output, spec.outputs)):
            got = [(v.name, onnx.helper.tensor_dtype_to_np_dtype(
                v.type.tensor_type.elem_type).name, _onnx_shape(v)) for v in values]
            assert got == [(t.name, t.dtype, t.shape) for t in tensors], name
        meta = {p.key: p.value for p in model.metadata_props}
        assert meta["cosyvino.stage"] == name


def _ov_shape(port) -> list[int]:
    return [d.get_length() if d.is_static else -1 for d in port.get_partial_shape()]


def test_openvino_files_carry_the_table(converted_dir):
    ov = pytest.importorskip("openvino")
    conv = converted_dir(TINY_A)
    table = _table(conv)
    core = ov.Core()
    for name, spec in table.items():
        model = core.read_model(os.path.join(conv, spec.stem + ".xml"))
        extra = ["beam_idx"] if spec.state else []  # the stateful IR's reorder input
        assert [p.get_any_name() for p in model.inputs] == spec.input_names[
            :len(spec.data_inputs)] + extra, name
        for port, t in zip(model.inputs, spec.data_inputs):
            assert _ov_shape(port) == t.partial_shape, (name, t.name)
            assert port.get_element_type().to_dtype().name == t.dtype, (name, t.name)
        assert [p.get_any_name() for p in model.outputs] == [t.name for t in
                                                             spec.data_outputs], name
        for port, t in zip(model.outputs, spec.data_outputs):
            assert _ov_shape(port) == t.partial_shape, (name, t.name)
        reads = {next(iter(op.output(0).get_names())): op for op in model.get_ops()
                 if op.get_type_name() == "ReadValue"}
        assert set(reads) == {s.input for s in spec.state}, name
        for s in spec.state:  # starts empty: a zero broadcast to the state's init shape
            init = reads[s.input].input_value(0).get_node()
            assert init.get_type_name() == "Broadcast"
            assert tuple(init.input_value(1).get_node().get_data()) == s.init_shape
        assigns = {op.get_variable_id() for op in model.get_ops()
                   if op.get_type_name() == "Assign"}
        assert assigns == {op.get_variable_id() for op in reads.values()}


@pytest.mark.parametrize("fixture", ["converted_dir", "onnx_dir"])
def test_manifest_records_family_and_graphs(request, fixture):
    conv = request.getfixturevalue(fixture)(TINY_A)
    m = read_manifest(conv)
    table = _table(conv)
    assert m["family"] == "cosyvoice1" == detect_family(conv).name
    assert m["graphs"] == table.stems
    stage_files = {r["stage"] for r in m["files"].values() if "stage" in r}
    assert stage_files == set(table)


def test_capture_beam_idx_is_the_stateful_input():
    pytest.importorskip("openvino")
    pytest.importorskip("torch")
    from cosyvino.export.openvino.stateful import BEAM_IDX
    from cosyvino.quantize.capture import BEAM_IDX as CAPTURED

    assert CAPTURED == BEAM_IDX


# ---- the capture wrapper -------------------------------------------------------------------

class _Inner:
    """Fake loaded stages: every call returns ``(name, args)``; sessions echo their input."""

    def __init__(self, config):
        self.config = config
        self.speakers = {"a": np.zeros((1, 192), np.float32)}
        self.calls: list[str] = []
        self.closed = False
        self.backend_detail = "inner"

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)

        def call(*args):
            self.calls.append(name)
            return name, args
        return call

    def new_llm_session(self):
        inner = self

        class Session:
            def forward(self, x):
                return x

            def reset(self):
                inner.calls.append("reset")

            def close(self):
                inner.calls.append("close")
        return Session()

    def close(self):
        self.closed = True


def test_recording_stages_delegate_every_call_and_record_table_names():
    from cosyvino.families.cosyvoice1.presets import tiny
    from cosyvino.quantize.capture import (
        ESTIMATOR_INPUTS,
        CaptureLimits,
        RecordingStages,
        _Recorder,
    )

    config = tiny()
    table = graph_table(config)
    inner = _Inner(config)
    rec = _Recorder(table, CaptureLimits(estimator=4, flow_encoder=2, llm_steps=1, vocoder=1),
                    n_steps=2, pick=np.random.default_rng(0))
    st = RecordingStages(inner, rec)
    assert isinstance(st, CosyVoice1Stages) and st.config is config
    assert st.speakers is inner.speakers and st.backend_detail == "inner"
    recorded = {"estimate": "estimator", "flow_encode": "flow_encoder",
                "vocoder_decode": "hift_decode"}
    for method in sorted(CosyVoice1Stages.__abstractmethods__ - {"new_llm_session"}):
        n = len(inspect.signature(getattr(CosyVoice1Stages, method)).parameters) - 1
        args = (table[recorded[method]].example_inputs() if method in recorded
                else [object() for _ in range(n)])
        assert getattr(st, method)(*args) == (method, tuple(args)), method
    assert sorted(inner.calls) == sorted(CosyVoice1Stages.__abstractmethods__
                                         - {"new_llm_session"})
    est = rec.estimator[0].items[0]
    assert tuple(est) == ESTIMATOR_INPUTS
    np.testing.assert_array_equal(est["x"], table["estimator"].example_inputs()[0])
    assert tuple(rec.flow_encoder.items[0]) == tuple(table["flow_encoder"].input_names)
    assert tuple(rec.vocoder.items[0]) == tuple(table["hift_decode"].input_names)
    session = st.new_llm_session()
    rows = [np.full((1, 1, 4), i, np.float32) for i in range(3)]
    for r in rows:
        session.forward(r)
    session.close()  # one utterance, first 1 + llm_steps rows kept
    assert len(rec.utterances) == 1 and len(rec.utterances[0]) == 2
    st.close()
    assert inner.closed
