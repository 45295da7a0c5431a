"""The web page ``cosyvino serve`` serves (issue 18 item 5): filled in by :func:`add_web_routes`."""

from __future__ import annotations


def add_web_routes(app, state, config) -> None:
    """Register the web page's routes on ``app`` (``state``: the app's ``AppState``;
    ``config``: its ``ServerConfig``). Placeholder until the page exists."""
