"""The converted-model directory (``cosyvino convert`` output): layout, manifest, validation.

Shared by the export side (:mod:`cosyvino.export.openvino` and :mod:`cosyvino.export.onnx`,
which write it) and the runtime plugins (which read it). Must import neither torch nor openvino
nor onnxruntime.

Layout of a converted directory (self-contained for serving)::

    manifest.json          format, runtime, versions, source file hashes, per-file hashes and
                           precision
    cosyvoice.yaml         copy of the source config
    speakers.json          speaker names, in row order of speakers.npy
    speakers.npy           float32 [S, 192] x-vectors (spk2info.pt without torch)
    llm_tables.npz         speech_embedding [V, D], special [2, D] (sos, task_id),
                           spk_affine_weight [D, 192], spk_affine_bias [D]
    <stage>.xml / .bin     one OpenVINO IR per stage (see STAGES), runtime "openvino", in D/openvino
    <stage>.onnx           or one ONNX model per stage (+ <stage>.onnx.data when its weights
                           are stored externally), runtime "onnxruntime", in D/onnx

The manifest's ``runtime`` names the runtime the files are for (manifests written before the
field existed are OpenVINO ones) and ``stage_ext`` the stage file extension.

Whether a conversion is current (what ``Backend.prepare`` and ``cosyvino convert`` keep) is
decided by one rule, :func:`conversion_status`; each converting backend supplies the manifest
fields a fresh conversion of its own would write.

Integrity rules checked at load (:func:`validate_converted_dir`): the manifest's own checksum
(an edited manifest is refused), every listed file present with the recorded size, small files
(xml, json, npy, npz, yaml) by full sha256, large ``.bin`` files by size and a sha256 of their
first and last 4 MiB (full hashing of GBs would cost seconds per load). When the source model
files are next to the converted dir (``D/openvino`` with ``D/llm.pt`` ...), they must be the ones
it was converted from (size + mtime, else full sha256).
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Iterable, NamedTuple

from .errors import ConvertedModelError

MANIFEST = "manifest.json"
FORMAT = 1
DEFAULT_SUBDIR = "openvino"
#: runtime (manifest ``runtime``) -> default converted subdir of an official model dir
RUNTIME_SUBDIRS = {"openvino": DEFAULT_SUBDIR, "onnxruntime": "onnx"}
#: runtime -> stage file extension (the file that names a stage's graph)
STAGE_EXTS = {"openvino": ".xml", "onnxruntime": ".onnx"}
#: runtime -> ``cosyvino convert`` arguments that write it
_CONVERT_HINT = {"openvino": "cosyvino convert", "onnxruntime": "cosyvino convert --format onnx"}
#: runtime -> what its converted model is called in messages
_RUNTIME_LABELS = {"openvino": "OpenVINO", "onnxruntime": "ONNX"}
SPEAKERS_FILE = "speakers.json"
SOURCE_FILES = ("cosyvoice.yaml", "llm.pt", "flow.pt", "hift.pt", "spk2info.pt")

#: stage name -> IR file stem. ``llm`` is the stateful (KV cache in state) LLM step.
STAGES = {
    "text_encoder": "text_encoder",
    "llm": "llm",
    "flow_encoder": "flow_encoder",
    "length_regulator": "length_regulator",
    "estimator": "estimator",
    "hift_f0": "hift_f0",
    "hift_source": "hift_source",
    "hift_decode": "hift_decode",
}

_PARTIAL = 4 << 20  # bytes hashed at each end of a large .bin
_FULL_HASH_LIMIT = 64 << 20


def sha256_file(path: str, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def quick_digest(path: str) -> str:
    """sha256 of the whole file when small, else of (size, first 4 MiB, last 4 MiB)."""
    size = os.path.getsize(path)
    if size <= _FULL_HASH_LIMIT:
        return sha256_file(path)
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(_PARTIAL))
        f.seek(size - _PARTIAL)
        h.update(f.read(_PARTIAL))
    return "partial:" + h.hexdigest()


def _manifest_checksum(data: dict) -> str:
    body = {k: v for k, v in data.items() if k != "checksum"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, ensure_ascii=True).encode()).hexdigest()


def source_record(path: str) -> dict:
    st = os.stat(path)
    return {"sha256": sha256_file(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def file_record(path: str, **extra) -> dict:
    return {"digest": quick_digest(path), "size": os.path.getsize(path), **extra}


def write_manifest(out_dir: str, data: dict) -> None:
    data = dict(data)
    data["checksum"] = _manifest_checksum(data)
    with open(os.path.join(out_dir, MANIFEST), "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True, ensure_ascii=False)


def manifest_runtime(data: dict) -> str:
    """The runtime a manifest's files are for (``openvino`` when the field is absent)."""
    return data.get("runtime", "openvino")


def convert_hint(runtime: str | None) -> str:
    """The ``cosyvino convert`` command line that writes ``runtime``'s files (the OpenVINO one
    for an unknown or missing runtime)."""
    return _CONVERT_HINT.get(runtime or "", "cosyvino convert")


def _stale(msg: str, path: str, runtime: str | None = None) -> ConvertedModelError:
    hint = convert_hint(runtime)
    return ConvertedModelError(f"{msg}; re-run `{hint}` for this model", path)


def _with_article(word: str) -> str:
    """``word`` with its indefinite article by spelling ("an openvino", "an onnxruntime")."""
    return ("an " if word[:1].lower() in "aeiou" else "a ") + word


def read_manifest(conv_dir: str, runtime: str | None = None) -> dict:
    """The manifest of ``conv_dir``, checksum- and format-checked; with ``runtime``, also
    refused (:class:`ConvertedModelError`) when it was written for another runtime."""
    path = os.path.join(conv_dir, MANIFEST)
    if not os.path.isfile(path):
        raise _stale(f"{path} is missing: not a converted cosyvino model directory", path,
                     runtime)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise _stale(f"{path} is unreadable ({e})", path, runtime) from None
    if not isinstance(data, dict) or data.get("checksum") != _manifest_checksum(data):
        raise _stale(f"{path} was edited or is corrupt (checksum mismatch)", path, runtime)
    if data.get("format") != FORMAT:
        raise _stale(f"{path} has format {data.get('format')!r}, this cosyvino reads "
                     f"format {FORMAT}", path, runtime)
    if runtime is not None and manifest_runtime(data) != runtime:
        raise _stale(f"{path} is {_with_article(manifest_runtime(data))} conversion, not "
                     f"{runtime}", path, runtime)
    return data


def validate_converted_dir(conv_dir: str, source_dir: str | None = None,
                           check_files: Iterable[str] | None = None,
                           runtime: str | None = None) -> dict:
    """Check a converted dir against its manifest (and the source model when given; with
    ``runtime``, that the manifest was written for it).

    Returns the manifest. Raises :class:`ConvertedModelError` naming the first bad file.
    """
    data = read_manifest(conv_dir, runtime)
    files = data.get("files", {})
    names = list(files) if check_files is None else list(check_files)
    for name in names:
        rec = files.get(name)
        path = os.path.join(conv_dir, name)
        if rec is None:
            raise _stale(f"{path} is not listed in {MANIFEST}", path, runtime)
        if not os.path.isfile(path):
            raise _stale(f"{path} is missing", path, runtime)
        if os.path.getsize(path) != rec.get("size"):
            raise _stale(f"{path} has size {os.path.getsize(path)}, the manifest records "
                         f"{rec.get('size')} (truncated or replaced)", path, runtime)
        if quick_digest(path) != rec.get("digest"):
            raise _stale(f"{path} content does not match the manifest (corrupt or replaced)",
                         path, runtime)
    if source_dir is not None:
        for name, rec in data.get("source", {}).items():
            path = os.path.join(source_dir, name)
            if not os.path.isfile(path):
                continue  # serving from a self-contained copy: sources need not be there
            st = os.stat(path)
            if st.st_size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns"):
                continue
            if st.st_size != rec.get("size") or sha256_file(path) != rec.get("sha256"):
                raise _stale(f"{path} changed since the files in {conv_dir} were converted "
                             "(stale conversion)", path, runtime)
    return data


def is_converted_dir(path) -> bool:
    """True when ``path`` is a converted dir itself (holds a :data:`MANIFEST`)."""
    return os.path.isfile(os.path.join(os.fspath(path), MANIFEST))


def read_speaker_names(conv_dir) -> list[str]:
    """Speaker names of a converted dir (``speakers.json``, row order of ``speakers.npy``),
    read without numpy, torch or a runtime. Raises :class:`ConvertedModelError` (naming the
    file and the ``cosyvino convert`` command of the dir's runtime) when it is missing,
    unreadable or not a JSON list of strings."""
    conv_dir = os.fspath(conv_dir)
    path = os.path.join(conv_dir, SPEAKERS_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            names = json.load(f)
    except (OSError, ValueError) as e:
        names, why = None, str(e)
    else:
        why = "expected a JSON list of speaker names"
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        try:
            runtime = manifest_runtime(read_manifest(conv_dir))
        except ConvertedModelError:
            runtime = None
        raise _stale(f"{path}: cannot read speakers ({why})", path, runtime)
    return names


def _has_sources(conv_dir: str, parent: str) -> bool:
    """True when ``parent`` holds a weights file the conversion in ``conv_dir`` was made from
    (its manifest's ``source`` records, any family; config files alone do not count)."""
    try:
        with open(os.path.join(conv_dir, MANIFEST), encoding="utf-8") as f:
            names = list(json.load(f).get("source", {}))
    except (OSError, ValueError, AttributeError):
        names = ["llm.pt"]
    return any(os.path.isfile(os.path.join(parent, n)) for n in names
               if not n.endswith((".yaml", ".json")))


def find_converted_dir(model_dir: str, runtime: str = "openvino") -> tuple[str, str | None]:
    """``(converted_dir, source_dir or None)`` for a converted dir or an official dir with the
    runtime's subdir (``openvino/``, ``onnx/``: :data:`RUNTIME_SUBDIRS`; another runtime's
    subdir is named like the runtime). Raises
    :class:`ConvertedModelError` when there is none (the runtime of a dir given directly is
    checked by :func:`read_manifest` / :func:`validate_converted_dir` with ``runtime``).

    A ``model_dir`` that does not exist raises :class:`ConvertedModelError` (a
    :class:`~cosyvino.errors.ModelDirError`) with the torch backend's message, "model directory
    not found: <dir>": suggesting `cosyvino convert` for a mistyped path would mislead."""
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        raise ConvertedModelError(f"model directory not found: {model_dir}", model_dir)
    if os.path.isfile(os.path.join(model_dir, MANIFEST)):
        parent = os.path.dirname(os.path.abspath(model_dir))
        return model_dir, (parent if _has_sources(model_dir, parent) else None)
    subdir = RUNTIME_SUBDIRS.get(runtime, runtime)
    sub = os.path.join(model_dir, subdir)
    if os.path.isfile(os.path.join(sub, MANIFEST)):
        return sub, model_dir
    path = os.path.join(model_dir, MANIFEST)
    what = _RUNTIME_LABELS.get(runtime, runtime)
    raise ConvertedModelError(
        f"{model_dir} has no converted {what} model ({MANIFEST} not found there or in "
        f"{subdir}/); run `{convert_hint(runtime)} --model-dir {model_dir}` first", path)


class ConversionStatus(NamedTuple):
    """Answer of :func:`conversion_status` (and of ``Backend.conversion_status``).

    Attributes:
        current: ``dir`` can be served as it is: nothing needs converting.
        dir: the converted dir looked at (absolute for a subdir found or written by default;
            as given otherwise), None when there is none yet.
        reason: one line: why it is current, or what makes it stale / missing.
    """

    current: bool
    dir: str | None
    reason: str


#: values of manifest fields in manifests written before the field existed (compared by
#: :func:`conversion_status` as if recorded): every early conversion stored fp32 weights and
#: the exact-length LLM position table
_FIELD_DEFAULTS = {"weights": "fp32", "llm": {"pos_bucket": 1}}


def _same_path(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _describe(key: str, value) -> str:
    if key == "weights":
        return f"{value} weights"
    if key == "cosyvino_version":
        return f"cosyvino {value}"
    return f"{key} {value}"


def conversion_status(model_dir, out_dir, runtime: str, expected: dict, *,
                      subdir: str | None = None) -> ConversionStatus:
    """The single freshness rule for converted dirs: is there a conversion of ``model_dir`` for
    ``runtime`` that can be served as it is?

    * ``model_dir`` is itself a converted dir (and ``out_dir`` is None or the same dir):
      current when its manifest is for ``runtime`` (served as it is: there is no checkpoint
      next to it to convert from).
    * otherwise the dir looked at is ``out_dir`` (default ``model_dir/SUBDIR``: ``subdir``,
      else the runtime's in :data:`RUNTIME_SUBDIRS`, else the runtime's name). It is current
      when :func:`validate_converted_dir` accepts it against ``model_dir``'s source files
      (manifest checksum and format, runtime, every listed file, sources unchanged) and every
      field of ``expected`` equals the manifest's (a dict value is compared key by key, e.g.
      ``{"llm": {"pos_bucket": 64}}``; fields a manifest predates count with their historical
      values, ``weights`` ``fp32`` and ``llm.pos_bucket`` 1).

    ``expected`` holds what a fresh conversion here would record: stored weights, the cosyvino
    and exporter versions, the LLM export layout. A backend leaves out what it cannot know
    (e.g. the exporter's version when the exporter is not installed, so the dir could not be
    rewritten here anyway). Reads only the manifest and hashes files; imports nothing.

    Raises:
        ConvertedModelError: ``model_dir`` is a converted dir of another runtime or with an
            unreadable manifest (there is nothing to convert it from).
    """
    model_dir = os.fspath(model_dir)
    if not os.path.isdir(model_dir):
        return ConversionStatus(False, None, f"model directory not found: {model_dir}")
    if is_converted_dir(model_dir) and (out_dir is None or _same_path(os.fspath(out_dir),
                                                                      model_dir)):
        read_manifest(model_dir, runtime)
        return ConversionStatus(True, model_dir, "a converted directory itself, served as it "
                                                 "is")
    default = subdir or RUNTIME_SUBDIRS.get(runtime, runtime)
    target = os.fspath(out_dir) if out_dir is not None else os.path.abspath(
        os.path.join(model_dir, default))
    if not os.path.isfile(os.path.join(target, MANIFEST)):
        return ConversionStatus(False, None, f"no conversion in {target}")
    try:
        manifest = validate_converted_dir(target, model_dir, runtime=runtime)
    except ConvertedModelError as e:
        return ConversionStatus(False, target, str(e))
    for key, want in expected.items():
        have = manifest.get(key, _FIELD_DEFAULTS.get(key))
        if isinstance(want, dict):
            have = have if isinstance(have, dict) else {}
            defaults = _FIELD_DEFAULTS.get(key, {})
            for sub, w in want.items():
                h = have.get(sub, defaults.get(sub) if isinstance(defaults, dict) else None)
                if h != w:
                    return ConversionStatus(False, target, f"{key}.{sub} is {h!r} in {target}, "
                                                           f"a fresh conversion writes {w!r}")
        elif have != want:
            return ConversionStatus(False, target, f"{key} is {have!r} in {target}, a fresh "
                                                   f"conversion writes {want!r}")
    parts = ["same source files"] + [_describe(k, v) for k, v in expected.items()
                                     if not isinstance(v, dict)]
    return ConversionStatus(True, target, ", ".join(parts))
