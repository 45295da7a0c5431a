"""Turn a graph's explicit state inputs/outputs (the LLM step's KV cache) into OpenVINO state
(imports openvino).

The states are the graph table's :class:`cosyvino.families.StateSpec` entries (v1 LLM:
``past_key_values.{i}.key|value`` -> ``present.{i}.key|value``). Steps (the order matters): a
``beam_idx`` parameter and a ``Gather(past, beam_idx, axis 0)`` in front of every state input
(reorder hook; the CPU plugin's stateful-SDPA fusion expects it), ``MakeStateful`` over the
(input, output) name pairs, then every ``ReadValue`` gets a zero initializer of its state's
``init_shape`` (zero-sized along the growing axis), so a fresh or reset request starts empty
(batch ``init_shape[0]``, 1: a session's prefill).

Batched decode (several requests' rows in one request's state): the state's batch is dynamic; a
batch request's state is written with ``set_state`` when rows join, and ``beam_idx`` selects and
orders the state rows the next step continues from (a row gather the CPU plugin applies inside
its KV cache), so rows leave between steps without a copy of the caches.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import openvino as ov
from openvino import opset13

from ...families import StateSpec

#: the reorder input the stateful transformation adds (OpenVINO's convention for stateful
#: LLMs; not a graph-table tensor: the runtime feeds it, the table's callers never see it)
BEAM_IDX = "beam_idx"


def make_llm_stateful(model: ov.Model, states: Sequence[StateSpec]) -> ov.Model:
    """In-place: the ``states``' inputs/outputs become OpenVINO states; adds the
    :data:`BEAM_IDX` i32 ``[batch]`` input (dynamic: the rows a step continues from).

    Raises ValueError: no states, states of different initial batch or growing along axis 0,
    the model already has a :data:`BEAM_IDX` input, or a ``ReadValue`` that matches no state
    (a bug).
    """
    if not states:
        raise ValueError("no states to make stateful")
    batches = {s.init_shape[0] for s in states}
    if len(batches) != 1:
        raise ValueError(f"states of different batch sizes {sorted(batches)}")
    if BEAM_IDX in sum((list(p.get_names()) for p in model.inputs), []):
        raise ValueError(f"model already has a {BEAM_IDX} input")
    if any(s.axis == 0 for s in states):
        raise ValueError("state batch axis 0 cannot be the growing axis")
    beam_idx = opset13.parameter(ov.PartialShape([-1]), ov.Type.i32, name=BEAM_IDX)
    beam_idx.output(0).get_tensor().set_names({BEAM_IDX})
    model.add_parameters([beam_idx])
    for state in states:
        port = model.input(state.input)
        consumers = port.get_target_inputs()
        gather = opset13.gather(port, beam_idx, opset13.constant(np.int64(0)))
        for c in consumers:
            c.replace_source_output(gather.output(0))
    model.validate_nodes_and_infer_types()

    from openvino._offline_transformations import apply_make_stateful_transformation

    apply_make_stateful_transformation(model, {s.input: s.output for s in states})
    # the ReadValue that replaced a state's input keeps that input's tensor name
    by_input = {s.input: s for s in states}
    for op in model.get_ops():
        if op.get_type_name() != "ReadValue":
            continue
        matched = [by_input[n] for n in op.output(0).get_names() if n in by_input]
        if len(matched) != 1:
            raise ValueError(f"ReadValue {op.get_friendly_name()} matches no single state "
                             f"(tensor names {sorted(op.output(0).get_names())})")
        state = matched[0]
        zero = opset13.constant(np.zeros((), dtype=state.dtype))
        init = opset13.broadcast(zero, opset13.constant(np.array(state.init_shape, np.int64)))
        op.set_arguments([init])
    model.validate_nodes_and_infer_types()
    return model
