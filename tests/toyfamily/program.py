"""The toy family's text frontend and per-request program. Must not import torch.

Frontend: one segment per sentence (split after ``.``, ``!``, ``?``), text ids
``ord(char) % text_vocab``. Program, per segment: PREFILL (speaker row + text rows through the
LM), DECODE (one speech token per step, sampled at the config's temperature with
``draws.sampling(segment, index)``; EOS is banned below the minimum length and decoding stops at
the maximum), FLOW (tokens -> frames, noise ``draws.flow_noise(segment, ...)``), VOCODER (frames
-> samples; emits the segment's chunk). The draws are indexed by segment and position, so a seed
gives the same audio whole, streamed or scheduled.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass

import numpy as np

from cosyvino.audio import Audio
from cosyvino.engine.program import Phase, Program
from cosyvino.errors import EmptyTextError, InputError
from cosyvino.timing import StageTimes, audio_stats

from . import ToyConfig


@dataclass(frozen=True)
class ToySegment:
    """One sentence and its text ids."""

    text: str
    token_ids: tuple[int, ...]


class ToyFrontend:
    """Sentence splitting and character ids for ``config``."""

    def __init__(self, config: ToyConfig):
        self.config = config

    def segments(self, text: str) -> list[ToySegment]:
        """Sentences of ``text``. Raises EmptyTextError when there is no letter or digit."""
        parts = [p.strip() for p in re.split(r"(?<=[.!?])\s*", text)]
        segs = [ToySegment(p, tuple(ord(ch) % self.config.text_vocab for ch in p))
                for p in parts if any(ch.isalnum() for ch in p)]
        if not segs:
            raise EmptyTextError(f"nothing to speak in {text!r}")
        return segs


class ToyProgram(Program):
    """One validated request on loaded :class:`~.stages.ToyStages`.

    Raises (at construction): EmptyTextError (nothing speakable), InputError (speech_tokens
    given: the toy has no token-to-audio mode; a voice embedding of another width than D).
    """

    def __init__(self, stages, request, draws, frontend: ToyFrontend):
        self.stages = stages
        self.config: ToyConfig = stages.config
        self.request = request
        self.draws = draws
        if request.speech_tokens is not None:
            raise InputError("toyvoice cannot vocode given speech tokens")
        self.speaker = np.ascontiguousarray(request.voice.embedding, np.float32)
        if self.speaker.shape != (1, self.config.dim):
            raise InputError(f"toyvoice voices have embeddings [1, {self.config.dim}], "
                             f"{request.voice.name!r} has {list(self.speaker.shape)}")
        self.segments = frontend.segments(request.text)
        self.total_segments = len(self.segments)
        self.index = 0
        self._session = None
        self._begin_segment()

    def _begin_segment(self) -> None:
        self.phase = Phase.PREFILL
        self.times = StageTimes()
        self.started = time.perf_counter()
        self.tokens: list[int] = []
        self.frames = None

    def step(self, lane=None) -> list[Audio]:
        if self.phase is Phase.PREFILL:
            self._prefill()
        elif self.phase is Phase.DECODE:
            self._decode()
        elif self.phase is Phase.FLOW:
            self._flow()
        elif self.phase is Phase.VOCODER:
            return [self._vocoder()]
        return []

    def _prefill(self) -> None:
        cfg, seg = self.config, self.segments[self.index]
        n = len(seg.token_ids)
        if self.request.num_speech_tokens is not None:
            self.min_len = self.max_len = self.request.num_speech_tokens
        else:
            self.min_len = max(1, int(n * cfg.min_tokens_per_char))
            self.max_len = max(self.min_len, int(n * cfg.max_tokens_per_char))
        with self.times.measure("lm_prefill"):
            text = self.stages.embed(np.asarray(seg.token_ids, np.int64)[None])
            rows = np.concatenate([self.speaker[:, None, :], text], axis=1)
            self._session = self.stages.new_lm_session()
            self.logp = self._session.run([rows])[0][0]
        self.phase = Phase.DECODE

    def _decode(self) -> None:
        cfg = self.config
        with self.times.measure("lm_sampling"):
            logits = self.logp.astype(np.float64) / cfg.temperature
            if len(self.tokens) < self.min_len:
                logits[cfg.eos] = -np.inf
            p = np.exp(logits - logits.max())
            cdf = np.cumsum(p / p.sum())
            u = self.draws.sampling(self.index, len(self.tokens)).random()
            # clamped to the last token with mass: rounding can leave cdf[-1] just below u
            token = int(min(np.searchsorted(cdf, u, side="right"), np.flatnonzero(p)[-1]))
        if token == cfg.eos:
            self._end_decoding()
            return
        self.tokens.append(token)
        if len(self.tokens) >= self.max_len:
            self._end_decoding()
            return
        with self.times.measure("lm_decode"):
            row = self.stages.embed(np.array([[cfg.text_vocab + token]], np.int64))
            self.logp = self._session.run([row])[0][0]

    def _end_decoding(self) -> None:
        self._close_session()
        self.phase = Phase.FLOW

    def _flow(self) -> None:
        cfg = self.config
        tokens = np.asarray(self.tokens, np.int64)[None]
        frames = tokens.shape[1] * cfg.frames_per_token
        noise = cfg.noise_scale * self.draws.flow_noise(self.index, cfg.mels, frames)
        with self.times.measure("acoustic"):
            self.frames = self.stages.acoustic(tokens, self.speaker, noise)
        self.phase = Phase.VOCODER

    def _vocoder(self) -> Audio:
        with self.times.measure("vocoder"):
            samples = self.stages.vocode(self.frames)[0]
        tokens = np.asarray(self.tokens, np.int64)
        audio = Audio(samples.astype(np.float32), self.config.sample_rate, tokens)
        wall = time.perf_counter() - self.started
        audio.stats = {**audio_stats(self.times, audio.duration, wall, int(tokens.size)),
                       "text": self.segments[self.index].text, "segment": self.index,
                       "seed": self.request.seed}
        self.index += 1
        if self.index < self.total_segments:
            self._begin_segment()
        else:
            self.phase = Phase.DONE
        return audio

    def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()

    def close(self) -> None:
        self._close_session()
