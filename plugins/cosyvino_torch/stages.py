"""PyTorch eager implementation of :class:`cosyvino.backends.Stages` (fp32, CPU).

Runs our modules from :mod:`cosyvino.families.cosyvoice1.torch` on numpy inputs (zero-copy
``torch.from_numpy``) under ``torch.inference_mode``. Threads: ``num_threads`` sets
``torch.set_num_threads`` (process-wide in PyTorch).
"""

from __future__ import annotations

import numpy as np
import torch

from cosyvino.backends.base import LLMSession, Stages
from cosyvino.families.cosyvoice1.torch.length_regulator import LengthRegulatorStage
from cosyvino.families.cosyvoice1.torch.llm import (
    LLMStepStage,
    SpeakerEmbedStage,
    SpeechEmbedStage,
    TextEncoderStage,
)
from cosyvino.families.cosyvoice1.torch.flow_encoder import FlowEncoderStage
from cosyvino.families.cosyvoice1.torch.loading import load_torch_model


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().contiguous().numpy()


class TorchLLMSession(LLMSession):
    """KV cache held as stacked tensors [layers, 1, heads, P, d_k]."""

    def __init__(self, stages: "TorchStages"):
        self._stages = stages
        self.reset()

    def reset(self) -> None:
        cfg = self._stages.config.llm.llm
        d_k = cfg.output_size // cfg.attention_heads
        empty = torch.zeros(cfg.num_blocks, 1, cfg.attention_heads, 0, d_k)
        self._k, self._v = empty, empty.clone()

    def forward(self, inputs_embeds: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            # Prefill (T > 1) and single-token decode use different (numerically equal)
            # formulations of the rel-pos term: each is much faster for its own shape.
            step = self._stages._llm_decode if inputs_embeds.shape[1] == 1 else \
                self._stages._llm_prefill
            logp, self._k, self._v = step(_t(inputs_embeds), self._k, self._v)
        return _np(logp)[0]


class TorchStages(Stages):
    # Modules are only read in forward (no caches mutated); the KV cache lives in each
    # TorchLLMSession, so concurrent calls from several threads are safe.
    thread_safe = True

    def __init__(self, model_dir: str):
        model = load_torch_model(model_dir)
        self.model = model
        self.config = model.config
        self.speakers = model.speakers
        self._text_encoder = TextEncoderStage(model.llm)
        self._spk = SpeakerEmbedStage(model.llm)
        self._speech = SpeechEmbedStage(model.llm)
        self._llm_prefill = LLMStepStage(model.llm, query_side_pos=False)
        self._llm_decode = LLMStepStage(model.llm, query_side_pos=True)
        self._flow_encoder = FlowEncoderStage(model.flow)
        self._length_regulator = LengthRegulatorStage(model.flow.length_regulator)
        self._estimator = model.flow.decoder.estimator
        self._f0 = model.hift.f0_stage()
        self._source = model.hift.source_stage()
        self._decode = model.hift.decode_stage()
        with torch.inference_mode():
            w = model.llm.llm_embedding.weight
            self._sos = _np(w[0].reshape(1, 1, -1)).copy()
            self._task = _np(w[1].reshape(1, 1, -1)).copy()

    def encode_text(self, text_token):
        with torch.inference_mode():
            return _np(self._text_encoder(_t(text_token.astype(np.int64))))

    def embed_llm_speaker(self, embedding):
        with torch.inference_mode():
            return _np(self._spk(_t(embedding.astype(np.float32))))

    def embed_speech_tokens(self, tokens):
        with torch.inference_mode():
            return _np(self._speech(_t(tokens.astype(np.int64))))

    def llm_special_embeddings(self):
        return self._sos, self._task

    def new_llm_session(self):
        return TorchLLMSession(self)

    def flow_encode(self, tokens, embedding):
        with torch.inference_mode():
            h, spks = self._flow_encoder(_t(tokens.astype(np.int64)),
                                         _t(embedding.astype(np.float32)))
        return _np(h), _np(spks)

    def length_regulate(self, h, interp):
        with torch.inference_mode():
            return _np(self._length_regulator(_t(h), _t(interp)))

    def estimate(self, x, mask, mu, t, spks, cond):
        with torch.inference_mode():
            return _np(self._estimator(_t(x), _t(mask), _t(mu), _t(t), _t(spks), _t(cond)))

    def vocoder_f0(self, mel):
        with torch.inference_mode():
            return _np(self._f0(_t(mel)))

    def vocoder_source(self, f0, phase, noise):
        with torch.inference_mode():
            return _np(self._source(_t(f0), _t(phase), _t(noise)))

    def vocoder_decode(self, mel, source):
        with torch.inference_mode():
            return _np(self._decode(_t(mel), _t(source)))
