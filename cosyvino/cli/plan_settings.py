"""One rule for flags over a plan file, shared by ``serve``, ``synth``, ``vc`` and ``demo``."""

from __future__ import annotations

import os

from click.core import ParameterSource

#: how a parameter counts as given explicitly (an environment variable is a deliberate setting)
EXPLICIT = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def same_model(a: str, b: str) -> bool:
    """True when model dirs ``a`` and ``b`` are the same or one holds the other (a plan made for
    D may name D or a converted dir inside it, e.g. D/openvino-int8)."""
    a, b = (os.path.realpath(os.path.expanduser(p)) for p in (a, b))
    return os.path.commonpath([a, b]) in (a, b)


def source_model_dir(model_dir: str) -> str:
    """The official model dir a converted dir was made from (its manifest's ``source_dir``,
    when that dir exists), else ``model_dir`` itself."""
    import json

    try:
        with open(os.path.join(model_dir, "manifest.json"), encoding="utf-8") as f:
            src = json.load(f).get("source_dir")
    except (OSError, ValueError, AttributeError):
        return model_dir
    return src if isinstance(src, str) and os.path.isdir(src) else model_dir


def merge_plan(ctx, settings: dict, plan_path: str | None) -> tuple[dict, str, list[str]]:
    """``settings`` (values by parameter name: ``model_dir``, ``backend``, ``threads``, ...)
    with a plan's values (:func:`cosyvino.server.config.settings_from_plan`) for every key not
    given explicitly (flag or environment variable). The plan's ``backend_options`` (its
    precision, ...) go with its backend: dropped when ``--backend`` overrides it, and so does a
    converted dir as its ``model_dir`` (e.g. ``D/openvino-int8-llm``, IRs only): the other
    backend gets the model it was converted from (:func:`source_model_dir`). A plan made for
    another model than an explicit ``--model-dir`` is not used.

    ``plan_path`` None: :func:`cosyvino.server.config.find_plan` (``$COSYVINO_PLAN``,
    ``./plan.toml``, ``<model-dir>/plan.toml``). Returns (settings with ``backend_options``,
    source: where the values came from, notes: what was not used and why).

    Raises InputError / PlanError: an unreadable plan file."""
    from cosyvino.server.config import find_plan, settings_from_plan

    out = dict(settings)
    out.setdefault("backend_options", {})
    given = {k for k in settings if ctx.get_parameter_source(k) in EXPLICIT}
    source, notes = ("flags" if given else "defaults"), []
    path = plan_path if plan_path is not None else find_plan(settings.get("model_dir"))
    if path is None:
        return out, source, notes
    planned = settings_from_plan(path)
    planned_dir = planned.get("model_dir")
    if "model_dir" in given and planned_dir and not same_model(settings["model_dir"],
                                                               planned_dir):
        notes.append(f"plan {os.path.abspath(path)} is for {planned_dir}, not "
                     f"{settings['model_dir']}: not used")
        return out, source, notes
    for key, value in planned.items():
        if key in out and key not in given and not (key == "backend_options"
                                                    and "backend" in given):
            out[key] = value
    if "backend" in given and "model_dir" not in given and planned_dir:
        src = source_model_dir(planned_dir)
        if src != planned_dir:
            out["model_dir"] = src
            notes.append(f"--backend overrides the plan: model dir {src} (the plan's "
                         f"{planned_dir} is a conversion for its backend)")
    overridden = sorted(k.replace("_", "-") for k in given - {"model_dir"} if k in planned)
    source = f"plan {os.path.abspath(path)}" + (
        f", overridden by --{', --'.join(overridden)}" if overridden else "")
    return out, source, notes
