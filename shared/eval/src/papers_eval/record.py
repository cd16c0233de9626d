"""The results record every ``reproduce`` writes: ``claim.json`` and ``claim.md``.

Schema 2 (``write_claim`` / ``load_claim``) records a claim judged under the protocol of
``papers_eval.claim``: pre-registered checks, controls, seeds, per-seed values, intervals and a
computed verdict. Schema 1 (``write_results`` / ``load_results``: a ``criterion`` in words and a
``holds`` flag set by the project) is superseded; it stays only until the first six projects move
to the protocol, and ``load_claim`` refuses it with a message naming the change.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from papers_eval.table import markdown_table

RESULTS_FIELDS = (
    "project",
    "experiment",
    "claim",
    "criterion",
    "holds",
    "metrics",
    "seeds",
    "config",
    "git_revision",
    "hardware",
    "wall_time_s",
    "command",
    "created",
)


def git_revision(
    cwd: str | os.PathLike | None = None, ignore: str | os.PathLike | None = None
) -> str:
    """``HEAD``'s commit hash, with ``+dirty`` when tracked files have uncommitted changes.

    ``ignore`` (a folder) is left out of the check: a rerun rewriting ``results/`` is not a
    code change.
    """
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, check=True
        ).stdout.strip()
        exclude = [f":(exclude){Path(ignore).resolve()}"] if ignore is not None else []
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no", "--", ":/", *exclude],
            cwd=cwd,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return rev + ("+dirty" if dirty else "")


#: What a project's code is made of beside its own folder: the workspace packages and the lock.
CODE_INPUTS = ("shared", "uv.lock", "pyproject.toml")


def code_revision(project_dir: str | os.PathLike, *, inputs: Sequence[str] = CODE_INPUTS) -> str:
    """A hash of the code a project's claim run executes: the key of its job cache.

    ``git_revision`` changes with every commit, so a merge in another project (or committing
    this project's own new ``results/``) would start every cache afresh. This hashes instead the
    blob ids at ``HEAD`` of the project folder (its ``results/`` and Markdown files aside) and of
    ``inputs`` at the repository root where they exist (``shared/``, ``uv.lock``, the root
    ``pyproject.toml``), plus the uncommitted diff of those same paths (so two different
    uncommitted edits get two keys; untracked files are not seen). Returns 16 hex digits, or
    ``"unknown"`` outside a git checkout (the cache then cannot see code changes: use
    ``--fresh``).
    """
    project = Path(project_dir).resolve()

    def git(*argv: str) -> str:
        return subprocess.run(
            ["git", *argv], cwd=project, capture_output=True, text=True, check=True
        ).stdout

    try:
        root = Path(git("rev-parse", "--show-toplevel").strip())
        rel = project.relative_to(root).as_posix()
        prefix = "" if rel == "." else f"{rel}/"
        paths = [rel] + [name for name in inputs if prefix and (root / name).exists()]
        listing = git("ls-tree", "-r", "--full-tree", "HEAD", "--", *paths)
        kept = [
            line
            for line in listing.splitlines()
            if not line.split("\t", 1)[1].startswith(f"{prefix}results/")
            and not line.endswith(".md")
        ]
        skip = [f":(top,exclude){prefix}results", ":(top,exclude,glob)**/*.md"]
        tops = [f":(top){'' if path == '.' else path}" for path in paths]
        diff = git("diff", "HEAD", "--no-ext-diff", "--", *tops, *skip)
    except (OSError, subprocess.CalledProcessError, ValueError):
        return "unknown"
    digest = hashlib.sha256("\n".join(kept).encode())
    digest.update(b"\0" + diff.encode())
    return digest.hexdigest()[:16]


def hardware_info() -> dict[str, Any]:
    """What the numbers were measured on: CPU, core count, GPU, and library versions."""
    import torch

    info = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    return info


def provenance(
    out_dir: str | os.PathLike, command: str, start: float, argv: Sequence[str] | None = None
) -> dict[str, Any]:
    """Where a side experiment's numbers come from, for its results file: the code revision
    (``out_dir`` itself, being rewritten, does not count as a change), the hardware, the wall time
    since ``start`` (``time.perf_counter()``) and the command (``command`` followed by ``argv``,
    by default this process's arguments)."""
    args = sys.argv[1:] if argv is None else list(argv)
    return {
        "git_revision": git_revision(out_dir, ignore=out_dir),
        "hardware": hardware_info(),
        "wall_time_s": round(time.perf_counter() - start, 1),
        "command": " ".join([command, *args]),
    }


def _jsonable(value: Any) -> Any:
    """Plain JSON types; NaN/inf become None so the file stays strict JSON."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist"):  # numpy / torch scalars and arrays
        return _jsonable(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def write_results(
    out_dir: str | os.PathLike,
    *,
    project: str,
    experiment: str,
    claim: str,
    criterion: str,
    holds: bool,
    metrics: Mapping[str, Mapping[str, Any]],
    config: Mapping[str, Any],
    seeds: Sequence[int],
    wall_time_s: float,
    columns: Sequence[str] | None = None,
    headline: str = "",
    notes: str = "",
    extra: Mapping[str, Any] | None = None,
) -> Path:
    """Write a schema-1 ``claim.json`` and ``claim.md`` to ``out_dir`` (superseded by
    ``write_claim``).

    ``metrics`` maps method -> metric -> value (a float, or ``{"mean", "ci"}``); ``criterion``
    says in words and thresholds how ``holds`` was decided. Git revision, hardware, command and
    time stamp are filled in here so no project forgets them. ``headline`` is one line of the
    key numbers, formatted by the project from ``metrics``; the root README's table shows it.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "project": project,
        "experiment": experiment,
        "claim": claim,
        "criterion": criterion,
        "holds": bool(holds),
        "metrics": metrics,
        "seeds": list(seeds),
        "config": config,
        "git_revision": git_revision(out, ignore=out),
        "hardware": hardware_info(),
        "wall_time_s": round(float(wall_time_s), 1),
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    }
    if headline:
        record["headline"] = headline
    if extra:
        record["extra"] = extra
    path = out / "claim.json"
    path.write_text(json.dumps(_jsonable(record), indent=2) + "\n")
    hw = record["hardware"]
    device = ", ".join(hw["cuda_devices"]) or f"CPU ({hw['cpu_count']} cores)"
    md = [
        f"# {project}: {experiment}",
        "",
        f"**Claim.** {claim}",
        "",
        f"**Criterion.** {criterion}",
        "",
        f"**Holds in this run:** {'yes' if holds else 'no'}",
        "",
        markdown_table(metrics, columns),
        "",
        f"Command: `{record['command']}`; seeds {list(seeds)}; {device}; "
        f"torch {hw['torch']}; wall time {record['wall_time_s']} s; "
        f"git {record['git_revision']}.",
    ]
    if notes:
        md += ["", notes]
    (out / "claim.md").write_text("\n".join(md) + "\n")
    return path


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read a schema-1 ``claim.json`` and check it has every field of that record."""
    record = json.loads(Path(path).read_text())
    missing = [f for f in RESULTS_FIELDS if f not in record]
    if missing:
        raise ValueError(f"{path} is not a results record; missing fields: {missing}")
    return record
