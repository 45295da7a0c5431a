"""uvicorn wiring: the server object that marks the pool as draining on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import time

import uvicorn

from .config import ServerConfig
from .logs import configure_logging
from .routes import create_app

log = logging.getLogger("cosyvino.server")


class DrainingServer(uvicorn.Server):
    """uvicorn server that drains before it stops (docs/server.md, "Graceful shutdown").

    On SIGTERM with ``ServerConfig.shutdown_delay`` > 0, first the delay: ``/ready`` turns 503
    at once but everything else is served as before, new connections and syntheses included,
    so a load balancer (a Kubernetes Service's endpoints) stops sending traffic before the
    listener closes. Then (at once on SIGINT, or without a delay) the drain: ``/ready`` is
    503 and new syntheses get 503 + Retry-After
    + ``Connection: close``; the listening socket closes (new connections are refused) but
    open connections stay open, so a request on a keep-alive connection gets that 503 rather
    than a reset. Admitted requests (running and queued) run to the end, for at most
    ``ServerConfig.drain_seconds``; then uvicorn's own shutdown closes the idle connections,
    whatever is left is cancelled and the process exits with status 0 (the signal is not
    re-raised: a drain is the normal way to stop). A second signal (during the delay or the
    drain) stops at once.
    """

    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.cosyvino_state = state
        self.drain_cut = 0  # requests still admitted when the drain time ran out
        self.drain_at: float | None = None  # monotonic time the delayed drain starts

    def handle_exit(self, sig, frame):
        state = self.cosyvino_state
        pool = state.pool
        if self.should_exit or self.drain_at is not None:  # second signal: stop now
            self.force_exit = True
            self.should_exit = True
            pool.draining = True
            pool.cancel_all()
            return
        state.stopping = True  # /ready: 503 from now on
        delay = state.config.shutdown_delay
        if delay > 0 and sig == signal.SIGTERM:
            log.info("SIGTERM: not ready; serving for %g s more, then draining", delay)
            self.drain_at = time.monotonic() + delay
            return
        self._start_drain()

    def _start_drain(self) -> None:
        self.cosyvino_state.pool.draining = True
        self.should_exit = True  # not recorded in _captured_signals: exit 0, not -sig

    async def on_tick(self, counter: int) -> bool:
        if self.drain_at is not None and not self.should_exit \
                and time.monotonic() >= self.drain_at:
            self._start_drain()
        return await super().on_tick(counter)

    def stop_on_load_failure(self, error: BaseException) -> None:
        """Stop serving (the model failed to load); called from the loader thread."""
        log.error("stopping: the model failed to load (%s)", error)
        self.cosyvino_state.pool.draining = True
        self.should_exit = True

    async def shutdown(self, sockets=None) -> None:
        pool = self.cosyvino_state.pool
        pool.draining = True
        for server in getattr(self, "servers", []):
            server.close()  # stop accepting; open connections keep being served (503)
        limit = self.cosyvino_state.config.drain_seconds
        deadline = time.monotonic() + limit
        if pool.admitted:
            log.info("draining %d admitted request(s) (at most %g s)", pool.admitted, limit)
        while pool.admitted and not self.force_exit and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        self.drain_cut = pool.admitted
        if self.drain_cut:
            log.warning("drain time (%g s) over: cancelling %d request(s)", limit,
                        self.drain_cut)
            pool.cancel_all()
        # uvicorn's shutdown: idle connections closed, the rest waited for (briefly: the
        # requests are done or cancelled), then the lifespan stops the scheduler
        self.config.timeout_graceful_shutdown = max(1.0, deadline - time.monotonic())
        await super().shutdown(sockets)

    @property
    def port(self) -> int | None:
        """The bound port (useful with port 0)."""
        for server in getattr(self, "servers", []) or []:
            for sock in server.sockets:
                return sock.getsockname()[1]
        return None


def make_server(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, *,
                synthesizers=None, log_level: str = "info",
                graceful_timeout: float | None = None) -> DrainingServer:
    """The server for ``config``; ``graceful_timeout`` overrides ``config.drain_timeout``."""
    if graceful_timeout is not None:
        config = dataclasses.replace(config, drain_timeout=graceful_timeout)
    app = create_app(config, synthesizers)
    # logging is ours (logs.configure_logging in run(); the access line is
    # logs.RequestIdMiddleware's): uvicorn's loggers propagate to the root logger
    ucfg = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          log_config=None, access_log=False,
                          timeout_graceful_shutdown=config.drain_seconds)
    server = DrainingServer(ucfg, app.state.cosyvino)
    app.state.cosyvino.on_load_failed = server.stop_on_load_failure
    return server


class ModelLoadFailed(Exception):
    """The server stopped because its model failed to load; ``__cause__`` is the error."""


def run(config: ServerConfig, host: str, port: int, *, log_level: str = "info",
        graceful_timeout: float | None = None) -> None:
    """Serve until a signal stops the server. Raises :class:`ModelLoadFailed` (from the
    loader's exception) when the model fails to load: the server stops at once, since a
    server that can never become ready would otherwise answer 503 ``not_ready`` forever."""
    configure_logging(config.log_format, log_level)
    server = make_server(config, host, port, log_level=log_level,
                         graceful_timeout=graceful_timeout)
    server.run()
    error = server.cosyvino_state.pool.load_error
    if error is not None:
        raise ModelLoadFailed(f"model failed to load: {error}") from error
