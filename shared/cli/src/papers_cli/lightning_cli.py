"""The LightningCLI base every paper project's ``train`` uses.

What it adds to ``lightning.pytorch.cli.LightningCLI``:
- ``fit`` is inserted when no subcommand is given (``uv run train`` == ``uv run train fit``);
- ``configs/default.yaml`` of the *project* (found from the module's file, never the working
  directory) is always loaded first; any ``--config`` layers on top of it;
- trainer defaults from ``papers_gpu`` (bf16-mixed on capable GPUs, 32-true on CPU, DDP on
  several GPUs), run outputs under ``runs/<slug>/``, a rich progress bar (dropped by
  ``--trainer.enable_progress_bar false``), Lightning's ThroughputMonitor (samples/s; MFU when
  the module defines ``flops_per_batch``), peak-memory logging and a ``summary_rank<k>.json``
  per process at the end of ``fit``;
- on every fit: per-step re-seeding from (seed, rank, epoch, batch) (``SeedEveryStep``: ranks
  draw different noise, resumed runs repeat the uninterrupted run), and a ``last.ckpt`` when a
  fit took no optimizer step (``FitEndCheckpoint``), so ``train test --ckpt_path`` always has
  something to load;
- ``save_config_kwargs={"overwrite": True}`` so reruns in the same folder do not fail;
- ``train test|validate|predict --ckpt_path`` with a missing file, or with a checkpoint whose
  shapes differ from the model the config builds, is a ``ConfigError``, not a traceback;
- user-facing errors (missing data, bad input) print one paragraph and exit 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Lightning 2.6 still calls jsonargparse APIs deprecated in 4.49; the notices are not
# actionable for users of `uv run train`, so they are silenced before jsonargparse loads.
os.environ.setdefault("JSONARGPARSE_DEPRECATION_WARNINGS", "off")

import torch  # noqa: E402
from lightning.pytorch import Callback, LightningModule, Trainer  # noqa: E402
from lightning.pytorch.callbacks import ProgressBar, RichProgressBar  # noqa: E402
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI  # noqa: E402

from papers_cli.errors import TRACEBACK_ENV, ConfigError, UserError, user_errors  # noqa: E402
from papers_cli.projects import find_project, project_dir_of  # noqa: E402
from papers_gpu import (  # noqa: E402
    PeakMemoryMonitor,
    SeedEveryStep,
    throughput_monitor,
    trainer_defaults,
)

SUBCOMMANDS = ("fit", "validate", "test", "predict")


class RunSummary(Callback):
    """Writes ``summary_rank<k>.json`` into the log folder when ``fit`` ends, on every rank:
    world size, steps, final logged metrics, parameter count and shapes, wall time, the
    checkpoint written and the seed of the rank's last noise draws.

    One file per process makes multi-process runs checkable: each rank must leave its own.
    """

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start = time.perf_counter()

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Loggers pick their version folder per process; rank 0's choice is the run's folder.
        folder = Path(trainer.strategy.broadcast(trainer.log_dir or trainer.default_root_dir))
        folder.mkdir(parents=True, exist_ok=True)
        summary = {
            "global_rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "strategy": type(trainer.strategy).__name__,
            "precision": str(trainer.precision),
            "global_step": trainer.global_step,
            "epoch": trainer.current_epoch,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1},
            "num_parameters": sum(p.numel() for p in pl_module.parameters()),
            "parameter_shapes": {n: list(p.shape) for n, p in pl_module.named_parameters()},
            "wall_time_s": round(time.perf_counter() - self._start, 3),
            "checkpoint": _checkpoint_path(trainer),
            "noise_seed": torch.initial_seed(),  # differs across ranks under SeedEveryStep
        }
        path = folder / f"summary_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(summary, indent=1) + "\n")


def _checkpoint_path(trainer: Trainer) -> str | None:
    """The newest checkpoint this fit wrote (last, else best), or None."""
    callback = trainer.checkpoint_callback
    if callback is None:
        return None
    return getattr(callback, "last_model_path", "") or callback.best_model_path or None


class FitEndCheckpoint(Callback):
    """Saves ``last.ckpt`` when a fit ends without having written any checkpoint.

    ModelCheckpoint saves only after optimizer steps, so a fit that never calls ``opt.step()``
    (a closed-form or EM fit under manual optimisation, where ``global_step`` stays 0) would
    leave nothing for ``train test --ckpt_path`` to load. Its fitted parameters are saved here.
    """

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        callback = trainer.checkpoint_callback
        if callback is None or trainer.fast_dev_run or _checkpoint_path(trainer):
            return
        path = Path(callback.dirpath or trainer.default_root_dir) / "last.ckpt"
        trainer.save_checkpoint(path)
        callback.last_model_path = str(path)


class PapersProgressBar(RichProgressBar):
    """Rich's bar, reading ``Epoch 3`` rather than ``Epoch 3/-2`` when ``max_steps`` (not
    ``max_epochs``) bounds the run."""

    def _get_train_description(self, current_epoch: int) -> str:
        if self.trainer.max_epochs not in (None, -1):
            return super()._get_train_description(current_epoch)
        return f"{f'Epoch {current_epoch}':{len(self.validation_description)}}"


class PapersArgumentParser(LightningArgumentParser):
    """Prints a bad argument or config as a short paragraph instead of the full usage dump."""

    def error(self, message: str, ex: Exception | None = None):
        if not self.exit_on_error or os.environ.get("JSONARGPARSE_DEBUG"):
            return super().error(message, ex)
        if os.environ.get(TRACEBACK_ENV):  # the stack, as for every other user-facing error
            raise argparse.ArgumentError(None, message) from ex
        print(
            f"error: {message}\n"
            "Check the flag or config key against `uv run train --help` (every option with its "
            "type, choices and default) and the project's configs/default.yaml; config files "
            "given with --config must exist and hold keys of the same names.",
            file=sys.stderr,
        )
        self.exit(2)


class PapersCLI(LightningCLI):
    """LightningCLI with the project's default config and the shared trainer defaults."""

    def __init__(
        self,
        model_class: Any = None,
        datamodule_class: Any = None,
        *,
        project_file: str | Path,
        args: Sequence[str] | None = None,
        trainer_defaults_override: dict[str, Any] | None = None,
        default_config: str = "default.yaml",
        **kwargs: Any,
    ) -> None:
        # MFU needs the module's FLOPs; without them samples/s is still logged, so the
        # monitor's reminder would only be noise in every project that has no FLOP count.
        warnings.filterwarnings("ignore", message=".*you need to define a `flops_per_batch`")
        project_dir = project_dir_of(project_file)
        project = find_project(project_dir)
        self.slug = project.slug if project else project_dir.name
        default_config = project_dir / "configs" / default_config
        if not default_config.is_file():
            raise UserError(
                f"The project's default config {default_config} is missing. Every project "
                f"ships configs/{default_config.name} (the CPU miniature); restore it from git "
                "or create it."
            )
        run_dir = str(Path("runs") / self.slug)
        defaults = {
            **trainer_defaults(),
            "default_root_dir": run_dir,
            "logger": default_logger(run_dir),
            "callbacks": [
                PapersProgressBar(leave=True),
                PeakMemoryMonitor(),
                throughput_monitor(),
                RunSummary(),
            ],
            **(trainer_defaults_override or {}),
        }
        parser_kwargs = {
            name: {"default_config_files": [str(default_config)]} for name in SUBCOMMANDS
        }
        if args is not None:
            args = _with_subcommand(list(args))
        else:
            sys.argv[1:] = _with_subcommand(sys.argv[1:])
        super().__init__(
            model_class,
            datamodule_class,
            trainer_defaults=defaults,
            parser_kwargs=parser_kwargs,
            save_config_kwargs={"overwrite": True},
            parser_class=PapersArgumentParser,
            args=args,
            **kwargs,
        )

    def _run_subcommand(self, subcommand: str) -> None:
        ckpt_path = self.config_init[subcommand].get("ckpt_path")
        if ckpt_path not in (None, "last", "best", "hpc") and not Path(ckpt_path).is_file():
            raise ConfigError(
                f"--ckpt_path {ckpt_path} is not a file. Checkpoints of `uv run train` are under "
                f"runs/{self.slug}/ (look for *.ckpt)."
            )
        try:
            super()._run_subcommand(subcommand)
        except RuntimeError as error:
            if "Error(s) in loading state_dict" not in str(error):
                raise
            lines = str(error).splitlines()
            detail = lines[1].strip() if len(lines) > 1 else "parameter names or shapes differ"
            raise ConfigError(
                f"The checkpoint {ckpt_path} does not fit the model this command built "
                f"({detail}). Build the model it was "
                "trained with: pass the same --config files and --model options, e.g. the "
                "config.yaml saved beside that run's logs."
            ) from error

    def _instantiate_trainer(self, config: dict[str, Any], callbacks: list[Callback]) -> Trainer:
        # A progress bar among the defaults would make `--trainer.enable_progress_bar false`
        # an error; every fit re-seeds per step and saves at least one checkpoint.
        if config.get("enable_progress_bar") is False:
            defaults = self.trainer_defaults.get("callbacks") or []
            self.trainer_defaults = {
                **self.trainer_defaults,
                "callbacks": [c for c in defaults if not isinstance(c, ProgressBar)],
            }
        return super()._instantiate_trainer(
            config, [*callbacks, SeedEveryStep(), FitEndCheckpoint()]
        )


def default_logger(save_dir: str) -> dict[str, Any]:
    """TensorBoard when it is installed, else CSV, both under ``<save_dir>/lightning_logs``
    (as a class path, the form LightningCLI accepts for defaults)."""
    try:
        import tensorboard  # noqa: F401

        logger = "TensorBoardLogger"
    except ImportError:
        logger = "CSVLogger"
    return {
        "class_path": f"lightning.pytorch.loggers.{logger}",
        "init_args": {"save_dir": save_dir},
    }


def _with_subcommand(argv: list[str]) -> list[str]:
    """Insert ``fit`` unless the first argument already names a subcommand."""
    return argv if argv and argv[0] in SUBCOMMANDS else ["fit", *argv]


def cli_main(
    model_class: Any = None,
    datamodule_class: Any = None,
    *,
    project_file: str | Path,
    args: Sequence[str] | None = None,
    cli_class: type[PapersCLI] = PapersCLI,
    **kwargs: Any,
) -> PapersCLI:
    """Run the project's LightningCLI (what ``uv run train`` calls). ``args=None`` reads argv.

    ``default_config="vision.yaml"`` (a keyword passed on to ``PapersCLI``) makes a second
    entry point of a project, with its own module and data, start from that file instead of
    ``configs/default.yaml``.

    ``cli_class`` may be a ``PapersCLI`` subclass (e.g. one whose ``add_arguments_to_parser``
    links data and model sizes). Extra keyword arguments go to ``LightningCLI``
    (e.g. ``subclass_mode_model=True``).
    """
    with user_errors():
        return cli_class(
            model_class, datamodule_class, project_file=project_file, args=args, **kwargs
        )


# One training run inside a claim experiment: no logger, checkpoints, summary, validation or bar.
QUIET_RUN_ARGS = (
    "--trainer.devices=1",
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_model_summary=false",
    "--trainer.limit_val_batches=0",
)


def quiet_fit(
    model_class: Any,
    datamodule_class: Any,
    *,
    project_file: str | Path,
    seed: int,
    config_files: Sequence[str | Path] = (),
    overrides: Sequence[str] = (),
    callbacks: Sequence[Any] = (),
    cli_class: type[PapersCLI] = PapersCLI,
    default_config: str = "default.yaml",
) -> PapersCLI:
    """Fit one configuration of a claim experiment through the project's real CLI, quietly.

    Order: ``config_files``, then ``QUIET_RUN_ARGS`` (so no config turns logging back on), then
    ``overrides`` (which may, deliberately). ``callbacks`` replace the interactive defaults.
    Nothing is written: no logger, no checkpoint and no ``runs/<slug>/config.yaml``, so a
    claim experiment leaves the working directory as it found it.
    """
    configs = [f"--config={path}" for path in config_files]
    return cli_main(
        model_class,
        datamodule_class,
        project_file=project_file,
        args=[*configs, f"--seed_everything={seed}", *QUIET_RUN_ARGS, *overrides],
        cli_class=cli_class,
        trainer_defaults_override={"callbacks": list(callbacks), "enable_progress_bar": False},
        save_config_callback=None,
        default_config=default_config,
    )


class _ReproduceParser(argparse.ArgumentParser):
    """Fills the default ``--out`` after parsing, when ``--quick`` is known."""

    def __init__(self, *args: Any, results: Path, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.results = results

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        parsed, rest = super().parse_known_args(args, namespace)
        if getattr(parsed, "out", None) is None:
            # A quick run must never overwrite the committed record of a full one.
            parsed.out = self.results / "quick" if parsed.quick else self.results
        return parsed, rest


def reproduce_parser(description: str, *, project_file: str | Path) -> argparse.ArgumentParser:
    """The flags every ``reproduce`` shares; add project-specific ones to the returned parser.

    ``--quick``: a seconds-long run of the same pipeline (tests use it); ``--seed`` / ``--seeds``;
    ``--out``: where ``claim.json``, ``claim.md`` and plots go (default: the project's results/,
    or results/quick/ for a quick run, which git ignores). ``--replicate``: judge the same checks
    on the spec's replication seeds and add that judgement to the record (claim protocol v3).
    ``--allow-dirty``: write a non-quick record from a tree with uncommitted changes (recorded).
    ``--jobs``, ``--fresh``, ``--scheduler``: the shared job runner (``papers_eval.jobs``): worker
    processes, ignore the cache of finished jobs, or send the jobs to a Dask scheduler.
    """
    results = project_dir_of(project_file) / "results"
    # "resolve": a project that still declares its own --jobs keeps working until it moves over.
    parser = _ReproduceParser(
        prog="reproduce", description=description, results=results, conflict_handler="resolve"
    )
    parser.add_argument("--quick", action="store_true", help="tiny budget, same pipeline")
    parser.add_argument("--seed", type=int, default=0, help="seed of a single-seed run")
    parser.add_argument("--seeds", type=int, nargs="+", help="several seeds (overrides --seed)")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output folder for claim.json, claim.md and plots "
        "(default: results/, or results/quick/ with --quick)",
    )
    parser.add_argument(
        "--replicate",
        action="store_true",
        help="also judge the checks on the replication seeds of configs/claim.yaml",
    )
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="write a full record from a tree with uncommitted changes (the record says so)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="worker processes, one torch thread each (default: the project's choice)",
    )
    parser.add_argument(
        "--fresh", action="store_true", help="ignore the cache of finished jobs under runs/"
    )
    parser.add_argument(
        "--scheduler",
        default=None,
        metavar="ADDRESS",
        help="send the jobs to a Dask scheduler, e.g. tcp://HOST:8786 (see papers-eval's README)",
    )
    return parser
