"""What software the planner can choose from: the backend plugins, what each of them finds in
the model dir, and their runtimes' view of the CPU.

The planner knows no backend by name: it asks every registered backend class
(:meth:`cosyvino.backends.Backend.inventory`, :meth:`~cosyvino.backends.Backend.device_info`,
:meth:`~cosyvino.backends.Backend.capabilities`) and keeps the answers. Never requires torch or
a runtime itself (a backend's ``device_info`` may import its runtime).
"""

from __future__ import annotations

import os

#: pipeline components a precision is decided for
STAGES = ("llm", "flow", "estimator", "vocoder")


def _reference_first(classes: dict) -> list[str]:
    """Backend names, reference backends first (the speed baseline), then by name."""
    return sorted(classes, key=lambda n: (not getattr(classes[n], "reference", False), n))


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


def device_views() -> dict[str, dict]:
    """Backend name -> its runtime's view of the CPU (:meth:`Backend.device_info`), for the
    backends that report one; a backend whose ``device_info`` raises is recorded with
    ``{"error": ...}``."""
    from ..plugins import backend_classes

    classes = backend_classes()
    out: dict[str, dict] = {}
    for name in _reference_first(classes):
        try:
            info = classes[name].device_info()
        except Exception as e:  # a plugin's self-description must not break probing
            info = {"error": f"device_info() raised {type(e).__name__}: {e}"}
        if info:
            out[name] = dict(info)
    return out


def _recognized_family(model_dir: str) -> str | None:
    from ..families import recognized_family

    return recognized_family(model_dir)


def model_inventory(model_dir: str | None) -> dict:
    """What a model dir holds, without loading it.

    Returns the generic part {dir, exists[, converted_dir][, family]} plus one section per
    registered backend that finds something to say, under the backend's name
    (:meth:`cosyvino.backends.Backend.inventory`; e.g. ``openvino``: {present, dirs, bytes,
    precisions, dir_precisions...}, ``torch``: {files, bytes}). ``exists`` says a
    registered family recognizes the dir (:func:`cosyvino.families.recognized_family`: an
    official dir by its own config file, e.g. ``cosyvoice2.yaml``; a converted dir by its
    manifest's ``family``), ``converted_dir`` that
    the dir is a converted one itself (``manifest.json``), ``family`` the model family's name
    (absent when no family recognizes the dir: nothing there yet). Reference backends'
    sections come first. A backend whose ``inventory`` raises gets ``{"error": ...}``.
    """
    from ..plugins import backend_classes

    info: dict = {"dir": model_dir or "", "exists": False}
    if model_dir and os.path.isdir(model_dir):
        converted = os.path.isfile(os.path.join(model_dir, "manifest.json"))
        if converted:
            info["converted_dir"] = True
        # a dir a registered family recognizes: an official dir by its own config file
        # (whatever the family), a converted dir by its manifest's family
        family = _recognized_family(model_dir)
        info["exists"] = family is not None
        if family:
            info["family"] = family
    classes = backend_classes()
    for name in _reference_first(classes):
        if name in info:  # a backend named like a generic key cannot have a section
            continue
        try:
            section = classes[name].inventory(model_dir)
        except Exception as e:  # a plugin's inventory must not break planning
            section = {"error": f"inventory() raised {type(e).__name__}: {e}"}
        if isinstance(section, dict) and section:
            info[name] = section
    return info


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


# ---- the dirs of one conversion: fp32 and what `cosyvino quantize` made of it ----------------
def _read_json_manifest(conv_dir: str) -> dict | None:
    """The ``manifest.json`` of ``conv_dir`` as a dict, or None (missing or unreadable: the
    backend's own checks report such a dir when it is loaded; the planner only looks)."""
    import json

    from ..converted import MANIFEST

    try:
        with open(os.path.join(conv_dir, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def quantization_record(conv_dir: str | None) -> dict:
    """The ``quantization`` block `cosyvino quantize` wrote into ``conv_dir``'s manifest
    (preset, ``machine`` the accuracy was measured on, ``floors``, ``accuracy``...; see
    docs/quantization.md), ``{}`` for an unquantized or unreadable dir."""
    data = _read_json_manifest(conv_dir) if conv_dir else None
    q = (data or {}).get("quantization")
    return q if isinstance(q, dict) else {}


def _source_of(conv_dir: str, quant: dict) -> str | None:
    """The fp32 dir ``conv_dir`` was quantized from: the recorded path, else (the model dir
    was moved or mounted elsewhere) the sibling of that name."""
    recorded = quant.get("source_converted_dir")
    if not isinstance(recorded, str) or not recorded:
        return None
    for d in (recorded, os.path.join(os.path.dirname(os.path.abspath(conv_dir)),
                                     os.path.basename(recorded.rstrip(os.sep)))):
        if os.path.isdir(d) and _read_json_manifest(d) is not None:
            return os.path.abspath(d)
    return None


def conversion_variants(conv_dir: str | None) -> list[str]:
    """The other converted dirs of the model ``conv_dir`` belongs to, when ``conv_dir`` is a
    `cosyvino quantize` output: the fp32 dir it was quantized from
    (``quantization.source_converted_dir``, or the sibling of that name) and every sibling dir
    quantized from the same fp32 dir (same ``source_manifest_sha256``, or the same source dir).
    Absolute paths, the fp32 dir first, then by name; ``[]`` for an unquantized dir. Reads
    only manifests (cheap; no backend)."""
    if not conv_dir:
        return []
    conv_dir = os.path.abspath(conv_dir)
    quant = quantization_record(conv_dir)
    if not quant:
        return []
    source = _source_of(conv_dir, quant)
    out = [source] if source and source != conv_dir else []
    parent = os.path.dirname(conv_dir)
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        names = []
    for name in names:
        d = os.path.join(parent, name)
        if d in (conv_dir, source) or not os.path.isdir(d):
            continue
        q = quantization_record(d)
        if not q:
            continue
        same_sha = (q.get("source_manifest_sha256") and q.get("source_manifest_sha256")
                    == quant.get("source_manifest_sha256"))
        if same_sha or (source is not None and _source_of(d, q) == source):
            out.append(d)
    return out
