"""What software the planner can choose from: backend plugins, OpenVINO's view of the CPU, and
the model precisions present on disk.

Never requires OpenVINO or torch: OpenVINO is imported only when installed (for its
FULL_DEVICE_NAME and OPTIMIZATION_CAPABILITIES); converted IRs are found by their manifest
(``<model_dir>/openvino/manifest.json``, INT8 variants in ``<model_dir>/openvino-int8/`` or as
per-IR precisions inside a manifest) without importing anything.
"""

from __future__ import annotations

import importlib.util
import json
import os

#: pipeline stages a precision is decided for
STAGES = ("llm", "flow", "estimator", "vocoder")

#: directories (relative to the model dir) holding converted OpenVINO IRs, with a manifest;
#: "." covers a converted dir passed as the model dir itself
#: where converted IRs may live; ``openvino-<preset>`` is what ``cosyvino quantize`` writes. The
#: first quantized dir in this order is the one served (full INT8 before LLM-only INT8 before
#: INT4-LLM: measured end-to-end speed-ups over OpenVINO fp32 1.7x, 1.5x, 1.5x; docs/performance.md)
OPENVINO_DIRS = ("openvino", "openvino-int8", "openvino-int8-llm", "openvino-int4-llm", ".")

#: torch checkpoint files the torch backend loads
TORCH_FILES = ("llm.pt", "flow.pt", "hift.pt")


def installed_backends() -> dict[str, dict]:
    """Registered backend plugins: name -> {available, reason, description}."""
    from ..plugins import backend_classes

    out = {}
    for name, cls in sorted(backend_classes().items()):
        try:
            ok, why = cls.is_available()
        except Exception as e:  # a plugin's check must not break planning
            ok, why = False, f"is_available raised {type(e).__name__}: {e}"
        out[name] = {"available": bool(ok), "reason": why or "",
                     "description": getattr(cls, "description", "")}
    return out


def openvino_view() -> dict:
    """OpenVINO's CPU device properties, or {} when OpenVINO is not installed/failed.

    OPTIMIZATION_CAPABILITIES always lists INT8 (it can run int8 graphs everywhere), so it says
    nothing about VNNI; the planner takes ISA facts from /proc/cpuinfo instead.
    """
    if importlib.util.find_spec("openvino") is None:
        return {}
    try:
        import openvino as ov

        core = ov.Core()
        return {"version": ov.get_version(),
                "full_device_name": str(core.get_property("CPU", "FULL_DEVICE_NAME")),
                "optimization_capabilities": [str(c) for c in
                                              core.get_property("CPU",
                                                                "OPTIMIZATION_CAPABILITIES")]}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _stage_of(name: str) -> str | None:
    n = name.lower()
    if "estimator" in n:
        return "estimator"
    if "llm" in n or "text_encoder" in n:
        return "llm"
    if "hift" in n or "vocoder" in n or "f0" in n or "source" in n:
        return "vocoder"
    if "flow" in n or "length_regulator" in n:
        return "flow"
    return None


_PREC_KEYS = ("weights", "weight_precision", "precision", "dtype")


def _norm_prec(p) -> str:
    p = str(p).lower()
    return {"float32": "fp32", "f32": "fp32", "float16": "fp16", "f16": "fp16",
            "bfloat16": "bf16", "u8": "int8", "i8": "int8", "int4": "int4",
            "int8-weights": "int8", "int8_weights": "int8", "int8-static": "int8",
            "int4-weights": "int4"}.get(p, p)


#: weight precisions from lowest to highest; others (unknown labels) rank above fp32
_PREC_ORDER = ("int4", "int8", "fp16", "bf16", "fp32")


def _prec_rank(p: str | None) -> int:
    if p is None:
        return len(_PREC_ORDER) + 1
    return _PREC_ORDER.index(p) if p in _PREC_ORDER else len(_PREC_ORDER)


def _manifest_precisions(manifest) -> dict[str, str]:
    """stage -> weight precision from a manifest, tolerant of its exact layout: any dict entry
    whose name maps to a stage and which names a precision (``weights``/``precision``...);
    a top-level precision applies to every stage not named."""
    found: dict[str, str] = {}

    def visit(obj, name=""):
        if isinstance(obj, dict):
            prec = next((obj[k] for k in _PREC_KEYS if isinstance(obj.get(k), str)), None)
            label = str(obj.get("stage") or obj.get("name") or obj.get("file") or name)
            stage = _stage_of(label)
            if stage and prec:
                # the lowest precision found for a stage is what it runs in: a stage has
                # several IRs (flow = flow_encoder + length_regulator) and `cosyvino quantize`
                # quantizes some of them (flow_encoder int8-static, length_regulator fp16)
                p = _norm_prec(prec)
                if _prec_rank(p) < _prec_rank(found.get(stage)):
                    found[stage] = p
            for k, v in obj.items():
                visit(v, str(k))
        elif isinstance(obj, list):
            for v in obj:
                visit(v, name)

    visit(manifest)
    if isinstance(manifest, dict):
        top = next((manifest[k] for k in _PREC_KEYS if isinstance(manifest.get(k), str)), None)
        if top:
            for s in STAGES:
                found.setdefault(s, _norm_prec(top))
    return found


def _dir_bytes(path: str, suffixes) -> int:
    total = 0
    try:
        for name in os.listdir(path):
            if name.endswith(suffixes):
                try:
                    total += os.path.getsize(os.path.join(path, name))
                except OSError:
                    pass
    except OSError:
        pass
    return total


def model_inventory(model_dir: str | None) -> dict:
    """What a model dir holds, without loading it.

    Returns {dir, exists, torch_files, torch_bytes, openvino: {present, dirs, bytes,
    precisions, dir_precisions[, quantized_dir]}} where ``exists`` says ``cosyvoice.yaml`` is
    there, ``torch_files`` lists the :data:`TORCH_FILES` present, ``precisions`` maps stage ->
    lowest weight precision of the IRs on disk in any converted dir ("fp32", "fp16", "int8",
    "int4"; manifest labels such as ``int8-static`` / ``int8-weights`` normalized), and
    ``dir_precisions`` maps each converted dir (absolute path) -> its own stage -> precision
    (what the plan reports for the dir it serves).
    """
    info: dict = {"dir": model_dir or "", "exists": False, "torch_files": [], "torch_bytes": 0,
                  "openvino": {"present": False, "dirs": [], "bytes": 0, "precisions": {}}}
    if not model_dir or not os.path.isdir(model_dir):
        return info
    info["exists"] = os.path.isfile(os.path.join(model_dir, "cosyvoice.yaml"))
    if os.path.isfile(os.path.join(model_dir, "manifest.json")):
        info["converted_dir"] = True
    info["torch_files"] = [f for f in TORCH_FILES if os.path.isfile(os.path.join(model_dir, f))]
    info["torch_bytes"] = sum(os.path.getsize(os.path.join(model_dir, f))
                              for f in info["torch_files"])
    ov = info["openvino"]
    for sub in OPENVINO_DIRS:
        d = os.path.join(model_dir, sub)
        manifest_path = os.path.join(d, "manifest.json")
        if not os.path.isfile(manifest_path):
            continue
        try:
            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
        except (OSError, ValueError) as e:
            ov.setdefault("errors", []).append(f"{manifest_path}: {e}")
            continue
        ov["present"] = True
        ov["dirs"].append(sub)
        precs = _manifest_precisions(manifest)
        if sub.endswith("int8"):
            precs = {s: "int8" if s in ("llm", "estimator") and p != "fp32" else p
                     for s, p in precs.items()} or {"llm": "int8"}
        for name in os.listdir(d):
            if name.endswith(".xml") and "int8" in name.lower() and _stage_of(name):
                precs[_stage_of(name)] = "int8"
        ov.setdefault("dir_precisions", {})[os.path.abspath(d)] = dict(precs)
        ov.setdefault("dir_bytes", {})[os.path.abspath(d)] = _dir_bytes(d, (".bin",))
        for stage, p in precs.items():
            if _prec_rank(p) < _prec_rank(ov["precisions"].get(stage)):
                ov["precisions"][stage] = p
        quantized = any(precs.get(st) in ("int8", "int4") for st in ("llm", "estimator"))
        if quantized and sub not in ("openvino", ".") and "quantized_dir" not in ov:
            # serve this dir: it holds every stage, some of them quantized (`cosyvino quantize`)
            ov["quantized_dir"] = os.path.abspath(d)
        if sub in ("openvino", "."):
            ov["bytes"] = _dir_bytes(d, (".bin",))
    return info


def inventory_for(model_dir: str | None, probe=None) -> dict:
    """The inventory of ``model_dir``: ``probe.model`` when the probe already holds the one of
    that dir (the planner's, or a test's stand-in), else :func:`model_inventory` of it. For
    :meth:`cosyvino.backends.Backend.capabilities` implementations."""
    model = getattr(probe, "model", None) or {}
    if model and model.get("dir", "") == (model_dir or ""):
        return model
    return model_inventory(model_dir)


def backend_capabilities(names, model_dir: str | None, probe=None
                         ) -> tuple[dict, dict[str, str]]:
    """Ask each registered backend in ``names`` for its capabilities on ``model_dir``.

    Returns ({name: Capabilities}, {name: problem}): a backend that is not registered, whose
    ``capabilities()`` raises, or which returns something else than a
    :class:`cosyvino.backends.Capabilities`, is left out of the first and named in the second
    (the planner reports it and goes on without it).
    """
    from ..backends.base import Capabilities
    from ..plugins import backend_classes

    classes = backend_classes()
    caps: dict = {}
    problems: dict[str, str] = {}
    for name in names:
        cls = classes.get(name)
        if cls is None:
            problems[name] = "not registered in this process"
            continue
        try:
            c = cls.capabilities(model_dir, probe)
        except Exception as e:  # a plugin's self-description must not break planning
            problems[name] = f"capabilities() raised {type(e).__name__}: {e}"
            continue
        if not isinstance(c, Capabilities):
            problems[name] = (f"capabilities() returned {type(c).__name__}, not "
                              "cosyvino.backends.Capabilities")
            continue
        caps[name] = c
    return caps, problems
