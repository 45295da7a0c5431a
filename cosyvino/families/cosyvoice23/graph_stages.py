"""The stage calls CosyVoice2 and CosyVoice3 share over a generic
:class:`cosyvino.backends.graphs.GraphRunner`: the speech LM (``text_embedding``,
``speech_embedding``, the stateful ``llm``), the estimator with its attention chunk as an input,
the fixed CFM noise, and the speakers / voices of the model dir (an official dir's come from the
torch runner's loaded model, a converted dir's from :mod:`.serving_files`). The families'
stage classes (:mod:`cosyvino.families.cosyvoice2.graph_stages`,
:mod:`cosyvino.families.cosyvoice3.graph_stages`) add the flow encoder and the vocoder.
Must not import torch.
"""

from __future__ import annotations

import numpy as np

from cosyvino.converted import is_converted_dir
from cosyvino.errors import BackendError

from ..cosyvoice1.stages import LLMSession
from .graph_specs import FULL_ATTENTION
from .serving_files import read_noise
from .voices import read_voice_files


def f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def i64(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int64)


class GraphLLMSession(LLMSession):
    """The ``llm`` graph's KV cache in a runner session."""

    def __init__(self, session):
        self._session = session

    def forward(self, inputs_embeds):
        return self._session.run([f32(inputs_embeds)])[0][0]

    def reset(self):
        self._session.reset()

    def close(self):
        self._session.close()

    def cache_length(self) -> int:
        """Positions in the KV cache."""
        return self._session.state_length()


class SpeechLMGraphStages:
    """Mixin of the shared stage calls as graph calls on ``runner`` (put it before the family's
    abstract stages class). Sets ``runner``, ``config``, ``thread_safe``, ``speakers``,
    ``prompt_voices`` and ``official`` (True: an official dir on the torch runner, whose
    ``runner.model`` serves the tables).

    Raises: ConvertedModelError (a converted dir's files unreadable)."""

    def __init__(self, runner, model_dir: str):
        self.runner = runner
        self.config = runner.config
        self.thread_safe = bool(getattr(runner, "thread_safe", False))
        model = getattr(runner, "model", None)
        self.official = model is not None and not is_converted_dir(model_dir)
        if self.official:
            self.speakers, self.prompt_voices = dict(model.speakers), dict(model.voices)
            self._noise = model.cfm_noise()
        else:
            self.speakers, self.prompt_voices = read_voice_files(model_dir)
            self._noise = read_noise(model_dir)
        cfg = self.config.flow
        self._full = np.array([FULL_ATTENTION], np.int64)
        self._est_chunk = np.array([cfg.estimator.static_chunk_size], np.int64)
        self._look = cfg.pre_lookahead_len

    def _one(self, graph: str, *inputs) -> np.ndarray:
        return self.runner.run(graph, list(inputs))[0]

    def embed_text(self, ids):
        return self._one("text_embedding", i64(ids))

    def embed_speech(self, tokens):
        return self._one("speech_embedding", i64(tokens))

    def new_llm_session(self):
        return GraphLLMSession(self.runner.new_session("llm"))

    def lookahead_split(self, tokens, finalize: bool):
        """``tokens`` int [1, N] -> (body int64 [1, L], context int64 [1, 3], context_scale
        float32 [1]) for a flow encoder graph: a final call has no look-ahead (zero context,
        scale 0), a non-final one uses its last ``pre_lookahead_len`` tokens as context only
        (sheet v2 §5.2-5.3, v3 §5.2)."""
        tokens = i64(tokens).reshape(1, -1)
        if finalize:
            body, context = tokens, np.zeros((1, self._look), np.int64)
        else:
            body, context = tokens[:, :-self._look], tokens[:, -self._look:]
        scale = np.array([0.0 if finalize else 1.0], np.float32)
        return np.ascontiguousarray(body), np.ascontiguousarray(context), scale

    def estimate(self, x, mask, mu, t, spks, cond, *, streaming):
        chunk = self._est_chunk if streaming else self._full
        return self._one("estimator", f32(x), f32(mask), f32(mu), f32(t), f32(spks), f32(cond),
                         chunk)

    def cfm_noise(self):
        return self._noise

    # ---- incremental streaming (issue 36): torch on an official dir only ---------------------
    def _torch_part(self, method: str, part: str) -> str | None:
        if not self.official:
            return (f"the converted graphs have no chunk-state inputs for the {part} yet "
                    "(issue 36 item 3); this backend re-runs it (official streaming)")
        if not callable(getattr(self.runner.model, method, None)):
            return f"this family's {part} has no incremental form yet"
        return None

    def flow_stream_unavailable(self) -> str | None:
        """Why :meth:`new_flow_stream` cannot run here (None: it can)."""
        return self._torch_part("flow_stream", "flow")

    def new_flow_stream(self, embedding, prompt_token, prompt_feat, n_timesteps):
        """A segment's incremental flow (``hop(tokens, finalize, final, before_step) -> mel``;
        :class:`cosyvino.families.cosyvoice2.torch.incremental_flow.FlowStream`) on the torch
        model: ``embedding`` float32 [1, 192], ``prompt_token`` int [N1] / ``prompt_feat``
        float32 [2 N1, 80] (empty: no prompt), ``n_timesteps`` Euler steps (None: the
        config's). Raises BackendError when :meth:`flow_stream_unavailable` says why."""
        why = self.flow_stream_unavailable()
        if why is not None:
            raise BackendError(why)
        return self.runner.model.flow_stream(self._noise, embedding, prompt_token=prompt_token,
                                             prompt_feat=prompt_feat, n_timesteps=n_timesteps)

    def vocoder_stream_unavailable(self) -> str | None:
        """Why :meth:`new_vocoder_stream` cannot run here (None: it can)."""
        return self._torch_part("vocoder_stream", "vocoder")

    def new_vocoder_stream(self):
        """A segment's incremental vocoder (``hop(new_mel, finalize) -> samples``, the
        official re-run's samples; :class:`cosyvino.families.cosyvoice3.torch.incremental_hift.
        IncrementalCausalHiFT`). Raises BackendError when :meth:`vocoder_stream_unavailable`
        says why."""
        why = self.vocoder_stream_unavailable()
        if why is not None:
            raise BackendError(why)
        return self.runner.model.vocoder_stream()

    def close(self):
        self.runner.close()


__all__ = ["GraphLLMSession", "SpeechLMGraphStages"]
