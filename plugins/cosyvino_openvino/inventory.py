"""What the OpenVINO backend finds on disk and in the CPU plugin, without loading a model: the
converted IR dirs of a model dir (by their manifests) with their bytes and weight precisions,
and OpenVINO's view of the CPU device.

Imports neither torch nor openvino at import time (the device view imports openvino when it is
installed); the planner calls :func:`scan` on every planning run.
"""

from __future__ import annotations

import importlib.util
import json
import os

from cosyvino.converted import MANIFEST, manifest_runtime

#: model components a weight precision is reported for (``Capabilities.weight_precisions``)
COMPONENTS = ("llm", "flow", "estimator", "vocoder")

#: directories (relative to the model dir) holding converted OpenVINO IRs, with a manifest;
#: ``openvino-<preset>`` is what ``cosyvino quantize`` writes and "." covers a converted dir
#: passed as the model dir itself. The first quantized dir in this order is the one served
#: (full INT8 before LLM-only INT8 before INT4-LLM: measured end-to-end speed-ups over
#: OpenVINO fp32 1.7x, 1.5x, 1.5x; docs/performance.md)
OPENVINO_DIRS = ("openvino", "openvino-int8", "openvino-int8-llm", "openvino-int4-llm", ".")
#: the dirs above holding the plain (not quantized) conversion
PLAIN_DIRS = ("openvino", ".")


def device_view() -> dict:
    """OpenVINO's CPU device properties (``version``, ``full_device_name``,
    ``optimization_capabilities``) with the ``label``/``summary`` row of ``cosyvino plan``;
    ``{"error": ...}`` when OpenVINO fails, a "not installed" row when it is absent.

    OPTIMIZATION_CAPABILITIES always lists INT8 (it can run int8 graphs everywhere), so it says
    nothing about VNNI; the planner takes ISA facts from /proc/cpuinfo instead.
    """
    row = {"label": "OpenVINO"}
    if importlib.util.find_spec("openvino") is None:
        return dict(row, summary="not installed")
    try:
        import openvino as ov

        core = ov.Core()
        info = {"version": ov.get_version(),
                "full_device_name": str(core.get_property("CPU", "FULL_DEVICE_NAME")),
                "optimization_capabilities": [str(c) for c in
                                              core.get_property("CPU",
                                                                "OPTIMIZATION_CAPABILITIES")]}
    except Exception as e:
        error = f"{type(e).__name__}: {e}"
        return dict(row, error=error, summary=f"error: {error}")
    return dict(row, **info,
                summary=f"{info['version'].split('-')[0]}: {info['full_device_name']}; "
                        f"capabilities {' '.join(info['optimization_capabilities'])} "
                        "(INT8 is always listed; VNNI comes from cpuinfo)")


def _component_of(name: str) -> str | None:
    n = name.lower()
    if "estimator" in n:
        return "estimator"
    if "llm" in n or "text_encoder" in n or "embedding" in n:  # v2: the LLM's embedding IRs
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


def manifest_precisions(manifest) -> dict[str, str]:
    """component -> weight precision from a manifest, tolerant of its exact layout: any dict
    entry whose name maps to a component and which names a precision (``weights``/
    ``precision``...); a top-level precision applies to every component not named."""
    found: dict[str, str] = {}

    def visit(obj, name=""):
        if isinstance(obj, dict):
            prec = next((obj[k] for k in _PREC_KEYS if isinstance(obj.get(k), str)), None)
            label = str(obj.get("stage") or obj.get("name") or obj.get("file") or name)
            comp = _component_of(label)
            if comp and prec:
                # the lowest precision found for a component is what it runs in: a component
                # has several IRs (flow = flow_encoder + length_regulator) and `cosyvino
                # quantize` quantizes some of them (flow_encoder int8-static, length_regulator
                # fp16)
                p = _norm_prec(prec)
                if _prec_rank(p) < _prec_rank(found.get(comp)):
                    found[comp] = p
            for k, v in obj.items():
                visit(v, str(k))
        elif isinstance(obj, list):
            for v in obj:
                visit(v, name)

    visit(manifest)
    if isinstance(manifest, dict):
        top = next((manifest[k] for k in _PREC_KEYS if isinstance(manifest.get(k), str)), None)
        if top:
            for c in COMPONENTS:
                found.setdefault(c, _norm_prec(top))
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


def scan(model_dir: str | None) -> dict:
    """The converted IR dirs of ``model_dir`` (the backend's inventory section).

    Returns {present, dirs, bytes, precisions, dir_precisions, dir_bytes[, quantized_dir]
    [, errors], summary}: ``dirs`` the :data:`OPENVINO_DIRS` holding an OpenVINO manifest,
    ``bytes`` the ``.bin`` bytes of the plain conversion, ``precisions`` component -> lowest
    weight precision of the IRs on disk in any of them ("fp32", "fp16", "int8", "int4";
    manifest labels such as ``int8-static`` / ``int8-weights`` normalized), ``dir_precisions``
    / ``dir_bytes`` the same per dir (absolute path), ``quantized_dir`` the first dir written
    by ``cosyvino quantize`` with an INT8/INT4 LLM or estimator (the one served), ``errors``
    unreadable manifests, ``stale`` dirs the backend would refuse (:func:`stale_layout`; not
    counted as present). A manifest of another runtime (an ONNX dir) does not count.
    """
    ov: dict = {"present": False, "dirs": [], "bytes": 0, "precisions": {}}
    if model_dir and os.path.isdir(model_dir):
        for sub in OPENVINO_DIRS:
            _scan_dir(model_dir, sub, ov)
    if ov["present"]:
        ov["summary"] = (f"IRs in {', '.join(ov['dirs'])}: "
                         + ", ".join(f"{k}={v}" for k, v in sorted(ov["precisions"].items())))
    else:
        ov["summary"] = "no OpenVINO IRs"
    return ov


def stale_layout(manifest) -> str:
    """Why the backend would refuse to load a dir with this manifest ('' = it would not): an
    LLM section without ``positional`` was converted before the LLM took its positional
    tables as inputs (cosyvino before 2026-12-02). A manifest without an ``llm`` section is
    not judged (stand-ins, other families)."""
    llm = manifest.get("llm") if isinstance(manifest, dict) else None
    if isinstance(llm, dict) and "positional" not in llm:
        return ("converted before the LLM took its positional tables as inputs; re-run "
                "`cosyvino convert` (and `cosyvino quantize` for a quantized dir)")
    return ""


def _scan_dir(model_dir: str, sub: str, ov: dict) -> None:
    d = os.path.join(model_dir, sub)
    manifest_path = os.path.join(d, MANIFEST)
    if not os.path.isfile(manifest_path):
        return
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        ov.setdefault("errors", []).append(f"{manifest_path}: {e}")
        return
    if isinstance(manifest, dict) and manifest_runtime(manifest) != "openvino":
        return  # e.g. an ONNX dir given as the model dir: not ours to serve
    stale = stale_layout(manifest)
    if stale:  # the backend would refuse it: plan as if it were not there
        ov.setdefault("stale", []).append(f"{d}: {stale}")
        return
    ov["present"] = True
    ov["dirs"].append(sub)
    precs = manifest_precisions(manifest)
    if sub.endswith("int8"):
        # the name says at least int8 for what its manifest leaves unsaid; an INT4 LLM
        # (`--llm-weights int4`) stays int4
        precs = {c: "int8" if c in ("llm", "estimator") and p not in ("fp32", "int4") else p
                 for c, p in precs.items()} or {"llm": "int8"}
    for name in os.listdir(d):
        if name.endswith(".xml") and "int8" in name.lower() and _component_of(name):
            precs[_component_of(name)] = "int8"
    ov.setdefault("dir_precisions", {})[os.path.abspath(d)] = dict(precs)
    ov.setdefault("dir_bytes", {})[os.path.abspath(d)] = _dir_bytes(d, (".bin",))
    for comp, p in precs.items():
        if _prec_rank(p) < _prec_rank(ov["precisions"].get(comp)):
            ov["precisions"][comp] = p
    quantized = any(precs.get(c) in ("int8", "int4") for c in ("llm", "estimator"))
    if quantized and sub not in PLAIN_DIRS and "quantized_dir" not in ov:
        # serve this dir: it holds every stage, some of them quantized (`cosyvino quantize`)
        ov["quantized_dir"] = os.path.abspath(d)
    if sub in PLAIN_DIRS:
        ov["bytes"] = _dir_bytes(d, (".bin",))


def served_precisions(ov: dict, load_dir: str | None) -> dict[str, str]:
    """component -> weight precision of the dir served from ``load_dir`` (that dir or its
    ``openvino/``), from the inventory section ``ov``; its lowest precision over all dirs
    when that dir is not in it."""
    by_dir = ov.get("dir_precisions", {})
    if load_dir:
        for d in (load_dir, os.path.join(load_dir, "openvino")):
            if os.path.abspath(d) in by_dir:
                return dict(by_dir[os.path.abspath(d)])
    return dict(ov.get("precisions", {}))
