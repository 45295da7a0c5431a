"""Plugin discovery: one pluggy PluginManager, setuptools entry points of group ``cosyvino``.

``COSYVINO_PLUGINS`` pins which entry points load (comma-separated names; empty string loads
none) — for tests and for users isolating a broken plugin. A plugin that fails to import or
registers something malformed is reported by name (warning + :func:`plugin_errors`) and
skipped; it never breaks the others.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading

import pluggy

from . import hookspecs
from .errors import BackendError, PluginError

ENTRY_POINT_GROUP = "cosyvino"
#: plugin modules of the core, registered in every PluginManager through the same hooks as
#: entry-point plugins (not subject to ``COSYVINO_PLUGINS``: cosyvino cannot read a model dir
#: without its built-in family)
BUILTIN_PLUGINS = ("cosyvino.families.cosyvoice1", "cosyvino.families.cosyvoice2",
                   "cosyvino.families.cosyvoice3")
log = logging.getLogger(__name__)

_lock = threading.Lock()
_pm: pluggy.PluginManager | None = None
_errors: dict[str, str] = {}


def _allowed_names() -> set[str] | None:
    pinned = os.environ.get("COSYVINO_PLUGINS")
    if pinned is None:
        return None
    return {n.strip() for n in pinned.split(",") if n.strip()}


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide PluginManager, loading entry points on first use."""
    global _pm
    with _lock:
        if _pm is not None:
            return _pm
        pm = pluggy.PluginManager("cosyvino")
        pm.add_hookspecs(hookspecs)
        for name in BUILTIN_PLUGINS:
            pm.register(importlib.import_module(name), name=name)
        allowed = _allowed_names()
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            if allowed is not None and ep.name not in allowed:
                continue
            if pm.has_plugin(ep.name):
                continue
            try:
                module = ep.load()
                pm.register(module, name=ep.name)
            except Exception as e:  # a third-party plugin must not take cosyvino down
                _errors[ep.name] = f"{type(e).__name__}: {e}"
                log.warning("cosyvino plugin %r (%s) failed to load and is skipped: %s",
                            ep.name, ep.value, _errors[ep.name])
        _pm = pm
        return pm


def plugin_errors() -> dict[str, str]:
    """Plugins that failed to load or register, name -> reason."""
    get_plugin_manager()
    return dict(_errors)


def _reset_for_tests() -> None:
    global _pm
    with _lock:
        _pm = None
        _errors.clear()


def registered(hook_name: str, base: type, what: str) -> dict[str, type]:
    """Classes registered through ``hook_name`` (``register(cls)`` calls) by their ``name``,
    first registration winning; a class that is not a ``base`` subclass with a non-empty
    ``name`` (``what``: the base's name, for the report) or a hook that raises is reported by
    plugin name (warning + :func:`plugin_errors`) and skipped. Used for backends here and for
    model families by :func:`cosyvino.families.family_classes`."""
    pm = get_plugin_manager()
    found: dict[str, type] = {}
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        plugin_name = pm.get_name(impl.plugin) or repr(impl.plugin)
        collected: list = []
        try:
            impl.function(register=collected.append)
        except Exception as e:
            _errors[plugin_name] = f"{hook_name} raised {type(e).__name__}: {e}"
            log.warning("cosyvino plugin %r: %s", plugin_name, _errors[plugin_name])
            continue
        for cls in collected:
            if not (isinstance(cls, type) and issubclass(cls, base)
                    and isinstance(getattr(cls, "name", None), str) and cls.name):
                _errors[plugin_name] = (f"registered {cls!r}, which is not a {what} subclass "
                                        "with a non-empty 'name'")
                log.warning("cosyvino plugin %r: %s", plugin_name, _errors[plugin_name])
                continue
            found.setdefault(cls.name, cls)
    return found


def backend_classes() -> dict[str, type]:
    """All registered backend classes by ``Backend.name``; malformed ones are skipped."""
    from .backends.base import Backend

    return registered("register_backends", Backend, "Backend")


def get_backend(name: str) -> type:
    """The backend class registered under ``name``.

    Raises:
        BackendError: no such backend (the message lists installed ones and plugin errors).
    """
    classes = backend_classes()
    if name in classes:
        return classes[name]
    msg = f"unknown backend {name!r}; installed backends: {', '.join(sorted(classes)) or 'none'}"
    if _errors:
        msg += "; plugins that failed to load: " + "; ".join(f"{k} ({v})"
                                                             for k, v in _errors.items())
    raise (PluginError if name in _errors else BackendError)(msg)
