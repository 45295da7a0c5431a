"""CosyVoice2 stages over a generic :class:`cosyvino.backends.graphs.GraphRunner`: each stage
call is one graph of :mod:`.graphs`. What a backend that runs graph tables (the torch runner on
an official dir, ONNX Runtime on a converted one) gets for v2. Must not import torch (an
official dir's speakers and noise come from the torch runner's loaded model).
"""

from __future__ import annotations

import numpy as np

from cosyvino.converted import is_converted_dir

from ..cosyvoice1.stages import LLMSession
from .graphs import FULL_ATTENTION
from .serving_files import NOISE_FILE, read_noise
from .stages import CosyVoice2Stages
from .voices import read_voice_files


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


class CosyVoice2GraphStages(CosyVoice2Stages):
    """v2 stage calls as graph calls on ``runner``. Speakers, voices and the CFM noise table
    come from the converted dir (:mod:`.serving_files`) or, for an official dir, from the
    runner's loaded torch model (``runner.model``).

    Raises: ConvertedModelError (a converted dir's files unreadable)."""

    def __init__(self, runner, model_dir: str):
        self.runner = runner
        self.config = runner.config
        self.thread_safe = bool(getattr(runner, "thread_safe", False))
        model = getattr(runner, "model", None)
        if model is not None and not is_converted_dir(model_dir):
            self.speakers, self.prompt_voices = dict(model.speakers), dict(model.voices)
            self._noise = model.cfm_noise()
        else:
            self.speakers, self.prompt_voices = read_voice_files(model_dir)
            self._noise = read_noise(model_dir)
        cfg = self.config.flow
        self._chunks = {False: np.array([FULL_ATTENTION], np.int64)}
        self._enc_chunk = np.array([cfg.encoder.static_chunk_size], np.int64)
        self._est_chunk = np.array([cfg.estimator.static_chunk_size], np.int64)
        self._look = cfg.pre_lookahead_len
        ids = np.array([[0, 1]], np.int64)
        rows = self._one("special_embedding", ids)
        self._special = (_f32(rows[:, :1]), _f32(rows[:, 1:2]))

    def _one(self, graph: str, *inputs) -> np.ndarray:
        return self.runner.run(graph, list(inputs))[0]

    def embed_text(self, ids):
        return self._one("text_embedding", _i64(ids))

    def embed_speech(self, tokens):
        return self._one("speech_embedding", _i64(tokens))

    def llm_special_embeddings(self):
        return self._special

    def new_llm_session(self):
        return GraphLLMSession(self.runner.new_session("llm"))

    def flow_encode(self, tokens, embedding, *, finalize, streaming):
        tokens = _i64(tokens).reshape(1, -1)
        if finalize:
            body, context = tokens, np.zeros((1, self._look), np.int64)
        else:
            body, context = tokens[:, :-self._look], tokens[:, -self._look:]
        scale = np.array([0.0 if finalize else 1.0], np.float32)
        chunk = self._enc_chunk if streaming else self._chunks[False]
        mu, spks = self.runner.run("flow_encoder", [np.ascontiguousarray(body), context, scale,
                                                    chunk, _f32(embedding)])
        return mu, spks

    def estimate(self, x, mask, mu, t, spks, cond, *, streaming):
        chunk = self._est_chunk if streaming else self._chunks[False]
        return self._one("estimator", _f32(x), _f32(mask), _f32(mu), _f32(t), _f32(spks),
                         _f32(cond), chunk)

    def cfm_noise(self):
        return self._noise

    def vocoder_f0(self, mel):
        return self._one("hift_f0", _f32(mel))

    def vocoder_source(self, f0, noise):
        return self._one("hift_source", _f32(f0), _f32(noise))

    def vocoder_decode(self, mel, source):
        return self._one("hift_decode", _f32(mel), _f32(source))

    def close(self):
        self.runner.close()


__all__ = ["NOISE_FILE", "CosyVoice2GraphStages", "GraphLLMSession"]
