"""uvicorn wiring: the server object that marks the pool as draining on SIGTERM/SIGINT."""

from __future__ import annotations

import logging

import uvicorn

from .routes import create_app
from .config import ServerConfig

log = logging.getLogger("cosyvino.server")


class DrainingServer(uvicorn.Server):
    """uvicorn server whose exit signal first flips /ready to 503 and refuses new syntheses
    (503 + Retry-After), while uvicorn drains the responses already in flight."""

    def __init__(self, config: uvicorn.Config, state):
        super().__init__(config)
        self.cosyvino_state = state

    def handle_exit(self, sig, frame):
        self.cosyvino_state.pool.draining = True
        super().handle_exit(sig, frame)

    def stop_on_load_failure(self, error: BaseException) -> None:
        """Stop serving (the model failed to load); called from the loader thread."""
        log.error("stopping: the model failed to load (%s)", error)
        self.cosyvino_state.pool.draining = True
        self.should_exit = True

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
    app = create_app(config, synthesizers)
    ucfg = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                          access_log=log_level == "debug",
                          timeout_graceful_shutdown=(graceful_timeout
                                                     if graceful_timeout is not None
                                                     else config.request_timeout))
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
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    server = make_server(config, host, port, log_level=log_level,
                         graceful_timeout=graceful_timeout)
    server.run()
    error = server.cosyvino_state.pool.load_error
    if error is not None:
        raise ModelLoadFailed(f"model failed to load: {error}") from error
