"""``cosyvino serve``: OpenAI-compatible and CosyVoice-compatible HTTP service.

Needs the ``server`` extra (``pip install 'cosyvino[server]'``). See docs/server.md.
"""

from __future__ import annotations

from .config import ServerConfig, settings_from_plan

__all__ = ["ServerConfig", "settings_from_plan", "create_app", "run_server"]


def create_app(config: ServerConfig, synthesizers=None):
    """The FastAPI app (see :func:`cosyvino.server.routes.create_app`)."""
    from .routes import create_app as _create

    return _create(config, synthesizers)


def run_server(config: ServerConfig, host: str = "127.0.0.1", port: int = 8000, *,
               log_level: str = "info", graceful_timeout: float | None = None) -> None:
    """Serve until SIGINT/SIGTERM; then stop accepting, drain in-flight requests (up to
    ``graceful_timeout`` s, default the request timeout) and exit."""
    from .runner import run

    run(config, host, port, log_level=log_level, graceful_timeout=graceful_timeout)
