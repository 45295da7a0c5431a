"""The embedded default model: created once; a clear error where it cannot be created."""

from __future__ import annotations

import sys

import pytest

from cosyvino.defaults import ensure_default_model
from cosyvino.errors import ModelDirError


def test_existing_model_is_returned_without_torch(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "cosyvino.families.cosyvoice1.synthetic", None)
    assert ensure_default_model(tiny_model_dir) == tiny_model_dir


def test_missing_model_without_torch_is_a_model_dir_error(tmp_path, monkeypatch):
    """A serving-only install (no torch) asked for the synthetic default: a typed error that
    says what to install or pass, not a bare ImportError."""
    monkeypatch.setitem(sys.modules, "cosyvino.families.cosyvoice1.synthetic", None)
    with pytest.raises(ModelDirError) as e:
        ensure_default_model(str(tmp_path / "m"), say=lambda m: None)
    assert "cosyvino[torch]" in str(e.value) and "--model-dir" in str(e.value)
    assert not (tmp_path / "m").exists()
