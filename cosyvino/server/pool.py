"""Admission of synthesis requests (queue + 503) in front of the engine's scheduler.

* The running is done by ONE :class:`cosyvino.engine.Scheduler` over the loaded model(s): a
  backend whose stages are thread-safe per call (``Stages.thread_safe``, e.g. torch) is loaded
  ONCE and its engine gets all ``max_sessions`` workers (``Synthesizer(max_parallel=N)``,
  scheduler over ``[engine] * N``); any other backend gets one loaded ``Synthesizer`` per
  worker (scheduler over ``[s.engine for s in synths]``). Each request has its own program and
  LLM session (KV cache), so requests never share decoding state.
* Admission happens on the event loop: at most ``max_sessions`` requests hold a slot in the
  scheduler (plus detached ones finishing their last stage call, below) and ``queue_size``
  wait for a slot; one more raises :class:`Busy` (the
  app answers 503 + Retry-After). Bounding what reaches the scheduler keeps its round-robin
  from spreading the model over every queued request (each would slow down, none would finish
  sooner).
* A :class:`Job` brings a request's chunks from the scheduler's worker threads to the event loop
  (the handle's callback posts them with ``loop.call_soon_threadsafe``). Setting the job's
  ``cancel`` event (client gone, timeout, shutdown) stops the request before its next stage
  call. The slot is given back when the worker reports the request finished (done, failed,
  cancelled) or, when the response stops waiting for it first (a stream cut at the timeout or
  by a failure, a 504, a client gone: :meth:`SynthesisPool.detach`), at that moment (issue 33:
  a cut request held its slot for the ~3 s of its last stage call and the next requests got
  503). A detached request is cancelled, so it overlaps the next one by at most the stage call
  it is in; until its worker reports it stopped it is *stopping* (``/ready``), no longer
  running: its remaining work is not counted ahead of new requests, and neither its chunks nor
  those of requests running beside it feed the quiet rate.
* Admission accounts for work (issue 19, items 2, 3, 10): :class:`WorkEstimator` turns a request
  into expected seconds of speech and wall seconds (rates measured online, decaying), and
  :meth:`SynthesisPool.enter` refuses a request that would not finish before its deadline given
  the work already running and queued (503 + Retry-After), or that could never finish within
  the request timeout (:class:`TooLong`, a 400). A queued request whose deadline becomes
  unreachable leaves the queue with a 503 before it starts (:meth:`SynthesisPool.acquire`), so
  an admitted request is not left to time out because of queue order.
* "Never fits" is decided on the request's cost ALONE (issue 33, defect 1): the 400 uses the
  quiet rate, measured only on chunks a request delivered while it was the only one in the
  pool (none other running or being validated), each costed at the wall time it would have
  taken with the CPU to itself (:meth:`WorkEstimator.observe_chunk`); and only when that
  estimate exceeds the request timeout by :data:`TOO_LONG_FACTOR` (estimates near the timeout
  are noise: such a request is admitted and the timeout bounds it). Load (our own or another
  process's) raises the current rate, which only ever gives 503 + Retry-After, and only while
  other work is in the pool: an idle server never answers 503 (it admits, or gives the 400).
* A request carrying a recording is first judged on a cheap size (:meth:`SynthesisPool.check`:
  the text's length, or the source recording's duration from its header) before its
  recordings go through the prompt models, so a refusal does not wait for them.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import math
import os
import threading
import time
import unicodedata
from dataclasses import dataclass

from ..engine import RequestHandle, Scheduler
from ..engine.scheduler import CHUNK, DONE
from ..errors import InputError, SynthesisCancelled
from ..request import SynthesisRequest

log = logging.getLogger("cosyvino.server")


class Busy(Exception):
    """Queue full, or the request would not finish before its deadline behind the work already
    admitted: answer 503 with ``retry_after`` (whole seconds, >= 1). ``reason``:
    ``queue_full``, ``deadline`` or ``draining``."""

    def __init__(self, message: str, retry_after: int, reason: str = "queue_full"):
        super().__init__(message)
        self.retry_after = retry_after
        self.reason = reason


class NotReady(Exception):
    """The model is still loading (or failed to load)."""


class TooLong(Exception):
    """The request would take more than :data:`TOO_LONG_FACTOR` x the request timeout even
    alone on this server, at its quiet speed (:meth:`WorkEstimator.quiet_rtf_of`): a 400
    (retrying cannot help).

    Attributes: ``seconds`` (estimated wall seconds alone), ``limit`` (the request timeout,
    s), ``speech_seconds`` (expected speech at speed 1), ``max_speech_seconds`` (what finishes
    within the timeout at the quiet speed) and ``source``: what makes the request long,
    ``"text"`` or ``"source audio"`` (voice conversion: the source recording's length, not a
    text, sets its work)."""

    def __init__(self, seconds: float, limit: float, speech_seconds: float,
                 max_speech_seconds: float, source: str = "text"):
        if source == "source audio":
            what = f"the source audio is {speech_seconds:.1f} s long"
            cut = (f"about {max_speech_seconds:.0f} s of source audio: split the recording "
                   "into shorter requests")
        else:
            what = f"this input is about {speech_seconds:.0f} s of speech"
            cut = (f"about {max_speech_seconds:.0f} s of speech: split the text into shorter "
                   "requests")
        super().__init__(
            f"{what}, which would take about {seconds:.0f} s to synthesize even with this "
            f"server to itself (its measured speed alone), more than {TOO_LONG_FACTOR:g} x "
            f"the request timeout of {limit:g} s; that timeout allows {cut}")
        self.seconds = seconds
        self.limit = limit
        self.speech_seconds = speech_seconds
        self.max_speech_seconds = max_speech_seconds
        self.source = source


# ---- work estimates --------------------------------------------------------------------------
#: prior seconds of speech per text unit (a CJK/kana/hangul character is 1 unit, a Latin
#: letter or digit :data:`LETTER_UNITS`): Mandarin is read at about 4-5 characters per second,
#: English at about 13-15 letters per second (0.07-0.08 s, about a third of a character).
#: Only the starting point: the ratio is then measured on completed requests.
SPEECH_SECONDS_PER_UNIT = 0.22
LETTER_UNITS = 0.35
#: speech tokens per second of speech at speed 1 until the loaded model says its own rate
#: (:attr:`cosyvino.Synthesizer.speech_token_rate`: CosyVoice v1 50, CosyVoice2 25): exact
#: speech length of a request with forced token counts or given speech tokens
TOKENS_PER_SECOND = 50.0
#: prior wall seconds per second of speech (before anything was measured) and how many seconds
#: of measured speech it weighs
PRIOR_RTF = 1.0
PRIOR_WEIGHT_SECONDS = 2.0
#: requests whose voice carries a prompt recording (zero-shot / cross-lingual with a prompt or
#: a registered voice) cost more per second of speech: the prompt's speech tokens lengthen the
#: LLM prefix and its mel frames go through the flow of every hop. Their wall seconds per speech
#: second are measured apart (kind "prompt"); before any is measured this many times the plain
#: rate is assumed (a starting point only: the soak cut 3 zero-shot streams that were admitted
#: on the plain rate, docs/reliability.md)
PROMPT_PRIOR_FACTOR = 2.0
#: request kinds with a rate of their own: "vc" (voice conversion, token-to-wav) runs no LLM,
#: only the flow and the vocoder over the source's tokens, so it is far cheaper per second of
#: speech than "prompt" text-to-speech and must not share its rate
KINDS = ("plain", "prompt", "vc")
#: half-life (s) of the decaying averages: an observation counts half after this long
HALF_LIFE_SECONDS = 60.0
#: admission plans for this factor more wall time than the estimate (estimates are averages)
MARGIN = 1.25
#: a request is refused as never fitting (400) only when its quiet estimate (wall seconds
#: alone, no :data:`MARGIN`) exceeds the request timeout by this factor: an estimate near the
#: timeout is noise (the trial: a 1,008-character text finished alone in 105.7 s, then the same
#: text got a 400 at an estimate of 121 s vs 120 s); what is admitted between is still bounded
#: by the timeout (a cut stream or 504, never a 400 for work that fits)
TOO_LONG_FACTOR = 1.5
#: seconds of speech measured before a request is refused as never fitting (400): for the
#: quiet rate, seconds measured alone for the request's own kind
MIN_EVIDENCE_SECONDS = 5.0
#: chunks shorter than this (wall s) do not set the best CPU utilization (too coarse a clock)
QUIET_MIN_CPU_WALL = 0.05


def text_units(text: str) -> float:
    """Length of ``text`` in speech units: 1 per CJK ideograph, kana or hangul syllable,
    :data:`LETTER_UNITS` per other letter or digit; punctuation and spaces count 0."""
    units = 0.0
    for ch in text:
        if not ch.isalnum():
            continue
        name = unicodedata.name(ch, "")
        if name.startswith(("CJK", "HIRAGANA", "KATAKANA", "HANGUL")):
            units += 1.0
        else:
            units += LETTER_UNITS
    return units


class _DecayingRatio:
    """``sum(w * num) / sum(w * den)`` with weights halving every ``half_life`` seconds of the
    clock: recent observations dominate, and idle time changes nothing (both sums decay
    alike)."""

    def __init__(self, prior: float, weight: float, half_life: float):
        self.num, self.den = prior * weight, weight
        self.half_life = half_life
        self.last: float | None = None

    def add(self, num: float, den: float, now: float) -> None:
        if self.last is not None and now > self.last:
            f = 0.5 ** ((now - self.last) / self.half_life)
            self.num *= f
            self.den *= f
        self.last = now
        self.num += num
        self.den += den

    @property
    def value(self) -> float:
        return self.num / self.den


class WorkEstimator:
    """Expected speech and wall seconds of requests, from rates measured online.

    * speech seconds (at speed 1) of a request: the speech tokens given (voice conversion: the
      source's, forced count or not) over :attr:`tokens_per_second`, ``segments *
      num_speech_tokens /`` :attr:`tokens_per_second` when the token count is forced, else
      ``text_units(text) *`` the measured speech seconds per unit (completed requests; prior
      :data:`SPEECH_SECONDS_PER_UNIT`);
    * current rate (:meth:`rtf_of`): wall seconds per speech second, observed on every chunk a
      running request delivers (so a long request counts as it progresses, and under
      contention the rate includes it); prior :data:`PRIOR_RTF`. What a request costs with
      the server as loaded now: the 503 decisions;
    * quiet rate (:meth:`quiet_rtf_of`): observed only on chunks delivered while the request
      was alone in the pool (``alone``), each costed at ``min(wall, cpu / U)``: ``cpu`` the
      process's CPU seconds over the chunk, ``U`` the best CPU utilization (CPU s per wall s,
      at most the cores) seen on such chunks and at least 1. A chunk starved by another
      process took longer in wall time but not in CPU time, so it counts at about what it
      would have taken with the CPU to itself; never seen un-starved, at most its CPU time,
      which bounds the wall time of work that keeps one core busy. No prior: what a request
      costs alone on this machine, which load cannot raise. The 400 decision (never fits)
      uses only this.

    All are :class:`_DecayingRatio` s with half-life :data:`HALF_LIFE_SECONDS`, so older (long)
    requests stop dominating. Not thread-safe: the pool calls it under its lock.

    Args:
        clock: seconds, monotonic (``time.perf_counter``; tests pass a fake one).
        tokens_per_second: the model's speech tokens per second of speech (the pool sets the
            loaded model's, :meth:`SynthesisPool.load`); default :data:`TOKENS_PER_SECOND`.
    """

    def __init__(self, clock=time.perf_counter, half_life: float = HALF_LIFE_SECONDS,
                 tokens_per_second: float = TOKENS_PER_SECOND):
        self.clock = clock
        self.tokens_per_second = float(tokens_per_second)
        self._rtf = {k: _DecayingRatio(PRIOR_RTF, PRIOR_WEIGHT_SECONDS, half_life)
                     for k in KINDS}
        self._seen = {k: 0.0 for k in KINDS}
        self._quiet = {k: _DecayingRatio(0.0, 0.0, half_life) for k in KINDS}
        self._quiet_seen = {k: 0.0 for k in KINDS}
        self.best_cpu_use = 0.0  # highest CPU s per wall s of a chunk measured alone
        self._per_unit = _DecayingRatio(SPEECH_SECONDS_PER_UNIT, 10.0, half_life)
        self.measured_seconds = 0.0  # speech seconds observed (not decayed): the evidence

    @property
    def rtf(self) -> float:
        """Wall seconds per second of speech (at speed 1) of plain requests, as loaded."""
        return self._rtf["plain"].value

    def rtf_of(self, kind: str) -> float:
        """Current wall seconds per second of speech of requests of ``kind`` (:data:`KINDS`);
        a kind not measured yet: :data:`PROMPT_PRIOR_FACTOR` x the plain rate for "prompt",
        the plain rate for "vc" (no LLM: cheaper than plain).

        Raises:
            KeyError: unknown kind."""
        if kind != "plain" and self._seen[kind] <= 0:
            return self.rtf * (PROMPT_PRIOR_FACTOR if kind == "prompt" else 1.0)
        return self._rtf[kind].value

    def quiet_rtf_of(self, kind: str) -> float | None:
        """Wall seconds per second of speech of a request of ``kind`` running alone (None:
        never measured alone).

        Raises:
            KeyError: unknown kind."""
        q = self._quiet[kind]
        return q.value if self._quiet_seen[kind] > 0 and q.den > 0 else None

    def knows_quiet(self, kind: str) -> bool:
        """Enough of ``kind`` measured alone to refuse a request as never fitting."""
        return self._quiet_seen[kind] >= MIN_EVIDENCE_SECONDS

    @staticmethod
    def kind(request: SynthesisRequest | None) -> str:
        """``"vc"`` for speech tokens to vocode (voice conversion), ``"prompt"`` for a request
        that carries a prompt recording (its own or a registered voice's), else ``"plain"``."""
        if request is None:
            return "plain"
        if request.speech_tokens is not None:
            return "vc"
        voice = request.voice
        if request.prompt_audio is not None or getattr(voice, "has_prompt", False):
            return "prompt"
        return "plain"

    @property
    def speech_per_unit(self) -> float:
        """Seconds of speech per text unit."""
        return self._per_unit.value

    @property
    def confident(self) -> bool:
        """Enough measured (any kind, loaded or not) to refuse a request as late (503)."""
        return self.measured_seconds >= MIN_EVIDENCE_SECONDS

    def speech_seconds(self, request: SynthesisRequest, segments: int = 1) -> float:
        """Expected seconds of speech of a validated request, at speed 1 (>= 0)."""
        # voice conversion: the source's tokens (a forced token count is for the LLM, which
        # vc does not run; the server sets one on every request with --num-speech-tokens)
        if request.speech_tokens is not None:
            return request.speech_tokens.size / self.tokens_per_second
        if request.num_speech_tokens:
            return max(1, segments) * request.num_speech_tokens / self.tokens_per_second
        return text_units(request.text) * self.speech_per_unit

    def observe_chunk(self, wall: float, speech_seconds: float, kind: str = "plain",
                      alone: bool = False, cpu: float | None = None) -> None:
        """A running request of ``kind`` delivered ``speech_seconds`` (audio seconds x speed)
        in ``wall`` seconds since its previous chunk (or its start). ``alone``: no other
        request was in the pool all that time; ``cpu``: the process's CPU seconds over it
        (None: unknown, the chunk is taken as not starved)."""
        if speech_seconds <= 0 or wall < 0:
            return
        if self._seen[kind] <= 0 and kind != "plain":  # its prior: from plain's
            self._rtf[kind] = _DecayingRatio(self.rtf_of(kind), PRIOR_WEIGHT_SECONDS,
                                             self._rtf[kind].half_life)
        now = self.clock()
        self._rtf[kind].add(wall, speech_seconds, now)
        self._seen[kind] += speech_seconds
        self.measured_seconds += speech_seconds
        if alone:
            self._quiet[kind].add(self._alone_cost(wall, cpu), speech_seconds, now)
            self._quiet_seen[kind] += speech_seconds

    def _alone_cost(self, wall: float, cpu: float | None) -> float:
        """Wall seconds a chunk measured alone would have taken with the CPU to itself:
        ``min(wall, cpu / U)`` (class docstring; updates the best utilization ``U``)."""
        if cpu is None or wall <= 0:
            return wall
        if wall >= QUIET_MIN_CPU_WALL:
            self.best_cpu_use = max(self.best_cpu_use, min(cpu / wall, _cores()))
        return min(wall, max(cpu, 0.0) / max(1.0, self.best_cpu_use))

    def observe_request(self, units: float, speech_seconds: float) -> None:
        """A completed (not forced-length) request: ``units`` of text gave ``speech_seconds``."""
        if units > 0 and speech_seconds > 0:
            self._per_unit.add(speech_seconds, units, self.clock())


def _cores() -> float:
    """CPUs this process may run on (the most CPU seconds it can get per wall second)."""
    try:
        return float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return float(os.cpu_count() or 1)


@dataclass(eq=False)
class Ticket:
    """A request's place in the pool, with what admission knows of it.

    Attributes:
        speech: expected seconds of speech (speed 1); ``units``: its text units (0 if forced).
        deadline: clock time by which its last byte must be out.
        started: clock time it got a slot (None while queued); ``done``: speech seconds
            delivered so far; ``last``: clock time of its start or last chunk; ``cpu_last``:
            the process's CPU time then.
        shared: another request was in the pool (running or being validated) at some time
            since ``last``: the next chunk is not a measure of the request alone.
    """

    speech: float = 0.0
    units: float = 0.0
    kind: str = "plain"
    deadline: float = math.inf
    speed: float = 1.0
    started: float | None = None
    done: float = 0.0
    last: float = 0.0
    cpu_last: float = 0.0
    shared: bool = False


#: the ticket of the request this task is serving (set by :meth:`SynthesisPool.enter`, read by
#: :meth:`~SynthesisPool.acquire` and :meth:`~SynthesisPool.start` in the same task when they
#: are not given one)
_CURRENT_TICKET: contextvars.ContextVar[Ticket | None] = contextvars.ContextVar(
    "cosyvino_ticket", default=None)


class SynthesisPool:
    """Loads the model(s), admits requests and runs them on the engine's scheduler.

    Args:
        config: a :class:`~cosyvino.server.config.ServerConfig`.
        synthesizers: already loaded synthesizers to use instead of loading (tests): one shared
            (thread-safe backend) or one per worker.
        metrics: a :class:`~cosyvino.server.metrics.Metrics` (gauges for queue and in-flight).

    Threads: :meth:`enter`, :meth:`leave`, :meth:`acquire` and :meth:`start` run on the event
    loop; :meth:`load` and :meth:`prepare` in any thread; chunk callbacks on the scheduler's
    workers.
    """

    def __init__(self, config, synthesizers=None, metrics=None, clock=time.perf_counter,
                 cpu_clock=time.process_time):
        self.config = config
        self.clock = clock
        self.cpu_clock = cpu_clock  # process CPU seconds (all threads): is a chunk starved?
        self._validating = 0  # validations in progress (prompt models: CPU-heavy; under _lock)
        self._stopping = 0  # detached jobs whose worker is still in a stage call (under _lock)
        self.estimator = WorkEstimator(clock)
        self._queued: list[Ticket] = []   # admitted, waiting for a slot (FIFO; under _lock)
        self._started: list[Ticket] = []  # holding a slot (under _lock)
        self.metrics = metrics
        self.synths: list = list(synthesizers or [])
        self.scheduler: Scheduler | None = None
        self.ready = threading.Event()
        self.load_error: BaseException | None = None
        self.draining = False
        self._admitted = 0      # running + waiting (event-loop thread only)
        self._waiting = 0
        self._running = 0       # requests in the scheduler (any thread; guarded by _lock)
        self._jobs: set = set()  # their jobs (guarded by _lock), cancelled on shutdown
        self._lock = threading.Lock()
        self._sem: asyncio.Semaphore | None = None
        if metrics is not None:  # the gauge shows the starting estimate, as /ready does
            metrics.estimated_rtf.set(self.estimator.rtf)

    # ---- loading -----------------------------------------------------------------------------
    @property
    def shared(self) -> bool:
        return len(self.synths) == 1

    @property
    def synth(self):
        """A loaded synthesizer (speakers, sample rate, frontend, validation)."""
        if not self.synths:
            raise NotReady(self.load_error and f"model failed to load: {self.load_error}"
                           or "model is loading")
        return self.synths[0]

    @property
    def estimator_batch(self) -> int:
        """Requests one estimator call can hold as loaded (the rendezvous' cap; 1 = none), or
        the configured value before the model is loaded."""
        if not self.synths:
            return self.config.estimator_batch
        # synthesizers from elsewhere (tests, wrappers) may carry engines without batchers
        batchers = getattr(getattr(self.synths[0], "engine", None), "batchers", None) or {}
        rv = batchers.get("estimator")
        return 1 if rv is None else int(rv.cap)

    def engines(self) -> list:
        """The scheduler's worker list: the shared engine ``max_sessions`` times, or one engine
        per loaded model."""
        if self.shared:
            return [self.synths[0].engine] * self.config.max_sessions
        return [s.engine for s in self.synths]

    def load(self) -> None:
        """Load (unless given), start the scheduler and warm up; sets :attr:`ready`. Blocking;
        run off the loop. A failure is kept in :attr:`load_error` (not raised)."""
        try:
            if not self.synths:
                self.synths = self._load_synthesizers()
            self.estimator.tokens_per_second = token_rate(self.synths[0])
            # synthesizers from elsewhere (tests, wrappers) may not say: the scheduler default
            hold = getattr(self.synths[0], "first_chunk_hold", True)
            self.scheduler = Scheduler(self.engines(), name="cosyvino-synth",
                                       llm_batch=self.config.llm_batch, first_chunk_hold=hold)
            wanted, got = self.config.estimator_batch, self.estimator_batch
            if wanted > 1 and got < wanted:
                log.warning("estimator batch %d: %s serves %d request(s) per estimator call "
                            "here (%s)", wanted, self.config.backend, got,
                            "needs --max-sessions >= 2 and a thread-safe backend"
                            if got == 1 else "the backend's max_estimator_batch")
            if self.config.warmup:
                start = time.perf_counter()
                if warm_up(self.synths[0]):
                    log.info("warm-up synthesis %.2f s", time.perf_counter() - start)
            self.ready.set()
        except BaseException as e:  # noqa: BLE001 - reported by /ready and every request
            self.load_error = e
            log.error("model failed to load: %s", e)

    def _load_synthesizers(self) -> list:
        from ..defaults import ensure_default_model

        c = self.config
        start = time.perf_counter()
        # `cosyvino serve` without a model dir: the CLI's default path (created once, loudly)
        out = load_synthesizers(c, c.model_dir or ensure_default_model())
        log.info("loaded %d model instance(s) for %d session(s) on %s in %.1f s", len(out),
                 c.max_sessions, c.backend, time.perf_counter() - start)
        return out

    # ---- validation (any thread) -------------------------------------------------------------
    def prepare(self, request: SynthesisRequest) -> SynthesisRequest:
        """``request`` validated against the loaded model (seed fixed, voice resolved, text
        split), before it takes a place. Blocking (the text frontend); run off the loop.

        Raises:
            InputError and subclasses (EmptyTextError, UnknownSpeakerError): a bad request.
            NotReady: no model loaded.
        """
        return self.validate(request)[0]

    def validate(self, request: SynthesisRequest) -> tuple[SynthesisRequest, int]:
        """:meth:`prepare`, also returning the number of text segments (for :meth:`enter`).
        While it runs (a prompt or source recording goes through the prompt models) the
        running requests are not alone: their chunks do not feed the quiet rate."""
        with self._lock:
            self._validating += 1
            self._mark_shared()
        try:
            state = self.synth.engine.start(request)
            state.program.close()  # validation only: nothing ran, no LLM session was opened
        finally:
            with self._lock:
                self._validating -= 1
        return state.request, state.total_segments

    def _mark_shared(self) -> None:
        """Under _lock: when more than one request is in the pool (running, validating or
        stopping), none of the running ones is alone until its next chunk."""
        if len(self._started) + self._validating + self._stopping > 1:
            for t in self._started:
                t.shared = True

    # ---- admission (event loop) --------------------------------------------------------------
    def enter(self, request: SynthesisRequest | None = None, segments: int = 1,
              arrived: float | None = None) -> Ticket:
        """Reserve a place (running or queued) for ``request`` (validated; ``segments`` text
        segments) that arrived at clock time ``arrived`` (default now), or refuse it
        (:meth:`_judge`). The ticket is returned and also bound to the calling task (a context
        variable) for :meth:`acquire` and :meth:`start`. Without ``request`` only the count is
        checked (tests).

        Raises:
            Busy: draining, queue full, or, with other work in the pool, it would not finish
                before its deadline (503; ``retry_after``: the seconds it is late by, at most
                until the work admitted now is done and it would run alone).
            TooLong: even alone, at the quiet rate, it would take more than
                :data:`TOO_LONG_FACTOR` x the request timeout (400; only once
                :meth:`WorkEstimator.knows_quiet` its kind).
            NotReady: the model is not loaded.
        """
        now = self._open_now()
        arrived = now if arrived is None else arrived
        with self._lock:
            est = self.estimator
            ticket = Ticket(deadline=arrived + self.config.request_timeout, last=now)
            if request is not None:
                ticket.speech = est.speech_seconds(request, segments)
                ticket.units = 0.0 if request.num_speech_tokens else text_units(request.text)
                ticket.speed = request.speed
                ticket.kind = est.kind(request)
        self._judge(ticket, now)
        with self._lock:
            self._queued.append(ticket)
        self._admitted += 1
        _CURRENT_TICKET.set(ticket)
        return ticket

    def check(self, kind: str, speech_seconds: float, arrived: float | None = None) -> None:
        """Admission's answer for a request known only by a cheap size, before it is
        validated (a recording's trip through the prompt models can take tens of seconds on a
        loaded machine: a refusal should not wait for it). Reserves nothing; :meth:`enter`
        decides again on the validated request.

        Args:
            kind: the request's kind (:data:`KINDS`).
            speech_seconds: its expected seconds of speech at speed 1: for voice conversion
                the source recording's duration, otherwise what :meth:`rough_speech_seconds`
                gives (no more than :meth:`enter` will count, so this refuses nothing that
                :meth:`enter` would admit in the same state).
            arrived: clock time of arrival (default now).

        Raises: as :meth:`enter`.
        """
        now = self._open_now()
        arrived = now if arrived is None else arrived
        self._judge(Ticket(speech=max(0.0, speech_seconds), kind=kind,
                           deadline=arrived + self.config.request_timeout, last=now), now)

    def rough_speech_seconds(self, text: str, num_speech_tokens: int | None = None) -> float:
        """Expected seconds of speech of a text-to-speech request before validation: as
        :meth:`WorkEstimator.speech_seconds` with one text segment (a forced token count
        applies per segment, so this is a lower bound)."""
        with self._lock:
            est = self.estimator
            if num_speech_tokens:
                return num_speech_tokens / est.tokens_per_second
            return text_units(text) * est.speech_per_unit

    def _open_now(self) -> float:
        """The clock now, or Busy (draining) / NotReady (not loaded)."""
        if self.draining:
            self._refused("draining")
            raise Busy("server is shutting down; retry on another instance", retry_after=5,
                       reason="draining")
        if not self.ready.is_set():
            raise NotReady(f"model failed to load: {self.load_error}" if self.load_error
                           else "model is loading; retry shortly")
        return self.clock()

    def _judge(self, ticket: Ticket, now: float) -> None:
        """Admit ``ticket`` (return) or refuse it (raise), in this order:

        * queue full: Busy ``queue_full``;
        * never fits: the quiet estimate (speech x :meth:`WorkEstimator.quiet_rtf_of`, no
          margin) exceeds :data:`TOO_LONG_FACTOR` x the request timeout, once its kind
          :meth:`~WorkEstimator.knows_quiet`: TooLong (400);
        * an idle pool (nothing running or queued) admits: nothing is ahead, the request runs
          alone, and what the estimates cannot settle is bounded by the timeout (an idle
          server never answers 503: no client is told to retry into the same state);
        * otherwise, with :data:`MARGIN` x the estimate at the current rate
          (:meth:`WorkEstimator.rtf_of`, load included) after the estimated wait for a slot
          (the remaining work of the running requests and that of the queued ones, on
          ``max_sessions`` lanes): Busy ``deadline`` when it would end after its deadline
          (before :attr:`WorkEstimator.confident`, only when it must wait), with Retry-After
          at most the time until the work admitted now is done.
        """
        c = self.config
        with self._lock:
            est = self.estimator
            quiet = est.quiet_rtf_of(ticket.kind)
            alone = ticket.speech * quiet if quiet is not None else 0.0
            never_fits = est.knows_quiet(ticket.kind) and \
                alone > TOO_LONG_FACTOR * c.request_timeout
            lanes = self._lanes(now)
            wait, drained = min(lanes), max(lanes)
            running, queued = len(self._started), len(self._queued)
            need = ticket.speech * est.rtf_of(ticket.kind) * MARGIN
            confident = est.confident
        self._admission_gauges(wait)
        if self._admitted >= c.max_sessions + c.queue_size:
            self._refused("queue_full")
            raise Busy(f"server busy: {c.max_sessions} session(s) running and "
                       f"{c.queue_size} request(s) queued; retry later",
                       retry_after=self._seconds(self._first_free(now)), reason="queue_full")
        if never_fits:
            self._refused("too_long")
            raise TooLong(alone, c.request_timeout, ticket.speech, c.request_timeout / quiet,
                          source="source audio" if ticket.kind == "vc" else "text")
        if not running and not queued:
            return
        # before anything was measured the prior decides only against queued work
        late = now + wait + need - ticket.deadline if confident or wait > 0 else 0.0
        if late > 0:
            self._refused("deadline")
            # it runs alone, at the latest, once the work admitted now is done
            raise Busy(f"server busy: {running} request(s) running and {queued} queued, about "
                       f"{wait:.0f} s of work before a session is free; at the current load "
                       f"this request needs about {need:.0f} s and would not finish within "
                       f"the {c.request_timeout:g} s request timeout; retry later",
                       retry_after=self._seconds(min(late, max(drained, 1.0))),
                       reason="deadline")

    def leave(self, ticket: Ticket | None = None) -> None:
        """Give back a place reserved by :meth:`enter` that never got a session."""
        self._admitted -= 1
        ticket = ticket or _CURRENT_TICKET.get()
        with self._lock:
            if ticket in self._queued:
                self._queued.remove(ticket)

    def _remaining(self, t: Ticket) -> float:
        """Estimated wall seconds left of a started request (under _lock)."""
        left = max(t.speech - t.done, 0.1 * t.speech)
        return left * self.estimator.rtf_of(t.kind)

    def _lanes(self, now: float) -> list[float]:
        """Seconds until each of the ``max_sessions`` slots is free for a new request, with
        the queued requests placed (FIFO) on the earliest-free slot (under _lock)."""
        n = self.config.max_sessions
        lanes = sorted(self._remaining(t) for t in self._started)[:n]
        lanes += [0.0] * (n - len(lanes))
        for t in self._queued:
            i = lanes.index(min(lanes))
            lanes[i] += t.speech * self.estimator.rtf_of(t.kind)
        return lanes

    def _first_free(self, now: float) -> float:
        """Seconds until the first running request is estimated to finish."""
        with self._lock:
            running = [self._remaining(t) for t in self._started]
        return min(running) if running else 0.0

    def _seconds(self, value: float) -> int:
        """A Retry-After value: whole seconds, 1 .. request timeout."""
        return int(max(1, min(math.ceil(value), math.ceil(self.config.request_timeout))))

    def retry_after(self) -> int:
        """Seconds until a slot is estimated to free up (>= 1): the remaining work of the
        running request closest to its end, from the measured speed."""
        return self._seconds(self._first_free(self.clock()))

    def estimates(self) -> dict:
        """The admission estimator's numbers (for /ready)."""
        now = self.clock()
        with self._lock:
            est = self.estimator
            quiet = {k: (None if est.quiet_rtf_of(k) is None else round(est.quiet_rtf_of(k), 4))
                     for k in KINDS}
            return {"rtf": round(est.rtf, 4),
                    "prompt_rtf": round(est.rtf_of("prompt"), 4),
                    "vc_rtf": round(est.rtf_of("vc"), 4),
                    "quiet_rtf": quiet,
                    "speech_seconds_per_unit": round(self.estimator.speech_per_unit, 4),
                    "speech_tokens_per_second": est.tokens_per_second,
                    "measured_speech_seconds": round(self.estimator.measured_seconds, 2),
                    "backlog_seconds": round(min(self._lanes(now)), 2)}

    def _refused(self, reason: str) -> None:
        if self.metrics is not None:
            self.metrics.refused.labels(reason).inc()

    def _admission_gauges(self, wait: float) -> None:
        if self.metrics is not None:
            self.metrics.backlog_seconds.set(wait)
            self.metrics.estimated_rtf.set(self.estimator.rtf)

    async def acquire(self, timeout: float, stop: asyncio.Event,
                      ticket: Ticket | None = None) -> bool:
        """Wait for a free slot (after :meth:`enter`; ``ticket`` defaults to the one
        :meth:`enter` bound to this task). False when ``stop`` fired first. Raises
        :class:`Busy` (503, nothing ran) when ``timeout`` passes or, re-checked as the
        estimates change, when the ticket's deadline no longer leaves time for its estimated
        work (:data:`MARGIN` included). In those cases the place is given back."""
        if self._sem is None:
            self._sem = asyncio.Semaphore(self.config.max_sessions)
        ticket = ticket or _CURRENT_TICKET.get()
        self._waiting += 1
        self._gauges()
        give_up = self.clock() + max(0.0, timeout)
        get = asyncio.ensure_future(self._sem.acquire())  # one place in the semaphore's FIFO
        stopped = asyncio.ensure_future(stop.wait())
        done: set = set()
        late = False
        try:
            await asyncio.sleep(0)  # a free slot is taken before any deadline check
            while True:
                if get.done():
                    done = {get}
                    break
                now = self.clock()
                left = give_up - now
                if ticket is not None and ticket.speech > 0:
                    with self._lock:  # without measurements, only the timeout (as in enter)
                        if self.estimator.confident:
                            need = ticket.speech * self.estimator.rtf_of(ticket.kind) * MARGIN
                            left = min(left, ticket.deadline - need - now)
                if left <= 0:
                    late = True
                    break
                # re-check the deadline at least every second (the rate may change)
                done, _ = await asyncio.wait({get, stopped}, timeout=min(left, 1.0),
                                             return_when=asyncio.FIRST_COMPLETED)
                if done:
                    break
        finally:
            self._waiting -= 1
            stopped.cancel()
            self._gauges()
        if get in done:
            if ticket is not None:
                with self._lock:
                    if ticket in self._queued:
                        self._queued.remove(ticket)
                    ticket.started = ticket.last = self.clock()
                    ticket.cpu_last = self.cpu_clock()
                    ticket.shared = False
                    if ticket not in self._started:
                        self._started.append(ticket)
                    self._mark_shared()
            return True
        get.cancel()
        try:
            await get  # it may have completed right as we cancelled it
            self._sem.release()
        except asyncio.CancelledError:
            pass
        self.leave(ticket)
        if stopped in done and not late:
            return False
        self._refused("deadline")
        raise Busy("server busy: the work queued ahead of this request did not leave time "
                   "for it to finish within the request timeout; retry later",
                   retry_after=self.retry_after(), reason="deadline")

    def _release(self) -> None:
        self._admitted -= 1
        if self._sem is not None:
            self._sem.release()
        self._gauges()

    def _gauges(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(self._waiting)
            self.metrics.in_flight.set(self._running)

    # ---- jobs --------------------------------------------------------------------------------
    async def start(self, request: SynthesisRequest, cancel: threading.Event) -> "Job":
        """Submit ``request`` to the scheduler, after :meth:`acquire` returned True; returns the
        :class:`Job` to read its chunks from. The slot is released when the scheduler reports
        the request finished, or earlier by :meth:`detach`.

        A request admitted before draining began still runs (graceful shutdown drains the
        queue too), until :meth:`shutdown` closes the scheduler.

        Raises (the slot released first):
            Busy: the scheduler is closed (shutdown).
            NotReady: no model loaded.
            InputError: ``request`` is bad (not :meth:`prepare` d).
        """
        loop = asyncio.get_running_loop()
        job = Job(loop, cancel)
        job.ticket = _CURRENT_TICKET.get()
        with self._lock:
            self._running += 1
            self._jobs.add(job)
        self._gauges()
        scheduler = self.scheduler
        if scheduler is None:  # not loaded (acquire is only reached when ready)
            self._finish(job, ran=False)
            raise NotReady("model is loading; retry shortly")

        def submit() -> RequestHandle:
            return scheduler.submit(request, cancel=cancel,
                                    callback=lambda kind, value: self._on_event(job, kind,
                                                                                value))

        # Off the loop: submit validates and splits the text again (milliseconds for a long
        # text). Chunks may reach the job before this returns; they wait in its queue.
        submitted = loop.run_in_executor(None, submit)
        try:
            handle = await asyncio.shield(submitted)
        except asyncio.CancelledError:
            # We are abandoned, the submit is not: once (if) it is in, the cancel stops it at
            # its first step and its worker gives the slot back; a failed submit gives it here.
            cancel.set()
            submitted.add_done_callback(
                lambda f: self._finish(job, ran=False) if f.cancelled() or f.exception()
                else None)
            raise
        except BaseException as e:
            self._finish(job, ran=False)
            if isinstance(e, RuntimeError) and self.draining:  # scheduler closed under us
                raise Busy("server is shutting down", retry_after=5) from e
            raise
        job.handle = handle
        job.total = handle.total
        return job

    def _on_event(self, job: "Job", kind: str, value) -> None:
        """The handle's callback (a scheduler worker thread): chunk, done or error."""
        if kind == CHUNK:
            t = job.ticket
            if t is not None:
                now, cpu = self.clock(), self.cpu_clock()
                speech = value.duration * t.speed
                with self._lock:
                    # a detached job's last chunk is not a measure of a request alone
                    alone = not (t.shared or job.detached or self._validating
                                 or self._stopping) and len(self._started) == 1
                    self.estimator.observe_chunk(now - t.last, speech, t.kind, alone=alone,
                                                 cpu=cpu - t.cpu_last)
                    t.done += speech
                    t.last, t.cpu_last = now, cpu
                    t.shared = len(self._started) + self._validating + self._stopping > 1
                    rtf = self.estimator.rtf
                if self.metrics is not None:
                    self.metrics.estimated_rtf.set(rtf)
            job.emit("segment", value)
            return
        if kind == DONE:
            job.completed = True
            job.emit("end", None)
        elif isinstance(value, SynthesisCancelled):
            if self.metrics is not None:
                self.metrics.stopped_early.inc()
            job.emit("cancelled", None)
        else:
            log.error("synthesis failed", exc_info=value)
            job.emit("error", value)
        self._finish(job)

    def _finish(self, job: "Job", ran: bool = True) -> None:
        """The request left the scheduler (``ran``) or never got in: bookkeeping, then the slot
        goes back on the loop, unless :meth:`detach` gave it back already (then the job only
        stops counting as stopping). Any thread; once per job."""
        t = job.ticket
        with self._lock:
            if t is not None:
                if t in self._started:
                    self._started.remove(t)
                if t in self._queued:
                    self._queued.remove(t)
                if ran and job.completed:  # speech per text unit, from whole requests
                    self.estimator.observe_request(t.units, t.done)
            release = not job.released
            if release:
                job.released = True
                self._running -= 1
            else:
                self._stopping -= 1
            self._jobs.discard(job)
            running = self._running
        if self.metrics is not None:
            self.metrics.in_flight.set(running)
        # set before the slot goes back: whoever gets the slot sees this job finished
        job.finished.set()
        if not release:
            return
        try:
            job.loop.call_soon_threadsafe(self._release)
        except RuntimeError:  # loop already closed (shutdown)
            pass

    def detach(self, job: "Job") -> bool:
        """The response stops waiting for ``job`` (its stream is cut, it answered 504, its
        client is gone): cancel it and give its slot back now, without waiting for its worker
        to leave the stage call it is in (event-loop thread). The job then counts as stopping
        (:attr:`stopping`) until its worker reports it finished (:meth:`_finish` does the rest
        of its bookkeeping then: the estimator still gets what it measured). False when the
        job had finished already (nothing to do); safe to call more than once."""
        job.cancel.set()  # before the slot goes back: it stops at its next stage call
        with self._lock:
            if job.released:
                return False
            job.released = job.detached = True
            t = job.ticket
            if t is not None and t in self._started:
                self._started.remove(t)
            self._running -= 1
            self._stopping += 1
            self._mark_shared()  # the requests running beside it are not alone meanwhile
        self._release()
        return True

    @property
    def admitted(self) -> int:
        """Requests holding a place (running or queued; event-loop thread)."""
        return self._admitted

    @property
    def running(self) -> int:
        """Requests in the scheduler holding a slot (submitted, neither finished nor
        detached)."""
        return self._running

    @property
    def stopping(self) -> int:
        """Detached requests (:meth:`detach`) whose worker has not reported them stopped yet
        (it is finishing the stage call it was in)."""
        return self._stopping

    def cancel_all(self) -> None:
        """Cancel every request in the scheduler (each stops before its next step)."""
        with self._lock:
            jobs = list(self._jobs)
        for job in jobs:
            job.cancel.set()

    def shutdown(self, wait: bool = True) -> None:
        """Refuse new requests, cancel the running ones and stop the scheduler's workers
        (``wait``: until they have stopped)."""
        self.draining = True
        self.cancel_all()
        if self.scheduler is not None:
            self.scheduler.close(wait=wait)


class Job:
    """One request's synthesis, as seen from the event loop.

    Attributes:
        cancel: the request's cancel event (shared with its engine state; set it to stop).
        handle: the scheduler's :class:`~cosyvino.engine.RequestHandle` (after submit).
        total: number of text segments (chunks) to expect.
        finished: set once the request has left the scheduler.
        released: its slot was given back (by :meth:`SynthesisPool.detach` or at the end;
            under the pool's lock); ``detached``: by :meth:`~SynthesisPool.detach`, before
            its worker reported it finished.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, cancel: threading.Event):
        self.loop = loop
        self.cancel = cancel
        self.items: asyncio.Queue = asyncio.Queue()
        self.finished = threading.Event()
        self.handle: RequestHandle | None = None
        self.total = 1
        self.started = time.perf_counter()
        self.ticket: Ticket | None = None  # the admission ticket (estimates), if any
        self.completed = False
        self.released = False
        self.detached = False

    def emit(self, kind: str, value) -> None:
        """Post ``(kind, value)`` to the loop (any thread)."""
        try:
            self.loop.call_soon_threadsafe(self.items.put_nowait, (kind, value))
        except RuntimeError:  # loop closed: nobody is listening any more
            self.cancel.set()

    async def next(self, timeout: float, stop: asyncio.Event):
        """The next (kind, value): ``("segment", Audio)``, ``("end", None)``,
        ``("cancelled", None)``, ``("error", exc)``; ``("timeout", None)`` or
        ``("stopped", None)`` when ``timeout`` passed or ``stop`` fired first."""
        get = asyncio.ensure_future(self.items.get())
        stopped = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait({get, stopped}, timeout=max(0.0, timeout),
                                     return_when=asyncio.FIRST_COMPLETED)
        stopped.cancel()
        if get in done:
            return get.result()
        get.cancel()
        return ("stopped", None) if stopped in done else ("timeout", None)


def warm_up(synth) -> bool:
    """One short synthesis (4 speech tokens) with the first of the model's own voices that one
    of its modes takes alone (an SFT speaker; CosyVoice2 without SFT speakers: a spk2info
    prompt voice, zero-shot); False when there is none (a model without built-in voices, or
    whose modes take none of them on its own), then nothing runs. Raises what a synthesis
    raises for any other reason (a broken model fails at start, not on the first request)."""
    voices = getattr(synth, "voices", None)  # stand-ins (tests) may list speakers only
    names = list(synth.speakers) if voices is None else \
        [n for n, v in voices.items() if v.builtin]
    for name in names:
        try:
            synth.synthesize("Hello.", name, seed=0, num_speech_tokens=4)
        except InputError:  # no mode of this model takes that voice alone: the next one
            continue
        return True
    return False


def token_rate(synth) -> float:
    """Speech tokens per second of speech of ``synth``'s model
    (:attr:`cosyvino.Synthesizer.speech_token_rate`), or :data:`TOKENS_PER_SECOND` for one
    that does not say (a stand-in, a family without the rate)."""
    rate = getattr(synth, "speech_token_rate", None)
    return float(rate) if rate else TOKENS_PER_SECOND


def load_synthesizers(config, model_dir: str) -> list:
    """The model instances that serve ``config.max_sessions`` sessions of ``model_dir``
    (``config``: a :class:`~cosyvino.server.config.ServerConfig`): one
    :class:`~cosyvino.Synthesizer` shared by every session when its stages are thread-safe
    (their steps run in parallel), else one per session sharing the prompt models (~0.5 GB
    full size). All on the same voice store, so a voice registered through one is seen by
    all. Raises what :class:`~cosyvino.Synthesizer` raises (ModelDirError, BackendError...)."""
    from ..synthesizer import Synthesizer

    n = config.max_sessions
    voices = {} if config.voices_dir is None else {"voices_dir": config.voices_dir}
    first = Synthesizer(model_dir, backend=config.backend, num_threads=config.threads,
                        estimator_batch=getattr(config, "estimator_batch", 1),
                        **voices, **config.backend_options)
    if n == 1:
        return [first]
    if getattr(first.stages, "thread_safe", False):
        first.set_max_parallel(n)  # rebuilds the engine, with its estimator rendezvous
        return [first]
    return [first] + [Synthesizer(model_dir, backend=config.backend, num_threads=config.threads,
                                  prompt_encoder=first.prompt_encoder, **voices,
                                  **config.backend_options) for _ in range(n - 1)]
