"""What the CosyVoice2 and CosyVoice3 graph tables share: the spec class whose example inputs
hold values the graph is fed, the tensor helpers and fills, the ``chunk`` value of full
attention, and the speech-LM entries (``text_embedding``, ``speech_embedding``, the stateful
``llm``), which are the same graphs over the shared Qwen2 speech LM
(:class:`~cosyvino.families.cosyvoice23.torch.speech_lm.SpeechLMBase`). The family tables are
:mod:`cosyvino.families.cosyvoice2.graphs` and :mod:`cosyvino.families.cosyvoice3.graphs`.
Must not import torch (the ``torch_module`` factories import it when called).

Shapes: D = LLM width, L / KH / hd = Qwen2 layers / KV heads / head width, V = rows of the
speech head (v2: 6564, v3: 6761).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from ..base import GraphSpec, StateSpec, TensorSpec

F32, I64 = "float32", "int64"
#: the LLM cache tensors (stacked over layers: [L, 1, KH, positions, hd], sheet v2 §4.5)
PAST_K, PAST_V, PRESENT_K, PRESENT_V = "past_k", "past_v", "present_k", "present_v"
#: the ``chunk`` input of full attention (any sequence shorter than it is one chunk: the CFM
#: noise table bounds a segment to 15000 frames). Small enough that the graphs' chunk
#: arithmetic (``chunk * upsample_stride``, ``(i // chunk + 1) * chunk``) stays below 2**31:
#: OpenVINO's CPU plugin computes int64 index tensors in int32, and 1 << 30 overflowed there
#: (every key hidden, a wrong full-attention encoder)
FULL_ATTENTION = 1 << 20


@dataclass(frozen=True)
class ValuedGraphSpec(GraphSpec):
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


def f32(name, *shape) -> TensorSpec:
    return TensorSpec(name, F32, tuple(shape))


def i64(name, *shape) -> TensorSpec:
    return TensorSpec(name, I64, tuple(shape))


# example value fills
def ones(shape, rng):
    return np.ones(shape)


def unit(shape, rng):
    return rng.random(shape)


def small_chunk(shape, rng):
    # a chunk smaller than the example lengths, so the traced mask is a real chunk mask
    return np.full(shape, 5)


def f0_hz(shape, rng):
    return np.where(rng.random(shape) < 0.8, rng.uniform(80.0, 400.0, shape), 0.0)


def small(shape, rng):
    return 0.1 * rng.standard_normal(shape)


# torch module factories (called with a family's torch model: ``.llm`` is a SpeechLMBase)
def _text_embedding(m):
    from .torch.graphs import TextEmbeddingGraph

    return TextEmbeddingGraph(m.llm)


def _speech_embedding(m):
    from .torch.graphs import SpeechEmbeddingGraph

    return SpeechEmbeddingGraph(m.llm)


def _llm(m):
    return m.llm  # SpeechLMBase.forward(inputs_embeds, past_k, past_v) is the step


def speech_lm_graphs(llm) -> list[GraphSpec]:
    """``text_embedding``, ``speech_embedding`` and ``llm`` for the speech-LM config ``llm``
    (:class:`~cosyvino.families.cosyvoice23.lm_config.SpeechLMConfig` with ``vocab_out``)."""
    q = llm.qwen
    d, v = llm.llm_input_size, llm.vocab_out
    layers, kv, hd = q.num_hidden_layers, q.num_key_value_heads, q.attention_head_dim
    cache = (layers, "batch", kv)
    return [
        ValuedGraphSpec("text_embedding", "llm", (i64("ids", 1, "n"),),
                        (f32("rows", 1, "n", d),), example_sizes={"n": 7},
                        torch_module=_text_embedding, int_high={"ids": q.vocab_size},
                        doc="Qwen2 text ids -> LLM input rows", role="text_encoder"),
        ValuedGraphSpec("speech_embedding", "llm", (i64("tokens", 1, "n"),),
                        (f32("rows", 1, "n", d),), example_sizes={"n": 5},
                        torch_module=_speech_embedding, int_high={"tokens": v},
                        doc="speech tokens (and the rows after them) -> LLM input rows",
                        role="speech_embedding"),
        GraphSpec("llm", "llm",
                  (f32("inputs_embeds", "batch", "new", d), f32(PAST_K, *cache, "past", hd),
                   f32(PAST_V, *cache, "past", hd)),
                  (f32("logp", "batch", v), f32(PRESENT_K, *cache, "total", hd),
                   f32(PRESENT_V, *cache, "total", hd)),
                  state=(StateSpec(PAST_K, PRESENT_K, (layers, 1, kv, 0, hd), axis=3),
                         StateSpec(PAST_V, PRESENT_V, (layers, 1, kv, 0, hd), axis=3)),
                  example_sizes={"batch": 1, "new": 4, "past": 3, "total": 7},
                  torch_module=_llm, role="llm",
                  doc="one KV-cached Qwen2 call (prefill or one decode step): log-softmax of "
                      "the speech head at the last new position"),
    ]


#: the OpenVINO export's LLM layout (manifest ``llm`` fields, compared by ``cosyvino convert``):
#: one state per layer and K/V (:func:`layer_state_spec`); RoPE positions from the cache length
#: inside the graph (no positional inputs). The same for CosyVoice2 and CosyVoice3 (one Qwen2).
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
    :class:`~cosyvino.families.cosyvoice23.torch.speech_lm.LayerCacheStep`.

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


__all__ = ["FULL_ATTENTION", "OPENVINO_LLM_LAYOUT", "PAST_K", "PAST_V", "PRESENT_K",
           "PRESENT_V", "ValuedGraphSpec", "layer_key_names", "layer_state_spec",
           "speech_lm_graphs"]
