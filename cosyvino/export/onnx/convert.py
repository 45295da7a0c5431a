"""Convert an official-layout CosyVoice v1 model dir to ONNX (imports torch and onnx).

:func:`convert_model_dir` exports every stage of our PyTorch implementation with the
TorchScript-based ``torch.onnx.export(..., dynamo=False)`` (our modules have no data-dependent
control flow, so tracing is exact and sizes stay symbolic; the dynamo exporter would need
onnxscript and is slower to run), opset :data:`OPSET`, sequence dims dynamic. The LLM step keeps
its KV cache as explicit per-layer inputs/outputs (``past_key_values.{i}.key|value`` ->
``present.{i}.key|value``): ONNX Runtime has no state. Every file is checked with
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

import onnx
import torch
from torch import nn

from ... import __version__
from ...converted import FORMAT, RUNTIME_SUBDIRS, STAGE_EXTS, STAGES, file_record
from cosyvino.families.cosyvoice1.torch.flow_encoder import FlowEncoderStage
from cosyvino.families.cosyvoice1.torch.length_regulator import LengthRegulatorStage
from cosyvino.families.cosyvoice1.torch.llm import TextEncoderStage, TransformerLM
from cosyvino.families.cosyvoice1.torch.loading import TorchModel
from ..common import Progress, convert_atomically, llm_cache_layout
from ..estimator_linears import plain_estimator_linears

RUNTIME = "onnxruntime"
EXT = STAGE_EXTS[RUNTIME]
#: 17: first opset with LayerNormalization (one ORT kernel instead of ~8 nodes per norm)
OPSET = 17
#: protobuf's hard limit is 2 GiB; above this the weights go to ``<stem>.onnx.data``
_SINGLE_FILE_LIMIT = 1_800_000_000


class LLMCacheStep(nn.Module):
    """``(inputs_embeds [1, T, D], past_0_key, past_0_value, ...) -> (logp [1, V+1],
    present_0_key, present_0_value, ...)``; per-layer caches float32 ``[1, H, P, d_k]``,
    presents ``[1, H, P+T, d_k]``. ``query_side_pos=True`` (the decode-friendly evaluation
    order of the rel-pos term, see :class:`cosyvino.families.cosyvoice1.torch.llm.LLMStepStage`) serves
    prefill and decode with one graph."""

    def __init__(self, lm: TransformerLM):
        super().__init__()
        self.lm = lm

    def forward(self, inputs_embeds: torch.Tensor, *past: torch.Tensor):
        h, pk, pv = self.lm.llm.forward_cached(inputs_embeds, list(past[0::2]),
                                               list(past[1::2]), True)
        out = [torch.log_softmax(self.lm.llm_decoder(h[:, -1]), dim=-1)]
        for k, v in zip(pk, pv):
            out += [k, v]
        return tuple(out)


def llm_cache_names(layers: int) -> tuple[list[str], list[str]]:
    """(past input names, present output names), layer-major, key before value."""
    past = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return past, present


class _Spec:
    """What one stage export needs: module, example inputs, names, dynamic axes."""

    def __init__(self, module: nn.Module, example: tuple, inputs: list[str], outputs: list[str],
                 dynamic: dict[str, dict[int, str]]):
        self.module, self.example = module, example
        self.inputs, self.outputs, self.dynamic = inputs, outputs, dynamic


def stage_specs(m: TorchModel) -> dict[str, _Spec]:
    """Export spec per stage (keys = :data:`cosyvino.converted.STAGES`). Example sizes are
    deliberately unlike each other so a size baked into a graph shows up in the parity tests."""
    fc, h = m.config.flow, m.config.hift
    c, spk = fc.output_size, fc.spk_embed_dim
    layers, heads, dk, d = llm_cache_layout(m)
    past, present = llm_cache_names(layers)
    llm_dyn = {"inputs_embeds": {1: "new"}}
    llm_dyn.update({n: {2: "past"} for n in past})
    llm_dyn.update({n: {2: "total"} for n in present})
    t, hop, nh = 20, h.hop_length, h.nb_harmonics + 1
    mel = torch.randn(1, 80, t)
    f0_stage = m.hift.f0_stage()
    with torch.no_grad():
        f0 = f0_stage(mel)
    fr = 57
    return {
        "text_encoder": _Spec(TextEncoderStage(m.llm), (torch.randint(0, 100, (1, 9)),),
                              ["text_token"], ["text_features"],
                              {"text_token": {1: "text_len"}, "text_features": {1: "text_len"}}),
        "llm": _Spec(LLMCacheStep(m.llm),
                     (torch.randn(1, 4, d), *(torch.randn(1, heads, 3, dk) for _ in past)),
                     ["inputs_embeds", *past], ["logp", *present], llm_dyn),
        "flow_encoder": _Spec(FlowEncoderStage(m.flow),
                              (torch.randint(0, 100, (1, 13)), torch.randn(1, spk)),
                              ["token", "embedding"], ["h", "spks"],
                              {"token": {1: "tokens"}, "h": {1: "tokens"}}),
        "length_regulator": _Spec(LengthRegulatorStage(m.flow.length_regulator),
                                  (torch.randn(1, 13, c), torch.rand(23, 13)),
                                  ["h", "interp"], ["mu"],
                                  {"h": {1: "tokens"}, "interp": {0: "frames", 1: "tokens"},
                                   "mu": {1: "frames"}}),
        "estimator": _Spec(m.flow.decoder.estimator,
                           (torch.randn(2, c, fr), torch.ones(2, 1, fr), torch.randn(2, c, fr),
                            torch.rand(2), torch.randn(2, c), torch.randn(2, c, fr)),
                           ["x", "mask", "mu", "t", "spks", "cond"], ["velocity"],
                           {n: {2: "frames"} for n in ("x", "mask", "mu", "cond", "velocity")}),
        "hift_f0": _Spec(f0_stage, (mel,), ["mel"], ["f0"],
                         {"mel": {2: "frames"}, "f0": {1: "frames"}}),
        "hift_source": _Spec(m.hift.source_stage(),
                             (f0, torch.rand(1, nh), torch.randn(1, nh, hop * t)),
                             ["f0", "phase", "noise"], ["source"],
                             {"f0": {1: "frames"}, "noise": {2: "samples"},
                              "source": {2: "samples"}}),
        "hift_decode": _Spec(m.hift.decode_stage(), (mel, torch.randn(1, 1, hop * t) * 0.1),
                             ["mel", "source"], ["wav"],
                             {"mel": {2: "frames"}, "source": {2: "samples"},
                              "wav": {1: "samples"}}),
    }


def export_stage(spec: _Spec, out_dir: str, stem: str, stage: str) -> list[str]:
    """Export one stage to ``out_dir/<stem>.onnx`` (+ ``<stem>.onnx.data`` when the weights
    exceed the 2 GiB protobuf limit), check it with ``onnx.checker``; returns the file names.
    """
    scratch = tempfile.mkdtemp(prefix=f".{stem}-", dir=out_dir)
    try:
        raw = os.path.join(scratch, stem + EXT)
        spec.module.eval()
        with torch.no_grad(), warnings.catch_warnings(), plain_estimator_linears():
            # the tracer warns about every shape read turned into a tensor; the parity tests at
            # lengths unlike the example inputs are what proves the graph is dynamic
            warnings.simplefilter("ignore")
            torch.onnx.export(spec.module, spec.example, raw, dynamo=False, opset_version=OPSET,
                              input_names=spec.inputs, output_names=spec.outputs,
                              dynamic_axes=spec.dynamic, do_constant_folding=True)
        model = onnx.load(raw)  # also reads any external tensors the exporter spread out
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

    def write_stages(m: TorchModel, tmp: str, files: dict, say: Progress, start: float) -> None:
        for stage, spec in stage_specs(m).items():
            for name in export_stage(spec, tmp, STAGES[stage], stage):
                files[name] = file_record(os.path.join(tmp, name), stage=stage,
                                          precision="fp32")
            say(f"exported {stage} ({time.perf_counter() - start:.0f} s)")

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
                              progress=progress, overwrite=overwrite)
