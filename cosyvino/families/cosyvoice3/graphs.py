"""THE table of CosyVoice3's exported graphs: names, tensors, dtypes, dynamic dims, state.

Read by the ONNX exporter, the graph-running backends (ONNX Runtime, the generic torch runner)
and the family's stages (:mod:`.graph_stages`); nothing else writes these names down. Must not
import torch (the ``torch_module`` factories import it when called, on a
:class:`~.torch.model.CosyVoice3TorchModel`).

Shapes: D = LLM width (896), L / KH / hd = Qwen2 layers / KV heads / head width (24 / 2 / 64),
V = speech head rows (6761: speech tokens 0..6560, then SOS 6561, EOS 6562, TASK 6563, FILL
6564, sheet v3 §4.1), C = mel bins (80), S = x-vector width (192), hop = output samples per mel
frame (480), H = NSF table columns (9). Components: ``llm`` (embeddings, LLM step; shared with
CosyVoice2: :func:`cosyvino.families.cosyvoice23.graph_specs.speech_lm_graphs`), ``flow``
(``flow_encoder`` = input embedding + pre-lookahead, no conformer encoder; ``estimator`` = the
DiT), ``vocoder`` (causal HiFT: f0, source from the fixed NSF table, decode). v3 has no
``special_embedding``: SOS / TASK are rows of ``speech_embedding``. The estimator takes its
attention pattern as data (``chunk``) and the vocoder its look-ahead (``context``), so one file
serves streaming and whole-segment calls (:mod:`.torch.graphs`).
"""

from __future__ import annotations

from ..base import GraphTable
from ..cosyvoice23.graph_specs import (
    FULL_ATTENTION,
    ValuedGraphSpec,
    f0_hz,
    f32,
    i64,
    ones,
    small,
    small_chunk,
    speech_lm_graphs,
    unit,
)

#: graph names in table order
GRAPH_NAMES = ("text_embedding", "speech_embedding", "llm", "flow_encoder", "estimator",
               "hift_f0", "hift_source", "hift_decode")


# torch module factories (called with a .torch.model.CosyVoice3TorchModel)
def _flow_encoder(m):
    from .torch.graphs import FlowEncoderGraph

    return FlowEncoderGraph(m.flow)


def _estimator(m):
    from .torch.graphs import EstimatorGraph

    return EstimatorGraph(m.flow.decoder.estimator)


def _hift_f0(m):
    from .torch.graphs import F0Graph

    return F0Graph(m.hift)


def _hift_source(m):
    return m.hift.source_stage()


def _hift_decode(m):
    from .torch.graphs import DecodeGraph

    return DecodeGraph(m.hift)


def graph_table(config) -> GraphTable:
    """The v3 graphs for ``config`` (:class:`~.model_config.CosyVoice3ModelConfig`)."""
    flow = config.flow
    c, s, look = flow.output_size, flow.spk_embed_dim, flow.pre_lookahead_len
    mel_bins, h = config.hift.in_channels, config.hift.nb_harmonics + 1
    hop, look_right = config.samples_per_frame, config.hift.conv_pre_look_right
    t_hift = 20
    return GraphTable([
        *speech_lm_graphs(config.llm),
        ValuedGraphSpec("flow_encoder", "flow",
                        (i64("tokens", 1, "n"), i64("context", 1, look),
                         f32("context_scale", 1), f32("embedding", 1, s)),
                        (f32("mu", 1, c, "frames"), f32("spks", 1, c)),
                        example_sizes={"n": 13, "frames": 2 * 13}, torch_module=_flow_encoder,
                        int_high={"tokens": flow.vocab_size, "context": flow.vocab_size},
                        example_values={"context_scale": ones},
                        doc="speech tokens (+ look-ahead context) -> mu (input embedding + "
                            "pre-lookahead, 2 frames per token) and the projected speaker",
                        role="flow_encoder"),
        ValuedGraphSpec("estimator", "flow",
                        (f32("x", 2, c, "frames"), f32("mask", 2, 1, "frames"),
                         f32("mu", 2, c, "frames"), f32("t", 2), f32("spks", 2, c),
                         f32("cond", 2, c, "frames"), i64("chunk", 1)),
                        (f32("velocity", 2, c, "frames"),),
                        example_sizes={"frames": 23}, torch_module=_estimator,
                        example_values={"mask": ones, "t": unit, "chunk": small_chunk},
                        doc="CFM estimator (DiT), batch 2 = conditional + unconditional; "
                            "chunk = attention chunk in frames", role="estimator"),
        ValuedGraphSpec("hift_f0", "vocoder", (f32("mel", 1, mel_bins, "frames"),),
                        (f32("f0", 1, "frames"),), example_sizes={"frames": t_hift},
                        torch_module=_hift_f0,
                        doc="causal f0 predictor (Hz per mel frame; float64 in torch, float32 "
                            "in ONNX)", role="hift_f0"),
        ValuedGraphSpec("hift_source", "vocoder",
                        (f32("f0", 1, "frames"), f32("sine_waves", 1, "samples", h)),
                        (f32("source", 1, 1, "samples"),),
                        example_sizes={"frames": t_hift, "samples": hop * t_hift},
                        torch_module=_hift_source,
                        example_values={"f0": f0_hz, "sine_waves": unit},
                        doc="causal NSF source from f0 and rows of the fixed uniform table",
                        role="hift_source"),
        ValuedGraphSpec("hift_decode", "vocoder",
                        (f32("mel", 1, mel_bins, "frames"),
                         f32("context", 1, mel_bins, look_right),
                         f32("source", 1, 1, "samples")),
                        (f32("wav", 1, "out_samples"),),
                        example_sizes={"frames": t_hift, "samples": hop * (t_hift + 4),
                                       "out_samples": hop * t_hift},
                        torch_module=_hift_decode,
                        example_values={"source": small, "context": small},
                        doc="causal HiFT decode to the 24 kHz waveform (480 per mel frame), "
                            "clipped to ±0.99; context = conv_pre's look-ahead frames",
                        role="hift_decode"),
    ])


__all__ = ["FULL_ATTENTION", "GRAPH_NAMES", "graph_table"]
