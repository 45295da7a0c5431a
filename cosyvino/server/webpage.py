"""The web page ``cosyvino serve`` serves (issue 18 item 5): a text box, voice picker, format,
seed and speed, "Speak" playing the audio as it streams (Web Audio), voice cloning from an
uploaded recording, an API-key field and the request's timings.

The page is four static files in ``cosyvino/server/web/`` (:data:`ASSETS`; no build step,
nothing loaded from elsewhere) served under ``/ui/``; ``/`` and ``/ui`` redirect there. The
files are public even when the server has an API key: they hold no data, and the page sends
the key the user types with its own API calls (``Authorization: Bearer``). Everything the page
shows comes from the existing API (``/ready``, ``/v1/audio/voices``, ``/v1/audio/speech`` with
``stream_format: "sse"``, ``/inference_zero_shot`` / ``_cross_lingual``).
"""

from __future__ import annotations

import hashlib
import logging
from importlib import resources

from fastapi import Request
from fastapi.responses import RedirectResponse, Response

from .errors import APIError

log = logging.getLogger("cosyvino.server")

#: the page's files (in ``cosyvino/server/web/``) and their Content-Type
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "app.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}

#: URL prefix of the page
PREFIX = "/ui/"

#: headers of every page file: the browser may run only the page's own script and style and
#: talk only to this server (``blob:`` for the finished audio's download link and playback);
#: no framing, no MIME sniffing; revalidate each load (ETag) so an upgraded server's page shows
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; media-src 'self' blob:; "
                               "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; "
                               "form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def load_assets() -> dict[str, bytes]:
    """The page's files as shipped in the package: ``{name: bytes}`` for every name of
    :data:`ASSETS` that exists (a broken install may lack some; :func:`add_web_routes` answers
    those with 500 ``web_page_missing`` rather than failing the whole server)."""
    folder = resources.files(__package__).joinpath("web")
    out = {}
    for name in ASSETS:
        try:
            out[name] = folder.joinpath(name).read_bytes()
        except (FileNotFoundError, NotADirectoryError, OSError):
            continue
    return out


def add_web_routes(app, state, config) -> None:
    """Register the web page's routes on ``app``: ``GET /`` and ``GET /ui`` redirect to
    ``/ui/`` (relative redirects, so a reverse proxy's path prefix is kept); ``GET /ui/`` is
    ``index.html``, ``GET /ui/<name>`` the other files of :data:`ASSETS` (with an ETag; a
    matching ``If-None-Match`` gets 304); ``GET /favicon.ico`` is ``favicon.svg`` (the page
    itself links ``favicon.svg``). Not in the OpenAPI schema; no API key needed.
    Another name under ``/ui/`` is a 404 in the API's error shape.

    Args:
        app: the FastAPI app of :func:`~cosyvino.server.routes.create_app`.
        state: its ``AppState`` (unused: the page reads everything over the API).
        config: its ``ServerConfig`` (unused, as ``state``).
    """
    del state, config
    files = load_assets()
    missing = [name for name in ASSETS if name not in files]
    if missing:
        log.error("web page files missing from the install (%s): the page at %s is "
                  "unavailable; reinstall cosyvino", ", ".join(missing), PREFIX)
    etags = {name: '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
             for name, data in files.items()}

    def serve(name: str, request: Request) -> Response:
        if name not in ASSETS:
            raise APIError(404, f"no page file {name!r} (the page is {PREFIX})",
                           code="not_found")
        if name not in files:
            raise APIError(500, f"the web page file {name!r} is missing from this install of "
                           "cosyvino (reinstall it)", type_="server_error",
                           code="web_page_missing")
        headers = {**SECURITY_HEADERS, "ETag": etags[name]}
        given = _etags(request.headers.get("if-none-match", ""))
        if etags[name] in given or "*" in given:
            return Response(status_code=304, headers=headers)
        return Response(files[name], media_type=ASSETS[name], headers=headers)

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    async def root():
        return RedirectResponse("ui/", status_code=307)

    @app.api_route("/ui", methods=["GET", "HEAD"], include_in_schema=False)
    async def ui_no_slash():
        return RedirectResponse("ui/", status_code=307)

    @app.api_route("/favicon.ico", methods=["GET", "HEAD"], include_in_schema=False)
    async def favicon(request: Request):
        # what a browser asks for on any page of this origin that names no icon (/docs,
        # /ready, ...): the page's icon (SVG, which browsers take under any name), not a 404
        return serve("favicon.svg", request)

    @app.api_route(PREFIX, methods=["GET", "HEAD"], include_in_schema=False)
    async def index(request: Request):
        return serve("index.html", request)

    @app.api_route(PREFIX + "{name}", methods=["GET", "HEAD"], include_in_schema=False)
    async def asset(name: str, request: Request):
        return serve(name, request)


def _etags(header: str) -> set[str]:
    """The entity tags of an ``If-None-Match`` header, weak ones compared as strong (the weak
    comparison RFC 9110 section 13.1.2 prescribes for it); ``*`` stays ``*``."""
    tags = set()
    for part in header.split(","):
        part = part.strip()
        if part.startswith("W/"):
            part = part[2:]
        if part:
            tags.add(part)
    return tags
