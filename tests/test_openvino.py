"""OpenVINO backend: golden parity at f32 (stateful LLM cache included), whole-utterance parity
with the torch backend, concurrent sessions, torch-free serving, converted-dir integrity and
atomic conversion. The tiny model is converted once per session (``converted_dir`` fixture)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading

import numpy as np
import pytest

pytest.importorskip("openvino")
torch = pytest.importorskip("torch")

from cosyvino import Synthesizer  # noqa: E402
from cosyvino.errors import ConvertedModelError  # noqa: E402
from conftest import TINY_A, golden_dirs  # noqa: E402

F32 = {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}


def _maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.fixture(scope="module", params=golden_dirs(), ids=lambda p: p.name)
def golden_ov(request, converted_dir):
    src = request.param
    tts = Synthesizer(converted_dir(src), backend="openvino", **F32)
    golden = torch.load(src / "golden.pt", weights_only=False)
    return tts, golden


def test_compiled_with_f32_and_reports_choice(golden_ov):
    info = golden_ov[0].stages.compile_info
    assert info["llm"]["INFERENCE_PRECISION_HINT"] == "f32"
    assert info["llm"]["KV_CACHE_PRECISION"] == "f32"
    assert info["estimator"]["INFERENCE_PRECISION_HINT"] == "f32"


def test_text_encoder_and_lm_input(golden_ov):
    tts, g = golden_ov
    g = g["llm"]
    out = tts.stages.encode_text(g["text_token"].numpy())
    assert _maxabs(out, g["text_encoder_out"].numpy()) < 1e-4
    lm_input = tts.pipeline.build_lm_input(g["text_token"].numpy(), g["embedding"].numpy())
    assert _maxabs(lm_input, g["lm_input"].numpy()) < 1e-4


def test_teacher_forced_logp_through_stateful_cache(golden_ov):
    tts, g = golden_ov
    g = g["llm"]
    session = tts.stages.new_llm_session()
    for _ in range(2):  # second pass: reset_state must give the same rows
        session.reset()
        rows = [session.forward(g["lm_input"].numpy())]
        for tok in g["forced_speech_tokens"].tolist():
            rows.append(session.forward(tts.stages.embed_speech_tokens(
                np.array([[tok]], dtype=np.int64))))
        assert len(rows) == 25
        err = _maxabs(np.stack(rows), g["logp"].numpy())
        assert err < 1e-4, err
    assert session.cache_length() == g["lm_input"].shape[1] + 24


def test_zero_shot_prefix_first_logp(golden_ov):
    tts, g = golden_ov
    g = g["llm"]
    lm_input = tts.pipeline.build_lm_input(g["text_token"].numpy(), g["embedding"].numpy(),
                                           g["prompt_text_token"].numpy(),
                                           g["prompt_speech_token"].numpy())
    assert _maxabs(lm_input, g["zero_shot_lm_input"].numpy()) < 1e-4
    session = tts.stages.new_llm_session()
    assert _maxabs(session.forward(lm_input), g["zero_shot_first_logp"].numpy()) < 1e-4


def test_estimator(golden_ov):
    tts, g = golden_ov
    e = g["flow"]["estimator_in"]
    out = tts.stages.estimate(*(e[k].numpy() for k in ("x", "mask", "mu", "t", "spks", "cond")))
    assert _maxabs(out, g["flow"]["estimator_out"].numpy()) < 1e-4


def test_mel_with_given_noise(golden_ov):
    tts, g = golden_ov
    f = g["flow"]
    pipe = tts.pipeline
    mel = pipe.tokens_to_mel(f["speech_token"].numpy()[0], f["embedding"].numpy(),
                             noise=f["noise"].numpy())
    assert _maxabs(mel, f["mel"].numpy()) < 1e-4
    mel_p = pipe.tokens_to_mel(f["speech_token"].numpy()[0], f["embedding"].numpy(),
                               noise=f["noise_with_prompt"].numpy(),
                               prompt_token=f["prompt_speech_token"].numpy()[0],
                               prompt_feat=f["prompt_feat"].numpy()[0])
    assert _maxabs(mel_p, f["mel_with_prompt"].numpy()) < 1e-4


def test_vocoder(golden_ov):
    tts, g = golden_ov
    h = g["hift"]
    f0 = tts.stages.vocoder_f0(h["mel"].numpy())
    assert _maxabs(f0, h["f0"].numpy()) < 1e-3  # Hz
    wav = tts.pipeline.mel_to_wav(h["mel"].numpy(), source=h["source"].numpy())
    assert _maxabs(wav, h["wav"].numpy()[0]) < 1e-3


@pytest.fixture(scope="module")
def tiny_ov(converted_dir):
    return Synthesizer(converted_dir(TINY_A), backend="openvino", **F32)


def test_whole_utterance_matches_torch_backend(tiny_ov):
    ref = Synthesizer(str(TINY_A), backend="torch")
    for text in ("你好，世界。", "Hello world, this is a test."):
        a = ref.synthesize(text, "中文女", seed=5, num_speech_tokens=40)
        b = tiny_ov.synthesize(text, "中文女", seed=5, num_speech_tokens=40)
        np.testing.assert_array_equal(a.speech_tokens, b.speech_tokens)
        assert a.samples.shape == b.samples.shape
        assert _maxabs(a.samples, b.samples) < 1e-3


def test_two_concurrent_sessions_do_not_share_state(tiny_ov):
    stages = tiny_ov.stages
    rng = np.random.default_rng(0)
    d = stages.config.llm.llm_input_size
    inputs = [[rng.standard_normal((1, 9, d), dtype=np.float32)]
              + [rng.standard_normal((1, 1, d), dtype=np.float32) for _ in range(12)]
              for _ in range(2)]

    def run(seq):
        s = stages.new_llm_session()
        return np.stack([s.forward(x) for x in seq])

    expected = [run(seq) for seq in inputs]
    got: list = [None, None]
    barrier = threading.Barrier(2)

    def worker(i):
        s = stages.new_llm_session()
        rows = []
        for x in inputs[i]:
            barrier.wait()  # interleave the two sessions step by step
            rows.append(s.forward(x))
        got[i] = np.stack(rows)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(2):
        np.testing.assert_array_equal(got[i], expected[i])
    assert not np.array_equal(expected[0], expected[1])


def test_serving_from_ir_does_not_import_torch(converted_dir):
    code = (
        "import sys, numpy as np\n"
        "from cosyvino import Synthesizer\n"
        f"t = Synthesizer({converted_dir(TINY_A)!r}, backend='openvino', cache_dir='')\n"
        "a = t.synthesize('你好。', t.speakers[0], seed=0, num_speech_tokens=8)\n"
        "assert a.samples.size > 0\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n")
    env = dict(os.environ, COSYVINO_PLUGINS="torch,openvino")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "NO-TORCH"


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

    def boom(m):
        raise RuntimeError("conversion exploded")

    monkeypatch.setattr(conv, "convert_llm", boom)
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
    with pytest.raises(BackendError, match="unknown options"):
        Synthesizer(converted_dir(TINY_A), backend="openvino", no_such_option=1)
    with pytest.raises(BackendError, match="precision"):
        Synthesizer(converted_dir(TINY_A), backend="openvino", precision="f64")


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
