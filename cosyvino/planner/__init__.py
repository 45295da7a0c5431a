"""Deployment planner: probe the CPU, decide threads/streams/backend/precision/sessions, write a
plan that ``cosyvino serve`` and :meth:`cosyvino.Synthesizer.auto` obey. See docs/planner.md.

API (all torch- and openvino-free to import)::

    from cosyvino.planner import probe, make_plan, load_plan
    p = probe(model_dir=D)                 # Probe: topology, ISA, cgroup limits, backends, model
    plan = make_plan(p, model_dir=D, goal="latency")   # Plan (raises PlanError)
    plan.save("plan.toml"); plan = load_plan("plan.toml")
    Synthesizer(D, backend=plan.backend, **plan.backend_options)
    plan.max_sessions, plan.queue_size      # server pool and queue sizes
    plan.check_machine(probe())             # -> list of warnings ([] = machine still matches)
"""

from __future__ import annotations

from .inventory import device_views, installed_backends, model_inventory
from .planfile import (PLAN_ENV, PLAN_FILENAME, PLAN_VERSION, Plan, PlanError, find_plan_file,
                       load_plan)
from .rules import GOALS, make_plan
from .topology import Probe, probe_topology


def probe(root: str = "/", *, affinity=None, model_dir: str | None = None,
          with_devices: bool = True, with_backends: bool = True) -> Probe:
    """Full probe: :func:`probe_topology` plus the backends' runtimes' view of the CPU
    (``devices``: :meth:`cosyvino.backends.Backend.device_info`), the installed backend plugins
    and the model dir's inventory (when ``model_dir`` is given: what each backend finds)."""
    p = probe_topology(root, affinity=affinity)
    if with_devices:
        p.devices = device_views()
    if with_backends:
        p.backends = installed_backends()
    if model_dir is not None:
        p.model = model_inventory(model_dir)
    return p


__all__ = ["GOALS", "PLAN_ENV", "PLAN_FILENAME", "PLAN_VERSION", "Plan", "PlanError", "Probe",
           "device_views", "find_plan_file", "installed_backends", "load_plan", "make_plan",
           "model_inventory", "probe", "probe_topology"]
