"""ONNX Runtime backend: whole-utterance parity with torch and OpenVINO, concurrent sessions,
torch-free serving, ONNX-dir integrity, the export's graph contract and ``cosyvino convert
--format onnx``. Golden parity (explicit KV cache, with and without IO binding, included): the
conformance suite (tests/test_conformance_builtin.py) and tests/test_golden_parity_backends.py.
The tiny model is converted once per session (``onnx_dir`` fixture, through the CLI)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")
torch = pytest.importorskip("torch")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.errors import BackendError, ConvertedModelError  # noqa: E402
from conftest import TINY_A  # noqa: E402


def _maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def _load(path, **options):
    return Synthesizer(str(path), backend="onnxruntime", **options)


@pytest.fixture(scope="module")
def tiny_ort(onnx_dir):
    return _load(onnx_dir(TINY_A))


# ---- the exported graphs --------------------------------------------------------------------

def test_graphs_have_opset_17_dynamic_sequence_dims_and_explicit_cache(onnx_dir):
    conv = onnx_dir(TINY_A)
    with open(os.path.join(conv, "manifest.json"), encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["runtime"] == "onnxruntime" and manifest["stage_ext"] == ".onnx"
    layers = manifest["llm"]["layers"]
    llm = onnx.load(os.path.join(conv, "llm.onnx"), load_external_data=False)
    assert {o.domain: o.version for o in llm.opset_import}[""] >= 17
    names = [i.name for i in llm.graph.input]
    assert names == ["inputs_embeds", "attention_mask", "pos_offset"] + [
        f"pos_keys.{i}" for i in range(layers)] + [
        f"past_key_values.{i}.{k}" for i in range(layers) for k in ("key", "value")]
    outs = [o.name for o in llm.graph.output]
    assert outs == ["logp"] + [f"present.{i}.{k}" for i in range(layers)
                               for k in ("key", "value")]

    def dims(value_info):
        return [d.dim_param or d.dim_value for d in value_info.type.tensor_type.shape.dim]

    assert dims(llm.graph.input[0])[:2] == ["batch", "new"]
    assert dims(llm.graph.input[1]) == ["batch", "total"]
    assert dims(llm.graph.input[3])[1] == "pos_rows"
    assert dims(llm.graph.input[3 + layers])[:3:2] == ["batch", "past"]
    assert dims(llm.graph.output[1])[2] == "total"
    est = onnx.load(os.path.join(conv, "estimator.onnx"))
    assert dims(est.graph.input[0]) == [2, 80, "frames"]
    onnx.checker.check_model(est)


def test_llm_prefill_equals_token_by_token(tiny_ort):
    """The explicit cache at P = 0 and P > 0: one prefill of 6 rows == 6 single-row steps."""
    stages = tiny_ort.stages
    x = np.random.default_rng(1).standard_normal((1, 6, stages.config.llm.llm_input_size),
                                                  dtype=np.float32)
    whole = stages.new_llm_session().forward(x)
    s = stages.new_llm_session()
    for i in range(6):
        last = s.forward(x[:, i:i + 1])
    assert _maxabs(whole, last) < 1e-4
    assert s.cache_length() == 6


# ---- onnx-dir integrity and options ---------------------------------------------------------

@pytest.fixture
def onnx_copy(onnx_dir, tmp_path):
    dst = tmp_path / "conv"
    shutil.copytree(onnx_dir(TINY_A), dst)
    return dst


def test_missing_onnx_file_is_refused(onnx_copy):
    (onnx_copy / "estimator.onnx").unlink()
    with pytest.raises(ConvertedModelError, match="estimator.onnx") as e:
        _load(onnx_copy)
    assert e.value.path == str(onnx_copy / "estimator.onnx")


def test_corrupt_onnx_file_is_refused(onnx_copy):
    p = onnx_copy / "llm.onnx"
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(ConvertedModelError, match="llm.onnx"):
        _load(onnx_copy)


def test_edited_manifest_is_refused(onnx_copy):
    m = onnx_copy / "manifest.json"
    data = json.loads(m.read_text())
    data["files"]["llm.onnx"]["precision"] = "fp16"
    m.write_text(json.dumps(data))
    with pytest.raises(ConvertedModelError, match="manifest.json") as e:
        _load(onnx_copy)
    assert e.value.path == str(m)


def test_not_converted_dir_says_what_to_do(tmp_path):
    with pytest.raises(ConvertedModelError, match="cosyvino convert --format onnx"):
        _load(tmp_path)


def test_openvino_dir_is_not_served_by_onnxruntime(converted_dir):
    pytest.importorskip("openvino")
    with pytest.raises(ConvertedModelError, match="openvino conversion, not onnxruntime"):
        _load(converted_dir(TINY_A))


def test_official_dir_with_onnx_subdir_is_used(tmp_path, onnx_dir):
    src = tmp_path / "model"
    shutil.copytree(TINY_A, src)
    shutil.copytree(onnx_dir(TINY_A), src / "onnx")
    tts = _load(src)
    assert tts.stages.converted_dir == str(src / "onnx")
    assert tts.speakers == Synthesizer(str(TINY_A), backend="torch").speakers
    with open(src / "flow.pt", "ab") as f:  # the source changed: the ONNX files are stale
        f.write(b"\0")
    with pytest.raises(ConvertedModelError, match="flow.pt"):
        _load(src)


def test_backend_options_reach_the_sessions(onnx_dir, tmp_path):
    tts = _load(onnx_dir(TINY_A), num_threads=1, inter_op_num_threads=2,
                graph_optimization_level="basic", execution_mode="parallel",
                enable_cpu_mem_arena=False, optimized_model_dir=str(tmp_path / "opt"))
    so = tts.stages.sessions["llm"].get_session_options()
    assert so.intra_op_num_threads == 1
    assert so.inter_op_num_threads == 2
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    assert so.enable_cpu_mem_arena is False
    assert (tmp_path / "opt" / "estimator.opt.onnx").is_file()
    with pytest.raises(BackendError, match="unknown options"):
        _load(onnx_dir(TINY_A), no_such_option=1)
    with pytest.raises(BackendError, match="graph_optimization_level"):
        _load(onnx_dir(TINY_A), graph_optimization_level="max")
    with pytest.raises(BackendError, match="num_threads"):
        _load(onnx_dir(TINY_A), num_threads=0)


def test_capabilities(onnx_dir, tmp_path):
    from cosyvino_onnxruntime import ONNXRuntimeBackend

    caps = ONNXRuntimeBackend.capabilities(onnx_dir(TINY_A))
    assert caps.ready and caps.thread_safe
    assert caps.load_dir == onnx_dir(TINY_A)
    assert caps.resident_bytes > 0
    missing = ONNXRuntimeBackend.capabilities(str(tmp_path))
    assert not missing.ready
    assert "cosyvino convert --format onnx" in missing.reason


# ---- conversion ----------------------------------------------------------------------------

def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    from cosyvino.export.onnx import convert as conv

    def boom(*a, **k):
        raise RuntimeError("conversion exploded")

    monkeypatch.setattr(conv, "export_stage", boom)
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="exploded"):
        conv.convert_model_dir(str(TINY_A), str(out))
    assert list(tmp_path.iterdir()) == []


def test_large_graph_weights_go_to_one_external_file(tmp_path, monkeypatch):
    """Above the protobuf limit the weights go to ``<stem>.onnx.data``; ORT still loads it
    (the limit is lowered so the tiny hift_f0 stage takes that path)."""
    from cosyvino.export.onnx import convert as conv
    from cosyvino.families.cosyvoice1.torch.loading import load_torch_model

    monkeypatch.setattr(conv, "_SINGLE_FILE_LIMIT", 1000)
    m = load_torch_model(str(TINY_A))
    spec = conv.stage_specs(m)["hift_f0"]
    names = conv.export_stage(spec, str(tmp_path), "hift_f0", "hift_f0")
    assert names == ["hift_f0.onnx", "hift_f0.onnx.data"]
    assert sorted(os.listdir(tmp_path)) == names  # no scratch files left
    s = ort.InferenceSession(str(tmp_path / "hift_f0.onnx"), providers=["CPUExecutionProvider"])
    mel = np.random.default_rng(2).standard_normal((1, 80, 31), dtype=np.float32)
    with torch.no_grad():
        ref = m.hift.f0_stage()(torch.from_numpy(mel)).numpy()
    assert _maxabs(s.run(None, {"mel": mel})[0], ref) < 1e-3


def test_convert_cli_refuses_fp16_for_onnx(tmp_path):
    from click.testing import CliRunner

    from cosyvino.cli.main import main

    res = CliRunner().invoke(main, ["convert", "--format", "onnx", "--weights", "fp16",
                                    "--model-dir", str(TINY_A), "--out", str(tmp_path / "o")])
    assert res.exit_code == 2
    assert "fp32 weights only" in res.output
    assert not (tmp_path / "o").exists()


def test_prepare_converts_once_and_reuses(tmp_path, onnx_dir, converted_dir):
    from cosyvino_onnxruntime import ONNXRuntimeBackend

    src = tmp_path / "model"
    shutil.copytree(TINY_A, src)
    out = ONNXRuntimeBackend.prepare(str(src))
    assert out == str(src / "onnx")
    assert ONNXRuntimeBackend.capabilities(str(src)).load_dir == out
    stamp = os.stat(src / "onnx" / "manifest.json").st_mtime_ns
    assert ONNXRuntimeBackend.prepare(str(src)) == out  # up to date: not rewritten
    assert os.stat(src / "onnx" / "manifest.json").st_mtime_ns == stamp
    assert ONNXRuntimeBackend.prepare(onnx_dir(TINY_A)) == onnx_dir(TINY_A)
    pytest.importorskip("openvino")
    with pytest.raises(ConvertedModelError, match="openvino conversion"):
        ONNXRuntimeBackend.prepare(converted_dir(TINY_A))


def test_convert_keeps_an_up_to_date_conversion(tmp_path):
    """A second `cosyvino convert` with the same sources/versions keeps the dir (README command 1
    runs convert every time); a changed source or --force converts again."""
    from click.testing import CliRunner

    from cosyvino.cli.main import main
    from cosyvino.families.cosyvoice1.synthetic import make_model

    src = make_model("tiny", tmp_path / "m", seed=5)
    args = ["convert", "--format", "onnx", "--model-dir", str(src)]
    first = CliRunner().invoke(main, args)
    assert first.exit_code == 0, first.output
    manifest = tmp_path / "m" / "onnx" / "manifest.json"
    stamp = manifest.stat().st_mtime_ns
    again = CliRunner().invoke(main, args)
    assert again.exit_code == 0, again.output
    assert "kept" in again.output and "up to date" in again.output
    assert manifest.stat().st_mtime_ns == stamp
    forced = CliRunner().invoke(main, args + ["--force"])
    assert forced.exit_code == 0 and "wrote" in forced.output
    assert manifest.stat().st_mtime_ns != stamp
    stamp = manifest.stat().st_mtime_ns
    with open(tmp_path / "m" / "cosyvoice.yaml", "a", encoding="utf-8") as f:
        f.write("\n# edited\n")
    changed = CliRunner().invoke(main, args)
    assert changed.exit_code == 0 and "wrote" in changed.output
    assert manifest.stat().st_mtime_ns != stamp
