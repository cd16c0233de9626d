"""Test helper for paper projects: a real multi-process run of `train`.

    summaries = run_ddp_train(PROJECT, [*tiny_args], tmp_path / "ddp")
    assert [s["world_size"] for s in summaries] == [2, 2]

It runs the workspace's `train` console script (the same dispatcher a user runs) from the project
folder as a CPU DDP job (gloo backend) and returns each rank's ``summary_rank<k>.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def run_ddp_train(
    project_dir: str | os.PathLike,
    args: Sequence[str],
    root_dir: str | os.PathLike,
    devices: int = 2,
    timeout: float = 300,
) -> list[dict[str, Any]]:
    """Run ``train <args>`` as a ``devices``-process DDP job on CPU; return every rank's summary.

    Raises AssertionError with the tail of stderr when the run fails or a rank left no summary.
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
    return [json.loads(p.read_text()) for p in paths]
