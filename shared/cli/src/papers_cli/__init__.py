"""The ``train`` / ``reproduce`` dispatchers and the LightningCLI base of every paper project.

- ``train`` and ``reproduce`` (console scripts): find the project you are in and run its entry
  point from the ``papers.train`` / ``papers.reproduce`` groups (see ``dispatch``).
- ``cli_main``: LightningCLI with the conventions every project shares (see ``lightning_cli``).
- ``quiet_fit``: one training run of a claim experiment through the real CLI, without logging.
- ``reproduce_parser``: the flags every ``reproduce`` shares (``--quick``, ``--seed``, ``--out``).
"""

from papers_cli.errors import ConfigError, UserError, user_errors
from papers_cli.lightning_cli import (
    PapersCLI,
    RunSummary,
    cli_main,
    quiet_fit,
    reproduce_parser,
)
from papers_cli.projects import Project, find_project, project_dir_of

__all__ = [
    "ConfigError",
    "PapersCLI",
    "Project",
    "RunSummary",
    "UserError",
    "cli_main",
    "find_project",
    "project_dir_of",
    "quiet_fit",
    "reproduce_parser",
    "user_errors",
]
