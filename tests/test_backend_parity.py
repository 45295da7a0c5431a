"""What the runtime backends, OpenVINO (f32 compute and KV cache) and ONNX Runtime (fp32; its
LLM also with ``io_binding``), must both do, one parametrized copy: golden parity against the
official code's ``golden.pt`` of tiny-a and of every dir in COSYVINO_GOLDEN_DIRS (tensors within
1e-4, f0 in Hz and waveforms within 1e-3), whole utterances equal to the torch backend's (same
tokens, waveform within 1e-3), LLM sessions that share no state across threads, and serving in a
process that never imports torch.

The conformance suite (tests/test_conformance_builtin.py) already checks tiny-a's text encoder,
LM input, teacher-forced logp, estimator, mel from given noise, f0 and waveform for both
backends, so those run here only for the extra golden dirs (``extra_*`` cases: none when
COSYVINO_GOLDEN_DIRS is unset). Checked here for every golden dir: the KV cache across a reset
(25 teacher-forced rows, twice, and its length), the zero-shot prefix and the mel with a prompt.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from cosyvino import Synthesizer  # noqa: E402
from conftest import TINY_A, golden_dirs  # noqa: E402

ATOL, WAV_ATOL = 1e-4, 1e-3
#: variant -> (backend, conftest fixture converting a model dir for it, load options)
VARIANTS = {
    "openvino": ("openvino", "converted_dir",
                 {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}),
    "onnxruntime": ("onnxruntime", "onnx_dir", {}),
    "onnxruntime-iobinding": ("onnxruntime", "onnx_dir", {"io_binding": True}),
}
BACKENDS = ("openvino", "onnxruntime")
TEXTS = ("你好，世界。", "Hello world, this is a test.")


#: skip reason of the ``extra_*`` cases when no extra golden dir is given
NO_EXTRA_DIRS = ("runs only for the golden dirs given in COSYVINO_GOLDEN_DIRS (tiny-a is "
                 "covered by tests/test_conformance_builtin.py); none given")


def _cases(variants, dirs) -> list:
    """One case per (variant, dir); with no dirs, one skipped placeholder saying why (pytest's
    own reason for an empty parameter set names no cause)."""
    if not dirs:
        return [pytest.param(None, None, id="no-golden-dirs",
                             marks=pytest.mark.skip(reason=NO_EXTRA_DIRS))]
    return [pytest.param(v, d, id=f"{v}-{d.name}") for v in variants for d in dirs]


ALL_DIRS = _cases(BACKENDS, golden_dirs())
EXTRA_DIRS = _cases(BACKENDS, golden_dirs()[1:])


def _maxabs(a, b) -> float:
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@functools.lru_cache(maxsize=None)
def _golden(src) -> dict:
    return torch.load(src / "golden.pt", weights_only=False)


@pytest.fixture(scope="module")
def load(request):
    """``load(variant, src) -> (Synthesizer, golden)``, each loaded once per module."""
    cache: dict = {}

    def get(variant: str, src):
        if (variant, src) not in cache:
            backend, converter, options = VARIANTS[variant]
            conv = request.getfixturevalue(converter)(src)
            cache[variant, src] = Synthesizer(conv, backend=backend, **options)
        return cache[variant, src], _golden(src)

    return get


# ---- every golden dir -----------------------------------------------------------------------

@pytest.mark.parametrize("variant,src", _cases(VARIANTS, golden_dirs()))
def test_teacher_forced_logp_through_cache(load, variant, src):
    tts, g = load(variant, src)
    stages, g = tts.stages, g["llm"]
    session = stages.new_llm_session()
    for _ in range(2):  # second pass: reset must give the same rows
        session.reset()
        assert session.cache_length() == 0
        rows = [session.forward(g["lm_input"].numpy())]
        for tok in g["forced_speech_tokens"].tolist():
            rows.append(session.forward(stages.embed_speech_tokens(
                np.array([[tok]], dtype=np.int64))))
        assert len(rows) == 25
        err = _maxabs(np.stack(rows), g["logp"].numpy())
        assert err < ATOL, err
    assert session.cache_length() == g["lm_input"].shape[1] + 24


@pytest.mark.parametrize("variant,src", ALL_DIRS)
def test_zero_shot_prefix_first_logp(load, variant, src):
    tts, g = load(variant, src)
    g = g["llm"]
    lm_input = tts.pipeline.build_lm_input(g["text_token"].numpy(), g["embedding"].numpy(),
                                           g["prompt_text_token"].numpy(),
                                           g["prompt_speech_token"].numpy())
    assert _maxabs(lm_input, g["zero_shot_lm_input"].numpy()) < ATOL
    session = tts.stages.new_llm_session()
    assert _maxabs(session.forward(lm_input), g["zero_shot_first_logp"].numpy()) < ATOL


@pytest.mark.parametrize("variant,src", ALL_DIRS)
def test_mel_with_prompt_and_given_noise(load, variant, src):
    tts, g = load(variant, src)
    f = g["flow"]
    mel = tts.pipeline.tokens_to_mel(f["speech_token"].numpy()[0], f["embedding"].numpy(),
                                     noise=f["noise_with_prompt"].numpy(),
                                     prompt_token=f["prompt_speech_token"].numpy()[0],
                                     prompt_feat=f["prompt_feat"].numpy()[0])
    assert _maxabs(mel, f["mel_with_prompt"].numpy()) < ATOL


# ---- extra golden dirs only (tiny-a: the conformance suite) ---------------------------------

@pytest.mark.parametrize("variant,src", EXTRA_DIRS)
def test_extra_text_encoder_and_lm_input(load, variant, src):
    tts, g = load(variant, src)
    g = g["llm"]
    out = tts.stages.encode_text(g["text_token"].numpy())
    assert _maxabs(out, g["text_encoder_out"].numpy()) < ATOL
    lm_input = tts.pipeline.build_lm_input(g["text_token"].numpy(), g["embedding"].numpy())
    assert _maxabs(lm_input, g["lm_input"].numpy()) < ATOL


@pytest.mark.parametrize("variant,src", EXTRA_DIRS)
def test_extra_estimator(load, variant, src):
    tts, g = load(variant, src)
    e = g["flow"]["estimator_in"]
    out = tts.stages.estimate(*(e[k].numpy() for k in ("x", "mask", "mu", "t", "spks", "cond")))
    assert _maxabs(out, g["flow"]["estimator_out"].numpy()) < ATOL


@pytest.mark.parametrize("variant,src", EXTRA_DIRS)
def test_extra_mel_with_given_noise(load, variant, src):
    tts, g = load(variant, src)
    f = g["flow"]
    mel = tts.pipeline.tokens_to_mel(f["speech_token"].numpy()[0], f["embedding"].numpy(),
                                     noise=f["noise"].numpy())
    assert _maxabs(mel, f["mel"].numpy()) < ATOL


@pytest.mark.parametrize("variant,src", EXTRA_DIRS)
def test_extra_vocoder(load, variant, src):
    tts, g = load(variant, src)
    h = g["hift"]
    assert _maxabs(tts.stages.vocoder_f0(h["mel"].numpy()), h["f0"].numpy()) < WAV_ATOL  # Hz
    wav = tts.pipeline.mel_to_wav(h["mel"].numpy(), source=h["source"].numpy())
    assert _maxabs(wav, h["wav"].numpy()[0]) < WAV_ATOL


# ---- whole utterances, sessions, serving without torch (tiny-a) -----------------------------

@pytest.fixture(scope="module")
def torch_utterances():
    """The torch backend's audio for :data:`TEXTS` (the reference for every backend)."""
    ref = Synthesizer(str(TINY_A), backend="torch")
    return [ref.synthesize(text, "中文女", seed=5, num_speech_tokens=40) for text in TEXTS]


@pytest.mark.parametrize("variant", BACKENDS)
def test_whole_utterance_matches_torch_backend(load, torch_utterances, variant):
    tts, _ = load(variant, TINY_A)
    for text, a in zip(TEXTS, torch_utterances):
        b = tts.synthesize(text, "中文女", seed=5, num_speech_tokens=40)
        np.testing.assert_array_equal(a.speech_tokens, b.speech_tokens)
        assert a.samples.shape == b.samples.shape
        assert _maxabs(a.samples, b.samples) < WAV_ATOL


@pytest.mark.parametrize("variant", BACKENDS)
def test_two_concurrent_sessions_do_not_share_state(load, variant):
    stages = load(variant, TINY_A)[0].stages
    assert stages.thread_safe
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


@pytest.mark.parametrize("variant", BACKENDS)
def test_serving_does_not_import_torch(request, variant):
    backend, converter, options = VARIANTS[variant]
    conv = request.getfixturevalue(converter)(TINY_A)
    code = (
        "import sys, numpy as np\n"
        "from cosyvino import Synthesizer\n"
        f"t = Synthesizer({conv!r}, backend={backend!r}, **{options!r})\n"
        "a = t.synthesize('你好。', t.speakers[0], seed=0, num_speech_tokens=8)\n"
        "assert a.samples.size > 0\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n")
    env = dict(os.environ, COSYVINO_PLUGINS="torch,openvino,onnxruntime")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "NO-TORCH"
