"""PyTorch eager serving (fp32, CPU) of an official-layout model dir, for any model family.

CosyVoice v1 gets :class:`TorchStages`, its stage calls written out on our modules from
:mod:`cosyvino.families.cosyvoice1.torch` (the LLM in two numerically equal formulations, one
per prefill and one per decode step, each much faster for its own shape than the exported
graph's). Any other family gets :class:`TorchGraphRunner`: each graph of the family's table is
its ``torch_module`` on the family's PyTorch model, and the family builds its stages over the
runner (:meth:`cosyvino.families.base.ModelFamily.stages_from_runner`). :func:`load_stages`
dispatches on the detected family. Both run on numpy inputs (zero-copy ``torch.from_numpy``)
under ``torch.inference_mode``. Threads: ``num_threads`` sets ``torch.set_num_threads``
(process-wide in PyTorch).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from cosyvino.backends.base import Stages
from cosyvino.backends.graphs import GraphRunner
from cosyvino.errors import BackendError
from cosyvino.families import detect_family
from cosyvino.families.cosyvoice1.stages import CosyVoice1Stages, LLMBatch, LLMSession
from cosyvino.families.cosyvoice1.torch.length_regulator import LengthRegulatorStage
from cosyvino.families.cosyvoice1.torch.llm import (
    LLMStepStage,
    SpeakerEmbedStage,
    SpeechEmbedStage,
    TextEncoderStage,
)
from cosyvino.families.cosyvoice1.torch.flow_encoder import FlowEncoderStage
from cosyvino.families.cosyvoice1.torch.loading import load_torch_model

from . import MAX_ESTIMATOR_BATCH, MAX_LLM_BATCH


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

    def cache_length(self) -> int:
        """Number of cached positions."""
        return int(self._k.shape[3])


def _left_pad(t: torch.Tensor, width: int) -> torch.Tensor:
    """``t [layers, B, H, P, d_k]`` left-padded with zeros (or cut at the front) to ``width``
    positions."""
    n = t.shape[3]
    if n >= width:
        return t[:, :, :, n - width:]
    return torch.nn.functional.pad(t, (0, 0, width - n, 0))


class TorchLLMBatch(LLMBatch):
    """Rows of :class:`TorchLLMSession` s in one stacked cache [layers, B, H, W, d_k] (left-
    padded to the longest row ``W``), one decode-formulation call per step with the batch's key
    mask. A join or a leave rebuilds the stacks; every step writes the grown cache as new
    tensors (``torch.cat``, as an unbatched session does)."""

    def __init__(self, stages: "TorchStages"):
        super().__init__()
        self._stages = stages
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._width = 0

    def _rebuild(self, keep: list[int], extra: TorchLLMSession | None) -> None:
        lengths = [self._lengths[i] for i in keep]
        if extra is not None:
            lengths.append(extra.cache_length())
        width = max(lengths, default=0)
        ks, vs = [], []
        if keep and self._k is not None:
            idx = torch.tensor(keep)
            ks.append(_left_pad(self._k.index_select(1, idx), width))
            vs.append(_left_pad(self._v.index_select(1, idx), width))
        if extra is not None:
            ks.append(_left_pad(extra._k, width))
            vs.append(_left_pad(extra._v, width))
        self._k = torch.cat(ks, 1).contiguous() if ks else None
        self._v = torch.cat(vs, 1).contiguous() if vs else None
        self._width = width

    def _join(self, session):
        if not isinstance(session, TorchLLMSession) or session._stages is not self._stages:
            raise BackendError("only LLM sessions of the same torch model join this batch")
        length = session.cache_length()
        if length >= 1:
            with torch.inference_mode():
                self._rebuild(list(range(len(self))), session)
            session.reset()
        return length

    def _leave(self, index):
        with torch.inference_mode():
            self._rebuild([i for i in range(len(self)) if i != index], None)

    def _step(self, inputs_embeds):
        mask = _t(self.key_mask(self._width))
        with torch.inference_mode():
            logp, self._k, self._v = self._stages._llm_decode(_t(inputs_embeds), self._k,
                                                              self._v, mask)
        self._width += 1
        return _np(logp)


class TorchStages(CosyVoice1Stages):
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

    #: one decode call advances every row (:class:`TorchLLMBatch`)
    max_llm_batch = MAX_LLM_BATCH

    def new_llm_batch(self):
        return TorchLLMBatch(self)

    def flow_encode(self, tokens, embedding):
        with torch.inference_mode():
            h, spks = self._flow_encoder(_t(tokens.astype(np.int64)),
                                         _t(embedding.astype(np.float32)))
        return _np(h), _np(spks)

    def length_regulate(self, h, interp):
        with torch.inference_mode():
            return _np(self._length_regulator(_t(h), _t(interp)))

    #: eager torch runs any batch (rows are independent in the estimator)
    max_estimator_batch = MAX_ESTIMATOR_BATCH

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


class TorchGraphRunner(GraphRunner):
    """The graphs of a family's table run as their ``torch_module`` s on the family's PyTorch
    model (:meth:`~cosyvino.families.base.ModelFamily.load_torch_model` of ``model_dir``).

    Stateful graphs get the default :class:`cosyvino.backends.graphs.ExplicitStateSession`:
    the state tensors go in and out of the module like the data (the module's ``forward``
    takes every input of the spec, state included, and returns every output).

    Raises (at construction): ModelDirError / ConfigError / CheckpointError from the family's
    config and model loading.
    """

    # modules are only read in forward (eval mode, no caches mutated); each session holds its
    # own state, so concurrent calls from several threads are safe
    thread_safe = True

    def __init__(self, family, model_dir: str):
        self.family = family
        self.config = family.read_config(model_dir)
        self.table = family.graphs(self.config)
        self.model = family.load_torch_model(model_dir)
        self.modules = {}
        for name, spec in self.table.items():
            if spec.torch_module is not None:
                self.modules[name] = spec.torch_module(self.model).eval()

    def run(self, graph: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """``inputs`` in the spec's input order (converted to its dtypes) -> the module's
        outputs as numpy arrays, in the spec's output order.

        Raises: BackendError (unknown graph, a graph without a torch module, wrong input
        count, the module failed or returned another number of outputs)."""
        spec = self.table.get(graph)
        if spec is None:
            raise BackendError(f"torch: no graph {graph!r}; this model has "
                               f"{', '.join(self.table)}")
        module = self.modules.get(graph)
        if module is None:
            raise BackendError(f"torch: graph {graph!r} of family {self.family.name!r} has no "
                               "torch module")
        if len(inputs) != len(spec.inputs):
            raise BackendError(f"graph {graph!r} takes {len(spec.inputs)} inputs, got "
                               f"{len(inputs)}")
        args = [_t(np.asarray(a, t.dtype)) for t, a in zip(spec.inputs, inputs)]
        try:
            with torch.inference_mode():
                out = module(*args)
        except Exception as e:  # shape errors surface as RuntimeError / IndexError
            raise BackendError(f"torch: graph {graph!r} failed: {e}") from e
        outs = list(out) if isinstance(out, (tuple, list)) else [out]
        if len(outs) != len(spec.outputs):
            raise BackendError(f"torch: graph {graph!r} returned {len(outs)} outputs, its "
                               f"spec has {len(spec.outputs)}")
        # outputs in the spec's dtypes: a module computing in another precision still
        # returns what the table promises
        return [np.ascontiguousarray(_np(o), t.dtype) for o, t in zip(outs, spec.outputs)]


def load_stages(model_dir: str) -> Stages:
    """The model in the official-layout dir ``model_dir`` on PyTorch: :class:`TorchStages`
    for CosyVoice v1, else the family's stages over a :class:`TorchGraphRunner`.

    Raises: ModelDirError (missing dir, no family recognizes it) / ConfigError /
    CheckpointError."""
    family = detect_family(model_dir)
    if family.name == "cosyvoice1":
        return TorchStages(model_dir)
    return family.stages_from_runner(TorchGraphRunner(family, model_dir), model_dir)
