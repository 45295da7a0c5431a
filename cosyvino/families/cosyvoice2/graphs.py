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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ..base import GraphSpec, GraphTable, StateSpec, TensorSpec

F32, I64 = "float32", "int64"
#: the LLM cache tensors (stacked over layers: [L, 1, KH, positions, hd], sheet v2 §4.5)
PAST_K, PAST_V, PRESENT_K, PRESENT_V = "past_k", "past_v", "present_k", "present_v"
#: the ``chunk`` input of full attention (any sequence shorter than it is one chunk: the CFM
#: noise table bounds a segment to 15000 frames). Small enough that the graphs' chunk
#: arithmetic (``chunk * upsample_stride``, ``(i // chunk + 1) * chunk``) stays below 2**31:
#: OpenVINO's CPU plugin computes int64 index tensors in int32, and 1 << 30 overflowed there
#: (every key hidden, a wrong full-attention encoder)
FULL_ATTENTION = 1 << 20
#: graph names in table order
GRAPH_NAMES = ("text_embedding", "speech_embedding", "special_embedding", "llm",
               "flow_encoder", "estimator", "hift_f0", "hift_source", "hift_decode")


@dataclass(frozen=True)
class V2GraphSpec(GraphSpec):
    """A :class:`GraphSpec` whose example inputs have values the graph is fed: ``int_high``
    (input -> exclusive bound of its ids) and ``example_values`` (input -> ``fill(shape, rng)``)."""

    int_high: Mapping[str, int] = field(default_factory=dict)
    example_values: Mapping[str, Callable] = field(default_factory=dict)

    def example_inputs(self, seed: int = 0, high: int = 100) -> list[np.ndarray]:
        rng = np.random.default_rng(seed)
        out = []
        for t in self.inputs:
            fill = self.example_values.get(t.name)
            if fill is None:
                out.append(t.example(self.example_sizes, rng, self.int_high.get(t.name, high)))
                continue
            shape = tuple(d if isinstance(d, int) else int(self.example_sizes[d])
                          for d in t.shape)
            out.append(np.ascontiguousarray(fill(shape, rng), dtype=t.dtype))
        return out


def _f(name, *shape):
    return TensorSpec(name, F32, tuple(shape))


def _i(name, *shape):
    return TensorSpec(name, I64, tuple(shape))


# example value fills
def _ones(shape, rng):
    return np.ones(shape)


def _unit(shape, rng):
    return rng.random(shape)


def _chunk(shape, rng):
    # a chunk smaller than the example lengths, so the traced mask is a real chunk mask
    return np.full(shape, 5)


def _f0_hz(shape, rng):
    return np.where(rng.random(shape) < 0.8, rng.uniform(80.0, 400.0, shape), 0.0)


def _small(shape, rng):
    return 0.1 * rng.standard_normal(shape)


# torch module factories (called with a .torch.model.CosyVoice2TorchModel)
def _text_embedding(m):
    from .torch.graphs import TextEmbeddingGraph

    return TextEmbeddingGraph(m.llm)


def _speech_embedding(m):
    from .torch.graphs import SpeechEmbeddingGraph

    return SpeechEmbeddingGraph(m.llm)


def _special_embedding(m):
    from .torch.graphs import SpecialEmbeddingGraph

    return SpecialEmbeddingGraph(m.llm)


def _llm(m):
    return m.llm  # CosyVoice2LM.forward(inputs_embeds, past_k, past_v) is the step


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
    llm, q = config.llm, config.llm.qwen
    d, v3 = llm.llm_input_size, llm.vocab_out
    layers, kv, hd = q.num_hidden_layers, q.num_key_value_heads, q.attention_head_dim
    flow = config.flow
    c, s, look = flow.output_size, flow.spk_embed_dim, flow.pre_lookahead_len
    mel_bins, nh = config.hift.in_channels, config.hift.nb_harmonics + 1
    hop = config.samples_per_frame
    cache = (layers, "batch", kv)
    t_hift = 20
    return GraphTable([
        V2GraphSpec("text_embedding", "llm", (_i("ids", 1, "n"),), (_f("rows", 1, "n", d),),
                    example_sizes={"n": 7}, torch_module=_text_embedding,
                    int_high={"ids": q.vocab_size}, doc="Qwen2 text ids -> LLM input rows"),
        V2GraphSpec("speech_embedding", "llm", (_i("tokens", 1, "n"),),
                    (_f("rows", 1, "n", d),), example_sizes={"n": 5},
                    torch_module=_speech_embedding, int_high={"tokens": v3},
                    doc="speech tokens -> LLM input rows"),
        V2GraphSpec("special_embedding", "llm", (_i("ids", 1, "n"),),
                    (_f("rows", 1, "n", d),), example_sizes={"n": 2},
                    torch_module=_special_embedding, int_high={"ids": 2},
                    doc="0 = SOS, 1 = TASK -> LLM input rows"),
        GraphSpec("llm", "llm",
                  (_f("inputs_embeds", "batch", "new", d), _f(PAST_K, *cache, "past", hd),
                   _f(PAST_V, *cache, "past", hd)),
                  (_f("logp", "batch", v3), _f(PRESENT_K, *cache, "total", hd),
                   _f(PRESENT_V, *cache, "total", hd)),
                  state=(StateSpec(PAST_K, PRESENT_K, (layers, 1, kv, 0, hd), axis=3),
                         StateSpec(PAST_V, PRESENT_V, (layers, 1, kv, 0, hd), axis=3)),
                  example_sizes={"batch": 1, "new": 4, "past": 3, "total": 7},
                  torch_module=_llm,
                  doc="one KV-cached Qwen2 call (prefill or one decode step): log-softmax of "
                      "the speech head at the last new position"),
        V2GraphSpec("flow_encoder", "flow",
                    (_i("tokens", 1, "n"), _i("context", 1, look), _f("context_scale", 1),
                     _i("chunk", 1), _f("embedding", 1, s)),
                    (_f("mu", 1, c, "frames"), _f("spks", 1, c)),
                    example_sizes={"n": 13, "frames": 2 * 13}, torch_module=_flow_encoder,
                    int_high={"tokens": flow.vocab_size, "context": flow.vocab_size},
                    example_values={"context_scale": _ones, "chunk": _chunk},
                    doc="speech tokens (+ look-ahead context) -> mu (2 frames per token) and "
                        "the projected speaker; chunk = attention chunk in tokens"),
        V2GraphSpec("estimator", "flow",
                    (_f("x", 2, c, "frames"), _f("mask", 2, 1, "frames"),
                     _f("mu", 2, c, "frames"), _f("t", 2), _f("spks", 2, c),
                     _f("cond", 2, c, "frames"), _i("chunk", 1)),
                    (_f("velocity", 2, c, "frames"),),
                    example_sizes={"frames": 23}, torch_module=_estimator,
                    example_values={"mask": _ones, "t": _unit, "chunk": _chunk},
                    doc="CFM estimator (causal U-Net), batch 2 = conditional + unconditional; "
                        "chunk = attention chunk in frames"),
        GraphSpec("hift_f0", "vocoder", (_f("mel", 1, mel_bins, "frames"),),
                  (_f("f0", 1, "frames"),), example_sizes={"frames": t_hift},
                  torch_module=_hift_f0, doc="f0 predictor (Hz at the mel frame rate)"),
        V2GraphSpec("hift_source", "vocoder",
                    (_f("f0", 1, "frames"), _f("noise", 1, nh, "samples")),
                    (_f("source", 1, 1, "samples"),),
                    example_sizes={"frames": t_hift, "samples": hop * t_hift},
                    torch_module=_hift_source, example_values={"f0": _f0_hz},
                    doc="SineGen2 NSF source from f0 and the Gaussian draw"),
        V2GraphSpec("hift_decode", "vocoder",
                    (_f("mel", 1, mel_bins, "frames"), _f("source", 1, 1, "samples")),
                    (_f("wav", 1, "samples"),),
                    example_sizes={"frames": t_hift, "samples": hop * t_hift},
                    torch_module=_hift_decode, example_values={"source": _small},
                    doc="HiFT decode to the 24 kHz waveform, clipped to ±0.99"),
    ])


#: the OpenVINO export's LLM layout (manifest ``llm`` fields, compared by ``cosyvino convert``):
#: one state per layer and K/V (:func:`layer_state_spec`); RoPE positions from the cache length
#: inside the graph (no positional inputs)
OPENVINO_LLM_LAYOUT = {"state": "per_layer", "positional": "rope_in_graph"}


def layer_key_names(layers: int) -> list[tuple[str, str, str, str]]:
    """Per layer ``(past key, past value, present key, present value)`` tensor names (the
    stateful LLM convention OpenVINO's tools and v1's step use)."""
    return [(f"past_key_values.{i}.key", f"past_key_values.{i}.value", f"present.{i}.key",
             f"present.{i}.value") for i in range(layers)]


def layer_state_spec(spec: GraphSpec) -> GraphSpec:
    """The ``llm`` entry ``spec`` with its stacked caches (``past_k`` / ``past_v`` ``[L, B, KH,
    P, hd]``) split into one tensor per layer and K/V (``past_key_values.{i}.key`` ...
    ``[B, KH, P, hd]``, :func:`layer_key_names`), in the order ``k0, v0, k1, v1, ...``; the
    data inputs and outputs are the entry's. The module of this layout is
    :class:`~.torch.llm.LayerCacheStep`.

    Raises ValueError: ``spec`` has not the two stacked states of the table's ``llm``."""
    by_input = {s.input: s for s in spec.state}
    if set(by_input) != {PAST_K, PAST_V}:
        raise ValueError(f"graph {spec.name!r}: expected the states {PAST_K}, {PAST_V}")
    stacked = {t.name: t for t in (*spec.inputs, *spec.outputs)}
    layers = by_input[PAST_K].init_shape[0]
    past_shape = stacked[PAST_K].shape[1:]
    present_shape = stacked[PRESENT_K].shape[1:]
    init = by_input[PAST_K].init_shape[1:]
    axis = by_input[PAST_K].axis - 1
    ins, outs, states = [], [], []
    for pk, pv, qk, qv in layer_key_names(layers):
        ins += [TensorSpec(pk, F32, past_shape), TensorSpec(pv, F32, past_shape)]
        outs += [TensorSpec(qk, F32, present_shape), TensorSpec(qv, F32, present_shape)]
        states += [StateSpec(pk, qk, init, axis=axis), StateSpec(pv, qv, init, axis=axis)]
    return replace(spec, inputs=(*spec.data_inputs, *ins), outputs=(*spec.data_outputs, *outs),
                   state=tuple(states))


__all__ = ["GRAPH_NAMES", "OPENVINO_LLM_LAYOUT", "V2GraphSpec", "graph_table",
           "layer_key_names", "layer_state_spec"]
