"""Which CPU kernels (ISA) the OpenVINO CPU plugin ran for a compiled stage (for the bench).

The plugin's runtime model (``CompiledModel.get_runtime_model()``) names each node's primitive
in its ``primitiveType`` rt_info, e.g. ``brgemm_avx512_amx_bf16``, ``jit_avx512_i8``,
``jit_avx2_f32``, ``gemm_mlas_f32`` (MLAS: its own ISA dispatch), ``ref_any_f32``; nodes of dynamic shape name the primitive of the shapes
run so far (``unknown_dynamic`` before their first call), so read it after inference.
"""

from __future__ import annotations

import collections

#: node types that hold nearly all of a stage's arithmetic
HEAVY_LAYERS = ("Convolution", "FullyConnected", "MatMul", "ScaledDotProductAttention",
                "GroupConvolution", "Deconvolution", "ConvolutionBackpropData",
                "FullyConnectedCompressed")

#: ISA classes by the substring that marks them in a primitive name, most specific first
_ISA_MARKS = (("amx", "AMX"), ("avx512", "AVX-512"), ("avx2", "AVX2"), ("sse41", "SSE4.1"),
              ("sse42", "SSE4.2"), ("mlas", "MLAS"), ("ref", "reference"),
              ("uni", "jit (generic)"))


def isa_of(primitive: str) -> str | None:
    """The ISA class of a primitive name (``brgemm_avx512_amx_bf16`` -> ``AMX``); None for
    names that say nothing (``unknown_*``, ``undef_*``: not run yet, or a no-op)."""
    p = primitive.lower()
    if p.startswith(("unknown", "undef")):
        return None
    for mark, name in _ISA_MARKS:
        if mark in p:
            return name
    return "other"


def kernel_isas(compiled) -> dict[str, int]:
    """``{ISA class: heavy nodes}`` of an ``ov.CompiledModel`` (:data:`HEAVY_LAYERS` only)."""
    counts: collections.Counter = collections.Counter()
    for op in compiled.get_runtime_model().get_ops():
        info = op.get_rt_info()
        layer = info["layerType"].astype(str) if "layerType" in info else op.get_type_name()
        if layer not in HEAVY_LAYERS or "primitiveType" not in info:
            continue
        isa = isa_of(info["primitiveType"].astype(str))
        if isa is not None:
            counts[isa] += 1
    return dict(counts.most_common())
