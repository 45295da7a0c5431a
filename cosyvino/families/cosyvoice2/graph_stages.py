"""CosyVoice2 stages over a generic :class:`cosyvino.backends.graphs.GraphRunner`: each stage
call is one graph of :mod:`.graphs`. What a backend that runs graph tables (the torch runner on
an official dir, ONNX Runtime on a converted one) gets for v2. The speech-LM, estimator, noise
and voice parts are shared with CosyVoice3
(:class:`cosyvino.families.cosyvoice23.graph_stages.SpeechLMGraphStages`). Must not import
torch (an official dir's speakers and noise come from the torch runner's loaded model).
"""

from __future__ import annotations

import numpy as np

from ..cosyvoice23.graph_stages import GraphLLMSession, SpeechLMGraphStages, f32
from .serving_files import NOISE_FILE
from .stages import CosyVoice2Stages


class CosyVoice2GraphStages(SpeechLMGraphStages, CosyVoice2Stages):
    """v2 stage calls as graph calls on ``runner``. Speakers, voices and the CFM noise table
    come from the converted dir (:mod:`.serving_files`) or, for an official dir, from the
    runner's loaded torch model (``runner.model``).

    Raises: ConvertedModelError (a converted dir's files unreadable)."""

    def __init__(self, runner, model_dir: str):
        super().__init__(runner, model_dir)
        self._enc_chunk = np.array([self.config.flow.encoder.static_chunk_size], np.int64)
        rows = self._one("special_embedding", np.array([[0, 1]], np.int64))
        self._special = (f32(rows[:, :1]), f32(rows[:, 1:2]))

    def llm_special_embeddings(self):
        return self._special

    def flow_encode(self, tokens, embedding, *, finalize, streaming):
        body, context, scale = self.lookahead_split(tokens, finalize)
        chunk = self._enc_chunk if streaming else self._full
        mu, spks = self.runner.run("flow_encoder", [body, context, scale, chunk, f32(embedding)])
        return mu, spks

    def vocoder_f0(self, mel):
        return self._one("hift_f0", f32(mel))

    def vocoder_source(self, f0, noise):
        return self._one("hift_source", f32(f0), f32(noise))

    def vocoder_decode(self, mel, source):
        return self._one("hift_decode", f32(mel), f32(source))


__all__ = ["NOISE_FILE", "CosyVoice2GraphStages", "GraphLLMSession"]
