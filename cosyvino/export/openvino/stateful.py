"""Turn the LLM step's explicit KV-cache inputs/outputs into OpenVINO state (imports openvino).

Steps (the order matters): a ``beam_idx`` parameter and a ``Gather(past, beam_idx, axis 0)``
in front of every cache input (reorder hook; the CPU plugin's stateful-SDPA fusion expects it),
``MakeStateful`` over the (past, present) name pairs, then every ``ReadValue`` gets a
zero-sized zero initializer ``[1, H, 0, d_k]``, so a fresh or reset request starts with an
empty cache.
"""

from __future__ import annotations

import numpy as np
import openvino as ov
from openvino import opset13


def make_llm_stateful(model: ov.Model, past_names: list[str], present_names: list[str],
                      cache_shape: tuple[int, int, int, int]) -> ov.Model:
    """In-place: cache inputs/outputs become states; adds the ``beam_idx`` i32 [1] input.

    ``cache_shape`` is ``(batch, heads, 0, d_k)`` — the empty cache the states start from.
    """
    if "beam_idx" in sum((list(p.get_names()) for p in model.inputs), []):
        raise ValueError("model already has a beam_idx input")
    beam_idx = opset13.parameter(ov.PartialShape([cache_shape[0]]), ov.Type.i32, name="beam_idx")
    beam_idx.output(0).get_tensor().set_names({"beam_idx"})
    model.add_parameters([beam_idx])
    for name in past_names:
        port = model.input(name)
        consumers = port.get_target_inputs()
        gather = opset13.gather(port, beam_idx, opset13.constant(np.int64(0)))
        for c in consumers:
            c.replace_source_output(gather.output(0))
    model.validate_nodes_and_infer_types()

    from openvino._offline_transformations import apply_make_stateful_transformation

    apply_make_stateful_transformation(model, dict(zip(past_names, present_names)))
    shape = opset13.constant(np.array(cache_shape, dtype=np.int64))
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            zero = opset13.constant(np.zeros((), dtype=np.float32))
            init = opset13.broadcast(zero, shape)
            op.set_arguments([init])
    model.validate_nodes_and_infer_types()
    return model
