"""Test helpers for paper projects: a real multi-process run of `train`, and a bad config.

    reference = json.loads((single_run_dir / "summary_rank0.json").read_text())
    summaries = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)

It runs the workspace's `train` console script (the same dispatcher a user runs) from the project
folder as a CPU DDP job (gloo backend), checks that every rank finished under DDP, optionally that
each rank trained the same model and logged the same metrics as a single-process run, and returns
each rank's ``summary_rank<k>.json``.

    message = user_error_message(train, [*tiny_args, "--model.lr=-1"], capsys)

runs ``train`` in-process expecting the CLI's clean failure: exit 2 and one paragraph on stderr,
no traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def run_ddp_train(
    project_dir: str | os.PathLike,
    args: Sequence[str],
    root_dir: str | os.PathLike,
    devices: int = 2,
    timeout: float = 300,
    reference: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Run ``train <args>`` as a ``devices``-process DDP job on CPU; return every rank's summary.

    Raises AssertionError (with the tail of stderr) when the run fails, a rank left no summary or
    did not run under DDP with ``devices`` processes, or, given a single-process ``reference``
    summary, when a rank's parameter shapes or logged metric names differ from it.
    """
    root_dir = Path(root_dir)
    command = [
        str(Path(sys.executable).with_name("train")),
        *args,
        f"--trainer.default_root_dir={root_dir}",
        "--trainer.accelerator=cpu",
        f"--trainer.devices={devices}",
        "--trainer.strategy=ddp",
    ]
    result = subprocess.run(
        command,
        cwd=project_dir,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PL_DISABLE_FORK": "1"},
    )
    if result.returncode != 0:
        raise AssertionError(f"DDP train failed ({result.returncode}):\n{result.stderr[-3000:]}")
    paths = [root_dir / f"summary_rank{rank}.json" for rank in range(devices)]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise AssertionError(f"ranks left no summary: {missing}\n{result.stderr[-3000:]}")
    summaries = [json.loads(p.read_text()) for p in paths]
    check_summaries(summaries, devices, reference)
    return summaries


def check_summaries(
    summaries: Sequence[dict[str, Any]], devices: int, reference: dict[str, Any] | None = None
) -> None:
    """Every rank ran under DDP with ``devices`` processes and, given a single-process
    ``reference``, trained the same parameter shapes and logged the same metric names."""
    for rank, summary in enumerate(summaries):
        if summary["world_size"] != devices or summary["strategy"] != "DDPStrategy":
            raise AssertionError(f"rank {rank} ran {summary['strategy']} x{summary['world_size']}")
        if reference is None:
            continue
        if summary["parameter_shapes"] != reference["parameter_shapes"]:
            raise AssertionError(f"rank {rank} trained other parameter shapes than the reference")
        if summary["metrics"].keys() != reference["metrics"].keys():
            raise AssertionError(
                f"rank {rank} logged {sorted(summary['metrics'])}, "
                f"the reference {sorted(reference['metrics'])}"
            )


def user_error_message(train: Callable[[list[str]], Any], args: Sequence[str], capsys) -> str:
    """Run ``train(args)`` (a project's in-process entry point) and check that it fails as a
    user error should: exit status 2, one ``error:`` paragraph on stderr, no traceback. Returns
    the paragraph with its line breaks folded into spaces, for the caller to check the wording.

    ``capsys`` is pytest's fixture. Lines that Lightning logs before a failure inside ``fit``
    (one per line, no blank line) are part of the paragraph.
    """
    capsys.readouterr()  # only this run's output
    try:
        train(list(args))
    except SystemExit as exit_:
        code = exit_.code
    else:
        raise AssertionError(f"train accepted {list(args)[-1]!r}; expected exit status 2")
    err = capsys.readouterr().err.strip()
    if code != 2 or "Traceback" in err or "\n\n" in err or err.count("error:") != 1:
        raise AssertionError(f"expected exit 2 and one error paragraph, got {code}:\n{err}")
    return " ".join(err.split())
