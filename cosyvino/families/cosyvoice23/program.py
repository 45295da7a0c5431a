"""One CosyVoice2/3 request as a state machine the engine steps: the program both families run,
with the family's choices as hooks (:class:`SpeechLMProgram`; v2:
:class:`cosyvino.families.cosyvoice2.program.CosyVoice2Program`, v3:
:class:`cosyvino.families.cosyvoice3.program.CosyVoice3Program`). Must not import torch.

Two lanes, as v1 (:mod:`cosyvino.families.cosyvoice1.program`):

* ``llm``: per text segment, PREFILL (``[SOS][E_text(text before ⧺ tts)][TASK][E_speech(prompt
  speech)]``, sheet v2 §4.4, v3 §4.3) then DECODE (one RAS-sampled token per step under the
  family's rule (:meth:`SpeechLMProgram.decoding_rule`): bounds from the tts-text length; draws
  from ``draws.sampling(segment, index)``). Each token goes to the LLM's history and, if the
  family's filter keeps it (:meth:`SpeechLMProgram.keep_for_flow`; v3: the silent-token filter),
  to the flow's tokens; the segment's hop policy says which hops of those are due.
* ``audio``: per due hop, FLOW (:class:`~.token2wav.FlowHops`: the fixed seed-0 noise, no
  random draw) then VOCODER (the family's, :meth:`SpeechLMProgram.vocode`), which emits the
  hop's chunk at 24 kHz. The request's ``streaming.flow_streaming`` / ``vocoder_streaming``
  (issue 36) choose per segment between the official re-runs and the incremental streams the
  stages offer (:meth:`SpeechLMProgram.flow_stream`, :meth:`SpeechLMProgram.vocoder_stream`);
  a backend without them falls back to official streaming and logs why once; when
  ``incremental`` was asked for explicitly the chunks' ``stats["streaming_fallback"]`` carries
  the reason.

``vc`` (and :meth:`Synthesizer.tokens_to_audio`) skip the LLM: the given speech tokens are one
segment. Every random number comes from :class:`cosyvino.engine.draws.RandomDraws` by segment
and position, so a seed's audio does not depend on how the lanes are interleaved.
"""

from __future__ import annotations

import collections
import logging
import threading
import time

import numpy as np

from cosyvino.audio import Audio
from cosyvino.engine.program import Phase, Program
from cosyvino.errors import InputError
from cosyvino.timing import StageTimes, audio_stats

from ..cosyvoice1.sampling import ras_sample
from ..cosyvoice1.streaming import Hop
from .modes import flow_conditioning

LLM, AUDIO = "llm", "audio"

log = logging.getLogger(__name__)
#: fallback reasons already logged (once per process and reason, not per segment)
_LOGGED_FALLBACKS: set[str] = set()
_LOG_LOCK = threading.Lock()


def _log_fallback(part: str, asked: str, why: str) -> None:
    """Log once why the ``part`` (flow / vocoder) of a stream runs the official re-runs:
    a warning when ``incremental`` was asked for, info for ``auto``."""
    key = f"{part}:{asked}:{why}"
    with _LOG_LOCK:
        if key in _LOGGED_FALLBACKS:
            return
        _LOGGED_FALLBACKS.add(key)
    level = logging.WARNING if asked == "incremental" else logging.INFO
    log.log(level, "%s_streaming=%s: official streaming instead: %s", part, asked, why)


class SpeechLMProgram(Program):
    """A validated request on loaded CosyVoice2/3 stages. Subclasses implement the hooks:
    :meth:`decoding_rule`, :meth:`llm_prefix`, :meth:`hop_policy`, :meth:`new_stream`,
    :meth:`vocode` (and may override :meth:`llm_text`, :meth:`keep_for_flow`).

    Chunks are :class:`Audio` (24 kHz) with ``stats`` keys ``segment`` / ``chunk``,
    ``is_last_in_segment``, ``mode``, ``hop_schedule``, ``seed``, stage times and RTF.

    Raises (at construction): EmptyTextError (nothing speakable, unless speech tokens are
    given), InputError (a transcript or instruction with nothing speakable).
    """

    lanes = (LLM, AUDIO)

    def __init__(self, stages, request, draws, frontend):
        self.stages = stages
        self.request = request
        self.draws = draws
        self.config = stages.config
        self.schedule = request.streaming.hop_schedule
        self.rule = self.decoding_rule()
        if request.speech_tokens is not None:
            self.segments = [None]  # token-to-wav: one segment, no LLM
        elif getattr(request, "text_stream", False):
            self.segments = []  # text in: segments begin as the text comes (text_in_program)
        else:
            self.segments = frontend.segments(request.text)  # raises EmptyTextError
        self.total_segments = len(self.segments)
        self.prefix = self.llm_prefix(request, frontend)
        self.cond = flow_conditioning(request)
        self._prompt_tokens = (0 if self.cond.prompt_token is None
                               else int(self.cond.prompt_token.size))
        self._sos, self._task = stages.llm_special_embeddings()
        self._lock = threading.Lock()
        self._queue: collections.deque = collections.deque()
        self._session = None
        self.llm_segment = 0
        self.llm_phase = Phase.PREFILL
        self._llm_times = StageTimes()
        self._segment_started = time.perf_counter()
        self.audio_phase = Phase.FLOW
        self._hop = None
        self._streams: dict = {}
        self._chunk_index = 0
        self._emitted = 0
        self._fallbacks: dict[str, str] = {}  # part -> why it runs official streaming
        if not self.segments:
            self.tokens, self.flow_tokens = [], []
        elif self.segments[0] is None:
            self.tokens = [int(t) for t in request.speech_tokens]
            self.flow_tokens = self.tokens  # given tokens bypass any filter
            self.llm_phase = Phase.DONE
            self._queue_hops(0, self._policy().due(len(self.flow_tokens), finished=True),
                             self.flow_tokens)
        else:
            self._begin_llm_segment()

    # ---- the family's hooks -------------------------------------------------------------------
    def decoding_rule(self):
        """The :class:`~.decoding.DecodingRule` of the family for ``self.config.llm``."""
        raise NotImplementedError

    def llm_prefix(self, request, frontend):
        """The :class:`~.modes.LLMPrefix` of ``request`` in its mode. Raises InputError."""
        raise NotImplementedError

    def llm_text(self, text: np.ndarray) -> np.ndarray:
        """The ids between SOS and TASK for a segment's tts text ids ``text`` int64 [1, L]
        (default: ``prefix.text_before ⧺ text``). min_len / max_len count ``text`` only."""
        before = self.prefix.text_before
        return text if before is None else np.concatenate([before, text], axis=1)

    def hop_policy(self, hop_schedule: str, prompt_tokens: int):
        """A fresh hop policy of one segment (``due(n_tokens, finished) -> [Hop]``)."""
        raise NotImplementedError

    def new_stream(self):
        """A segment's :class:`~.token2wav.FlowHops` (with the family's vocoder state) for
        ``self.cond`` and the request's ``n_timesteps`` / ``speed``."""
        raise NotImplementedError

    def vocode(self, stream, segment: int, mel: np.ndarray, hop: Hop) -> np.ndarray:
        """The samples a hop emits from its new mel frames ``mel`` float32 [1, 80, m]
        (float32 [n] at 24 kHz)."""
        raise NotImplementedError

    def stream_stats(self, stream) -> dict:
        """What a chunk's stats say about how its hop ran (default: ``flow_streaming``)."""
        return {"flow_streaming": stream.last_flow_mode}

    # ---- incremental streaming (issue 36) ----------------------------------------------------
    def _incremental(self, part: str, option: str) -> bool:
        """Whether a new segment's ``part`` (``flow`` / ``vocoder``) runs incrementally: asked
        for (``auto`` / ``incremental``), a token-hop schedule (``segment`` has one hop: the
        non-streaming computation) and offered by the stages (else the fallback is logged
        and recorded)."""
        if option == "official" or self.schedule == "segment":
            return False
        check = getattr(self.stages, f"{part}_stream_unavailable", None)
        why = ("this backend's stages offer no incremental " + part) if check is None \
            else check()
        if why is not None:
            self._fallback(part, option, why)
            return False
        return True

    def _fallback(self, part: str, option: str, why: str) -> None:
        if option == "incremental":  # asked for explicitly: the chunks say why not
            self._fallbacks[part] = why
        _log_fallback(part, option, why)

    def flow_stream(self):
        """A new segment's incremental flow stream (``stages.new_flow_stream``) or None
        (official re-runs: asked for, the ``segment`` schedule, or unavailable: logged)."""
        option = self.request.streaming.flow_streaming
        if not self._incremental("flow", option):
            return None
        try:
            return self.stages.new_flow_stream(self.cond.embedding, self.cond.prompt_token,
                                               self.cond.prompt_feat, self.request.n_timesteps)
        except InputError as e:  # e.g. a vc prompt whose mel is not 2 frames per token
            self._fallback("flow", option, str(e))
            return None

    def vocoder_stream(self):
        """A new segment's incremental vocoder (``stages.new_vocoder_stream``) or None (as
        :meth:`flow_stream`, for ``streaming.vocoder_streaming``)."""
        if not self._incremental("vocoder", self.request.streaming.vocoder_streaming):
            return None
        return self.stages.new_vocoder_stream()

    def keep_for_flow(self, token: int) -> bool:
        """Whether a generated token also goes to the flow (default: every one). Called once
        per token, in order, after it joined ``self.tokens``."""
        return True

    def _policy(self):
        return self.hop_policy(self.schedule, self._prompt_tokens)

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
        """``audio`` when a hop is due or running, ``llm`` while decoding (held back while the
        request's first hop runs: the first chunk gets the cores, as v1)."""
        out = []
        pending = self._hop is not None or bool(self._queue)
        if self.audio_phase is not Phase.DONE and pending:
            out.append(AUDIO)
        if self.llm_phase is not Phase.DONE and not (pending and not self._emitted):
            out.append(LLM)
        return tuple(out)

    def step(self, lane: str | None = None) -> list[Audio]:
        if lane is None:
            ready = self.ready_lanes()
            if not ready:
                raise RuntimeError("no lane of this request can run (program stalled)")
            lane = ready[0]
        if lane == AUDIO:
            return self._audio_step()
        if lane == LLM:
            if self.llm_phase is Phase.PREFILL:
                self._prefill()
            elif self.llm_phase is Phase.DECODE:
                self._decode_step()
            return []
        raise ValueError(f"unknown lane {lane!r}")

    # ---- llm lane ---------------------------------------------------------------------------
    def _begin_llm_segment(self) -> None:
        self.tokens: list[int] = []  # every generated token: the sampler's history
        self.flow_tokens: list[int] = []  # those the flow gets (keep_for_flow)
        self.hops = self._policy()
        self.llm_phase = Phase.PREFILL

    def _prefill(self) -> None:
        seg = self.segments[self.llm_segment]
        text = np.asarray(seg.token_ids, dtype=np.int64)[None, :]
        if text.size == 0:
            raise InputError("no text tokens to synthesize")
        n = self.request.num_speech_tokens
        self.min_len, self.max_len = (n, n) if n is not None else \
            self.rule.length_limits(text.size)
        times = StageTimes()
        text = self.llm_text(text)
        with times.measure("text_encoder"):
            parts = [self._sos, self.stages.embed_text(text), self._task]
            if self.prefix.prompt_speech_token is not None:
                parts.append(self.stages.embed_speech(self.prefix.prompt_speech_token))
        lm_input = np.ascontiguousarray(np.concatenate(parts, axis=1), np.float32)
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

    def _sample(self) -> int:
        step = len(self.tokens)
        logp = self.rule.masked(np.asarray(self.logp), step, self.min_len)
        if self.request.num_speech_tokens is not None:  # a forced count: no stop id at all
            logp = np.array(logp, np.float32, copy=True)
            logp[list(self.rule.stop_token_ids)] = -np.inf
        rng = self.draws.sampling(self.llm_segment, step)
        return ras_sample(logp, self.tokens, rng, self.config.llm.sampling)

    # ---- batched decode (cosyvino.engine.batching) -------------------------------------------
    def decode_ready(self, lane: str) -> bool:
        return lane == LLM and self.llm_phase is Phase.DECODE and self._session is not None

    def decode_session(self):
        return self._session

    def decode_input(self) -> np.ndarray | None:
        """Sample the next token; its embedding float32 [1, 1, D], or None when the segment's
        decoding ends (a stop id or ``max_len``; call :meth:`decode_leave` then)."""
        times = StageTimes()
        with times.measure("llm_sampling"):
            token = self._sample()
        self._add_llm_times(times)
        if token in self.rule.stop_token_ids:
            return None
        self.tokens.append(token)
        if self.keep_for_flow(token):
            self.flow_tokens.append(token)
        if len(self.tokens) >= self.max_len:
            return None
        return self.stages.embed_speech(np.array([[token]], dtype=np.int64))

    def decode_accept(self, logp: np.ndarray, times: StageTimes | None = None) -> None:
        self.logp = logp
        if times is not None:
            self._add_llm_times(times)
        self._queue_hops(self.llm_segment,
                         self.hops.due(len(self.flow_tokens), finished=False), self.flow_tokens)

    def decode_leave(self) -> None:
        self._close_session()
        self._queue_hops(self.llm_segment, self.hops.due(len(self.flow_tokens), finished=True),
                         self.flow_tokens)
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
                self._queue.append((segment, hop, np.asarray(tokens[:hop.stop], np.int64),
                                    llm_times))

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
        if tokens.size == 0:
            raise InputError("no speech tokens to synthesize")
        times = StageTimes()
        times.merge(llm_times)
        stream = self._streams.get(segment)
        if stream is None:
            self._chunk_index = 0
            stream = self.new_stream()
            self._streams[segment] = stream
        mel = stream.flow(tokens, hop.start, hop.finalize, before_step=self.check_cancelled,
                          times=times)
        self._hop = (segment, hop, tokens, times, mel)

    def _vocoder(self) -> Audio:
        segment, hop, tokens, times, mel = self._hop
        stream = self._streams[segment]
        with times.measure("vocoder"):
            wav = self.vocode(stream, segment, mel, hop)
        self._hop = None
        new = tokens[hop.start:] if hop.finalize else \
            tokens[hop.start:hop.stop - self.config.flow.pre_lookahead_len]
        audio = Audio(wav, self.config.sample_rate, new, {})
        audio.stats = audio_stats(times, audio.duration,
                                  time.perf_counter() - self._segment_started, int(new.size))
        seg = self.segments[segment]
        if seg is not None and self._chunk_index == 0:
            audio.stats["text"] = seg.text
        audio.stats.update(segment=segment, chunk=self._chunk_index,
                           is_last_in_segment=hop.finalize, seed=self.request.seed,
                           mode=self.request.mode, hop_schedule=self.schedule,
                           **self.stream_stats(stream))
        if self._fallbacks:
            audio.stats["streaming_fallback"] = dict(self._fallbacks)
        self._chunk_index += 1
        self._emitted += 1
        self._segment_started = time.perf_counter()
        if hop.finalize:
            self._streams.pop(segment, None)
            self._segment_vocoded(segment)
        return audio

    def _segment_vocoded(self, segment: int) -> None:
        """The last hop of ``segment`` was vocoded (audio lane): the audio lane is done after
        the last segment (a text-in program, whose segment count grows, overrides it)."""
        if segment + 1 >= self.total_segments:
            self.audio_phase = Phase.DONE

    # ---- resources --------------------------------------------------------------------------
    def _close_session(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            session.close()

    def close(self) -> None:
        self._close_session()
