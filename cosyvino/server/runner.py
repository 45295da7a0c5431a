"""uvicorn wiring: the server object that marks the pool as draining on SIGTERM/SIGINT."""

from __future__ import annotations

import logging

import uvicorn

from .app import create_app
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
    return DrainingServer(ucfg, app.state.cosyvino)


def run(config: ServerConfig, host: str, port: int, *, log_level: str = "info",
        graceful_timeout: float | None = None) -> None:
    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    make_server(config, host, port, log_level=log_level,
                graceful_timeout=graceful_timeout).run()
