"""What every exporter writes besides its graph files (imports torch through the model code).

:func:`convert_atomically` is the shared frame of ``cosyvino convert``: it checks the
arguments, finds the model family (:func:`cosyvino.families.detect_family`), hashes the source
files, loads the family's PyTorch model and its graph table, lets the runtime's exporter write
one file per graph of the table, then ships the family's prompt models
(``ModelFamily.prompt_model_files``, already ONNX) when the source has them, lets the family write
its serving files (``ModelFamily.write_serving_files``; CosyVoice v1:
:mod:`cosyvino.families.cosyvoice1.serving_files`, LLM tables, speakers, yaml copy) and writes the manifest
(:mod:`cosyvino.converted` describes the layout; it records the family and the table's graph ->
file stem map) and publishes the directory atomically (:func:`cosyvino.fileutil.replace_dir`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Callable

from ..converted import file_record, source_record, write_manifest
from ..errors import ModelDirError
from ..families import GraphTable, ModelFamily, detect_family
from ..fileutil import replace_dir
from cosyvino.families.cosyvoice1.torch.loading import TorchModel

Progress = Callable[[str], None]
#: ``write_stages(model, table, tmp_dir, files, say, start)``: writes one file (or file set) per
#: graph of ``table`` into ``tmp_dir`` and adds their manifest records to ``files``; ``start``
#: is the ``time.perf_counter()`` of the conversion start (for progress messages)
StageWriter = Callable[[TorchModel, GraphTable, str, dict, Progress, float], None]


def model_family(model_dir: str) -> type[ModelFamily]:
    """The family of the model dir ``model_dir`` (:func:`cosyvino.families.detect_family`).

    Raises ModelDirError: missing dir, or no registered family recognizes it."""
    return detect_family(model_dir)


def model_graphs(m: TorchModel) -> GraphTable:
    """The graph table of the loaded model ``m``: its family's, sized by its config."""
    return model_family(m.path).graphs(m.config)


def convert_atomically(model_dir: str, out_dir: str | None, default_subdir: str, *,
                       write_stages: StageWriter, header: dict, stateful: bool,
                       progress: Progress | None = None, overwrite: bool = True,
                       llm_layout: dict | None = None) -> str:
    """Convert ``model_dir`` into ``out_dir`` (default ``model_dir/<default_subdir>``); returns
    the absolute out_dir.

    ``write_stages`` writes the runtime's graph files (see :data:`StageWriter`). The manifest
    holds ``header`` (format, runtime, versions, weights: the runtime's own fields, in its
    order), then ``family`` (the model family's name), ``graphs`` (graph name -> file stem,
    from the family's graph table), ``source_dir``, ``source``, ``files`` and the family's
    fields (``ModelFamily.manifest_fields``; CosyVoice v1: ``llm``, the cache layout from
    :func:`cosyvino.families.cosyvoice1.serving_files.llm_cache_layout`, ``stateful``, then
    ``llm_layout``: the runtime's LLM export-layout fields, e.g. OpenVINO's ``pos_bucket`` and
    ``positional``; ``pos_bucket`` defaults to 1).

    Raises ModelDirError / ConfigError / CheckpointError (bad source dir), FileExistsError
    (``out_dir`` exists and ``overwrite`` is False), whatever ``write_stages`` raises. On any
    failure nothing is left at ``out_dir`` (a previous conversion there stays untouched).
    """
    say = progress or (lambda msg: None)
    model_dir = os.path.abspath(os.fspath(model_dir))
    out_dir = os.path.abspath(out_dir or os.path.join(model_dir, default_subdir))
    if os.path.exists(out_dir) and not overwrite:
        raise FileExistsError(out_dir)
    if not os.path.isdir(model_dir):
        raise ModelDirError(f"model directory not found: {model_dir}", model_dir)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    start = time.perf_counter()
    try:
        family = model_family(model_dir)
        say("hashing source files")
        source = {n: source_record(os.path.join(model_dir, n))
                  for n in family.source_files(model_dir)
                  if os.path.isfile(os.path.join(model_dir, n))}
        say("loading PyTorch model")
        m = family.load_torch_model(model_dir)
        table = family.graphs(m.config)
        files: dict[str, dict] = {}
        write_stages(m, table, tmp, files, say, start)
        for name in family.prompt_model_files:  # already ONNX, read by both runtimes: ship them
            src = os.path.join(model_dir, name)
            if os.path.isfile(src):
                shutil.copyfile(src, os.path.join(tmp, name))
                files[name] = file_record(os.path.join(tmp, name), precision="onnx")
        for name in family.write_serving_files(m, model_dir, tmp):
            files[name] = file_record(os.path.join(tmp, name))
        write_manifest(tmp, {
            **header,
            "family": family.name,
            "graphs": table.stems,
            "source_dir": model_dir,
            "source": source,
            "files": files,
            **family.manifest_fields(m, stateful=stateful, llm_layout=llm_layout),
        })
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    say(f"done in {time.perf_counter() - start:.0f} s: {out_dir}")
    return out_dir
