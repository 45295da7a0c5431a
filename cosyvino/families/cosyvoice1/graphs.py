"""THE table of CosyVoice v1's exported graphs: names, tensors, dtypes, dynamic dims, state.

Read by both exporters (:mod:`cosyvino.export.openvino`, :mod:`cosyvino.export.onnx`), the
graph-running backends (ONNX Runtime, the generic torch runner), the quantizer's capture and the
conformance suite; nothing else writes these names down. Must not import torch (the
``torch_module`` factories import it when called).

Shapes: D = LLM width (``llm.llm_input_size``, 1024 for 300M), V = speech tokens (4096; the
``llm`` output has V + 1 entries, the last is EOS), H / d_k = LLM heads / head width, C = mel
bins (80), S = x-vector width (192), hop = output samples per mel frame (256), NH = NSF
harmonics + 1 (9).

Example inputs (:meth:`GraphSpec.example_inputs`: what the exporters trace with and the
conformance suite calls with) are random at :attr:`GraphSpec.example_sizes`; inputs with a valid
range get values in it (:class:`V1GraphSpec`: the estimator's mask is ones and ``t`` in [0, 1),
``interp`` in [0, 1), the LLM's ``attention_mask`` of left-padded rows, f0 in Hz with voiced
and unvoiced frames, the NSF phase in [-pi, pi) with the fundamental's at 0, a small source
signal), so a traced graph never sees inputs the pipeline cannot produce.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

import numpy as np

from ..base import GraphSpec, GraphTable, StateSpec, TensorSpec

F32, I64 = "float32", "int64"

#: ``fill(shape, rng) -> array``: example values of one input
ExampleFill = Callable[[tuple, np.random.Generator], np.ndarray]


@dataclass(frozen=True)
class V1GraphSpec(GraphSpec):
    """A :class:`GraphSpec` whose example inputs can have values in their valid range.

    Attributes:
        example_values: input name -> ``fill(shape, rng)`` for inputs where standard normals
            (floats) or ints in ``[0, high)`` are not what the graph is fed (a mask of ones,
            f0 in Hz, ``t`` in [0, 1)); the other inputs are drawn as by
            :meth:`GraphSpec.example_inputs`.
    """

    example_values: Mapping[str, ExampleFill] = field(default_factory=dict)

    def example_inputs(self, seed: int = 0, high: int = 100) -> list[np.ndarray]:
        """Inputs at :attr:`example_sizes`, in input order, dtypes as declared; one generator
        seeded with ``seed`` draws them in that order (deterministic per seed)."""
        rng = np.random.default_rng(seed)
        out = []
        for t in self.inputs:
            fill = self.example_values.get(t.name)
            if fill is None:
                out.append(t.example(self.example_sizes, rng, high))
                continue
            shape = tuple(d if isinstance(d, int) else int(self.example_sizes[d])
                          for d in t.shape)
            out.append(np.ascontiguousarray(fill(shape, rng), dtype=t.dtype))
        return out


# example value fills: what the pipeline feeds these inputs (ranges, not distributions)
def _ones(shape, rng):
    return np.ones(shape)


def _unit(shape, rng):
    return rng.random(shape)


def _f0_hz(shape, rng):
    # voiced frames (above the 10 Hz threshold) and unvoiced ones (0 Hz), like the predictor's
    return np.where(rng.random(shape) < 0.8, rng.uniform(80.0, 400.0, shape), 0.0)


def _nsf_phase(shape, rng):
    # U(-pi, pi) per harmonic, the fundamental's (column 0) at 0: what the pipeline draws
    phase = rng.uniform(-math.pi, math.pi, shape)
    phase[..., 0] = 0.0
    return phase


def _pos_offset(shape, rng):
    # a window inside the example's pos_keys rows (14, of which a step over 3 + 4 positions
    # slices 10), not at the start, so a wrong offset shows in the parity checks
    return np.full(shape, 2)


def _left_padded_mask(shape, rng):
    # key mask [B, P+T] of left-padded rows: row b has its first b keys padded (0), the rest
    # real (1); row 0 is unpadded. The new keys (the last T) are always real.
    mask = np.ones(shape)
    for b in range(shape[0]):
        mask[b, :min(b, shape[1] - 1)] = 0.0
    return mask


def _nsf_source(shape, rng):
    return 0.1 * rng.standard_normal(shape)


def _f(name, *shape):
    return TensorSpec(name, F32, tuple(shape))


def _i(name, *shape):
    return TensorSpec(name, I64, tuple(shape))


# torch module factories (called with a cosyvino.families.cosyvoice1.torch.loading.TorchModel)
def _text_encoder(m):
    from .torch.llm import TextEncoderStage

    return TextEncoderStage(m.llm)


def _llm(m):
    from .torch.llm import LLMExplicitCacheStep

    return LLMExplicitCacheStep(m.llm)


def _flow_encoder(m):
    from .torch.flow_encoder import FlowEncoderStage

    return FlowEncoderStage(m.flow)


def _length_regulator(m):
    from .torch.length_regulator import LengthRegulatorStage

    return LengthRegulatorStage(m.flow.length_regulator)


def _estimator(m):
    return m.flow.decoder.estimator


def _hift_f0(m):
    return m.hift.f0_stage()


def _hift_source(m):
    return m.hift.source_stage()


def _hift_decode(m):
    return m.hift.decode_stage()


def llm_pos_key_names(layers: int) -> list[str]:
    """The ``llm`` graph's per-layer projected position-table inputs, in layer order."""
    return [f"pos_keys.{i}" for i in range(layers)]


def llm_cache_names(layers: int) -> tuple[list[str], list[str]]:
    """(past input names, present output names), layer-major, key before value."""
    past = [f"past_key_values.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    present = [f"present.{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    return past, present


def graph_table(config) -> GraphTable:
    """The v1 graphs for ``config`` (:class:`cosyvino.families.cosyvoice1.config.ModelConfig`)."""
    llm = config.llm
    d = llm.llm_input_size
    layers, heads = llm.llm.num_blocks, llm.llm.attention_heads
    width = llm.llm.output_size
    dk = width // heads
    v1 = llm.speech_token_size + 1
    c, s = config.flow.output_size, config.flow.spk_embed_dim
    mel_bins = config.hift.in_channels
    nh = config.hift.nb_harmonics + 1
    hop = config.hift.hop_length
    past, present = llm_cache_names(layers)
    t_hift = 20
    graphs = [
        GraphSpec("text_encoder", "llm", (_i("text_token", 1, "text_len"),),
                  (_f("text_features", 1, "text_len", d),),
                  example_sizes={"text_len": 9}, torch_module=_text_encoder,
                  doc="text embedding, causal conformer, affine to the LLM width"),
        V1GraphSpec("llm", "llm",
                    (_f("inputs_embeds", "batch", "new", d),
                     _f("attention_mask", "batch", "total"),
                     _i("pos_offset", 1),
                     *(_f(n, heads, "pos_rows", dk) for n in llm_pos_key_names(layers)),
                     *(_f(n, "batch", heads, "past", dk) for n in past)),
                    (_f("logp", "batch", v1),
                     *(_f(n, "batch", heads, "total", dk) for n in present)),
                    state=tuple(StateSpec(p, q, (1, heads, 0, dk))
                                for p, q in zip(past, present)),
                    example_sizes={"batch": 2, "new": 4, "past": 3, "total": 7,
                                   "pos_rows": 14},
                    torch_module=_llm,
                    doc="one KV-cached LLM step of B rows (prefill: B = 1; batched decode: "
                        "T = 1), rows left-padded to the common cache length and "
                        "attention_mask (1 = real key, 0 = padding) over past + new keys: "
                        "log-softmax of the speech-token head at the last position; "
                        "pos_keys.{l} = layer l's linear_pos(pe) by head, row pos_offset + k "
                        "for distance past+new-1-k (cosyvino.families.cosyvoice1.positional."
                        "PositionalKeys)",
                    example_values={"attention_mask": _left_padded_mask,
                                    "pos_offset": _pos_offset}),
        GraphSpec("flow_encoder", "flow", (_i("token", 1, "tokens"), _f("embedding", 1, s)),
                  (_f("h", 1, "tokens", c), _f("spks", 1, c)),
                  example_sizes={"tokens": 13}, torch_module=_flow_encoder,
                  doc="speech-token embedding + conformer encoder + projection; speaker affine"),
        V1GraphSpec("length_regulator", "flow",
                    (_f("h", 1, "tokens", c), _f("interp", "frames", "tokens")),
                    (_f("mu", 1, "frames", c),),
                    example_sizes={"tokens": 13, "frames": 23},
                    torch_module=_length_regulator,
                    doc="InterpolateRegulator conv stack on interp @ h",
                    example_values={"interp": _unit}),
        V1GraphSpec("estimator", "flow",
                    (_f("x", 2, c, "frames"), _f("mask", 2, 1, "frames"),
                     _f("mu", 2, c, "frames"), _f("t", 2), _f("spks", 2, c),
                     _f("cond", 2, c, "frames")),
                    (_f("velocity", 2, c, "frames"),),
                    example_sizes={"frames": 57}, torch_module=_estimator,
                    doc="CFM estimator (U-Net), batch 2 = conditional + unconditional",
                    example_values={"mask": _ones, "t": _unit}),
        GraphSpec("hift_f0", "vocoder", (_f("mel", 1, mel_bins, "frames"),),
                  (_f("f0", 1, "frames"),),
                  example_sizes={"frames": t_hift}, torch_module=_hift_f0,
                  doc="f0 predictor (Hz at the mel frame rate)"),
        V1GraphSpec("hift_source", "vocoder",
                    (_f("f0", 1, "frames"), _f("phase", 1, nh), _f("noise", 1, nh, "samples")),
                    (_f("source", 1, 1, "samples"),),
                    example_sizes={"frames": t_hift, "samples": hop * t_hift},
                    torch_module=_hift_source, doc="NSF harmonic source from f0 and the draws",
                    example_values={"f0": _f0_hz, "phase": _nsf_phase}),
        V1GraphSpec("hift_decode", "vocoder",
                    (_f("mel", 1, mel_bins, "frames"), _f("source", 1, 1, "samples")),
                    (_f("wav", 1, "samples"),),
                    example_sizes={"frames": t_hift, "samples": hop * t_hift},
                    torch_module=_hift_decode,
                    doc="HiFT decode to the waveform, clipped to ±0.99",
                    example_values={"source": _nsf_source}),
    ]
    # the v1 graph names are the role names (base.ROLES): each graph plays its namesake
    return GraphTable([replace(g, role=g.name) for g in graphs])


@functools.lru_cache(maxsize=1)
def reference_table() -> GraphTable:
    """The table of the built-in ``tiny`` preset, for what every v1 config shares: graph names
    and order, components, file stems, data input/output names and dtypes. Sizes, and the
    LLM cache tensors (one pair per layer), depend on the config: use :func:`graph_table`."""
    from .presets import tiny

    return graph_table(tiny())


#: graph names in table order (the same for every v1 config)
GRAPH_NAMES = ("text_encoder", "llm", "flow_encoder", "length_regulator", "estimator",
               "hift_f0", "hift_source", "hift_decode")
