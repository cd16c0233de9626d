"""Errors a user can fix are printed as one paragraph, not as a traceback."""

from __future__ import annotations

import contextlib
import os
import sys
import textwrap
from collections.abc import Iterator

TRACEBACK_ENV = "PAPERS_TRACEBACK"


class UserError(Exception):
    """Bad input or a missing file: the message says what to do. Exit status 2."""

    user_facing = True


class ConfigError(UserError, ValueError):
    """Values that each pass their type but not together, or not with the data: ``n`` larger
    than the classes in the data, a checkpoint whose shapes differ from the config, sizes that
    contradict each other. The message names the options and says what to change. Exit status 2.

    A ``ValueError`` too, so code that catches bad values directly (tests, claim scripts) still
    does when a check turns into a ConfigError.
    """


@contextlib.contextmanager
def user_errors() -> Iterator[None]:
    """Print exceptions marked ``user_facing`` (e.g. ``DatasetNotFoundError``) as a wrapped
    paragraph on stderr and exit with status 2; set ``PAPERS_TRACEBACK=1`` to see the trace."""
    try:
        yield
    except Exception as error:
        if not getattr(error, "user_facing", False) or os.environ.get(TRACEBACK_ENV):
            raise
        message = textwrap.fill(str(error), width=100)
        print(f"error: {message}", file=sys.stderr)
        print(f"(set {TRACEBACK_ENV}=1 to see the traceback)", file=sys.stderr)
        raise SystemExit(2) from None
