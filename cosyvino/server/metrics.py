"""Prometheus metrics (own registry per app) and the ASGI middleware that records requests.

Besides the server's own metrics the registry holds prometheus_client's process metrics
(``process_cpu_seconds_total``, ``process_resident_memory_bytes``, ``process_open_fds``, ...;
Linux ``/proc``) and platform info (``python_info``), and the capacity gauges an autoscaler
reads: ``cosyvino_capacity_utilization`` = (running + queued requests) / ``cosyvino_sessions``
(above 1: requests wait for a session). See docs/server.md, "GET /metrics"."""

from __future__ import annotations

import time

from prometheus_client import (CollectorRegistry, Counter, Gauge, Histogram, PlatformCollector,
                               ProcessCollector)

_LATENCY_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128)
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 4, 8)


class Metrics:
    """All server metrics, in a registry of their own (several apps in one process)."""

    def __init__(self):
        r = self.registry = CollectorRegistry()
        self.requests = Counter("cosyvino_requests", "HTTP requests by endpoint and status",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("cosyvino_request_duration_seconds",
                                 "Arrival to last byte", ["endpoint"],
                                 buckets=_LATENCY_BUCKETS, registry=r)
        self.first_byte = Histogram("cosyvino_first_byte_seconds",
                                    "Arrival to first body byte", ["endpoint"],
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.rtf = Histogram("cosyvino_rtf", "Synthesis wall seconds / audio seconds per "
                             "request", buckets=_RTF_BUCKETS, registry=r)
        self.audio_seconds = Counter("cosyvino_audio_seconds", "Seconds of audio synthesized",
                                     registry=r)
        self.queue_depth = Gauge("cosyvino_queue_depth", "Requests waiting for a session",
                                 registry=r)
        self.in_flight = Gauge("cosyvino_in_flight", "Syntheses running on worker sessions",
                               registry=r)
        self.cache_hits = Counter("cosyvino_cache_hits", "Result cache hits", registry=r)
        self.cache_misses = Counter("cosyvino_cache_misses",
                                    "Result cache misses (seeded requests)", registry=r)
        self.cancelled = Counter("cosyvino_cancelled", "Syntheses cancelled", ["reason"],
                                 registry=r)
        self.streams_cut = Counter("cosyvino_streams_cut", "Responses cut after their headers "
                                   "went out (docs/server.md, 'Streams that are cut')",
                                   ["endpoint", "reason"], registry=r)
        self.stopped_early = Counter("cosyvino_stopped_early", "Syntheses whose worker stopped "
                                     "before the last segment (cancel seen)", registry=r)
        self.refused = Counter("cosyvino_refused", "Synthesis requests refused at admission",
                               ["reason"], registry=r)
        self.backlog_seconds = Gauge("cosyvino_backlog_seconds", "Estimated seconds until a "
                                     "new request would get a session", registry=r)
        self.estimated_rtf = Gauge("cosyvino_estimated_rtf", "Admission estimate: wall "
                                   "seconds per second of speech", registry=r)
        self.sessions = Gauge("cosyvino_sessions", "Configured concurrent synthesis sessions "
                              "(--max-sessions)", registry=r)
        self.capacity = Gauge("cosyvino_capacity_utilization", "(running + queued requests) "
                              "/ sessions; above 1 requests wait for a session", registry=r)
        self.llm_batch_rows = Gauge("cosyvino_llm_batch_rows", "Requests in the batched LLM "
                                    "decode step now (0 = none or batching off)", registry=r)
        self.llm_batch_mean_rows = Gauge("cosyvino_llm_batch_mean_rows", "Mean rows per "
                                         "batched LLM decode step so far", registry=r)
        self.llm_batch_steps = Gauge("cosyvino_llm_batch_steps", "Batched LLM decode steps "
                                     "so far", registry=r)
        self.estimator_batch_calls = Gauge(
            "cosyvino_estimator_batch_calls", "Estimator calls run through the rendezvous so "
            "far (0 = estimator batching off)", registry=r)
        self.estimator_batch_mean_requests = Gauge(
            "cosyvino_estimator_batch_mean_requests", "Mean requests per estimator call so "
            "far (batch 2 per request)", registry=r)
        self.estimator_batch_members = Gauge(
            "cosyvino_estimator_batch_members", "Requests inside a flow solve that may share "
            "estimator calls now", registry=r)
        self.first_chunk_holds = Gauge(
            "cosyvino_first_chunk_holds", "Waits of streaming requests' steps while a new "
            "request made its first chunk, so far (0 = none or the hold is off)", registry=r)
        self.first_chunk_held_seconds = Gauge(
            "cosyvino_first_chunk_held_seconds", "Seconds those waits took in all, so far",
            registry=r)
        self.build_info = Gauge("cosyvino_build_info", "Always 1; the labels say what runs",
                                ["version", "backend"], registry=r)
        ProcessCollector(registry=r)
        PlatformCollector(registry=r)

    def track_capacity(self, admitted, sessions: int) -> None:
        """Compute ``cosyvino_capacity_utilization`` at each scrape as ``admitted() /
        sessions`` (``admitted``: a callable giving running + queued requests) and set
        ``cosyvino_sessions``."""
        self.sessions.set(sessions)
        self.capacity.set_function(lambda: admitted() / sessions)

    def track_batching(self, stats) -> None:
        """Compute the ``cosyvino_llm_batch_*`` gauges at each scrape from ``stats()``: the
        scheduler's :meth:`~cosyvino.engine.Scheduler.batch_stats` (a list, one entry per
        engine, None where it does not batch), or [] before the model is loaded."""
        total = _combined(stats)
        self.llm_batch_rows.set_function(lambda: total("rows"))
        self.llm_batch_steps.set_function(lambda: total("steps"))
        self.llm_batch_mean_rows.set_function(lambda: total("mean_rows", max))

    def track_first_chunk_hold(self, stats) -> None:
        """Compute the ``cosyvino_first_chunk_*`` gauges at each scrape from ``stats()``: the
        scheduler's :attr:`~cosyvino.engine.Scheduler.hold_stats`, or None before the model
        is loaded."""
        def value(key):
            now = stats()
            return now[key] if now else 0
        self.first_chunk_holds.set_function(lambda: value("holds"))
        self.first_chunk_held_seconds.set_function(lambda: value("held_seconds"))

    def track_estimator_batching(self, stats) -> None:
        """Compute the ``cosyvino_estimator_batch_*`` gauges at each scrape from ``stats()``:
        a list of :meth:`~cosyvino.engine.rendezvous.CallRendezvous.stats` (one per loaded
        model, None where estimator calls are not batched)."""
        total = _combined(stats)
        self.estimator_batch_calls.set_function(lambda: total("calls"))
        self.estimator_batch_members.set_function(lambda: total("members"))
        self.estimator_batch_mean_requests.set_function(lambda: total("mean_members", max))


def _combined(stats):
    """``total(key, combine=sum)``: ``combine`` of ``key`` over the non-None dicts of
    ``stats()`` at call time (0 when there are none)."""
    def total(key, combine=sum):
        values = [s[key] for s in stats() if s]
        return combine(values) if values else 0
    return total


#: endpoint label values (anything else is "other": bounded label cardinality)
ENDPOINTS = ("/v1/audio/speech", "/v1/models", "/v1/audio/voices", "/inference_sft",
             "/inference_zero_shot", "/inference_cross_lingual", "/inference_instruct",
             "/inference_vc", "/health", "/ready", "/metrics",
             "/v1/audio/speech/stream-input")


class MetricsMiddleware:
    """Counts every HTTP response by endpoint/status; latency to the last byte and first-byte
    latency for responses with a body (streamed ones included)."""

    def __init__(self, app, metrics: Metrics):
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in ENDPOINTS else "other"
        start = time.perf_counter()
        state = {"status": None, "first": False}
        m = self.metrics

        async def wrapped_send(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body" and not state["first"] \
                    and message.get("body"):
                state["first"] = True
                m.first_byte.labels(endpoint).observe(time.perf_counter() - start)
            await send(message)

        try:
            await self.app(scope, receive, wrapped_send)
        finally:
            status = state["status"]
            m.requests.labels(endpoint, str(status) if status else "aborted").inc()
            m.latency.labels(endpoint).observe(time.perf_counter() - start)
