"""CosyVoice v1 stages over a generic :class:`cosyvino.backends.graphs.GraphRunner`: each stage
call is one graph of :mod:`.graphs`; the speaker affine and speech-token embedding are numpy
tables of the converted dir (:class:`cosyvino.backends.tables.ServingTablesMixin`). What a
backend gets for v1 when it runs graph tables instead of implementing the stages itself. Must
not import torch.
"""

from __future__ import annotations

import numpy as np

from cosyvino.backends.tables import ServingTablesMixin

from .stages import CosyVoice1Stages, LLMSession


def _f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def _i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


class GraphLLMSession(LLMSession):
    """The ``llm`` graph's KV cache in a runner session."""

    def __init__(self, session):
        self._session = session

    def forward(self, inputs_embeds):
        return self._session.run([_f32(inputs_embeds)])[0][0]

    def reset(self):
        self._session.reset()

    def close(self):
        self._session.close()

    def cache_length(self) -> int:
        """Positions in the KV cache."""
        return self._session.state_length()


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
        return GraphLLMSession(self.runner.new_session("llm"))

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
