"""THE table of CosyVoice2's exported graphs: names, tensors, dtypes, dynamic dims, state.

Read by the ONNX exporter, the graph-running backends (ONNX Runtime, the generic torch runner)
and the family's stages (:mod:`.graph_stages`); nothing else writes these names down. Must not
import torch (the ``torch_module`` factories import it when called, on a
:class:`~.torch.model.CosyVoice2TorchModel`).

Shapes: D = LLM width (896), L / KH / hd = Qwen2 layers / KV heads / head width (24 / 2 / 64),
V3 = speech tokens + 3 (6564: the head's EOS 6561, 6562, FILL 6563), C = mel bins (80), S =
x-vector width (192), hop = output samples per mel frame (480), NH = NSF harmonics + 1 (9).
Components: ``llm`` (embeddings, LLM step), ``flow`` (encoder, estimator), ``vocoder`` (HiFT).
The flow graphs take their attention pattern as data (``chunk``; :mod:`.torch.graphs`), so one
file serves streaming and whole-segment calls.
"""

from __future__ import annotations

from ..base import GraphSpec, GraphTable
from ..cosyvoice23.graph_specs import (
    FULL_ATTENTION,
    OPENVINO_LLM_LAYOUT,
    PAST_K,
    PAST_V,
    PRESENT_K,
    PRESENT_V,
    ValuedGraphSpec,
    layer_key_names,
    layer_state_spec,
    speech_lm_graphs,
)
from ..cosyvoice23.graph_specs import f0_hz as _f0_hz
from ..cosyvoice23.graph_specs import f32 as _f
from ..cosyvoice23.graph_specs import i64 as _i
from ..cosyvoice23.graph_specs import ones as _ones
from ..cosyvoice23.graph_specs import small as _small
from ..cosyvoice23.graph_specs import small_chunk as _chunk
from ..cosyvoice23.graph_specs import unit as _unit

#: graph names in table order
GRAPH_NAMES = ("text_embedding", "speech_embedding", "special_embedding", "llm",
               "flow_encoder", "estimator", "hift_f0", "hift_source", "hift_decode")
#: the v2 name of the shared spec class
V2GraphSpec = ValuedGraphSpec


# torch module factories (called with a .torch.model.CosyVoice2TorchModel)
def _special_embedding(m):
    from .torch.graphs import SpecialEmbeddingGraph

    return SpecialEmbeddingGraph(m.llm)


def _flow_encoder(m):
    from .torch.graphs import FlowEncoderGraph

    return FlowEncoderGraph(m.flow)


def _estimator(m):
    from .torch.graphs import EstimatorGraph

    return EstimatorGraph(m.flow.decoder.estimator)


def _hift_f0(m):
    return m.hift.f0_stage()


def _hift_source(m):
    return m.hift.source_stage()


def _hift_decode(m):
    return m.hift.decode_stage()


def graph_table(config) -> GraphTable:
    """The v2 graphs for ``config`` (:class:`~.model_config.CosyVoice2ModelConfig`)."""
    llm = config.llm
    d = llm.llm_input_size
    flow = config.flow
    c, s, look = flow.output_size, flow.spk_embed_dim, flow.pre_lookahead_len
    mel_bins, nh = config.hift.in_channels, config.hift.nb_harmonics + 1
    hop = config.samples_per_frame
    t_hift = 20
    shared = {g.name: g for g in speech_lm_graphs(llm)}
    return GraphTable([
        shared["text_embedding"], shared["speech_embedding"],
        V2GraphSpec("special_embedding", "llm", (_i("ids", 1, "n"),),
                    (_f("rows", 1, "n", d),), example_sizes={"n": 2},
                    torch_module=_special_embedding, int_high={"ids": 2},
                    doc="0 = SOS, 1 = TASK -> LLM input rows", role="llm_embedding"),
        shared["llm"],
        V2GraphSpec("flow_encoder", "flow",
                    (_i("tokens", 1, "n"), _i("context", 1, look), _f("context_scale", 1),
                     _i("chunk", 1), _f("embedding", 1, s)),
                    (_f("mu", 1, c, "frames"), _f("spks", 1, c)),
                    example_sizes={"n": 13, "frames": 2 * 13}, torch_module=_flow_encoder,
                    int_high={"tokens": flow.vocab_size, "context": flow.vocab_size},
                    example_values={"context_scale": _ones, "chunk": _chunk},
                    doc="speech tokens (+ look-ahead context) -> mu (2 frames per token) and "
                        "the projected speaker; chunk = attention chunk in tokens",
                    role="flow_encoder"),
        V2GraphSpec("estimator", "flow",
                    (_f("x", 2, c, "frames"), _f("mask", 2, 1, "frames"),
                     _f("mu", 2, c, "frames"), _f("t", 2), _f("spks", 2, c),
                     _f("cond", 2, c, "frames"), _i("chunk", 1)),
                    (_f("velocity", 2, c, "frames"),),
                    example_sizes={"frames": 23}, torch_module=_estimator,
                    example_values={"mask": _ones, "t": _unit, "chunk": _chunk},
                    doc="CFM estimator (causal U-Net), batch 2 = conditional + unconditional; "
                        "chunk = attention chunk in frames", role="estimator"),
        GraphSpec("hift_f0", "vocoder", (_f("mel", 1, mel_bins, "frames"),),
                  (_f("f0", 1, "frames"),), example_sizes={"frames": t_hift},
                  torch_module=_hift_f0, doc="f0 predictor (Hz at the mel frame rate)",
                  role="hift_f0"),
        V2GraphSpec("hift_source", "vocoder",
                    (_f("f0", 1, "frames"), _f("noise", 1, nh, "samples")),
                    (_f("source", 1, 1, "samples"),),
                    example_sizes={"frames": t_hift, "samples": hop * t_hift},
                    torch_module=_hift_source, example_values={"f0": _f0_hz},
                    doc="SineGen2 NSF source from f0 and the Gaussian draw", role="hift_source"),
        V2GraphSpec("hift_decode", "vocoder",
                    (_f("mel", 1, mel_bins, "frames"), _f("source", 1, 1, "samples")),
                    (_f("wav", 1, "samples"),),
                    example_sizes={"frames": t_hift, "samples": hop * t_hift},
                    torch_module=_hift_decode, example_values={"source": _small},
                    doc="HiFT decode to the 24 kHz waveform, clipped to ±0.99",
                    role="hift_decode"),
    ])


__all__ = ["FULL_ATTENTION", "GRAPH_NAMES", "OPENVINO_LLM_LAYOUT", "PAST_K", "PAST_V",
           "PRESENT_K", "PRESENT_V", "V2GraphSpec", "graph_table", "layer_key_names",
           "layer_state_spec"]
