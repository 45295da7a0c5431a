"""One CosyVoice v1 request as a state machine the engine steps. Must not import torch.

Two lanes, which the scheduler may step at the same time (one step per lane at a time):

* ``llm``: per text segment, PREFILL (the mode's LLM prefix through the LLM), then DECODE (one
  RAS-sampled speech token per step, upstream ``TransformerLM.inference`` bounds). After each
  token the segment's hop policy (:mod:`.streaming`) says which flow/vocoder hops are due; they
  are queued for the other lane. When a segment's decoding ends, the lane goes on with the next
  segment at once.
* ``audio``: per queued hop, FLOW (the hop's tokens -> mel, CFM Euler with CFG) then VOCODER
  (f0, NSF source, HiFT decode), which emits the hop's chunk. The ``segment`` schedule runs the
  whole-segment computation (windowed vocoder); the token-hop schedules run the official
  streaming algorithm (:class:`.official_stream.OfficialTokenHopStream`: flow cache, mel
  cross-fade, HiFT cache).

Every random number comes from :class:`cosyvino.engine.draws.RandomDraws` by segment and
position (token index, mel frame, output sample), so the audio of a seed does not depend on how
the steps of the two lanes (or of other requests) are interleaved.
"""

from __future__ import annotations

import collections
import threading
import time

import numpy as np

from cosyvino.audio import Audio
from cosyvino.engine.program import Phase, Program
from cosyvino.errors import InputError
from cosyvino.timing import StageTimes, audio_stats

from . import modes as v1_modes
from .length_regulation import mel_frames_for_tokens
from .official_stream import OfficialTokenHopStream
from .pipeline import Pipeline, linear_resize_time
from .streaming import Hop, policy

LLM, AUDIO = "llm", "audio"


class CosyVoice1Program(Program):
    """A validated request (:class:`cosyvino.request.SynthesisRequest`) on loaded
    :class:`~.stages.CosyVoice1Stages`.

    Chunks are :class:`Audio` with ``stats`` keys ``segment`` / ``chunk`` (0-based),
    ``is_last_in_segment``, ``speech_tokens`` (this chunk's new tokens), ``mode`` (the mode
    that ran), ``hop_schedule``, ``seed``, stage times and RTF.

    Raises (at construction): EmptyTextError when the text has nothing speakable (unless the
    request vocodes given ``speech_tokens``).
    """

    lanes = (LLM, AUDIO)

    def __init__(self, stages, request, draws, frontend, pipeline: Pipeline | None = None):
        self.stages = stages
        self.request = request
        self.draws = draws
        self.pipeline = pipeline or Pipeline(stages)
        self.config = stages.config
        self.schedule = request.streaming.hop_schedule
        if request.speech_tokens is not None:
            self.segments = [None]  # token-to-wav: one segment, no LLM
        else:
            self.segments = frontend.segments(request.text)  # raises EmptyTextError
        self.total_segments = len(self.segments)
        self.prefix = v1_modes.llm_prefix(request, frontend.tokenize)
        self.cond = v1_modes.flow_conditioning(request)
        self._lock = threading.Lock()  # the hop queue and the LLM times the lanes share
        self._queue: collections.deque = collections.deque()  # (segment, Hop, tokens, times)
        self._session = None
        # llm lane
        self.llm_segment = 0
        self.llm_phase = Phase.PREFILL
        self._llm_times = StageTimes()
        self._segment_started = time.perf_counter()
        # audio lane
        self.audio_phase = Phase.FLOW  # FLOW: waits for / runs a queued hop; DONE at the end
        self._hop = None  # (segment, Hop, tokens, llm times) between FLOW and VOCODER
        self._streams: dict[int, OfficialTokenHopStream] = {}
        self._chunk_index = 0
        self._emitted = 0  # chunks emitted by this request
        self._vocoder_frame = 0  # first mel frame of the next token-hop vocoder call
        if self.segments[0] is None:
            tokens = [int(t) for t in request.speech_tokens]
            self.tokens = tokens
            self.llm_phase = Phase.DONE
            self._queue_hops(0, policy(self.schedule).due(len(tokens), finished=True), tokens)
        else:
            self._begin_llm_segment()

    # ---- the engine's view ------------------------------------------------------------------
    @property
    def phase(self) -> Phase:
        if self.llm_phase is Phase.DONE and self.audio_phase is Phase.DONE:
            return Phase.DONE
        if self._hop is not None:
            return Phase.VOCODER
        if self._queue:
            return Phase.FLOW
        return self.llm_phase if self.llm_phase is not Phase.DONE else Phase.FLOW

    def ready_lanes(self) -> tuple[str, ...]:
        """Lanes with a step to run now: ``audio`` first (a due hop shortens the time to the
        next chunk), then ``llm``. Until the request's first chunk is out, the LLM lane waits
        while a hop is due or running: the first chunk gets every core (time to first audio),
        later hops overlap with decoding (throughput); docs/performance.md."""
        out = []
        hop_pending = self._hop is not None or bool(self._queue)
        if self.audio_phase is not Phase.DONE and hop_pending:
            out.append(AUDIO)
        if self.llm_phase is not Phase.DONE and not (hop_pending and not self._emitted):
            out.append(LLM)
        return tuple(out)

    def step(self, lane: str | None = None) -> list[Audio]:
        """One step of ``lane`` (None: the first ready lane)."""
        if lane is None:
            ready = self.ready_lanes()
            if not ready:
                raise RuntimeError("no lane of this request can run (program stalled)")
            lane = ready[0]
        if lane == AUDIO:
            return self._audio_step()
        if lane == LLM:
            self._llm_step()
            return []
        raise ValueError(f"unknown lane {lane!r}")

    # ---- llm lane ---------------------------------------------------------------------------
    def _begin_llm_segment(self) -> None:
        self.tokens: list[int] = []
        self.hops = policy(self.schedule)
        self.llm_phase = Phase.PREFILL

    def _llm_step(self) -> None:
        if self.llm_phase is Phase.PREFILL:
            self._prefill()
        elif self.llm_phase is Phase.DECODE:
            self._decode_step()

    def _prefill(self) -> None:
        seg = self.segments[self.llm_segment]
        text = np.asarray(seg.token_ids, dtype=np.int64)[None, :]
        if text.size == 0:
            raise InputError("no text tokens to synthesize")
        times = StageTimes()
        self.min_len, self.max_len = self.pipeline.decoding_bounds(
            text.size, self.request.num_speech_tokens)
        lm_input = self.pipeline.build_lm_input(text, self.prefix.embedding,
                                                self.prefix.prompt_text_token,
                                                self.prefix.prompt_speech_token, times)
        self._session = self.stages.new_llm_session()
        self._session.reset()
        with times.measure("llm_prefill"):
            self.logp = self._session.forward(lm_input)
        self._add_llm_times(times)
        self.llm_phase = Phase.DECODE

    def _decode_step(self) -> None:
        emb = self.decode_input()
        if emb is None:
            self.decode_leave()
            return
        times = StageTimes()
        with times.measure("llm_decode"):
            logp = self._session.forward(emb)
        self.decode_accept(logp, times)

    # ---- batched decode (the scheduler's side: cosyvino.engine.batching) -----------------------
    def decode_ready(self, lane: str) -> bool:
        """Whether ``lane``'s next step is a decode step that may run as a batch row."""
        return lane == LLM and self.llm_phase is Phase.DECODE and self._session is not None

    def decode_session(self):
        """The prefilled :class:`~.stages.LLMSession` of the segment being decoded (it joins
        an :class:`~.stages.LLMBatch` as a row)."""
        return self._session

    def decode_input(self) -> np.ndarray | None:
        """Sample the next speech token from the last logp with this request's own draws
        (segment, token index): float32 [1, 1, D], its embedding, for the next LLM position;
        None when the segment's decoding ends (EOS or max_len; then call
        :meth:`decode_leave` after taking the session out of any batch)."""
        times = StageTimes()
        with times.measure("llm_sampling"):
            token = self.pipeline.sample_token(
                self.logp, self.tokens, self.draws.sampling(self.llm_segment, len(self.tokens)),
                self.min_len)
        self._add_llm_times(times)
        if token == self.config.llm.eos_token:
            return None
        self.tokens.append(token)
        if len(self.tokens) >= self.max_len:
            return None
        return self.stages.embed_speech_tokens(np.array([[token]], dtype=np.int64))

    def decode_accept(self, logp: np.ndarray, times: StageTimes | None = None) -> None:
        """Take the logp float32 [V+1] of the token :meth:`decode_input` gave (from the
        session or a batch row) and queue the hops now due."""
        self.logp = logp
        if times is not None:
            self._add_llm_times(times)
        self._queue_hops(self.llm_segment, self.hops.due(len(self.tokens), finished=False),
                         self.tokens)

    def decode_leave(self) -> None:
        """End the segment's decoding (after :meth:`decode_input` returned None): close its
        session, queue the final hops, go on with the next segment (PREFILL) or DONE."""
        self._end_decoding()

    def _end_decoding(self) -> None:
        self._close_session()
        self._queue_hops(self.llm_segment, self.hops.due(len(self.tokens), finished=True),
                         self.tokens)
        self.llm_segment += 1
        if self.llm_segment < self.total_segments:
            self._begin_llm_segment()
        else:
            self.llm_phase = Phase.DONE

    def _add_llm_times(self, times: StageTimes) -> None:
        with self._lock:
            self._llm_times.merge(times)

    def _queue_hops(self, segment: int, hops: list[Hop], tokens: list[int]) -> None:
        if not hops:
            return
        with self._lock:
            for hop in hops:
                llm_times, self._llm_times = self._llm_times, StageTimes()
                self._queue.append((segment, hop, np.asarray(tokens[hop.start:hop.stop],
                                                             dtype=np.int64), llm_times))

    # ---- audio lane -------------------------------------------------------------------------
    def _audio_step(self) -> list[Audio]:
        if self._hop is None:
            with self._lock:
                if not self._queue:
                    return []
                item = self._queue.popleft()
            self._flow(*item)
            return []
        return [self._vocoder()]

    def _flow(self, segment: int, hop: Hop, tokens: np.ndarray, llm_times: StageTimes) -> None:
        cfg = self.config
        if tokens.size == 0:
            raise InputError("no speech tokens to synthesize")
        times = StageTimes()
        times.merge(llm_times)
        if hop.start == 0:
            self._chunk_index = 0
            self._vocoder_frame = 0
        m1 = 0 if self.cond.prompt_feat is None else int(np.shape(self.cond.prompt_feat)[0])
        frames = lambda n: mel_frames_for_tokens(  # noqa: E731
            n, token_rate=cfg.flow.input_frame_rate, sample_rate=cfg.sample_rate,
            hop=cfg.hift.hop_length)
        # noise positions on the segment's mel time line, so overlapping hops share draws
        noise = self.draws.flow_noise(segment, cfg.flow.output_size, m1 + frames(tokens.size),
                                      start=frames(hop.start))
        if self.schedule == "segment":
            mel = self.pipeline.tokens_to_mel(tokens, self.cond.embedding, noise=noise,
                                              prompt_token=self.cond.prompt_token,
                                              prompt_feat=self.cond.prompt_feat, times=times,
                                              before_step=self.check_cancelled,
                                              n_timesteps=self.request.n_timesteps)
            if self.request.speed != 1.0:
                mel = linear_resize_time(mel, max(1, int(mel.shape[-1] / self.request.speed)))
        else:
            stream = self._streams.get(segment)
            if stream is None:
                stream = OfficialTokenHopStream(
                    self.stages, self.cond.embedding, prompt_token=self.cond.prompt_token,
                    prompt_feat=self.cond.prompt_feat,
                    constants=policy(self.schedule).constants, speed=self.request.speed,
                    pipeline=self.pipeline, n_timesteps=self.request.n_timesteps)
                self._streams[segment] = stream
            mel = stream.flow_hop(tokens, hop.finalize, noise=noise,
                                  before_step=self.check_cancelled, times=times)
        self._hop = (segment, hop, tokens, times, mel)

    def _vocoder(self) -> Audio:
        h = self.config.hift
        segment, hop, tokens, times, mel = self._hop
        with times.measure("vocoder"):
            f0 = self.stages.vocoder_f0(mel)
            start = self._vocoder_frame * h.hop_length
            phase, noise = self.draws.nsf(segment, h.nb_harmonics + 1,
                                          h.hop_length * mel.shape[-1], start=start)
            source = self.stages.vocoder_source(f0, phase, noise)
            self.check_cancelled()  # between stage calls: a cancel or a first-chunk hold
            if self.schedule == "segment":
                wav = self.pipeline.mel_to_wav(mel, source=source,
                                               before_window=self.check_cancelled)
            else:
                stream = self._streams[segment]
                wav = stream.vocoder_hop(source)
                self._vocoder_frame += mel.shape[-1] - stream.constants.mel_cache_len
        self._hop = None
        new = tokens if hop.finalize else tokens[:self._new_tokens(segment, hop)]
        audio = Audio(wav, self.config.sample_rate, new, {})
        audio.stats = audio_stats(times, audio.duration,
                                  time.perf_counter() - self._segment_started, int(new.size))
        seg = self.segments[segment]
        if seg is not None and self._chunk_index == 0:
            audio.stats["text"] = seg.text
        audio.stats.update(segment=segment, chunk=self._chunk_index,
                           is_last_in_segment=hop.finalize, seed=self.request.seed,
                           mode=self.request.mode, hop_schedule=self.schedule)
        self._chunk_index += 1
        self._emitted += 1
        self._segment_started = time.perf_counter()
        if hop.finalize:
            self._streams.pop(segment, None)
            if segment + 1 >= self.total_segments:
                self.audio_phase = Phase.DONE
        return audio

    def _new_tokens(self, segment: int, hop: Hop) -> int:
        """Tokens a non-final hop adds (its window minus the overlap the next hop repeats)."""
        return (hop.stop - hop.start) - self._streams[segment].constants.token_overlap_len

    # ---- resources --------------------------------------------------------------------------
    def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()

    def close(self) -> None:
        self._close_session()
