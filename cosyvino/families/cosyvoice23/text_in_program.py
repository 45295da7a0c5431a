"""A CosyVoice2/3 request whose text arrives while it runs (text in, upstream's bistream input,
sheet v2 §4.6). Must not import torch.

:class:`TextInMixin` goes before a family's :class:`~.program.SpeechLMProgram` subclass. The
audio lane is the family's (hops, flow, vocoder); the ``llm`` lane runs
:class:`~.bistream.BistreamLayout`: one KV-cached LLM session per utterance, fed only the new
positions each call (prefill of the 5 new text tokens, or one speech token), never re-run.

Text comes in through :meth:`TextInMixin.feed_text` / :meth:`~TextInMixin.end_utterance` /
:meth:`~TextInMixin.close_input` (any thread; :class:`cosyvino.text_stream.TextStream` calls
them): pieces are tokenized as they come by :class:`~.incremental_text.IncrementalTokenizer`
(the ids of the whole text, however it was cut). Each ``end_utterance`` (a client's flush) ends
one utterance: its remaining text and TASK are fed and it is decoded to EOS; the next text
starts a new utterance (a new segment of the request, a fresh session), as a new upstream
``inference_bistream`` call would. Text before the first letter or digit of an utterance is
held; an utterance with none (empty or punctuation-only) is dropped without audio; a request
that ends without any is an :class:`~cosyvino.errors.EmptyTextError`.

Determinism: every draw is ``draws.sampling(segment, index in out)``, and the layout depends
only on the ids, so a seed's audio depends on the text and the flush points alone, not on how
the text was cut into pieces nor on when they came. It is NOT the audio of the same text given
whole (another LLM input layout, no text normalization or sentence splitting: upstream's
bistream input is not normalized either).

When the LLM lane has nothing to do it waits for text (:attr:`awaits_input`): the scheduler
neither steps nor fails the request; :meth:`feed_text` wakes it (``set_waker``).
"""

from __future__ import annotations

import threading

import numpy as np

from cosyvino.errors import EmptyTextError, InputError
from cosyvino.engine.program import Phase
from cosyvino.frontend.normalize import is_speakable
from cosyvino.timing import StageTimes

from ..cosyvoice1.sampling import ras_sample
from .bistream import EMIT, END, SOS, SPEECH, TASK, TEXT, BistreamLayout, BistreamTokens
from .incremental_text import IncrementalTokenizer
from .program import LLM

_ITEM_IDS, _ITEM_END, _ITEM_CLOSE = "ids", "end", "close"


def _settled_speakable(text: str) -> bool:
    """``is_speakable`` of the part of ``text`` that no later piece can turn into a tag
    (an unterminated ``<|...`` tail is left out), so the answer does not depend on the cut."""
    i = text.rfind("<|")
    if i >= 0 and "|>" not in text[i:]:
        text = text[:i]
    return is_speakable(text)


class TextInMixin:
    """Text-in request state (module docstring). The request must have ``text_stream=True``
    and empty ``text``; ``num_speech_tokens`` is not supported (validated in the request)."""

    accepts_text = True

    def __init__(self, stages, request, draws, frontend):
        self._frontend = frontend
        super().__init__(stages, request, draws, frontend)
        self._cond = threading.Condition()
        self._inbox: list = []
        self._idle = True  # the llm lane found nothing to do and the inbox empty
        self._waker = None
        self._closed_input = False  # close_input() was called (feeder side)
        self._llm_closed = False  # the llm lane took the close (no more utterances)
        self._started = 0  # utterances started on the llm lane
        self._vocoded = 0  # utterances whose last hop was vocoded (or that had no tokens)
        self._queued_utterances = 0  # utterances ended on the feeder side
        self._dropped = 0  # utterances without anything speakable
        self._layout: BistreamLayout | None = None
        self._layout_waiting = 0
        self._inbox_ids = 0
        self._new_feed_state()
        self.llm_phase = Phase.DECODE
        self.total_segments = 0

    # ---- the family's hooks -----------------------------------------------------------------
    def bistream_tokens(self) -> BistreamTokens:
        """The FILL / EOS ids and mix ratio of the family's LLM config."""
        llm = self.config.llm
        mix = tuple(getattr(llm, "mix_ratio", (5, 15)))
        return BistreamTokens(speech_token_size=int(llm.speech_token_size),
                              eos_token=int(llm.eos_token), fill_token=int(llm.fill_token),
                              mix_text=int(mix[0]), mix_speech=int(mix[1]))

    def bistream_prompt(self) -> tuple[np.ndarray, np.ndarray]:
        """``(placed, queued)``: the prompt text ids placed right after SOS, and those queued
        before the streamed text (v2: none placed; the transcript / instruction queued)."""
        before = self.prefix.text_before
        queued = np.zeros(0, np.int64) if before is None else np.asarray(before).reshape(-1)
        return np.zeros(0, np.int64), queued

    # ---- the feeder's side (any thread) -----------------------------------------------------
    def _new_feed_state(self) -> None:
        self._tokenizer = IncrementalTokenizer(self._frontend.tokenizer)
        self._held = ""
        self._speakable = False

    def set_waker(self, waker) -> None:
        """``waker()`` is called after new input (the scheduler queues the ``llm`` lane)."""
        self._waker = waker

    def _wake(self) -> None:
        if self._waker is not None:
            self._waker()

    def _put(self, item) -> None:
        self._inbox.append(item)
        if item[0] == _ITEM_IDS:
            self._inbox_ids += len(item[1])
        self._idle = False

    def feed_text(self, text: str) -> None:
        """Add ``text`` (whole characters) to the current utterance. Raises InputError after
        :meth:`close_input`."""
        if not text:
            return
        with self._cond:
            if self._closed_input:
                raise InputError("text sent after the text stream was closed")
            if not self._speakable:
                self._held += text
                if not _settled_speakable(self._held):
                    return
                self._speakable, text, self._held = True, self._held, ""
            ids = self._tokenizer.push(text)
            if ids:
                self._put((_ITEM_IDS, ids))
        self._wake()

    def end_utterance(self) -> bool:
        """End the current utterance (a flush). False when it had nothing speakable (it is
        dropped, no audio); True otherwise."""
        with self._cond:
            if self._closed_input:
                raise InputError("flush after the text stream was closed")
            spoken = self._speakable
            if spoken:
                ids = self._tokenizer.finish()
                if ids:
                    self._put((_ITEM_IDS, ids))
                self._put((_ITEM_END,))
                self._queued_utterances += 1
            else:
                self._dropped += 1
            self._new_feed_state()
        if spoken:
            self._wake()
        return spoken

    def close_input(self) -> None:
        """End the current utterance and the request's text (idempotent)."""
        with self._cond:
            if self._closed_input:
                return
        self.end_utterance()
        with self._cond:
            self._closed_input = True
            self._put((_ITEM_CLOSE,))
        self._wake()

    @property
    def pending_text_tokens(self) -> int:
        """Streamed text ids not yet taken by the LLM (the feeder's backpressure measure)."""
        with self._cond:
            return self._inbox_ids + self._layout_waiting

    def wait_for_room(self, limit: int, timeout: float | None = None) -> bool:
        """Block until at most ``limit`` text ids wait for the LLM, the request ended or was
        cancelled (True), or ``timeout`` seconds passed (False)."""
        def room() -> bool:
            return (self._inbox_ids + self._layout_waiting <= limit or self.phase is Phase.DONE
                    or (self.cancel is not None and self.cancel.is_set()) or self._failed)
        with self._cond:
            return self._cond.wait_for(room, timeout)

    _failed = False

    @property
    def utterances_dropped(self) -> int:
        """Utterances that had nothing speakable (no audio)."""
        return self._dropped

    # ---- the engine's view ------------------------------------------------------------------
    def _llm_has_work(self) -> bool:
        return not self._idle

    @property
    def awaits_input(self) -> bool:
        """True while the LLM lane waits for text (the request is not stalled)."""
        return self.llm_phase is not Phase.DONE and not self._llm_has_work()

    def ready_lanes(self) -> tuple[str, ...]:
        lanes = super().ready_lanes()
        cancelled = self.cancel is not None and self.cancel.is_set()
        if LLM in lanes and not self._llm_has_work() and not cancelled:
            lanes = tuple(lane for lane in lanes if lane != LLM)
        elif cancelled and LLM not in lanes and self.llm_phase is not Phase.DONE:
            lanes = lanes + (LLM,)  # a step of it raises SynthesisCancelled at once
        return lanes

    def decode_ready(self, lane: str) -> bool:
        return False  # text-in utterances decode in their own session (no batch rows)

    def step(self, lane: str | None = None):
        if lane is None:
            ready = self.ready_lanes()
            lane = ready[0] if ready else LLM
        if lane != LLM:
            return super().step(lane)
        try:
            self._text_in_step()
        except BaseException:
            with self._cond:
                self._failed = True
                self._cond.notify_all()
            raise
        return []

    # ---- the llm lane -----------------------------------------------------------------------
    def _take(self):
        """The next inbox item, or None (then the lane is idle until the feeder puts one)."""
        with self._cond:
            if not self._inbox:
                self._idle = True
                return None
            item = self._inbox.pop(0)
            if item[0] == _ITEM_IDS:
                self._inbox_ids -= len(item[1])
            return item

    def _text_in_step(self) -> None:
        self.check_cancelled()
        while True:
            if self._layout is None:
                item = self._take()
                if item is None:
                    return
                if item[0] == _ITEM_CLOSE:
                    self._take_close()
                    return
                self._begin_utterance()
            else:
                parts = self._layout.forward_due()
                if parts is not None:
                    break
                item = self._take()
                if item is None:
                    self._note_waiting()
                    return
            if item[0] == _ITEM_IDS:
                self._layout.push(item[1])
                self._text_count += len(item[1])
            elif item[0] == _ITEM_END:
                self._layout.max_len = max(1, int(self._text_count
                                                  * self.rule.max_token_text_ratio))
                self._layout.end()
            else:  # a close always follows an end
                raise RuntimeError("text stream closed inside an utterance")
        self._note_waiting()
        self._forward(parts)

    def _note_waiting(self) -> None:
        with self._cond:
            self._layout_waiting = 0 if self._layout is None else self._layout.waiting
            self._cond.notify_all()

    def _take_close(self) -> None:
        if self._started == 0:
            raise EmptyTextError("nothing speakable in the streamed text (every utterance was "
                                 "empty or only punctuation)")
        with self._cond:
            self._llm_closed = True
            self.llm_phase = Phase.DONE
            self._check_audio_done()
            self._cond.notify_all()

    def _begin_utterance(self) -> None:
        placed, queued = self.bistream_prompt()
        speech = self.prefix.prompt_speech_token
        speech = np.zeros(0, np.int64) if speech is None else np.asarray(speech).reshape(-1)
        self._layout = BistreamLayout(queued, speech, self.bistream_tokens(), placed_text=placed)
        self._text_count = 0
        self.llm_segment = self._started
        with self._cond:
            self._started += 1
            self.segments.append(None)
            self.total_segments = self._started
        self._begin_llm_segment()  # tokens, flow tokens, hop policy
        self._session = self.stages.new_llm_session()
        self._session.reset()
        self._fed_positions = 0

    def _embed(self, parts) -> np.ndarray:
        out = []
        for p in parts:
            if p.kind == SOS:
                out.append(self._sos)
            elif p.kind == TASK:
                out.append(self._task)
            elif p.kind == TEXT:
                out.append(self.stages.embed_text(np.asarray(p.ids, np.int64)[None, :]))
            elif p.kind == SPEECH:
                out.append(self.stages.embed_speech(np.asarray(p.ids, np.int64)[None, :]))
        return np.ascontiguousarray(np.concatenate(out, axis=1), np.float32)

    def _forward(self, parts) -> None:
        times = StageTimes()
        with times.measure("text_encoder"):
            emb = self._embed(parts)
        stage = "llm_prefill" if emb.shape[1] > 1 else "llm_decode"
        self.check_cancelled()
        with times.measure(stage):
            logp = self._session.forward(emb)
        self._fed_positions += emb.shape[1]
        segment = self.llm_segment

        def sample(masked, history) -> int:
            rng = self.draws.sampling(segment, len(history))
            return ras_sample(masked, history, rng, self.config.llm.sampling)

        with times.measure("llm_sampling"):
            kind, token = self._layout.decide(np.asarray(logp), sample)
        self._add_llm_times(times)
        if kind == EMIT:
            self.tokens.append(token)
            if self.keep_for_flow(token):
                self.flow_tokens.append(token)
            self._queue_hops(segment, self.hops.due(len(self.flow_tokens), finished=False),
                             self.flow_tokens)
        if kind == END or self._layout.done:
            self._end_utterance_llm()

    def _end_utterance_llm(self) -> None:
        segment = self.llm_segment
        self._close_session()
        self._layout = None
        if self.flow_tokens:
            self._queue_hops(segment, self.hops.due(len(self.flow_tokens), finished=True),
                             self.flow_tokens)
        else:  # EOS at once: nothing to vocode for this utterance
            self._segment_vocoded(segment)

    # ---- audio lane bookkeeping ---------------------------------------------------------------
    def _segment_vocoded(self, segment: int) -> None:
        with self._cond:
            self._vocoded += 1
            self._check_audio_done()

    def _check_audio_done(self) -> None:
        if self._llm_closed and self._vocoded >= self._started:
            self.audio_phase = Phase.DONE

    def close(self) -> None:
        super().close()
        with self._cond:
            self._failed = self._failed or self.phase is not Phase.DONE
            self._cond.notify_all()


__all__ = ["TextInMixin"]
