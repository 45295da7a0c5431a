"""OpenVINO backend: f32 compile properties, whole-utterance parity with the torch backend,
concurrent sessions, torch-free serving, converted-dir integrity, atomic conversion and resident
memory. Golden parity: the conformance suite (tests/test_conformance_builtin.py) and
tests/test_golden_parity_backends.py. The tiny model is converted once per session
(``converted_dir`` fixture)."""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pytest

pytest.importorskip("openvino")
torch = pytest.importorskip("torch")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.errors import ConvertedModelError  # noqa: E402
from conftest import TINY_A, cpu_has_native_bf16  # noqa: E402

F32 = {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}


def _maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.fixture(scope="module")
def tiny_ov(converted_dir):
    return Synthesizer(converted_dir(TINY_A), backend="openvino", **F32)


def test_compiled_with_f32_and_reports_choice(tiny_ov):
    info = tiny_ov.stages.compile_info
    assert info["llm"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert info["llm"]["KV_CACHE_PRECISION"] == "f32"
    assert info["estimator"]["INFERENCE_PRECISION_HINT"] == "f32"
    # bucketed position table (bounded LLM memory while decoding), recorded for old-dir checks
    assert tiny_ov.stages.manifest["llm"]["pos_bucket"] == 64
    assert tiny_ov.stages.manifest["llm"]["positional"] == "keys_input"


# ---- converted-dir integrity ------------------------------------------------------------

@pytest.fixture
def ov_copy(converted_dir, tmp_path):
    dst = tmp_path / "conv"
    shutil.copytree(converted_dir(TINY_A), dst)
    return dst


def _load(path):
    return Synthesizer(str(path), backend="openvino", cache_dir="")


def test_edited_manifest_is_refused(ov_copy):
    m = ov_copy / "manifest.json"
    data = json.loads(m.read_text())
    data["files"]["llm.bin"]["precision"] = "fp16"
    m.write_text(json.dumps(data))
    with pytest.raises(ConvertedModelError, match="manifest.json") as e:
        _load(ov_copy)
    assert e.value.path == str(m)


def test_missing_bin_is_refused(ov_copy):
    (ov_copy / "estimator.bin").unlink()
    with pytest.raises(ConvertedModelError, match="estimator.bin"):
        _load(ov_copy)


def test_corrupt_xml_is_refused(ov_copy):
    p = ov_copy / "llm.xml"
    p.write_bytes(p.read_bytes().replace(b"<net", b"<nxt", 1))
    with pytest.raises(ConvertedModelError, match="llm.xml"):
        _load(ov_copy)


def test_dir_without_positional_tables_says_what_to_run(ov_copy):
    """A dir converted before the LLM took its positional tables as inputs (its
    llm_tables.npz has no pos_weight; manifest consistent with it) is refused with the
    commands that rewrite it, not a crash in the first LLM step."""
    import numpy as np

    from cosyvino.converted import file_record, read_manifest, write_manifest

    tables = dict(np.load(ov_copy / "llm_tables.npz"))
    del tables["pos_weight"]
    np.savez(ov_copy / "llm_tables.npz", **tables)
    manifest = read_manifest(str(ov_copy))
    manifest["files"]["llm_tables.npz"] = file_record(str(ov_copy / "llm_tables.npz"))
    manifest.pop("checksum", None)
    write_manifest(str(ov_copy), manifest)
    with pytest.raises(ConvertedModelError, match="pos_weight.*cosyvino convert"):
        _load(ov_copy)


def test_not_converted_dir_says_what_to_do(tmp_path):
    with pytest.raises(ConvertedModelError, match="cosyvino convert"):
        _load(tmp_path)


def test_changed_source_makes_irs_stale(tmp_path, converted_dir):
    src = tmp_path / "model"
    shutil.copytree(TINY_A, src)
    shutil.copytree(converted_dir(TINY_A), src / "openvino")
    data = json.loads((src / "openvino" / "manifest.json").read_text())
    # the copy is the same content: refresh nothing, it must load (hash fallback on mtime)
    assert data["source"]["llm.pt"]["size"] == (src / "llm.pt").stat().st_size
    _load(src)
    with open(src / "flow.pt", "ab") as f:
        f.write(b"\0")
    with pytest.raises(ConvertedModelError, match="flow.pt"):
        _load(src)


def test_failed_conversion_leaves_nothing(tmp_path, monkeypatch):
    from cosyvino.export.openvino import convert as conv

    def boom(m, spec, **kwargs):
        raise RuntimeError("conversion exploded")

    monkeypatch.setattr(conv, "convert_stateful", boom)  # the LLM step, mid-conversion
    out = tmp_path / "out"
    with pytest.raises(RuntimeError, match="exploded"):
        conv.convert_model_dir(str(TINY_A), str(out))
    assert list(tmp_path.iterdir()) == []


def test_backend_options_reach_openvino(converted_dir):
    from cosyvino.errors import BackendError

    tts = Synthesizer(converted_dir(TINY_A), backend="openvino", num_threads=1,
                      precision="f32", kv_cache_precision="f16", cache_dir="")
    info = tts.stages.compile_info
    assert info["llm"]["INFERENCE_NUM_THREADS"] == "1"
    assert info["llm"]["KV_CACHE_PRECISION"] == "f16"
    assert info["text_encoder"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert info["llm"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "128"  # LLM default
    assert info["text_encoder"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "32"  # plugin default
    tts = Synthesizer(converted_dir(TINY_A), backend="openvino", cache_dir="",
                      properties={"DYNAMIC_QUANTIZATION_GROUP_SIZE": 64})
    assert tts.stages.compile_info["llm"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "64"
    # the planner's choice (0 = off on the Zen 4 kind); raw properties still win
    tts = Synthesizer(converted_dir(TINY_A), backend="openvino", cache_dir="",
                      llm_dynamic_quantization=0)
    assert tts.stages.compile_info["llm"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "0"
    assert tts.stages.compile_info["text_encoder"]["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "32"
    for bad in (-1, 1.5, True, "off"):
        with pytest.raises(BackendError, match="llm_dynamic_quantization"):
            Synthesizer(converted_dir(TINY_A), backend="openvino", cache_dir="",
                        llm_dynamic_quantization=bad)
    with pytest.raises(BackendError, match="unknown options"):
        Synthesizer(converted_dir(TINY_A), backend="openvino", no_such_option=1)
    with pytest.raises(BackendError, match="precision"):
        Synthesizer(converted_dir(TINY_A), backend="openvino", precision="f64")


def test_stage_precision_option(converted_dir):
    """One stage moved off the common precision (bf16; a CPU without bf16 runs it in f32);
    that stage loses the blob cache (bf16-from-cache segfault); bad stage names / precisions
    are BackendErrors."""
    from cosyvino_openvino.stages import stage_properties

    from cosyvino.errors import BackendError

    per = stage_properties({"INFERENCE_PRECISION_HINT": "f32", "CACHE_DIR": "/c"},
                           {"hift_decode": "bf16"})
    assert per["hift_decode"] == {"INFERENCE_PRECISION_HINT": "bf16"}
    assert per["estimator"] == {"INFERENCE_PRECISION_HINT": "f32", "CACHE_DIR": "/c"}
    tts = Synthesizer(converted_dir(TINY_A), backend="openvino", num_threads=1,
                      precision="f32", cache_dir="", stage_precision={"hift_decode": "bf16"})
    info = tts.stages.compile_info
    assert info["estimator"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert info["hift_decode"]["INFERENCE_PRECISION_HINT"] == (  # f32 where bf16 is not native
        "bf16" if cpu_has_native_bf16() else "f32")
    audio = tts.synthesize("Hello.", tts.speakers[0], seed=0, num_speech_tokens=5)
    assert audio.samples.size > 0 and np.all(np.isfinite(audio.samples))
    with pytest.raises(BackendError, match="unknown stage 'vocoder'"):
        stage_properties({}, {"vocoder": "bf16"})
    with pytest.raises(BackendError, match="must be one of"):
        stage_properties({}, {"hift_decode": "int8"})


def test_official_dir_with_openvino_subdir_is_used(tmp_path, converted_dir):
    src = tmp_path / "model"
    shutil.copytree(TINY_A, src)
    shutil.copytree(converted_dir(TINY_A), src / "openvino")
    tts = _load(src)
    assert tts.stages.converted_dir == str(src / "openvino")
    assert tts.speakers == Synthesizer(str(TINY_A), backend="torch").speakers


# ---- resident memory (plugins/cosyvino_openvino/memory.py) ----------------------------------

def _batched_matmul_model(weight: np.ndarray, target: list[int]):
    """x [2, T, K] @ Broadcast(weight, target) -- the estimator's exported ``bmm`` linears."""
    import openvino as ov
    from openvino import opset13 as ops

    x = ops.parameter([2, -1, target[-2]], np.float32, name="x")
    w = ops.broadcast(ops.constant(weight), ops.constant(np.array(target, np.int64)))
    return ov.Model([ops.matmul(x, w, False, False)], [x])


def test_fold_weight_broadcasts_keeps_values_and_drops_the_broadcast():
    import openvino as ov
    from cosyvino_openvino.memory import fold_weight_broadcasts

    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 4, 3)).astype(np.float32)
    x = rng.standard_normal((2, 5, 4)).astype(np.float32)
    model = _batched_matmul_model(w, [2, 4, 3])
    assert fold_weight_broadcasts(model) == 1
    types = {op.get_type_name() for op in model.get_ordered_ops()}
    assert "Broadcast" not in types
    assert list(model.output(0).get_partial_shape().get_min_shape()) == [2, 0, 3]
    out = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})([x])[0]
    assert _maxabs(out, x @ w) < 1e-5


def test_fold_weight_broadcasts_leaves_matrix_broadcasts_alone():
    from cosyvino_openvino.memory import fold_weight_broadcasts

    w = np.ones((1, 1, 3), np.float32)  # broadcast along K too: not a batch-only broadcast
    assert fold_weight_broadcasts(_batched_matmul_model(w, [2, 4, 3])) == 0


def _mapping_rss_kb(path: str) -> int:
    rss, inside = 0, False
    with open("/proc/self/smaps", encoding="utf-8") as f:
        for line in f:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                inside = line.rstrip().endswith(path)
            elif inside and first == "Rss:":
                rss += int(line.split()[1])
    return rss


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_release_weight_pages_drops_read_only_mappings_only(tmp_path):
    import mmap

    from cosyvino_openvino.memory import release_weight_pages

    data = np.arange(4 << 20, dtype=np.uint8)  # 4 MiB, distinct bytes per position mod 256
    path = tmp_path / "weights.bin"
    data.tofile(path)
    with open(path, "rb") as f:
        ro = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    view = np.frombuffer(ro, np.uint8)
    assert int(view.sum(dtype=np.int64)) == int(data.sum(dtype=np.int64))  # touch every page
    assert _mapping_rss_kb(str(path)) >= 4096
    assert release_weight_pages([str(tmp_path / "elsewhere")]) == 0
    assert release_weight_pages([str(tmp_path)]) == 4 << 20
    assert _mapping_rss_kb(str(path)) < 4096
    np.testing.assert_array_equal(view, data)  # faulted back in unchanged
    del view
    ro.close()
    with open(path, "r+b") as f:  # writable private mapping: never advised (could lose data)
        rw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    rw[0] = 255
    assert release_weight_pages([str(tmp_path)]) == 0
    assert rw[0] == 255
    rw.close()


def test_weight_pages_option_gives_the_same_audio(converted_dir):
    kept = Synthesizer(converted_dir(TINY_A), backend="openvino", release_weight_pages=False,
                       **F32)
    released = Synthesizer(converted_dir(TINY_A), backend="openvino", **F32)
    assert kept.stages._pages.dirs == ()
    assert released.stages._pages.dirs == (converted_dir(TINY_A),)
    a = kept.synthesize("你好，世界。", kept.speakers[0], seed=3, num_speech_tokens=12)
    b = released.synthesize("你好，世界。", released.speakers[0], seed=3, num_speech_tokens=12)
    np.testing.assert_array_equal(a.samples, b.samples)


class _FakeCompiled:
    def __init__(self):
        self.released = 0

    def release_memory(self):
        self.released += 1


def test_intermediate_releaser_frees_idle_stages_at_quiet_transitions():
    from cosyvino_openvino.memory import IntermediateReleaser

    r = IntermediateReleaser()
    est, voc, llm = _FakeCompiled(), _FakeCompiled(), _FakeCompiled()
    for key, c in (("estimator", est), ("hift_decode", voc), ("llm", llm)):
        r.register(key, c)
    for key in ("llm", "llm", "estimator", "estimator"):  # repeated calls keep the buffers
        r.enter(key)
        r.exit(key)
    assert (llm.released, est.released) == (1, 0)  # LLM released when the estimator started
    r.enter("hift_decode")  # estimator idle: released
    assert est.released == 1 and r.releases == 2
    r.enter("llm")  # a second request while the vocoder runs: not quiet, nothing released
    assert voc.released == 0
    r.exit("hift_decode")
    r.exit("llm")
    r.enter("estimator")  # quiet again: the vocoder and the LLM go
    r.exit("estimator")
    assert (voc.released, llm.released, est.released) == (1, 2, 1)
    assert r.releases == 4
    off = IntermediateReleaser(enabled=False)
    off.register("estimator", est)
    off.enter("estimator")
    off.exit("estimator")
    off.enter("hift_decode")
    assert est.released == 1 and off.releases == 0


def test_quiet_transitions_also_drop_weight_file_pages(tmp_path):
    """With ``on_release`` (the backend passes its weight-page release), a quiet transition
    that released a stage also runs the callback — once per transition, not per call — and the
    backend wires it to the real page release when ``release_weight_pages`` is on."""
    from cosyvino_openvino.memory import IntermediateReleaser

    calls = []
    r = IntermediateReleaser(on_release=lambda: calls.append(1))
    for key in ("llm", "estimator"):
        r.register(key, _FakeCompiled())
    for key in ("llm", "llm", "llm"):  # nothing else ran yet: nothing to release
        r.enter(key)
        r.exit(key)
    assert calls == []
    r.enter("estimator")  # the LLM is released -> pages dropped once
    r.exit("estimator")
    r.enter("estimator")
    r.exit("estimator")
    assert len(calls) == 1 and r.releases == 1


def test_backend_drops_weight_pages_at_quiet_transitions(converted_dir, monkeypatch):
    import cosyvino_openvino.stages as stages_mod

    dropped = []
    real = stages_mod.release_weight_pages
    monkeypatch.setattr(stages_mod, "release_weight_pages",
                        lambda dirs: dropped.append(tuple(dirs)) or real(dirs))
    tts = Synthesizer(converted_dir(TINY_A), backend="openvino", **F32)
    tts.synthesize("你好。", tts.speakers[0], seed=0, num_speech_tokens=8)  # first-call drops
    before, transitions = len(dropped), tts.stages._intermediates.releases
    tts.synthesize("你好。", tts.speakers[0], seed=0, num_speech_tokens=8)
    # the second segment (first-call drops all done): drops come from quiet transitions only,
    # at most one per released stage
    released = tts.stages._intermediates.releases - transitions
    assert 0 < len(dropped) - before <= released
    assert all(d[0] == tts.stages.converted_dir for d in dropped)
    off = Synthesizer(converted_dir(TINY_A), backend="openvino", release_weight_pages=False, **F32)
    n = len(dropped)
    off.synthesize("你好。", off.speakers[0], seed=0, num_speech_tokens=8)
    assert len(dropped) == n  # option off: never


def test_intermediate_memory_option_gives_the_same_audio(converted_dir):
    kept = Synthesizer(converted_dir(TINY_A), backend="openvino",
                       release_intermediate_memory=False, **F32)
    released = Synthesizer(converted_dir(TINY_A), backend="openvino", **F32)
    texts = ("你好，世界。", "Hello there, world.")
    a = [kept.synthesize(t, kept.speakers[0], seed=3, num_speech_tokens=12).samples
         for t in texts]
    b = [released.synthesize(t, released.speakers[0], seed=3, num_speech_tokens=12).samples
         for t in texts]
    assert kept.stages._intermediates.releases == 0
    # each segment: LLM after the text encoder, then the flow stages, the vocoder stages
    assert released.stages._intermediates.releases >= 2 * 6
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_llm_session_after_close_is_a_backend_error(converted_dir):
    from cosyvino.errors import BackendError

    stages = Synthesizer(converted_dir(TINY_A), backend="openvino", **F32).stages
    session = stages.new_llm_session()
    session.close()
    session.close()  # idempotent
    with pytest.raises(BackendError, match="after close"):
        session.forward(np.zeros((1, 1, stages.config.llm.llm_input_size), np.float32))


@pytest.mark.parametrize("field", ["pos_bucket", "positional", "qkv"])
def test_convert_does_not_keep_an_older_llm_export_layout(ov_copy, field):
    """A dir converted before the bucketed LLM position table (manifest without
    ``llm.pos_bucket``) or before the positional tables became LLM inputs (without
    ``llm.positional``), or before q/k/v became one projection (without ``llm.qkv``) is not
    'up to date': `cosyvino convert` rewrites it."""
    from cosyvino.cli.convert import up_to_date_conversion
    from cosyvino.converted import read_manifest, write_manifest

    assert up_to_date_conversion(str(TINY_A), str(ov_copy), "openvino", "fp32") is not None
    manifest = read_manifest(str(ov_copy))
    del manifest["llm"][field]
    manifest.pop("checksum", None)
    write_manifest(str(ov_copy), manifest)
    assert up_to_date_conversion(str(TINY_A), str(ov_copy), "openvino", "fp32") is None


def test_stage_threads_option_sets_each_stage_thread_count():
    pytest.importorskip("openvino")
    from cosyvino.errors import BackendError
    from cosyvino_openvino.stages import stage_threads_properties

    per = {"llm": {"INFERENCE_NUM_THREADS": 2}, "estimator": {"INFERENCE_NUM_THREADS": 2}}
    out = stage_threads_properties(per, {"llm": 1})
    assert out["llm"]["INFERENCE_NUM_THREADS"] == 1
    assert out["estimator"]["INFERENCE_NUM_THREADS"] == 2
    with pytest.raises(BackendError, match="unknown stage"):
        stage_threads_properties(per, {"vocoder": 1})
    with pytest.raises(BackendError, match=">= 1"):
        stage_threads_properties(per, {"llm": 0})


def test_fused_qkv_projects_like_the_three_linears_and_leaves_the_module_as_it_was():
    """The export patch stacks linear_q/k/v by output channel: q, k, v (and the cache
    concatenation) equal the three separate projections, a key projection without bias gets
    zero biases, and afterwards the module, its state_dict and its method are the originals."""
    from cosyvino.export.openvino.model_patcher import fused_qkv
    from cosyvino.families.cosyvoice1.torch.transformer import RelPositionMultiHeadedAttention

    torch.manual_seed(0)
    for key_bias in (True, False):
        att = RelPositionMultiHeadedAttention(4, 32, key_bias=key_bias).eval()
        keys_before = list(att.state_dict())
        x = torch.randn(2, 3, 32)
        past_k, past_v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 5, 8)
        with torch.no_grad():
            want = att.project_qkv(x, past_k, past_v)
            with fused_qkv(att):
                assert att.linear_qkv.weight.shape == (96, 32)
                got = att.project_qkv(x, past_k, past_v)
        for w, g in zip(want, got):
            assert g.shape == w.shape
            torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
        assert got[1].shape == (2, 4, 8, 8)  # the 5 cached keys + 3 new
        assert not hasattr(att, "linear_qkv")
        assert "project_qkv" not in vars(att)
        assert list(att.state_dict()) == keys_before


def test_converted_llm_has_one_qkv_projection_per_layer(converted_dir):
    """The exported step computes q, k and v with one FullyConnected per layer: MatMuls named
    after ``linear_qkv``, none after the separate ``linear_q`` / ``linear_k`` / ``linear_v``."""
    import openvino as ov

    from cosyvino.families.cosyvoice1.torch.loading import load_torch_model

    layers = len(load_torch_model(str(TINY_A)).llm.llm.encoders)
    model = ov.Core().read_model(f"{converted_dir(TINY_A)}/llm.xml")
    matmuls = [op.get_friendly_name() for op in model.get_ops()
               if op.get_type_name() == "MatMul" and ".llm.encoders." in op.get_friendly_name()]
    fused = {n.split(".self_attn")[0] for n in matmuls if "self_attn.linear_qkv" in n}
    assert len(fused) == layers
    assert not [n for n in matmuls if any(f"self_attn.linear_{p}/" in n for p in "qkv")]
