"""Plugin framework: entry-point discovery, pinning, and isolation of broken plugins."""

from __future__ import annotations

import importlib.metadata
import types

import pytest

import cosyvino
from cosyvino import plugins
from cosyvino.backends import Backend
from cosyvino.errors import BackendError


@pytest.fixture(autouse=True)
def fresh_manager():
    plugins._reset_for_tests()
    yield
    plugins._reset_for_tests()


def test_builtin_torch_backend_comes_from_entry_point():
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="cosyvino")}
    assert eps.get("torch") == "cosyvino_torch"
    cls = plugins.get_backend("torch")
    assert issubclass(cls, Backend) and cls.name == "torch"


def test_unknown_backend_lists_installed():
    with pytest.raises(BackendError, match="installed backends: .*torch"):
        plugins.get_backend("no-such-backend")


def test_pinning_to_no_plugins(monkeypatch):
    monkeypatch.setenv("COSYVINO_PLUGINS", "")
    assert plugins.backend_classes() == {}


class _FakeEP:
    def __init__(self, name, loader):
        self.name, self.value, self._loader = name, f"fake:{name}", loader

    def load(self):
        return self._loader()


def _install_fake_eps(monkeypatch, eps):
    real = importlib.metadata.entry_points

    def fake(group=None, **kw):
        found = list(real(group=group, **kw)) if group else []
        return found + list(eps) if group == "cosyvino" else found

    monkeypatch.setattr(importlib.metadata, "entry_points", fake)
    monkeypatch.setenv("COSYVINO_PLUGINS", "torch," + ",".join(e.name for e in eps))


def test_broken_plugins_are_reported_and_skipped(monkeypatch):
    def boom():
        raise RuntimeError("plugin import exploded")

    bad_register = types.ModuleType("bad_register")

    @cosyvino.hookimpl
    def register_backends(register):
        register(object)  # not a Backend subclass

    bad_register.register_backends = register_backends

    class Good(Backend):
        name = "good"
        description = "test backend"

        @classmethod
        def load(cls, model_dir, **options):
            raise NotImplementedError

    good = types.ModuleType("good_plugin")

    @cosyvino.hookimpl
    def register_good(register):
        register(Good)

    good.register_backends = register_good
    _install_fake_eps(monkeypatch, [_FakeEP("exploding", boom),
                                    _FakeEP("malformed", lambda: bad_register),
                                    _FakeEP("good", lambda: good)])
    classes = plugins.backend_classes()
    assert classes["good"] is Good and "torch" in classes
    errors = plugins.plugin_errors()
    assert "plugin import exploded" in errors["exploding"]
    assert "not a Backend subclass" in errors["malformed"]
    with pytest.raises(BackendError, match="exploding"):
        plugins.get_backend("exploding")
