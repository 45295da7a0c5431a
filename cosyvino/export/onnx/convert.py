"""Convert an official-layout model dir to ONNX (imports torch and onnx).

:func:`convert_model_dir` exports every graph of the model family's graph table
(:class:`cosyvino.families.GraphTable`, v1: :mod:`cosyvino.families.cosyvoice1.graphs`)
generically: the entry's ``torch_module`` traced on its ``example_inputs()``, with its input /
output names, its dynamic axes and its file stem, by the TorchScript-based
``torch.onnx.export(..., dynamo=False)`` (our modules have no data-dependent control flow, so
tracing is exact and sizes stay symbolic; the dynamo exporter would need onnxscript and is
slower to run), opset :data:`OPSET`. A stateful graph keeps its state as explicit inputs /
outputs (v1 LLM: ``past_key_values.{i}.key|value`` -> ``present.{i}.key|value``): ONNX Runtime
has no state. Every file is checked with
``onnx.checker``; the small tables, speakers, yaml and the manifest are written as for OpenVINO
by :func:`cosyvino.export.common.convert_atomically` (manifest ``runtime: "onnxruntime"``), which
also makes the output appear atomically (temp dir next to it, renamed at the end).
Export-time patch of the estimator: :mod:`cosyvino.export.estimator_linears`.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass

import onnx
import torch
from torch import nn

from ... import __version__
from ...converted import FORMAT, RUNTIME_SUBDIRS, STAGE_EXTS, file_record
from ...families import GraphSpec, GraphTable
from cosyvino.families.cosyvoice1.torch.loading import TorchModel
from ..common import Progress, convert_atomically, model_graphs
from ..estimator_linears import plain_estimator_linears

RUNTIME = "onnxruntime"
EXT = STAGE_EXTS[RUNTIME]
#: 17: first opset with LayerNormalization (one ORT kernel instead of ~8 nodes per norm)
OPSET = 17
#: Manifest fields (``llm``) of this exporter's LLM layout (``pos_bucket`` 1: the exact-length
#: position table; ``attention_mask``: a key mask input and a batch dimension, for batched
#: decode); a dir whose fields differ is rewritten by ``cosyvino convert``
LLM_LAYOUT = {"pos_bucket": 1, "positional": "keys_input", "attention_mask": "batch"}
#: protobuf's hard limit is 2 GiB; above this the weights go to ``<stem>.onnx.data``
_SINGLE_FILE_LIMIT = 1_800_000_000


@dataclass
class GraphExport:
    """What one graph's export needs: its table entry, the module to trace (the entry's
    ``torch_module`` built on the loaded model) and the example inputs (the entry's
    ``example_inputs()`` as tensors). Names, dynamic axes and the file stem come from ``spec``.
    """

    spec: GraphSpec
    module: nn.Module
    example: tuple[torch.Tensor, ...]

    @property
    def inputs(self) -> list[str]:
        return self.spec.input_names

    @property
    def outputs(self) -> list[str]:
        return self.spec.output_names

    @property
    def dynamic(self) -> dict[str, dict[int, str]]:
        return self.spec.dynamic_axes


def graph_export(m: TorchModel, spec: GraphSpec) -> GraphExport:
    """The :class:`GraphExport` of one table entry on the loaded model ``m``.

    Raises ValueError: the entry has no ``torch_module`` (nothing this exporter can trace).
    """
    if spec.torch_module is None:
        raise ValueError(f"graph {spec.name!r} has no torch module to export")
    example = tuple(torch.from_numpy(a) for a in spec.example_inputs())
    return GraphExport(spec, spec.torch_module(m), example)


def stage_specs(m: TorchModel, table: GraphTable | None = None) -> dict[str, GraphExport]:
    """:class:`GraphExport` per graph of ``table`` (default: the model's family table,
    :func:`cosyvino.export.common.model_graphs`), in table order."""
    table = model_graphs(m) if table is None else table
    return {name: graph_export(m, spec) for name, spec in table.items()}


def declare_table_shapes(model: onnx.ModelProto, spec: GraphSpec) -> None:
    """Declare ``spec``'s shapes on the graph's inputs and outputs (in place): fixed dims as
    values, dynamic dims by their table name. The exporter names the dims it was given as
    ``dynamic_axes`` but leaves a dim it cannot prove fixed (the batch of an output computed
    from a runtime shape) as a made-up symbol; the file is to say what the table says.

    Raises ValueError: the exported names or dtypes differ from ``spec`` (a bug).
    """
    for values, tensors in ((model.graph.input, spec.inputs),
                            (model.graph.output, spec.outputs)):
        names = [v.name for v in values]
        if names != [t.name for t in tensors]:
            raise ValueError(f"graph {spec.name!r}: exported tensors {names}, the table "
                             f"{[t.name for t in tensors]}")
        for v, t in zip(values, tensors):
            tt = v.type.tensor_type
            if onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name != t.dtype:
                raise ValueError(f"graph {spec.name!r} tensor {t.name!r}: exported as "
                                 f"{onnx.TensorProto.DataType.Name(tt.elem_type)}, the table "
                                 f"says {t.dtype}")
            tt.shape.ClearField("dim")
            for d in t.shape:
                dim = tt.shape.dim.add()
                if isinstance(d, int):
                    dim.dim_value = d
                else:
                    dim.dim_param = d


def export_stage(graph: GraphExport, out_dir: str, stem: str | None = None,
                 stage: str | None = None) -> list[str]:
    """Export one graph to ``out_dir/<stem>.onnx`` (+ ``<stem>.onnx.data`` when the weights
    exceed the 2 GiB protobuf limit), check it with ``onnx.checker``; returns the file names.
    ``stem`` / ``stage`` (recorded in the file's ``cosyvino.stage`` metadata) default to the
    table entry's stem and name.
    """
    stem = graph.spec.stem if stem is None else stem
    stage = graph.spec.name if stage is None else stage
    scratch = tempfile.mkdtemp(prefix=f".{stem}-", dir=out_dir)
    try:
        raw = os.path.join(scratch, stem + EXT)
        graph.module.eval()
        with torch.no_grad(), warnings.catch_warnings(), plain_estimator_linears():
            # the tracer warns about every shape read turned into a tensor; the parity tests at
            # lengths unlike the example inputs are what proves the graph is dynamic
            warnings.simplefilter("ignore")
            torch.onnx.export(graph.module, graph.example, raw, dynamo=False, opset_version=OPSET,
                              input_names=graph.inputs, output_names=graph.outputs,
                              dynamic_axes=graph.dynamic, do_constant_folding=True)
        model = onnx.load(raw)  # also reads any external tensors the exporter spread out
        declare_table_shapes(model, graph.spec)
        model.producer_name = "cosyvino"
        model.producer_version = __version__
        for key, value in (("cosyvino.stage", stage), ("cosyvino.version", __version__)):
            entry = model.metadata_props.add()
            entry.key, entry.value = key, value
        path = os.path.join(out_dir, stem + EXT)
        if model.ByteSize() > _SINGLE_FILE_LIMIT:
            data = stem + EXT + ".data"
            onnx.save_model(model, path, save_as_external_data=True,
                            all_tensors_to_one_file=True, location=data, size_threshold=1024)
            names = [stem + EXT, data]
        else:
            onnx.save_model(model, path)
            names = [stem + EXT]
        del model
        onnx.checker.check_model(path)  # by path: works with external data too
        return names
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def convert_model_dir(model_dir: str, out_dir: str | None = None, *,
                      progress: Progress | None = None, overwrite: bool = True) -> str:
    """Convert ``model_dir`` to ONNX in ``out_dir`` (default ``model_dir/onnx``); returns out_dir.

    Weights are stored as fp32 (ONNX Runtime's CPU kernels compute in fp32).

    Raises ModelDirError / ConfigError / CheckpointError (bad source dir), FileExistsError
    (``out_dir`` exists and ``overwrite`` is False), ``onnx.checker.ValidationError`` (an
    exported graph is invalid: a bug). On any failure nothing is left at ``out_dir`` (a
    previous conversion there stays untouched).
    """

    def write_stages(m: TorchModel, table: GraphTable, tmp: str, files: dict, say: Progress,
                     start: float) -> None:
        for name, spec in table.items():
            # built per graph: one graph's example tensors alive at a time
            for fname in export_stage(graph_export(m, spec), tmp, spec.stem, name):
                files[fname] = file_record(os.path.join(tmp, fname), stage=name,
                                           precision="fp32")
            say(f"exported {name} ({time.perf_counter() - start:.0f} s)")

    header = {
        "format": FORMAT,
        "runtime": RUNTIME,
        "stage_ext": EXT,
        "opset": OPSET,
        "cosyvino_version": __version__,
        "onnx_version": onnx.__version__,
        "torch_version": torch.__version__,
        "weights": "fp32",
    }
    return convert_atomically(model_dir, out_dir, RUNTIME_SUBDIRS[RUNTIME],
                              write_stages=write_stages, header=header, stateful=False,
                              progress=progress, overwrite=overwrite, llm_layout=LLM_LAYOUT)
