"""Convert an official-layout CosyVoice v1 model dir to OpenVINO IRs (imports torch, openvino).

:func:`convert_model_dir` drives ``openvino.convert_model`` once per stage of our PyTorch
implementation (TorchScript tracing with example inputs; sequence dims set dynamic afterwards),
makes the LLM stateful (:mod:`.stateful`) and saves the IRs with fp32 or fp16 weights; the small
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
from ...converted import DEFAULT_SUBDIR, FORMAT, STAGES, file_record
from cosyvino.families.cosyvoice1.torch.flow_encoder import FlowEncoderStage
from cosyvino.families.cosyvoice1.torch.length_regulator import LengthRegulatorStage
from cosyvino.families.cosyvoice1.torch.llm import TextEncoderStage
from cosyvino.families.cosyvoice1.torch.loading import TorchModel
from ..common import Progress, convert_atomically, llm_cache_layout
from ..estimator_linears import plain_estimator_linears
from .model_patcher import LLM_LAYOUT, LLMCacheStep, sdpa_attention
from .stateful import make_llm_stateful

WEIGHTS = ("fp32", "fp16")


def _dyn(model: ov.Model, shapes: dict[int, list[int]], out_names: list[str] | None = None,
         in_names: list[str] | None = None) -> ov.Model:
    """Name inputs/outputs and set partial shapes (-1 = dynamic) by input index."""
    if in_names:
        for port, name in zip(model.inputs, in_names):
            port.get_tensor().set_names({name})
    if out_names:
        for port, name in zip(model.outputs, out_names):
            port.get_tensor().set_names({name})
    model.reshape({model.inputs[i]: ov.PartialShape(s) for i, s in shapes.items()})
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


def convert_text_encoder(m: TorchModel) -> ov.Model:
    om = _convert(TextEncoderStage(m.llm), (torch.randint(0, 100, (1, 9)),))
    return _dyn(om, {0: [1, -1]}, ["text_features"], ["text_token"])


def convert_llm(m: TorchModel, *, stateful: bool = True, query_side_pos: bool = True
                ) -> ov.Model:
    """The KV-cached LLM step; stateful (``inputs_embeds``, ``beam_idx`` -> ``logp``) or with
    explicit ``past_key_values.{i}.key|value`` / ``present.{i}.key|value``."""
    layers, heads, dk, d = llm_cache_layout(m)
    step = LLMCacheStep(m.llm, query_side_pos=query_side_pos)
    example = [torch.randn(1, 4, d)]
    past, present = [], []
    for i in range(layers):
        for kind in ("key", "value"):
            example.append(torch.randn(1, heads, 3, dk))
            past.append(f"past_key_values.{i}.{kind}")
            present.append(f"present.{i}.{kind}")
    with sdpa_attention(m.llm):
        om = _convert(step, tuple(example))
    shapes = {0: [1, -1, d]}
    shapes.update({i + 1: [1, heads, -1, dk] for i in range(2 * layers)})
    om = _dyn(om, shapes, ["logp", *present], ["inputs_embeds", *past])
    if stateful:
        make_llm_stateful(om, past, present, (1, heads, 0, dk))
    return om


def convert_flow_encoder(m: TorchModel) -> ov.Model:
    om = _convert(FlowEncoderStage(m.flow), (torch.randint(0, 100, (1, 13)),
                                             torch.randn(1, m.config.flow.spk_embed_dim)))
    return _dyn(om, {0: [1, -1], 1: [1, m.config.flow.spk_embed_dim]}, ["h", "spks"],
                ["token", "embedding"])


def convert_length_regulator(m: TorchModel) -> ov.Model:
    c = m.config.flow.output_size
    om = _convert(LengthRegulatorStage(m.flow.length_regulator),
                  (torch.randn(1, 13, c), torch.rand(23, 13)))
    return _dyn(om, {0: [1, -1, c], 1: [-1, -1]}, ["mu"], ["h", "interp"])


def convert_estimator(m: TorchModel) -> ov.Model:
    c = m.config.flow.output_size
    t = 57
    ex = (torch.randn(2, c, t), torch.ones(2, 1, t), torch.randn(2, c, t), torch.rand(2),
          torch.randn(2, c), torch.randn(2, c, t))
    with plain_estimator_linears():  # 2-D constant weights: no Broadcast copy, INT8-able
        om = _convert(m.flow.decoder.estimator, ex)
    return _dyn(om, {0: [2, c, -1], 1: [2, 1, -1], 2: [2, c, -1], 3: [2], 4: [2, c],
                     5: [2, c, -1]}, ["velocity"], ["x", "mask", "mu", "t", "spks", "cond"])


def convert_hift(m: TorchModel) -> dict[str, ov.Model]:
    h = m.config.hift
    t, hop, nh = 20, h.hop_length, h.nb_harmonics + 1
    mel = torch.randn(1, 80, t)
    f0_stage, src_stage, dec_stage = m.hift.f0_stage(), m.hift.source_stage(), m.hift.decode_stage()
    f0 = _dyn(_convert(f0_stage, (mel,)), {0: [1, 80, -1]}, ["f0"], ["mel"])
    with torch.no_grad():
        f0_ex = f0_stage(mel)
    src = _dyn(_convert(src_stage, (f0_ex, torch.rand(1, nh), torch.randn(1, nh, hop * t))),
               {0: [1, -1], 1: [1, nh], 2: [1, nh, -1]}, ["source"], ["f0", "phase", "noise"])
    dec = _dyn(_convert(dec_stage, (mel, torch.randn(1, 1, hop * t) * 0.1)),
               {0: [1, 80, -1], 1: [1, 1, -1]}, ["wav"], ["mel", "source"])
    return {"hift_f0": f0, "hift_source": src, "hift_decode": dec}


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

    def write_stages(m: TorchModel, tmp: str, files: dict, say: Progress, start: float) -> None:
        def save(stage: str, model: ov.Model) -> None:
            stem = STAGES[stage]
            _save_ir(model, tmp, stem, stage, weights)
            for ext in (".xml", ".bin"):
                files[stem + ext] = file_record(os.path.join(tmp, stem + ext), stage=stage,
                                                precision=weights)
            say(f"converted {stage} ({time.perf_counter() - start:.0f} s)")

        save("text_encoder", convert_text_encoder(m))
        save("llm", convert_llm(m))
        save("flow_encoder", convert_flow_encoder(m))
        save("length_regulator", convert_length_regulator(m))
        save("estimator", convert_estimator(m))
        for stage, model in convert_hift(m).items():
            save(stage, model)

    header = {
        "format": FORMAT,
        "cosyvino_version": __version__,
        "openvino_version": ov.get_version(),
        "weights": weights,
    }
    return convert_atomically(model_dir, out_dir, DEFAULT_SUBDIR, write_stages=write_stages,
                              header=header, stateful=True, progress=progress,
                              overwrite=overwrite, llm_layout=LLM_LAYOUT)
