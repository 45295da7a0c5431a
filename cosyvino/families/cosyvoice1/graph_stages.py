"""CosyVoice v1 stages over a generic :class:`cosyvino.backends.graphs.GraphRunner`: each stage
call is one graph of :mod:`.graphs`; the speaker affine and speech-token embedding are numpy
tables of the converted dir (:class:`cosyvino.families.cosyvoice1.serving_tables.ServingTablesMixin`). What a
backend gets for v1 when it runs graph tables instead of implementing the stages itself. Must
not import torch.
"""

from __future__ import annotations

import numpy as np

from .serving_tables import ServingTablesMixin
from cosyvino.errors import BackendError

from .graphs import llm_pos_key_names
from .stages import CosyVoice1Stages, LLMBatch, LLMSession, left_pad


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


class GraphLLMSession(LLMSession):
    """The ``llm`` graph's KV cache in a runner session (batch 1: ``attention_mask`` all
    ones; ``pos_keys`` from the stages' shared
    :class:`~cosyvino.families.cosyvoice1.positional.PositionalKeys`)."""

    def __init__(self, session, positional_keys):
        self._session = session
        self._pos = positional_keys
        self._length = 0

    def forward(self, inputs_embeds):
        x = _f32(inputs_embeds)
        mask = np.ones((1, self._length + x.shape[1]), np.float32)
        offset, keys = self._pos.rows(self._length, x.shape[1])
        out = self._session.run([x, mask, offset, *keys])[0][0]
        self._length += x.shape[1]
        return out

    def reset(self):
        self._session.reset()
        self._length = 0

    def close(self):
        self._session.close()
        self._length = 0

    def cache_length(self) -> int:
        """Positions in the KV cache."""
        return self._length

    def state_arrays(self) -> dict[str, np.ndarray]:
        """The KV cache, state input name -> float32 [1, H, P, d_k]."""
        return self._session.state_arrays()


class GraphLLMBatch(LLMBatch):
    """Rows of :class:`GraphLLMSession` s decoded by one ``llm`` graph call per step: every
    layer's cache held as one left-padded array [B, H, W, d_k] (``W`` = the longest row) fed as
    the graph's state inputs, with the batch's key mask. A join or a leave rebuilds the arrays
    (one copy of every cache); a step feeds them as they are, but a runtime with explicit state
    (ONNX Runtime, the torch runner) writes the grown cache as new arrays, so each step copies
    every cache once there, as an unbatched session does."""

    def __init__(self, runner, positional_keys):
        super().__init__()
        self._runner = runner
        self._pos = positional_keys
        self._spec = runner.table["llm"]
        self._in = {t.name: i for i, t in enumerate(self._spec.inputs)}
        self._pos_in = [self._in[n] for n in llm_pos_key_names(len(self._spec.state) // 2)]
        out = {t.name: i for i, t in enumerate(self._spec.outputs)}
        self._present = {s.input: out[s.output] for s in self._spec.state}
        self._state: dict[str, np.ndarray] = {}
        self._width = 0

    def _rebuild(self, extra: dict[str, np.ndarray] | None, keep: list[int]) -> None:
        lengths = [self._lengths[i] for i in keep]
        if extra is not None:
            first = self._spec.state[0]
            lengths.append(int(extra[first.input].shape[first.axis]))
        width = max(lengths, default=0)
        state = {}
        for s in self._spec.state:
            parts = [left_pad(self._state[s.input][keep], width, s.axis)] if keep else []
            if extra is not None:
                parts.append(left_pad(np.asarray(extra[s.input], np.float32), width, s.axis))
            state[s.input] = np.ascontiguousarray(np.concatenate(parts)) if parts else None
        self._state = state if any(v is not None for v in state.values()) else {}
        self._width = width

    def _join(self, session):
        if not isinstance(session, GraphLLMSession):
            raise BackendError(f"a {type(session).__name__} cannot join a graph LLM batch")
        arrays = session.state_arrays()
        length = session.cache_length()
        if length >= 1:
            self._rebuild(arrays, list(range(len(self))))
            session.reset()
        return length

    def _leave(self, index):
        self._rebuild(None, [i for i in range(len(self)) if i != index])

    def _step(self, inputs_embeds):
        arrays: list = [None] * len(self._spec.inputs)
        arrays[self._in["inputs_embeds"]] = inputs_embeds
        arrays[self._in["attention_mask"]] = self.key_mask(self._width)
        offset, keys = self._pos.rows(self._width, 1)
        arrays[self._in["pos_offset"]] = offset
        for i, table in zip(self._pos_in, keys):
            arrays[i] = table
        for name, a in self._state.items():
            arrays[self._in[name]] = a
        outs = self._runner.run("llm", arrays)
        self._state = {name: outs[i] for name, i in self._present.items()}
        self._width += 1
        return outs[0]


class GraphStages(ServingTablesMixin, CosyVoice1Stages):
    """v1 stage calls as graph calls on ``runner``; tables and speakers read from
    ``model_dir`` (a converted dir, :mod:`cosyvino.converted` layout).

    Raises: ConvertedModelError when the tables or speakers cannot be read."""

    def __init__(self, runner, model_dir: str, runtime: str | None = None):
        self.runner = runner
        self.config = runner.config
        self.thread_safe = bool(getattr(runner, "thread_safe", False))
        self._load_serving_tables(model_dir, runtime or getattr(runner, "runtime", None))

    def _one(self, graph: str, *inputs) -> np.ndarray:
        return self.runner.run(graph, list(inputs))[0]

    def encode_text(self, text_token):
        return self._one("text_encoder", _i64(text_token))

    def new_llm_session(self):
        return GraphLLMSession(self.runner.new_session("llm"), self.positional_keys)

    #: one ``llm`` graph call advances every row (:class:`GraphLLMBatch`)
    max_llm_batch = 64

    def new_llm_batch(self) -> GraphLLMBatch:
        return GraphLLMBatch(self.runner, self.positional_keys)

    def flow_encode(self, tokens, embedding):
        h, spks = self.runner.run("flow_encoder", [_i64(tokens), _f32(embedding)])
        return h, spks

    def length_regulate(self, h, interp):
        return self._one("length_regulator", _f32(h), _f32(interp))

    def estimate(self, x, mask, mu, t, spks, cond):
        return self._one("estimator", _f32(x), _f32(mask), _f32(mu), _f32(t), _f32(spks),
                         _f32(cond))

    def vocoder_f0(self, mel):
        return self._one("hift_f0", _f32(mel))

    def vocoder_source(self, f0, phase, noise):
        return self._one("hift_source", _f32(f0), _f32(phase), _f32(noise))

    def vocoder_decode(self, mel, source):
        return self._one("hift_decode", _f32(mel), _f32(source))

    def close(self):
        self.runner.close()
