"""Convert an official-layout model dir to OpenVINO IRs (imports torch, openvino).

:func:`convert_model_dir` drives ``openvino.convert_model`` once per graph of the model
family's graph table (:class:`cosyvino.families.GraphTable`, v1:
:mod:`cosyvino.families.cosyvoice1.graphs`, v2: :mod:`cosyvino.families.cosyvoice2.graphs`):
the module the family's :meth:`~cosyvino.families.ModelFamily.export_graph` hook gives for the
entry (by default its ``torch_module``) traced on the entry's ``example_inputs()``
(TorchScript tracing), then the traced spec's input/output names and partial shapes (dynamic
dims -1) set on the IR, saved as ``<stem>.xml`` / ``.bin`` with fp32 or fp16 weights.
OpenVINO-specific, on top of the table: a graph with state (:attr:`GraphSpec.state`, the LLM
step) is traced with SDPA attention (:func:`.model_patcher.sdpa_attention`) and one stacked
q/k/v projection per layer (:func:`.model_patcher.fused_qkv`) — both act on v1's rel-pos
attentions only, a no-op for other modules — and made stateful from the traced spec's state
specs (:mod:`.stateful`); v1's step is :class:`.model_patcher.LLMCacheStep`, v2's has one state
per layer (:class:`cosyvino.families.cosyvoice2.torch.llm.LayerCacheStep`). The estimator's
linears are traced as plain MatMuls (:mod:`cosyvino.export.estimator_linears`). The small
tables as numpy files and the manifest (:mod:`cosyvino.converted`) are written by
:func:`cosyvino.export.common.convert_atomically`, which also makes the output appear
atomically: everything is written to a temp dir next to it and renamed at the end.
"""

from __future__ import annotations

import os
import time
import warnings

import openvino as ov
import torch

from ... import __version__
from ...converted import DEFAULT_SUBDIR, FORMAT, file_record
from ...errors import ModelDirError
from ...families import GraphSpec, GraphTable
from cosyvino.families.cosyvoice1.torch.loading import TorchModel
from ..common import Progress, convert_atomically, model_family, model_graphs
from ..estimator_linears import plain_estimator_linears
from .model_patcher import fused_qkv, sdpa_attention
from .stateful import make_llm_stateful

WEIGHTS = ("fp32", "fp16")
#: what the family hooks (``export_graph``, ``export_layout``) are told: OpenVINO keeps a
#: stateful graph's state inside the compiled model
IN_GRAPH_STATE = True
#: v1's LLM step, what :func:`convert_llm` converts (benchmarks/llm_batch.py)
LLM_GRAPH = "llm"


def name_and_shape(model: ov.Model, spec: GraphSpec) -> ov.Model:
    """Name the IR's inputs/outputs as ``spec``'s tensors (in order) and set their partial
    shapes (dynamic dims -1, :attr:`cosyvino.families.TensorSpec.partial_shape`); in place.

    Raises ValueError: the traced IR has another number of inputs/outputs, or an input of
    another dtype, than ``spec`` (the module and the table disagree: a bug).
    """
    if len(model.inputs) != len(spec.inputs) or len(model.outputs) != len(spec.outputs):
        raise ValueError(f"graph {spec.name!r}: the traced IR has {len(model.inputs)} inputs / "
                         f"{len(model.outputs)} outputs, the table {len(spec.inputs)} / "
                         f"{len(spec.outputs)}")
    for port, t in zip(model.inputs, spec.inputs):
        if port.get_element_type().to_dtype().name != t.dtype:
            raise ValueError(f"graph {spec.name!r} input {t.name!r}: traced as "
                             f"{port.get_element_type()}, the table says {t.dtype}")
        port.get_tensor().set_names({t.name})
    for port, t in zip(model.outputs, spec.outputs):
        port.get_tensor().set_names({t.name})
    model.reshape({port: ov.PartialShape(t.partial_shape)
                   for port, t in zip(model.inputs, spec.inputs)})
    return model


def _convert(module: torch.nn.Module, example: tuple) -> ov.Model:
    """Trace (no trace re-check: the parity tests check the IRs) and convert; ~2x faster than
    handing the module to ``convert_model``. Our modules have no data-dependent control flow,
    so the trace is exact; sizes stay symbolic (``aten::size``), dims are set dynamic later."""
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        traced = torch.jit.trace(module, example, check_trace=False)
        return ov.convert_model(traced, example_input=example)


def convert_graph(m: TorchModel, spec: GraphSpec, module: torch.nn.Module | None = None
                  ) -> ov.Model:
    """One table entry as an IR with the entry's names and partial shapes. ``module``: what
    to trace instead of ``spec.torch_module(m)`` (same inputs/outputs).

    Raises ValueError: no module to trace, or module and table disagree (see
    :func:`name_and_shape`)."""
    if module is None:
        if spec.torch_module is None:
            raise ValueError(f"graph {spec.name!r} has no torch module to convert")
        module = spec.torch_module(m)
    example = tuple(torch.from_numpy(a) for a in spec.example_inputs())
    # 2-D constant estimator weights: no Broadcast copy, INT8-able (no-op for other graphs)
    with plain_estimator_linears():
        om = _convert(module, example)
    return name_and_shape(om, spec)


def convert_stateful(m, spec: GraphSpec, *, stateful: bool = True) -> ov.Model:
    """The table entry ``spec`` (a graph with state) as the family's OpenVINO step
    (:meth:`~cosyvino.families.ModelFamily.export_graph`), traced with the SDPA and fused-q/k/v
    patches; stateful (its data inputs + ``beam_idx`` -> its data outputs, the traced spec's
    states in OpenVINO state) or with the state as explicit inputs/outputs (the traced
    spec's tensors)."""
    traced, step = model_family(m.path).export_graph(m, spec, IN_GRAPH_STATE)
    with sdpa_attention(step), fused_qkv(step):
        om = convert_graph(m, traced, step)
    if stateful:
        make_llm_stateful(om, traced.state)
    return om


def convert_llm(m: TorchModel, *, stateful: bool = True) -> ov.Model:
    """The table's :data:`LLM_GRAPH` entry as the OpenVINO LLM step (:func:`convert_stateful`)."""
    return convert_stateful(m, model_graphs(m)[LLM_GRAPH], stateful=stateful)


def convert_entry(m, spec: GraphSpec) -> ov.Model:
    """One table entry as the IR the converted dir holds: stateful graphs through
    :func:`convert_stateful`, the others through the family's module for OpenVINO."""
    if spec.state:
        return convert_stateful(m, spec)
    traced, module = model_family(m.path).export_graph(m, spec, IN_GRAPH_STATE)
    return convert_graph(m, traced, module)


def _save_ir(model: ov.Model, out_dir: str, stem: str, stage: str, weights: str) -> None:
    model.set_rt_info(stage, ["cosyvino", "stage"])
    model.set_rt_info(weights, ["cosyvino", "weights"])
    model.set_rt_info(__version__, ["cosyvino", "version"])
    ov.save_model(model, os.path.join(out_dir, stem + ".xml"),
                  compress_to_fp16=(weights == "fp16"))


def convert_model_dir(model_dir: str, out_dir: str | None = None, *, weights: str = "fp32",
                      progress: Progress | None = None, overwrite: bool = True) -> str:
    """Convert ``model_dir`` to ``out_dir`` (default ``model_dir/openvino``); returns out_dir.

    Raises ModelDirError / ConfigError / CheckpointError (bad source dir), ValueError (bad
    ``weights``), FileExistsError (``out_dir`` exists and ``overwrite`` is False). On any
    failure nothing is left at ``out_dir`` (a previous conversion there stays untouched).
    """
    if weights not in WEIGHTS:
        raise ValueError(f"weights must be one of {WEIGHTS}, got {weights!r}")

    def write_stages(m: TorchModel, table: GraphTable, tmp: str, files: dict, say: Progress,
                     start: float) -> None:
        for name, spec in table.items():
            stage_start = time.perf_counter()
            model = convert_entry(m, spec)
            _save_ir(model, tmp, spec.stem, name, weights)
            del model
            for ext in (".xml", ".bin"):
                files[spec.stem + ext] = file_record(os.path.join(tmp, spec.stem + ext),
                                                     stage=name, precision=weights)
            # the stage's own time, then the running total (a trial read the total alone as
            # the stage's)
            now = time.perf_counter()
            say(f"converted {name} in {now - stage_start:.0f} s ({now - start:.0f} s in all)")

    try:
        layout = model_family(model_dir).export_layout(IN_GRAPH_STATE)
    except ModelDirError:
        layout = {}  # convert_atomically reports the bad dir
    header = {
        "format": FORMAT,
        "cosyvino_version": __version__,
        "openvino_version": ov.get_version(),
        "weights": weights,
    }
    return convert_atomically(model_dir, out_dir, DEFAULT_SUBDIR, write_stages=write_stages,
                              header=header, stateful=True, progress=progress,
                              overwrite=overwrite, llm_layout=layout)
