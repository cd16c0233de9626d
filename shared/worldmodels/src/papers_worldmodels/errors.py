"""The one error the readers and checks of this package raise."""

from __future__ import annotations


class DataFormatError(ValueError):
    """The data do not have the layout, shapes or values expected; the message names the file,
    what was expected, what was found and how to fix it. ``user_facing`` tells the papers CLI to
    print it without a traceback."""

    user_facing = True
