"""Server logging: a request id per HTTP request, one access-log line per request, and the two
log formats of ``cosyvino serve --log-format`` (``text``, ``json``). See docs/server.md,
"Logs and request ids".

* :class:`RequestIdMiddleware` (ASGI): takes the client's ``X-Request-ID`` when it is a
  usable id (1-128 printable ASCII characters, no spaces), else makes one (32 hex digits);
  holds it in :data:`request_id` (a ``ContextVar``, so every log record emitted while the
  request runs carries it), echoes it in the ``X-Request-ID`` response header and logs one
  access line on logger ``cosyvino.access`` when the response ends: method, path (no query
  string: ``/inference_sft`` carries text there), status (``None`` when the client left
  before the response started) and duration in milliseconds, arrival to the last byte. The
  probes and ``/metrics`` are logged at DEBUG (a Kubernetes kubelet polls them every few
  seconds), everything else at INFO.
* :class:`JsonFormatter`: one JSON object per line with ``ts`` (UTC, ISO 8601 with
  milliseconds), ``level``, ``logger``, ``message``, ``request_id`` (inside a request), the
  access fields on access lines and ``exc_info`` (the formatted traceback) when there is one.
* :class:`TextFormatter`: ``TIME LEVEL LOGGER: MESSAGE`` plus ``request_id=...`` inside a
  request.
* :func:`configure_logging`: installs one of them on the root logger (uvicorn's own loggers
  propagate to it: ``runner`` starts uvicorn with ``log_config=None``).
* :class:`DeliberateCutFilter` (on logger ``uvicorn.error``, :func:`install_cut_filter`):
  drops uvicorn's ``ASGI callable returned without completing response.`` ERROR for a
  response that the server cut on purpose (:func:`mark_deliberate_cut`; docs/server.md,
  "Streams that are cut"), which has its own WARNING already. ASGI has no message that ends an
  HTTP/1.1 body without its terminating chunk: returning without the last body message is the
  only way, and uvicorn reports every such return as an ERROR, so this filter is the narrow
  way out. The same message for any other response still goes through.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import sys
import time
import uuid
from datetime import datetime, timezone

#: the id of the HTTP request being handled (None outside a request)
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "cosyvino_request_id", default=None)
#: notes the response of the HTTP request being handled leaves for the log records written
#: after the app returned (uvicorn's, in the same task): a fresh dict per request, set by
#: :class:`RequestIdMiddleware` and never reset (each request runs in a task of its own; a
#: dict, so a response running in a copied context still writes to the request's one)
response_notes: contextvars.ContextVar[dict | None] = contextvars.ContextVar(
    "cosyvino_response_notes", default=None)
#: what uvicorn logs (ERROR, logger ``uvicorn.error``) when an app returns with its response
#: begun but not ended: what a deliberate cut of a chunked body is
INCOMPLETE_RESPONSE = "ASGI callable returned without completing response."

LOG_FORMATS = ("text", "json")
HEADER = "x-request-id"
#: what an incoming X-Request-ID may be (anything else is replaced by a generated id)
_USABLE_ID = re.compile(r"[\x21-\x7e]{1,128}")
#: paths whose access lines are DEBUG (probes and scrapes)
QUIET_PATHS = ("/health", "/ready", "/metrics")
#: the record attributes of an access line (``extra=``), in JSON output order
ACCESS_FIELDS = ("method", "path", "status", "duration_ms")

access_log = logging.getLogger("cosyvino.access")


def new_request_id() -> str:
    """A fresh request id: 32 lowercase hex digits (a random UUID4)."""
    return uuid.uuid4().hex


def usable_request_id(value: str | None) -> str | None:
    """``value`` when it can serve as a request id (1-128 printable ASCII characters, no
    whitespace), else None."""
    return value if value is not None and _USABLE_ID.fullmatch(value) else None


class RequestIdMiddleware:
    """ASGI middleware: request id (incoming ``X-Request-ID`` or a new one) in
    :data:`request_id` and the response header, and the access-log line. Put it outermost so
    every response (CORS preflights, errors) has the id."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = None
        for name, value in scope.get("headers", ()):
            if name == HEADER.encode():
                given = usable_request_id(value.decode("latin-1"))
                break
        rid = given or new_request_id()
        token = request_id.set(rid)
        response_notes.set({})  # not reset: read after we return (DeliberateCutFilter)
        start = time.perf_counter()
        status = None

        async def send_with_id(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = [(k, v) for k, v in message.get("headers", ()) if k != HEADER.encode()]
                headers.append((HEADER.encode(), rid.encode()))
                message = {**message, "headers": headers}
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            failed = True
            raise
        finally:
            path = scope.get("path", "")
            if status is None and failed:
                status = 500  # what the outer error middleware answers
            ms = round((time.perf_counter() - start) * 1000.0, 1)
            level = logging.DEBUG if path in QUIET_PATHS else logging.INFO
            method = scope.get("method", "")
            access_log.log(level, "%s %s %s %.1f ms", method, path,
                           status if status is not None else "-", ms,
                           extra={"method": method, "path": path, "status": status,
                                  "duration_ms": ms})
            request_id.reset(token)


def mark_deliberate_cut(reason: str) -> None:
    """Note that the response of the request being handled is cut on purpose (``reason``:
    a :data:`~.streaming.CUT_REASONS` value), so uvicorn's report of its incomplete body is
    not logged (:class:`DeliberateCutFilter`). No-op outside :class:`RequestIdMiddleware`."""
    notes = response_notes.get()
    if notes is not None:
        notes["cut"] = reason


class DeliberateCutFilter(logging.Filter):
    """Drops :data:`INCOMPLETE_RESPONSE` records of a response marked by
    :func:`mark_deliberate_cut`; every other record (that message for an unmarked response
    included: a real bug) passes."""

    def filter(self, record):
        if record.msg != INCOMPLETE_RESPONSE:
            return True
        notes = response_notes.get()
        return not (notes and notes.get("cut"))


def install_cut_filter() -> None:
    """Put one :class:`DeliberateCutFilter` on logger ``uvicorn.error`` (where uvicorn's
    HTTP protocols log; idempotent)."""
    logger = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, DeliberateCutFilter) for f in logger.filters):
        logger.addFilter(DeliberateCutFilter())


class _RequestIdFilter(logging.Filter):
    """Puts :data:`request_id` on every record (``record.request_id``, None outside a
    request)."""

    def filter(self, record):
        if getattr(record, "request_id", None) is None:
            record.request_id = request_id.get()
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the keys)."""

    def format(self, record):
        out = {"ts": datetime.fromtimestamp(record.created, timezone.utc)
               .isoformat(timespec="milliseconds").replace("+00:00", "Z"),
               "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        rid = getattr(record, "request_id", None)
        if rid is not None:
            out["request_id"] = rid
        for key in ACCESS_FIELDS:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``TIME LEVEL LOGGER: MESSAGE`` (+ `` request_id=ID`` inside a request)."""

    def __init__(self):
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record):
        line = super().format(record)
        rid = getattr(record, "request_id", None)
        return line if rid is None else f"{line} request_id={rid}"


def make_handler(log_format: str, stream=None) -> logging.Handler:
    """A stream handler (default stderr) with the formatter of ``log_format`` and the
    request-id filter. Raises ValueError for an unknown format."""
    if log_format not in LOG_FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; choose one of "
                         + ", ".join(LOG_FORMATS))
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    handler.addFilter(_RequestIdFilter())
    return handler


def configure_logging(log_format: str = "text", level: str = "info", stream=None) -> None:
    """Replace the root logger's handlers by one :func:`make_handler` handler at ``level``
    (``debug``/``info``/``warning``/``error``); uvicorn's loggers propagate to it."""
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(make_handler(log_format, stream))
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
