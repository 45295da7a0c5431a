"""The ``cosyvino`` command line: one module per command group (``main`` holds the group and the
small commands; ``convert``, ``bench``, ``quantize``, ``plan``, ``serve`` their own); ``errors``
turns typed errors into one line and exit status 2."""

from .main import main

__all__ = ["main"]
