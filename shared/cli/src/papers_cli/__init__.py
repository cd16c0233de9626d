"""The ``train`` / ``reproduce`` dispatchers and the LightningCLI base of every paper project.

- ``train`` and ``reproduce`` (console scripts): find the project you are in and run its entry
  point from the ``papers.train`` / ``papers.reproduce`` groups (see ``dispatch``).
- ``cli_main``: LightningCLI with the conventions every project shares (see ``lightning_cli``).
- ``quiet_fit``: one training run of a claim experiment through the real CLI, without logging.
- ``reproduce_parser``: the flags every ``reproduce`` shares (``--quick``, ``--seed``, ``--out``).

The names are loaded on first use (PEP 562): importing ``papers_cli.dispatch`` runs this file,
and the dispatcher must list the projects without importing torch and Lightning (seconds of CPU)
when it is called outside a project.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from papers_cli.errors import ConfigError, UserError, user_errors
    from papers_cli.hparams import init_arguments
    from papers_cli.lightning_cli import (
        PapersCLI,
        RunSummary,
        cli_main,
        quiet_fit,
        reproduce_parser,
    )
    from papers_cli.projects import Project, find_project, project_dir_of

# Public name -> the submodule that defines it.
_SUBMODULE_OF = {
    "ConfigError": "errors",
    "UserError": "errors",
    "user_errors": "errors",
    "init_arguments": "hparams",
    "PapersCLI": "lightning_cli",
    "RunSummary": "lightning_cli",
    "cli_main": "lightning_cli",
    "quiet_fit": "lightning_cli",
    "reproduce_parser": "lightning_cli",
    "Project": "projects",
    "find_project": "projects",
    "project_dir_of": "projects",
}

__all__ = [
    "ConfigError",
    "PapersCLI",
    "Project",
    "RunSummary",
    "UserError",
    "cli_main",
    "find_project",
    "init_arguments",
    "project_dir_of",
    "quiet_fit",
    "reproduce_parser",
    "user_errors",
]


def __getattr__(name: str) -> Any:
    submodule = _SUBMODULE_OF.get(name)
    if submodule is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{submodule}"), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
