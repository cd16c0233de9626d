"""Hyper-parameters a LightningModule stores, given explicitly rather than read from a frame.

``LightningModule.save_hyperparameters()`` without arguments reads the calling ``__init__``'s
frame. The mutation lane (mutmut) wraps a mutated ``__init__`` in a trampoline, so Lightning then
reads the wrapper's frame, stores nothing, and every module test fails in mutmut's statistics
run. Projects therefore write, as the first statement after ``super().__init__()``::

    self.save_hyperparameters(init_arguments(locals()))

which also turns jsonargparse's ``PositiveInt``/``PositiveFloat`` (``int``/``float``
subclasses) into the builtin types, and paths into strings: a checkpoint loaded with
``weights_only=True`` (the torch default, and Lightning's resume) refuses any other class among
its hyper-parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import PurePath
from typing import Any

_NOT_ARGUMENTS = ("self", "__class__")


def builtin(value: Any) -> Any:
    """``value`` with int/float/str/bool subclasses made builtin and paths made ``str``, inside
    lists, tuples and dicts (a path argument is read back through ``Path(...)`` where used)."""
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, bool):
        return bool(value)
    for kind in (int, float, str):
        if isinstance(value, kind):
            return kind(value)
    if type(value) in (list, tuple):
        return type(value)(builtin(v) for v in value)
    if type(value) is dict:
        return {k: builtin(v) for k, v in value.items()}
    return value


def init_arguments(local_vars: Mapping[str, Any]) -> dict[str, Any]:
    """The arguments of an ``__init__`` from its ``locals()`` (taken before any other local is
    bound), without ``self`` and ``__class__``, as builtins (see the module docstring)."""
    return {k: builtin(v) for k, v in local_vars.items() if k not in _NOT_ARGUMENTS}
