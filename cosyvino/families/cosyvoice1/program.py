"""One CosyVoice v1 request as a state machine the engine steps. Must not import torch.

Per text segment: PREFILL (the mode's LLM prefix through the LLM), DECODE (one RAS-sampled
speech token per step, upstream ``TransformerLM.inference`` bounds), FLOW (the segment's tokens
-> mel, CFM Euler with CFG), VOCODER (f0, NSF source, windowed HiFT decode; emits the segment's
chunk). Every random number comes from :class:`cosyvino.engine.draws.RandomDraws` by segment and
position, so the audio of a seed does not depend on how the steps are scheduled.
"""

from __future__ import annotations

import time

import numpy as np

from cosyvino.audio import Audio
from cosyvino.engine.program import Phase, Program
from cosyvino.errors import InputError
from cosyvino.timing import StageTimes, audio_stats

from . import modes as v1_modes
from .length_regulation import mel_frames_for_tokens
from .pipeline import Pipeline, linear_resize_time
from .streaming import policy


class CosyVoice1Program(Program):
    """A validated request (:class:`cosyvino.request.SynthesisRequest`) on loaded
    :class:`~.stages.CosyVoice1Stages`.

    Raises (at construction): EmptyTextError when the text has nothing speakable (unless the
    request vocodes given ``speech_tokens``).
    """

    def __init__(self, stages, request, draws, frontend, pipeline: Pipeline | None = None):
        self.stages = stages
        self.request = request
        self.draws = draws
        self.pipeline = pipeline or Pipeline(stages)
        self.config = stages.config
        self.hops = policy(request.streaming.hop_schedule)
        if request.speech_tokens is not None:
            self.segments = [None]  # token-to-wav: one segment, no LLM
        else:
            self.segments = frontend.segments(request.text)  # raises EmptyTextError
        self.total_segments = len(self.segments)
        self.prefix = v1_modes.llm_prefix(request, frontend.tokenize)
        self.cond = v1_modes.flow_conditioning(request)
        self.index = 0
        self._session = None
        self._begin_segment()

    # ---- per segment ------------------------------------------------------------------------
    def _begin_segment(self) -> None:
        self.times = StageTimes()
        self.started = time.perf_counter()
        self.tokens: list[int] = []
        self.mel = None
        if self.segments[self.index] is None:
            self.tokens = [int(t) for t in self.request.speech_tokens]
            self.phase = Phase.FLOW
        else:
            self.phase = Phase.PREFILL

    def step(self) -> list[Audio]:
        if self.phase is Phase.PREFILL:
            self._prefill()
        elif self.phase is Phase.DECODE:
            self._decode_step()
        elif self.phase is Phase.FLOW:
            self._flow()
        elif self.phase is Phase.VOCODER:
            return [self._vocoder()]
        return []

    def _prefill(self) -> None:
        seg = self.segments[self.index]
        text = np.asarray(seg.token_ids, dtype=np.int64)[None, :]
        if text.size == 0:
            raise InputError("no text tokens to synthesize")
        self.min_len, self.max_len = self.pipeline.decoding_bounds(
            text.size, self.request.num_speech_tokens)
        lm_input = self.pipeline.build_lm_input(text, self.prefix.embedding,
                                                self.prefix.prompt_text_token,
                                                self.prefix.prompt_speech_token, self.times)
        self._session = self.stages.new_llm_session()
        self._session.reset()
        with self.times.measure("llm_prefill"):
            self.logp = self._session.forward(lm_input)
        self.phase = Phase.DECODE

    def _decode_step(self) -> None:
        with self.times.measure("llm_sampling"):
            token = self.pipeline.sample_token(
                self.logp, self.tokens, self.draws.sampling(self.index, len(self.tokens)),
                self.min_len)
        if token == self.config.llm.eos_token:
            self._end_decoding()
            return
        self.tokens.append(token)
        if len(self.tokens) >= self.max_len:
            self._end_decoding()
            return
        emb = self.stages.embed_speech_tokens(np.array([[token]], dtype=np.int64))
        with self.times.measure("llm_decode"):
            self.logp = self._session.forward(emb)

    def _end_decoding(self) -> None:
        self._close_session()
        if self.hops.hop_due(len(self.tokens), finished=True):
            self.phase = Phase.FLOW

    def _flow(self) -> None:
        cfg = self.config
        tokens = np.asarray(self.tokens, dtype=np.int64)
        if tokens.size == 0:
            raise InputError("no speech tokens to synthesize")
        m1 = 0 if self.cond.prompt_feat is None else int(np.shape(self.cond.prompt_feat)[0])
        m2 = mel_frames_for_tokens(tokens.size, token_rate=cfg.flow.input_frame_rate,
                                   sample_rate=cfg.sample_rate, hop=cfg.hift.hop_length)
        noise = self.draws.flow_noise(self.index, cfg.flow.output_size, m1 + m2)
        mel = self.pipeline.tokens_to_mel(tokens, self.cond.embedding, noise=noise,
                                          prompt_token=self.cond.prompt_token,
                                          prompt_feat=self.cond.prompt_feat, times=self.times)
        if self.request.speed != 1.0:
            mel = linear_resize_time(mel, max(1, int(mel.shape[-1] / self.request.speed)))
        self.mel = mel
        self.phase = Phase.VOCODER

    def _vocoder(self) -> Audio:
        h = self.config.hift
        mel = self.mel
        with self.times.measure("vocoder"):
            f0 = self.stages.vocoder_f0(mel)
            phase, noise = self.draws.nsf(self.index, h.nb_harmonics + 1,
                                          h.hop_length * mel.shape[-1])
            source = self.stages.vocoder_source(f0, phase, noise)
            wav = self.pipeline.mel_to_wav(mel, source=source)  # its own timing discarded
        tokens = np.asarray(self.tokens, dtype=np.int64)
        audio = Audio(wav, self.config.sample_rate, tokens, {})
        audio.stats = audio_stats(self.times, audio.duration,
                                    time.perf_counter() - self.started, int(tokens.size))
        seg = self.segments[self.index]
        if seg is not None:
            audio.stats["text"] = seg.text
        audio.stats["segment"] = self.index
        audio.stats["seed"] = self.request.seed
        self.index += 1
        if self.index < self.total_segments:
            self._begin_segment()
        else:
            self.phase = Phase.DONE
        return audio

    # ---- resources --------------------------------------------------------------------------
    def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()

    def close(self) -> None:
        self._close_session()
