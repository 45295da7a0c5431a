"""The built-in backends pass the public conformance suite (cosyvino.testing), and the suite's
numpy goldens are exactly the official golden.pt tensors they were exported from."""

from __future__ import annotations

import numpy as np
import pytest

from cosyvino.testing import (
    GOLDEN_KEYS,
    TINY_MODEL_DIR,
    BackendConformance,
    load_goldens,
)


class TestTorchConformance(BackendConformance):
    backend = "torch"


class TestOpenVINOConformance(BackendConformance):
    backend = "openvino"
    load_options = {"precision": "f32", "kv_cache_precision": "f32", "cache_dir": ""}

    @pytest.fixture(scope="class")
    @classmethod
    def prepared_dir(cls, available_class, converted_dir):
        pytest.importorskip("torch")  # converting reads the .pt files
        # conftest converts the tiny model once per session (through `cosyvino convert`);
        # prepare() of that converted dir must hand it back unchanged
        out = converted_dir(TINY_MODEL_DIR)
        assert available_class.prepare(out) == out
        return out


class TestOnnxRuntimeConformance(BackendConformance):
    """Runs once the ONNX Runtime plugin is installed and registered (it lands separately)."""

    backend = "onnxruntime"

    @pytest.fixture(scope="class")
    @classmethod
    def backend_class(cls):
        pytest.importorskip("onnxruntime")
        from cosyvino.plugins import backend_classes

        found = backend_classes().get(cls.backend)
        if found is None:
            pytest.skip("onnxruntime backend not registered (plugin not installed or pinned out)")
        return found

    @pytest.fixture(scope="class")
    @classmethod
    def prepared_dir(cls, available_class, onnx_dir):
        pytest.importorskip("torch")  # converting reads the .pt files
        return onnx_dir(TINY_MODEL_DIR)  # converted once per session (conftest)


def test_goldens_npz_matches_golden_pt():
    torch = pytest.importorskip("torch")
    golden = torch.load(TINY_MODEL_DIR / "golden.pt", weights_only=False)
    npz = load_goldens()
    assert set(npz) == set(GOLDEN_KEYS)
    for key, src in GOLDEN_KEYS.items():
        obj = golden
        for part in src.split("/"):
            obj = obj[part]
        want = obj.numpy()
        assert npz[key].dtype == (np.int64 if want.dtype.kind in "iu" else np.float32), key
        np.testing.assert_array_equal(npz[key], want, err_msg=key)
