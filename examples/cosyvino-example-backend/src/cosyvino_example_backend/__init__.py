"""Example cosyvino backend plugin ``logging-torch``: the built-in PyTorch backend with a timing
log line per stage call and a single-thread policy.

What makes it a plugin is only this module's ``register_backends`` hook and the entry point in
``pyproject.toml``; the backend itself reuses another registered backend (looked up by name, so
this package does not import cosyvino's built-in plugin modules).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time

import cosyvino
from cosyvino.backends import Backend, Capabilities
from cosyvino.families.cosyvoice1.stages import CosyVoice1Stages as Stages
from cosyvino.families.cosyvoice1.stages import LLMSession
from cosyvino.errors import BackendError
from cosyvino.plugins import get_backend

log = logging.getLogger(__name__)

#: the backend this one wraps
INNER = "torch"


class _TimedSession(LLMSession):
    def __init__(self, inner: LLMSession, owner: LoggingStages):
        self._inner, self._owner = inner, owner

    def forward(self, inputs_embeds):
        with self._owner.timed("llm_forward"):
            return self._inner.forward(inputs_embeds)

    def reset(self) -> None:
        self._inner.reset()

    def close(self) -> None:
        self._inner.close()


class LoggingStages(Stages):
    """Delegates every stage call to the wrapped :class:`Stages`, timing it.

    ``calls`` and ``seconds`` hold per-stage call counts and total wall time.
    """

    # one synthesis at a time per loaded model: the single-thread policy of this backend
    thread_safe = False

    def __init__(self, inner: Stages):
        self._inner = inner
        self.config = inner.config
        self.speakers = inner.speakers
        self.calls: dict[str, int] = {}
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def timed(self, stage: str):
        t0 = time.perf_counter()
        failed = True
        try:
            yield
            failed = False
        finally:
            dt = time.perf_counter() - t0
            with self._lock:
                self.calls[stage] = self.calls.get(stage, 0) + 1
                self.seconds[stage] = self.seconds.get(stage, 0.0) + dt
            log.debug("%s %.2f ms%s", stage, dt * 1e3, " (raised)" if failed else "")

    def _call(self, stage: str, *args):
        with self.timed(stage):
            return getattr(self._inner, stage)(*args)

    def encode_text(self, text_token):
        return self._call("encode_text", text_token)

    def embed_llm_speaker(self, embedding):
        return self._call("embed_llm_speaker", embedding)

    def embed_speech_tokens(self, tokens):
        return self._call("embed_speech_tokens", tokens)

    def llm_special_embeddings(self):
        return self._inner.llm_special_embeddings()

    def new_llm_session(self):
        return _TimedSession(self._inner.new_llm_session(), self)

    def flow_encode(self, tokens, embedding):
        return self._call("flow_encode", tokens, embedding)

    def length_regulate(self, h, interp):
        return self._call("length_regulate", h, interp)

    def estimate(self, x, mask, mu, t, spks, cond):
        return self._call("estimate", x, mask, mu, t, spks, cond)

    def vocoder_f0(self, mel):
        return self._call("vocoder_f0", mel)

    def vocoder_source(self, f0, phase, noise):
        return self._call("vocoder_source", f0, phase, noise)

    def vocoder_decode(self, mel, source):
        return self._call("vocoder_decode", mel, source)

    def close(self) -> None:
        self._inner.close()


class LoggingTorchBackend(Backend):
    """PyTorch eager fp32, one thread, with per-stage timing logs."""

    name = "logging-torch"
    description = "PyTorch eager fp32 with per-stage timing logs, one thread (example plugin)"

    @classmethod
    def is_available(cls):
        try:
            inner = get_backend(INNER)
        except BackendError as e:
            return False, f"needs the {INNER!r} backend: {e}"
        return inner.is_available()

    @classmethod
    def conversion_status(cls, model_dir, out_dir=None, *, weights="fp32"):
        return get_backend(INNER).conversion_status(model_dir, out_dir, weights=weights)

    @classmethod
    def convert(cls, model_dir, out_dir=None, progress=None, *, weights="fp32"):
        return get_backend(INNER).convert(model_dir, out_dir, progress, weights=weights)

    @classmethod
    def capabilities(cls, model_dir, probe=None) -> Capabilities:
        caps = get_backend(INNER).capabilities(model_dir, probe)
        # same files and speed as torch at one thread: never faster than torch, so the
        # planner picks it only through --backend logging-torch; its stages step LLM
        # sessions one by one (no batched decode: max_llm_batch 1) and take one request per
        # estimator call (max_estimator_batch 1)
        return dataclasses.replace(caps, thread_safe=False, max_llm_batch=1,
                                   max_estimator_batch=1,
                                   relative_speed=min(caps.relative_speed, 1.0),
                                   reason=f"{caps.reason} (via {INNER}, timing logs)")

    @classmethod
    def load(cls, model_dir: str, *, num_threads: int = 1, **options) -> Stages:
        return LoggingStages(get_backend(INNER).load(model_dir, num_threads=num_threads,
                                                     **options))


@cosyvino.hookimpl
def register_backends(register):
    register(LoggingTorchBackend)
