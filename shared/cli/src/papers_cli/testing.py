"""Test helpers for paper projects: a real multi-process run of `train`, the resume check,
and a bad config.

    reference = json.loads((single_run_dir / "summary_rank0.json").read_text())
    summaries = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)

It runs the workspace's `train` console script (the same dispatcher a user runs) from the project
folder as a CPU DDP job (gloo backend), checks that every rank finished under DDP, optionally that
each rank trained the same model and logged the same metrics as a single-process run, and returns
each rank's ``summary_rank<k>.json``.

    check_resume(train, tiny_args, steps=8, root_dir=tmp_path)

trains 8 steps straight, and 4 steps, then resumes from that run's checkpoint for 4 more, and
fails unless parameters, optimizer state and the last logged metrics agree.

Floats: the resume check runs the same batches, shapes and thread count in one process on one
machine, so the runs are expected to agree exactly; its default rtol 1e-5 / atol 1e-6 is far
below what a state left out of the checkpoint changes. The DDP run checks shapes and metric
names against the single-process reference, not values: DDP sums gradients in another order
than one process, so a test that compares values across the two states its own tolerance.

    message = user_error_message(train, [*tiny_args, "--model.lr=-1"], capsys)

runs ``train`` in-process expecting the CLI's clean failure: exit 2 and one paragraph on stderr,
no traceback.

    stdout = run_train_test(PROJECT, args, checkpoint)

runs ``train test <args> --ckpt_path=<checkpoint>`` through the same dispatcher, as a user
evaluates a checkpoint, and returns what it printed (the test metrics table).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch


def train_script() -> Path:
    """The workspace's ``train`` console script (the dispatcher a user runs)."""
    return Path(sys.executable).with_name("train")


def run_train_test(
    project_dir: str | os.PathLike,
    args: Sequence[str],
    ckpt_path: str | os.PathLike,
    timeout: float = 300,
) -> str:
    """Run ``train test <args> --ckpt_path=<ckpt_path>`` from the project folder; return its
    stdout. Raises AssertionError with the tail of stderr when it fails."""
    result = subprocess.run(
        [str(train_script()), "test", *args, f"--ckpt_path={ckpt_path}"],
        cwd=project_dir,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"train test failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result.stdout


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
        str(train_script()),
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
    """Every rank ran under DDP with ``devices`` processes, drew its own noise and, given a
    single-process ``reference``, trained the same parameter shapes and logged the same metric
    names (not values: DDP reduces in another order than one process, so values agree only
    within a tolerance the calling test states)."""
    seeds = [summary.get("noise_seed") for summary in summaries]
    if devices > 1 and None not in seeds and len(set(seeds)) < len(seeds):
        raise AssertionError(f"ranks drew the same noise (last seeds {seeds})")
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


def check_resume(
    train: Callable[[list[str]], Any],
    args: Sequence[str],
    steps: int,
    root_dir: str | os.PathLike,
    *,
    rtol: float = 1e-5,
    atol: float = 1e-6,
    ignore_metrics: Sequence[str] = ("peak_memory", "per_sec", "time"),
) -> dict[str, float]:
    """Resuming continues exactly: ``steps`` straight vs ``steps // 2``, checkpoint, resume, rest.

    ``train(argv)`` is the project's ``train`` (it returns the CLI); ``args`` shrink its default
    config so that ``steps // 2`` ends an epoch: Lightning resumes mid-epoch exactly only from a
    stateful dataloader. Compares parameters, optimizer state, global step and the last logged
    metrics (except those whose names contain an ``ignore_metrics`` part: memory and timing) to
    ``rtol``/``atol`` (tensors; any other value, such as the step count or the learning rate in
    the optimizer state, must be equal); raises AssertionError naming what differs; returns the
    largest absolute difference per part. The three runs share the batches, shapes, thread count
    and machine, so they normally agree bit for bit (differences 0); a looser tolerance passed
    here needs a comment saying which part of the training is not reproducible bit for bit on
    one machine. The resumed run's logged metrics are only those logged after the
    resume, so a metric logged at some steps only (per task, per stage) must either be logged
    in the resumed half too or be named in ``ignore_metrics``.
    """
    root_dir = Path(root_dir)

    def fit(name: str, max_steps: int, *extra: str):
        return train(
            [
                "fit",
                *args,
                f"--trainer.max_steps={max_steps}",
                # Only max_steps may bound the runs: a run restored from an epoch-end checkpoint
                # counts that epoch twice, so a max_epochs bound would stop it one epoch early.
                "--trainer.max_epochs=-1",
                "--trainer.enable_checkpointing=true",
                f"--trainer.default_root_dir={root_dir / name}",
                *extra,
            ]
        )

    straight = fit("straight", steps)
    half = fit("half", steps // 2)
    per_epoch = half.trainer.num_training_batches
    if (steps // 2) % per_epoch:
        raise ValueError(
            f"steps // 2 = {steps // 2} is not a multiple of the {per_epoch} batches per epoch: "
            "pick steps (or limit_train_batches) so that the checkpoint ends an epoch"
        )
    checkpoint = half.trainer.checkpoint_callback
    path = checkpoint and (checkpoint.last_model_path or checkpoint.best_model_path)
    if not path:
        raise AssertionError(f"the {steps // 2}-step run wrote no checkpoint under {root_dir}")
    resumed = fit("resumed", steps, f"--ckpt_path={path}")
    problems: list[str] = []
    if resumed.trainer.global_step != straight.trainer.global_step:
        problems.append(
            f"global_step {resumed.trainer.global_step} after resuming, "
            f"{straight.trainer.global_step} straight"
        )
    differences = {
        "parameters": _compare(
            straight.model.state_dict(),
            resumed.model.state_dict(),
            "parameter",
            problems,
            rtol,
            atol,
        ),
        "optimizer": _compare(
            [o.state_dict() for o in straight.trainer.optimizers],
            [o.state_dict() for o in resumed.trainer.optimizers],
            "optimizer state",
            problems,
            rtol,
            atol,
        ),
        "metrics": _compare(
            _kept(straight.trainer.callback_metrics, ignore_metrics),
            _kept(resumed.trainer.callback_metrics, ignore_metrics),
            "logged metric",
            problems,
            rtol,
            atol,
        ),
    }
    if problems:
        raise AssertionError("resuming did not continue exactly:\n  " + "\n  ".join(problems))
    return differences


def _kept(metrics: Mapping[str, Any], ignore: Sequence[str]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if not any(part in k for part in ignore)}


def _compare(
    expected: Any,
    actual: Any,
    what: str,
    problems: list[str],
    rtol: float,
    atol: float,
    name: str = "",
) -> float:
    """Largest absolute difference between two nested structures of tensors and numbers;
    appends a line to ``problems`` for every mismatch in structure or value."""
    if isinstance(expected, Mapping) and isinstance(actual, Mapping):
        if set(expected) != set(actual):
            problems.append(
                f"{what} keys differ at {name or 'top'}: "
                f"{sorted(map(str, set(expected) ^ set(actual)))}"
            )
            return float("inf")
        return max(
            [
                _compare(expected[k], actual[k], what, problems, rtol, atol, f"{name}.{k}")
                for k in expected
            ],
            default=0.0,
        )
    if isinstance(expected, (list, tuple)) and isinstance(actual, (list, tuple)):
        if len(expected) != len(actual):
            problems.append(f"{what} lengths differ at {name}")
            return float("inf")
        return max(
            [
                _compare(e, a, what, problems, rtol, atol, f"{name}[{i}]")
                for i, (e, a) in enumerate(zip(expected, actual, strict=True))
            ],
            default=0.0,
        )
    if isinstance(expected, torch.Tensor) or isinstance(actual, torch.Tensor):
        e, a = torch.as_tensor(expected).double(), torch.as_tensor(actual).double()
        if e.shape != a.shape:
            problems.append(f"{what} {name}: shape {tuple(e.shape)} vs {tuple(a.shape)}")
            return float("inf")
        if not torch.allclose(e, a, rtol=rtol, atol=atol, equal_nan=True):
            difference = (e - a).abs().nan_to_num(0).max().item()
            problems.append(f"{what} {name}: differs by up to {difference:.3g}")
            return difference
        return (e - a).abs().nan_to_num(0).max().item() if e.numel() else 0.0
    if expected != actual:
        problems.append(f"{what} {name}: {expected!r} vs {actual!r}")
        return float("inf")
    return 0.0


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
