"""``friendly_errors``: typed cosyvino errors -> one-line message, exit status 2 (as the main
CLI does). For command modules registered into :mod:`cosyvino.cli`, which must not import it
(it imports them: ``python -m cosyvino.cli`` would otherwise import itself twice)."""

from __future__ import annotations

import sys
from functools import wraps

import click

from cosyvino.errors import CosyvinoError


def friendly_errors(fn):
    @wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except CosyvinoError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
    return wrapper
