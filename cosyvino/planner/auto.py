"""Plan resolution for :meth:`cosyvino.Synthesizer.auto` and ``cosyvino serve``: load the plan
(or plan on the fly), warn when the machine no longer matches, build the Synthesizer.

Lookup order when no plan is given: ``$COSYVINO_PLAN``, ``./plan.toml``,
``<model_dir>/plan.toml`` (model_dir None = the default model dir); none found = plan now
(not written anywhere).
"""

from __future__ import annotations

import logging
import os
import warnings

from ..errors import BackendError
from .planfile import Plan, PlanError, find_plan_file, load_plan

log = logging.getLogger("cosyvino.planner")


class PlanMismatchWarning(UserWarning):
    """The machine (or model dir) differs from the one the plan was made for."""


def _same_dir(a: str | None, b: str | None) -> bool:
    if not a or not b:
        return True
    return os.path.realpath(os.path.expanduser(a)) == os.path.realpath(os.path.expanduser(b))


def _warn(msg: str) -> None:
    log.warning(msg)
    warnings.warn(msg, PlanMismatchWarning, stacklevel=4)


def resolve_plan(model_dir: str | None = None, plan=None, *, goal: str = "latency",
                 check: bool = True) -> Plan:
    """The plan to run ``model_dir`` with.

    Args:
        model_dir: model to serve (None = the plan's model dir, else the default model).
        plan: a :class:`Plan`, a path to a plan file, or None (look it up, else plan now).
        goal: used only when planning on the fly.
        check: compare the plan's probe with this machine and warn
            (:class:`PlanMismatchWarning`) on differences.

    Raises:
        PlanError: an explicitly given plan file is unreadable; no workable plan.
    """
    from . import make_plan, probe

    if isinstance(plan, (str, os.PathLike)):
        plan = load_plan(os.fspath(plan))
    elif plan is None:
        path = find_plan_file(model_dir)
        if path:
            try:
                plan = load_plan(path)
            except PlanError as e:
                _warn(f"{e}; planning on the fly instead")
    if plan is not None and model_dir is not None and not _same_dir(plan.model_dir, model_dir):
        _warn(f"plan {plan.path or ''} was made for {plan.model_dir}, not {model_dir}; "
              "planning on the fly instead")
        plan = None
    now = probe(model_dir=model_dir if model_dir is not None else
                (plan.model_dir if plan is not None and plan.model_dir else None))
    if plan is None:
        return make_plan(now, model_dir=model_dir, goal=goal)
    if check:
        diffs = plan.check_machine(now)
        if diffs:
            _warn(f"plan {plan.path or ''} does not match this machine: " + "; ".join(diffs))
        lost = _lost_int8_dot_products(plan, now)
        if lost:
            _warn(f"plan {plan.path or ''} serves static INT8 {lost}, planned on a CPU with "
                  "int8 dot products, but this CPU has none (no VNNI or AMX-INT8): INT8 is "
                  "slower and less accurate here; re-run `cosyvino plan`, which serves the "
                  "fp32 or INT8-LLM conversion on such a CPU (docs/planner.md, "
                  "'Machine kinds')")
    return plan


def _lost_int8_dot_products(plan: Plan, now) -> str:
    """The plan's static INT8 stages (comma-joined) when the plan was made on a CPU with int8
    dot products and ``now`` (a probe) has none; "" otherwise."""
    from .rules import INT8_COMPUTE_STAGES, int8_dot_products

    stages = [s for s in INT8_COMPUTE_STAGES if (plan.precision or {}).get(s) == "int8"]
    then = (plan.probe or {}).get("flags") or []
    if stages and int8_dot_products(then) and not int8_dot_products(now.flags):
        return ", ".join(stages)
    return ""


def synthesizer_from_plan(cls, model_dir: str | None, plan: Plan):
    """``cls(model_dir, backend=plan.backend, **plan.backend_options, llm_batch=plan.llm_batch,
    estimator_batch=plan.estimator_batch)`` (each only when > 1); when the backend
    rejects an option (older/newer plugin), retries with ``num_threads`` only and warns."""
    from ..families import recognized_family

    # the plan's dir when a family recognizes it (any family's official or converted dir)
    if model_dir is None and plan.model_dir and recognized_family(plan.model_dir):
        model_dir = plan.model_dir
    opts = dict(plan.backend_options)
    if getattr(plan, "llm_batch", 1) > 1:
        opts["llm_batch"] = plan.llm_batch
    if getattr(plan, "estimator_batch", 1) > 1:
        opts["estimator_batch"] = plan.estimator_batch
    try:
        synth = cls(model_dir, backend=plan.backend, **opts)
    except BackendError as e:
        if "unknown option" not in str(e) or set(opts) <= {"num_threads"}:
            raise
        _warn(f"backend {plan.backend!r} rejected plan options ({e}); using num_threads only")
        synth = cls(model_dir, backend=plan.backend, num_threads=opts.get("num_threads"))
    synth.plan = plan
    return synth
