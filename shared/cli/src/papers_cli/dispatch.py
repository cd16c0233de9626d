"""``train`` and ``reproduce``: one console script each for the whole workspace.

All workspace members share one virtual environment, so a ``train`` script per project would
overwrite each other. These dispatchers instead read the project you are in (nearest
``pyproject.toml`` above the working directory) and call the function that project registered
under the entry-point group ``papers.train`` or ``papers.reproduce``, with the same arguments.
"""

from __future__ import annotations

import sys
from importlib.metadata import entry_points

from papers_cli.errors import user_errors
from papers_cli.projects import find_project, registered_projects, workspace_projects


def _usage(command: str, reason: str) -> str:
    names = sorted(set(registered_projects(f"papers.{command}")) | set(workspace_projects()))
    listing = "\n".join(f"  - {name}" for name in names) or "  (none found)"
    return (
        f"error: {reason}\n"
        f"`{command}` runs the paper project of the folder you are in. Projects:\n{listing}\n"
        f"Pick one with `cd projects/<slug> && uv run {command}` (or, from anywhere, "
        f"`uv run --package <slug> <slug>` for training)."
    )


def dispatch(command: str) -> int:
    """Run the ``papers.<command>`` entry point of the current project; 2 when there is none."""
    project = find_project()
    if project is None or project.is_workspace_root or project.name is None:
        print(_usage(command, "you are not inside a paper project."), file=sys.stderr)
        return 2
    matches = entry_points(group=f"papers.{command}", name=project.name)
    if not matches:
        reason = (
            f"'{project.name}' ({project.directory}) registers no `papers.{command}` entry point. "
            f"If it is a paper project that is not installed yet, run "
            f"`uv sync --package {project.name}`; shared packages have no `{command}`."
        )
        print(_usage(command, reason), file=sys.stderr)
        return 2
    with user_errors():  # e.g. a bad configs/claim.yaml: one paragraph and exit 2
        try:
            result = next(iter(matches)).load()()
        finally:
            close_process_group()
    return result if isinstance(result, int) else 0


def close_process_group() -> None:
    """Destroy a torch.distributed process group the run left open (Lightning's DDP keeps it
    after ``fit``). Left to interpreter shutdown, gloo's threads can abort a finished run with
    "terminate called without an active exception" (exit -6), about one CPU DDP run in six."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def train() -> None:
    sys.exit(dispatch("train"))


def reproduce() -> None:
    sys.exit(dispatch("reproduce"))
