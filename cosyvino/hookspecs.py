"""Hook specifications of cosyvino's plugin system (pluggy project name ``cosyvino``).

A plugin is any module registered under the setuptools entry point group ``cosyvino`` that
implements one or more of these hooks with ``@cosyvino.hookimpl``. The built-in backends are
plugins too, registered the same way. Must not import torch.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("cosyvino")
hookimpl = pluggy.HookimplMarker("cosyvino")


@hookspec
def register_backends(register):
    """Call ``register(backend_class)`` for each :class:`cosyvino.backends.Backend` subclass
    this plugin provides."""


@hookspec
def register_families(register):
    """Call ``register(family_class)`` for each :class:`cosyvino.families.base.ModelFamily`
    subclass this plugin provides (a model family: config, graph table, modes, program)."""
