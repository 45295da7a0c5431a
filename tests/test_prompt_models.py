"""The two ONNX prompt models (campplus.onnx, speech_tokenizer_v1.onnx): the synthetic stand-ins'
I/O contract (architecture sheet 3.4 / 3.5), running them on OpenVINO and ONNX Runtime (same
outputs), make-model writing them, and the typed errors for missing / broken files and bad
features."""

from __future__ import annotations

import math
import os
import shutil

import numpy as np
import pytest

from cosyvino.errors import BackendError, InputError, ModelDirError
from cosyvino.families.cosyvoice1.prompt_models import (
    CAMPPLUS_FILE,
    SPEECH_TOKENIZER_FILE,
    PromptModels,
    runner_factory,
)
from cosyvino.families.cosyvoice1.synthetic_prompt_models import write_prompt_models

onnx = pytest.importorskip("onnx")
BACKENDS = ["openvino", "onnxruntime"]


@pytest.fixture(scope="module")
def prompt_dir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("prompt_models")
    write_prompt_models(d, "tiny", seed=7)
    return str(d)


@pytest.fixture(scope="module")
def models(prompt_dir):
    out = {b: PromptModels(prompt_dir, b) for b in BACKENDS}
    yield out
    for m in out.values():
        m.close()


def _features(frames: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    fbank = rng.standard_normal((frames, 80)).astype(np.float32)
    return fbank - fbank.mean(axis=0), rng.standard_normal((1, 128, frames)).astype(np.float32)


def _io(path):
    m = onnx.load(path)

    def dims(v):
        return [d.dim_value if d.HasField("dim_value") else d.dim_param
                for d in v.type.tensor_type.shape.dim]

    def dtype(v):
        return onnx.helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type)

    return ([(dtype(v), dims(v)) for v in m.graph.input],
            [(dtype(v), dims(v)) for v in m.graph.output])


def test_stand_ins_have_the_official_io_contract(prompt_dir):
    ins, outs = _io(os.path.join(prompt_dir, CAMPPLUS_FILE))
    assert ins == [(np.float32, [1, "T", 80])]
    assert outs == [(np.float32, [1, 192])]
    ins, outs = _io(os.path.join(prompt_dir, SPEECH_TOKENIZER_FILE))
    assert ins == [(np.float32, [1, 128, "T"]), (np.int32, [1])]
    assert outs == [(np.int64, [1, 1, "T_out"])]
    for name in (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE):
        onnx.checker.check_model(os.path.join(prompt_dir, name))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("frames", [1, 347, 348])
def test_outputs_have_the_contract_shapes(models, backend, frames):
    fbank, log_mel = _features(frames)
    emb = models[backend].embedding(fbank)
    assert emb.shape == (1, 192) and emb.dtype == np.float32 and np.isfinite(emb).all()
    assert np.abs(emb).max() > 0
    tokens = models[backend].speech_tokens(log_mel)
    assert tokens.shape == (1, math.ceil(frames / 2)) and tokens.dtype == np.int64
    assert tokens.min() >= 0 and tokens.max() < 4096


def test_openvino_equals_onnxruntime(models):
    for seed, frames in ((0, 346), (1, 1200)):
        fbank, log_mel = _features(frames, seed)
        np.testing.assert_allclose(models["openvino"].embedding(fbank),
                                   models["onnxruntime"].embedding(fbank), atol=1e-5, rtol=0)
        ov_tokens = models["openvino"].speech_tokens(log_mel)
        np.testing.assert_array_equal(ov_tokens, models["onnxruntime"].speech_tokens(log_mel))
        assert len(np.unique(ov_tokens)) > 5  # not a constant: the codebook lookup works


def test_outputs_depend_on_the_input(models):
    a, la = _features(300, 0)
    b, lb = _features(300, 1)
    m = models["openvino"]
    assert np.abs(m.embedding(a) - m.embedding(b)).max() > 1e-3
    assert (m.speech_tokens(la) != m.speech_tokens(lb)).any()
    np.testing.assert_array_equal(m.embedding(a[None]), m.embedding(a))  # [1, T, 80] accepted


def test_make_model_writes_the_stand_ins(tiny_model_dir):
    for name in (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE):
        assert os.path.isfile(os.path.join(tiny_model_dir, name))
    m = PromptModels(tiny_model_dir)
    fbank, log_mel = _features(200)
    assert m.embedding(fbank).shape == (1, 192)
    assert m.speech_tokens(log_mel).shape == (1, 100)


def test_stand_ins_are_deterministic_per_seed(tmp_path, prompt_dir):
    write_prompt_models(tmp_path, "tiny", seed=7)
    for name in (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE):
        with open(tmp_path / name, "rb") as f, open(os.path.join(prompt_dir, name), "rb") as g:
            assert f.read() == g.read()
    with pytest.raises(InputError, match="unknown prompt-model preset"):
        write_prompt_models(tmp_path, "huge")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE])
def test_missing_file_is_a_model_dir_error_naming_it(tmp_path, prompt_dir, backend, name):
    for other in (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE):
        if other != name:
            shutil.copy(os.path.join(prompt_dir, other), tmp_path / other)
    with pytest.raises(ModelDirError, match=name) as e:
        PromptModels(tmp_path, backend)
    assert e.value.path == str(tmp_path / name)
    assert "make-model" in str(e.value)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", [CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE])
def test_broken_file_is_a_model_dir_error_naming_it(tmp_path, prompt_dir, backend, name):
    for other in (CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE):
        shutil.copy(os.path.join(prompt_dir, other), tmp_path / other)
    good = (tmp_path / name).read_bytes()
    (tmp_path / name).write_bytes(good[: len(good) // 3])  # truncated download
    with pytest.raises(ModelDirError, match=name) as e:
        PromptModels(tmp_path, backend)
    assert e.value.path == str(tmp_path / name)
    (tmp_path / name).write_text("not an onnx file\n")
    with pytest.raises(ModelDirError, match="not a readable ONNX model"):
        PromptModels(tmp_path, backend)


def test_bad_features_are_input_errors(models):
    m = models["onnxruntime"]
    with pytest.raises(InputError, match=r"\[T, 80\]"):
        m.embedding(np.zeros((10, 40), np.float32))
    with pytest.raises(InputError, match=r"\[T, 80\]"):
        m.embedding(np.zeros((0, 80), np.float32))
    bad = np.zeros((10, 80), np.float32)
    bad[3, 3] = np.nan
    with pytest.raises(InputError, match="NaN"):
        m.embedding(bad)
    with pytest.raises(InputError, match=r"\[1, 128, T\]"):
        m.speech_tokens(np.zeros((1, 80, 10), np.float32))
    with pytest.raises(InputError, match="30 s"):
        m.speech_tokens(np.zeros((1, 128, 3001), np.float32))
    assert m.speech_tokens(np.zeros((1, 128, 3000), np.float32)).shape == (1, 1500)


def test_backend_choice_errors(prompt_dir):
    with pytest.raises(BackendError, match="unknown backend"):
        PromptModels(prompt_dir, "nosuch")
    # torch runs graphs of its own modules, not plain ONNX files: the message names who can
    with pytest.raises(BackendError, match="cannot run plain ONNX.*onnxruntime, openvino"):
        runner_factory("torch")
    with pytest.raises(BackendError, match="unknown ONNX runner options"):
        PromptModels(prompt_dir, "onnxruntime", precision="bf16")
    with pytest.raises(ModelDirError, match="not found"):
        PromptModels(os.path.join(prompt_dir, "nope"))


def test_custom_runner_factory(prompt_dir):
    calls = []

    class Fixed:
        def __init__(self, path):
            calls.append(os.path.basename(path))

        def run(self, inputs):
            if len(inputs) == 1:
                return [np.ones((1, 192), np.float32)]
            return [np.full((1, 1, 5), 4096, np.int64)]  # out of the vocabulary

    m = PromptModels(prompt_dir, factory=Fixed)
    assert calls == [CAMPPLUS_FILE, SPEECH_TOKENIZER_FILE]
    fbank, log_mel = _features(10)
    np.testing.assert_array_equal(m.embedding(fbank), np.ones((1, 192), np.float32))
    with pytest.raises(BackendError, match="outside 0..4095"):
        m.speech_tokens(log_mel)
