"""The shared job runner of claim experiments: every fit of a ``reproduce`` goes through it.

A claim experiment is a list of jobs, one per (subject, params, seed, stage), each a call of a
top-level function ``fn(job, settings) -> value``::

    from papers_eval.jobs import Job, run_jobs, runner_options, summarise_jobs

    jobs = [Job("permflow", seed, {"lr": lr}, stage="tune") for lr in grid for seed in seeds]
    results = run_jobs(fit_one, jobs, settings=settings, cache_dir=RUNS / "jobs",
                       revision=code_revision(PROJECT), label="permflow",
                       **runner_options(args, default_workers=2))
    by_job = {r.job: r.value for r in results}   # or zip(jobs, results): same order as jobs
    record["jobs"] = summarise_jobs(results)      # per-job wall time and peak memory

``ClaimJobs`` binds those arguments once for a whole claim run (``run = ClaimJobs(fit_one,
args=args, settings=settings, cache_dir=..., revision=..., label="permflow")``; ``run(jobs)`` is
``{job: value}``, ``run.ran`` every result for ``summarise_jobs``).

What it does, the same way for every project:

- **Workers.** ``workers == 1`` runs the jobs in the calling process (no pool); ``workers > 1``
  in spawned processes (``multiprocessing.get_context("spawn")``: forking after torch started
  its thread pools can hang), each with ``threads`` torch threads (default 1) and
  ``OMP_NUM_THREADS`` / ``MKL_NUM_THREADS`` set to match. The in-process path sets the same torch
  thread count for the run and restores the caller's afterwards, so a job's result does not
  depend on the worker count. Results come back in the order of ``jobs``; a job listed twice
  runs once.
- **Progress.** On a terminal, a ``rich`` display (jobs done / total, the running jobs, elapsed
  time, ETA) with one line per finished job above it. Elsewhere (CI, a log file) plain lines: a
  start line with the totals, then one line per finished job, e.g.
  ``[12/40] permflow lr=0.001 seed=0 [tune]: 35.2 s``, and an end line. ``progress=None`` picks by
  terminal detection, ``True`` forces the display, ``False`` the plain lines.
- **Quiet fits.** Lightning's per-fit banners ("GPU available", "Seed set to", litlogger tips)
  and its common warnings are silenced inside the jobs (``quiet_lightning``), so a claim run's
  output is the progress and nothing else.
- **Cache.** With ``cache_dir`` (projects pass ``runs/<slug>/jobs/``) every finished job is
  stored at once, content-addressed by ``job_key``: sha256 of a canonical JSON of (label,
  function, subject, params, seed, stage, settings, revision). A rerun loads finished jobs
  instead of running them, so an interrupted ``reproduce`` continues where it stopped;
  ``fresh=True`` ignores the cache (and overwrites its entries). ``revision`` is the caller's
  code revision: projects pass ``papers_eval.record.code_revision(PROJECT)``, a hash of the
  project folder's code, ``shared/`` and the lock at ``HEAD`` plus their uncommitted diff, so a
  change to the code starts a new cache while a commit elsewhere in the repository (or of the
  project's own ``results/`` and README) keeps it. With ``git_revision`` (the commit) instead,
  every commit starts afresh and a ``+dirty`` revision cannot tell one uncommitted edit from the
  next: pass ``fresh=True`` (``reproduce --fresh``) after such edits.
- **Clusters.** ``scheduler="tcp://HOST:8786"`` sends the same jobs to a Dask cluster
  (``distributed.Client``); a ``Client``, or a cluster object with a ``scheduler_address`` (a
  ``LocalCluster``, dask-jobqueue's ``SLURMCluster``), is accepted too. Same cache, same
  progress. See the package README, "The job runner".

Peak memory (``JobResult.peak_memory_mb``, MiB) is the peak resident set size (RSS) of the
process that ran the job, sampled every ``MEMORY_SAMPLE_S`` seconds while the job ran (psutil),
plus once at its start and end. It includes what that process held already (the interpreter,
torch and Lightning once imported; with ``workers == 1`` also the caller's own data), so it
bounds the job's need from above; a spike shorter than the sampling interval can be missed. On a
Dask worker running several tasks at once (``--nthreads`` > 1) it mixes them: start workers with
``--nthreads 1``.

This module imports neither torch nor Lightning (nor rich or distributed) until a run needs them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import logging
import math
import multiprocessing
import numbers
import os
import pickle
import socket
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

# The loggers Lightning's per-fit banners go to ("GPU available: ...", "Seed set to 0", the
# litlogger / litmodels tips, "`Trainer.fit` stopped", "LOCAL_RANK: 0 - CUDA_VISIBLE_DEVICES"),
# for the unified package and the two standalone ones. The leaves matter: importing Lightning
# resets its top loggers to INFO, and a job may be what imports it.
LIGHTNING_LOGGERS = (
    "lightning.pytorch",
    "lightning.fabric",
    "lightning_fabric",
    "pytorch_lightning",
    "lightning.pytorch.utilities.rank_zero",
    "lightning.pytorch.accelerators.cuda",
    "lightning.pytorch.trainer.connectors.checkpoint_connector",
    "lightning.fabric.utilities.rank_zero",
    "lightning.fabric.utilities.seed",
    "lightning.fabric.utilities.distributed",
    "lightning_fabric.utilities.rank_zero",
    "lightning_fabric.utilities.seed",
    "pytorch_lightning.utilities.rank_zero",
)
# Warnings every quiet fit of a miniature raises and nobody acts on (regexes, matched at the
# start of the message; filters by category would need Lightning imported).
LIGHTNING_WARNINGS = (
    r".*does not have many workers",  # PossibleUserWarning: num_workers of a tiny in-memory set
    r".*GPU available but not used",
    r".*The number of training batches .* is smaller than the logging interval",
    r".*Trying to infer the `batch_size` from an ambiguous collection",
    r".*The `srun` command is available on your system but is not used",  # dask-jobqueue on SLURM
    r".*LightningCLI's args parameter is intended",  # quiet_fit passes args= under reproduce's argv
    r".*Starting from v1\.9\.0, `tensorboardX` has been removed",
    r".*isinstance\(treespec, LeafSpec\)",  # a torch deprecation inside Lightning's _pytree
    r".*litlogger",
    r".*litmodels",
    r".*You have overridden `transfer_batch_to_device` in `LightningModule`",  # a note, per fit
)
MEMORY_SAMPLE_S = 0.01  # the peak-RSS sampling interval
CACHE_SCHEMA = 1  # part of every cache key: a change of the entry format starts a new cache


# ----------------------------------------------------------------------------- jobs and results


@dataclass(frozen=True)
class Job:
    """One fit of a claim experiment. ``params`` must be JSON-able (they go into the cache key
    and the record); the job is hashable by its content."""

    subject: str  # e.g. "permflow", "sinkhorn", "oracle"
    seed: int
    params: Mapping[str, Any] = field(default_factory=dict)  # e.g. {"lr": 1e-3}
    stage: str = "test"  # e.g. "tune", "test", "replicate", "budget"

    def __post_init__(self) -> None:
        if not isinstance(self.subject, str) or not self.subject:
            raise ValueError(f"a job's subject is a non-empty string, not {self.subject!r}")
        if not isinstance(self.seed, numbers.Integral) or isinstance(self.seed, bool):
            raise TypeError(f"a job's seed is an integer, not {self.seed!r}")
        object.__setattr__(self, "seed", int(self.seed))  # numpy integers too
        if not isinstance(self.stage, str) or not self.stage:
            raise ValueError(f"a job's stage is a non-empty string, not {self.stage!r}")
        if not isinstance(self.params, Mapping):
            raise TypeError(f"a job's params are a mapping, not {type(self.params).__name__}")
        # A private copy (later edits of the caller's dict cannot change the job); checked now.
        object.__setattr__(self, "params", dict(self.params))
        canonical_json(self.params, what=f"params of job {self.subject!r}")

    # Equal and hashed by the canonical JSON the cache key uses: (1, 2) == [1, 2] as a param,
    # but 1 != 1.0 and 1 != True, as they are different jobs to the cache.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Job):
            return NotImplemented
        return canonical_json(self.as_dict()) == canonical_json(other.as_dict())

    def __hash__(self) -> int:
        return hash(canonical_json(self.as_dict()))

    @property
    def name(self) -> str:
        """For display: ``permflow lr=0.001 seed=0 [tune]``."""
        knobs = " ".join(f"{k}={_show(v)}" for k, v in self.params.items())
        return " ".join(p for p in (self.subject, knobs, f"seed={self.seed}") if p) + (
            f" [{self.stage}]"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "subject": self.subject,
            "params": dict(self.params),
            "seed": self.seed,
            "stage": self.stage,
        }


@dataclass
class JobResult:
    """One job's outcome, from a run now or from the cache."""

    job: Job
    value: Any  # what fn returned (picklable)
    wall_time_s: float  # of the original run when cached
    peak_memory_mb: float  # MiB: peak RSS of the process that ran it (module docstring)
    cached: bool  # came from the cache, not run now
    key: str = ""  # the cache key (job_key)


class JobError(RuntimeError):
    """A job raised; the message names it, the original exception is ``__cause__``."""

    def __init__(self, job: Job, error: BaseException) -> None:
        message = f"job {job.name} failed: {type(error).__name__}: {error}"
        if type(error).__name__ == "BrokenProcessPool":
            message += (
                " (its worker process died: out of memory, killed, or a crash in native code;"
                " the output above may say which)"
            )
        super().__init__(message)
        self.job = job


def _show(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, float):
        return format(value, "g")
    return json.dumps(_plain(value, "a param"), separators=(",", ":"))


def _plain(value: Any, what: str) -> Any:
    """``value`` as plain JSON types; a TypeError names what cannot be (no silent ``str()``,
    which could put an object's address into a cache key)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v, f"{what}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{what}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return sorted((_plain(v, what) for v in value), key=repr)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, enum.Enum):
        return _plain(value.value, what)
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        return _plain(value.tolist(), what)
    raise TypeError(f"{what} is a {type(value).__name__}, which is not JSON-able: {value!r}")


def canonical_json(value: Any, *, what: str = "value") -> str:
    """Sorted keys, no spaces, tuples as lists, paths as strings, numpy values as numbers."""
    return json.dumps(_plain(value, what), sort_keys=True, separators=(",", ":"))


def _function_name(fn: Callable[..., Any]) -> str:
    module = getattr(fn, "__module__", None) or type(fn).__module__
    qualname = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    return f"{module}.{qualname}"


def job_key(
    job: Job,
    *,
    settings: Mapping[str, Any] = {},  # noqa: B006 (read only)
    revision: str = "",
    label: str = "",
    function: str = "",
) -> str:
    """The cache key of a job: sha256 of a canonical JSON of everything its result depends on
    that the runner can see (the code itself only through ``revision``)."""
    payload = {
        "schema": CACHE_SCHEMA,
        "label": label,
        "function": function,
        **job.as_dict(),
        "settings": dict(settings),
        "revision": revision,
    }
    return hashlib.sha256(canonical_json(payload, what="the job").encode()).hexdigest()


# ----------------------------------------------------------------------------- quiet Lightning


def _silence_lightning() -> None:
    for name in LIGHTNING_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in LIGHTNING_WARNINGS:
        warnings.filterwarnings("ignore", message=message)


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's per-fit banners and tips (its loggers at WARNING) and its common
    warnings (``LIGHTNING_WARNINGS``) inside the block; real warnings and errors still show.

    Complements ``papers_cli.quiet_fit`` (which turns off the logger, checkpoints, model summary
    and progress bar of a fit); this does not import Lightning. On exit the warning filters are
    restored, and so is each logger level the block set, unless something (a first Lightning
    import) changed it meanwhile."""
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    before = [logger.level for logger in loggers]
    with warnings.catch_warnings():
        _silence_lightning()
        try:
            yield
        finally:
            for logger, level in zip(loggers, before, strict=True):
                if logger.level == logging.WARNING:
                    logger.setLevel(level)


# ----------------------------------------------------------------------------- running one job


class _PeakRSS:
    """Peak RSS of this process while the block runs, sampled by a thread (module docstring)."""

    def __enter__(self) -> _PeakRSS:
        import psutil

        self._process = psutil.Process()
        self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="peak-rss", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(MEMORY_SAMPLE_S):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)

    @property
    def mb(self) -> float:
        return self.peak / 2**20


def _thread_env(threads: int) -> dict[str, str]:
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def _set_torch_threads(threads: int | None, *, import_torch: bool = False) -> int | None:
    """Set torch's intra-op thread count and return the previous one. In a process that has not
    imported torch (a fresh worker), unless ``import_torch``, set ``OMP_NUM_THREADS`` and
    ``MKL_NUM_THREADS`` instead, which torch reads when a job imports it: a worker whose jobs
    never use torch does not pay for the import."""
    if threads is None:
        return None
    if "torch" not in sys.modules and not import_torch:
        os.environ.update(_thread_env(threads))
        return None
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency of papers-eval
        return None
    previous = torch.get_num_threads()
    if previous != threads:
        torch.set_num_threads(threads)
    return previous


def _execute(
    fn: Callable[[Job, Mapping[str, Any]], Any],
    job: Job,
    settings: Mapping[str, Any],
    threads: int | None,
) -> tuple[Any, float, float]:
    """Run one job where it is (this process, a pool worker or a Dask worker):
    (value, wall seconds, peak RSS MiB)."""
    _set_torch_threads(threads)
    with quiet_lightning(), _PeakRSS() as memory:
        start = time.perf_counter()
        value = fn(job, settings)
        wall = time.perf_counter() - start
    return value, wall, memory.mb


def _init_worker(threads: int | None) -> None:
    """A pool worker's initializer: one torch thread (by default), Lightning quiet."""
    _set_torch_threads(threads)
    _silence_lightning()


@contextlib.contextmanager
def _environ(**values: str) -> Iterator[None]:
    """Set environment variables for the block (spawned workers inherit them before they
    import anything), then restore them."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# ----------------------------------------------------------------------------- the cache


class _Cache:
    """One pickle (the value) and one JSON sidecar (what the job was, its time and memory) per
    finished job, both written to a temporary file and renamed into place; the sidecar is
    written last, so an entry without one (an interrupted write) does not count."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.unreadable = 0

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.folder / f"{key}.pkl", self.folder / f"{key}.json"

    def load(self, key: str, job: Job) -> JobResult | None:
        value_path, meta_path = self._paths(key)
        if not meta_path.exists():
            return None
        try:
            meta = json.loads(meta_path.read_text())
            if meta.get("key") != key:
                raise ValueError("the sidecar belongs to another key")
            with value_path.open("rb") as handle:
                value = pickle.load(handle)
        except Exception:  # a corrupt or partial entry: run the job again, overwrite it
            self.unreadable += 1
            return None
        return JobResult(
            job=job,
            value=value,
            wall_time_s=float(meta.get("wall_time_s", math.nan)),
            peak_memory_mb=float(meta.get("peak_memory_mb", math.nan)),
            cached=True,
            key=key,
        )

    def store(self, result: JobResult, about: Mapping[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        value_path, meta_path = self._paths(result.key)
        try:
            data = pickle.dumps(result.value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            raise TypeError(
                f"the value of job {result.job.name} cannot be pickled for the job cache "
                f"({type(error).__name__}: {error}); return plain data (numbers, arrays, a "
                "state_dict) or run without a cache_dir"
            ) from error
        meta = {
            "key": result.key,
            **about,
            "wall_time_s": round(result.wall_time_s, 3),
            "peak_memory_mb": round(result.peak_memory_mb, 1),
            "created": datetime.now(UTC).isoformat(timespec="seconds"),
            "host": socket.gethostname(),
        }
        _write_atomic(value_path, data)
        _write_atomic(meta_path, (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode())


def _write_atomic(path: Path, data: bytes) -> None:
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as out:
            out.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


# ----------------------------------------------------------------------------- progress


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "? s"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.2f} h"


def _use_display(progress: bool | None) -> bool:
    if progress is not None:
        return progress
    try:
        from rich.console import Console

        console = Console()
        return console.is_terminal and not console.is_dumb_terminal
    except Exception:  # pragma: no cover
        return sys.stdout.isatty()


class _Progress:
    """Plain lines, or a rich display with the same lines above it."""

    def __init__(
        self, total: int, to_run: int, display: bool, running_word: str, parallel: int | None
    ) -> None:
        self.total, self.to_run, self.done, self.ran = total, to_run, 0, 0
        self.parallel = parallel  # jobs at a time; None: unknown (a Dask cluster)
        self.ran_wall = 0.0
        self.running: dict[str, str] = {}  # key -> name
        self.running_word = running_word
        self.display = display
        self.start = time.perf_counter()
        self._live: Any = None

    def begin(self) -> None:
        """Open the display (after the cached jobs' lines, so they do not count in its speed)."""
        if not self.display or self._live is not None:
            return
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )
        from rich.text import Text

        outer = self

        class _Display(Progress):
            def get_renderables(self) -> Iterator[Any]:
                yield self.make_tasks_table(self.tasks)
                names = list(outer.running.values())
                if names:
                    shown = ", ".join(names[:3]) + (
                        f" and {len(names) - 3} more" * (len(names) > 3)
                    )
                    yield Text(f"{outer.running_word}: {shown}", overflow="ellipsis", no_wrap=True)

        self._live = _Display(
            TextColumn("jobs"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            transient=True,  # the lines above it say everything once the run ends
        )
        self._live.start()
        self._task = self._live.add_task("jobs", total=self.total, completed=self.done)

    def line(self, text: str) -> None:
        if self._live is not None:
            self._live.console.print(text, markup=False, highlight=False)
        else:
            print(text, flush=True)

    def started(self, key: str, job: Job) -> None:
        self.running[key] = job.name
        self._refresh()

    def finished(self, key: str, result: JobResult) -> None:
        self.running.pop(key, None)
        self.done += 1
        tail = " (cached)"
        if not result.cached:
            self.ran += 1
            self.ran_wall += result.wall_time_s
            elapsed = time.perf_counter() - self.start
            if self.parallel:  # from the jobs' own times: worker start-up does not count
                left = self.ran_wall / self.ran * (self.to_run - self.ran) / self.parallel
            else:
                left = elapsed / self.ran * (self.to_run - self.ran)
            tail = f"  ({_duration(elapsed)} elapsed, about {_duration(left)} left)"
            if self.ran == self.to_run:
                tail = f"  ({_duration(elapsed)} elapsed)"
        self.line(
            f"[{self.done}/{self.total}] {result.job.name}: {_duration(result.wall_time_s)}{tail}"
        )
        self._refresh()

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._task, completed=self.done, refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


# ----------------------------------------------------------------------------- backends


_Todo = Sequence[tuple[str, Job]]  # (cache key, job)
_Done = Callable[[str, Job, Any, float, float], None]  # (key, job, value, wall s, memory MiB)


def _run_here(
    fn: Callable[..., Any],
    todo: _Todo,
    settings: Mapping[str, Any],
    threads: int | None,
    done: _Done,
    progress: _Progress,
) -> None:
    """In this process, one job after the other, with ``threads`` torch threads: set now and
    restored afterwards when torch is already imported; otherwise through the environment while
    the jobs run (a job that imports torch then keeps that thread count in this process)."""
    lazy = threads is not None and "torch" not in sys.modules
    with _environ(**(_thread_env(threads) if lazy else {})):
        previous = _set_torch_threads(threads)
        try:
            for key, job in todo:
                progress.started(key, job)
                try:
                    value, wall, memory = _execute(fn, job, settings, threads)
                except Exception as error:
                    raise JobError(job, error) from error
                done(key, job, value, wall, memory)
        finally:
            _set_torch_threads(previous)


def _run_pool(
    fn: Callable[..., Any],
    todo: _Todo,
    settings: Mapping[str, Any],
    threads: int | None,
    workers: int,
    done: _Done,
    progress: _Progress,
) -> None:
    """At most ``workers`` jobs in flight, so "running" is exact and a failure stops the rest:
    the jobs already running finish (and are cached), no new one starts."""
    context = multiprocessing.get_context("spawn")  # forking after torch started can hang
    env = {} if threads is None else _thread_env(threads)
    queue = iter(todo)
    running: dict[Future, tuple[str, Job]] = {}
    failure: tuple[Job, BaseException] | None = None
    with (
        _environ(**env),
        ProcessPoolExecutor(
            min(workers, len(todo)),
            mp_context=context,
            initializer=_init_worker,
            initargs=(threads,),
        ) as pool,
    ):

        def submit_next() -> None:
            for key, job in queue:
                running[pool.submit(_execute, fn, job, settings, threads)] = (key, job)
                progress.started(key, job)
                return

        try:
            for _ in range(min(workers, len(todo))):
                submit_next()
            while running:
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    key, job = running.pop(future)
                    try:
                        value, wall, memory = future.result()
                    except Exception as error:
                        progress.running.pop(key, None)
                        if failure is None:
                            failure = (job, error)
                            if running:
                                progress.line(
                                    f"{job.name} failed ({type(error).__name__}); waiting for "
                                    f"the {len(running)} running job(s) to finish"
                                )
                        continue
                    done(key, job, value, wall, memory)
                    if failure is None:
                        submit_next()
        except BaseException:  # Ctrl-C: do not wait for queued work
            pool.shutdown(wait=False, cancel_futures=True)
            raise
    if failure is not None:
        raise JobError(*failure) from failure[1]


def _dask_client(scheduler: Any) -> tuple[Any, bool]:
    """(client, whether this call owns it and must close it)."""
    from distributed import Client

    if isinstance(scheduler, Client):
        return scheduler, False
    if isinstance(scheduler, str) or hasattr(scheduler, "scheduler_address"):
        return Client(scheduler), True
    raise TypeError(
        "scheduler is an address (tcp://HOST:8786), a distributed.Client or a cluster object "
        f"with a scheduler_address, not a {type(scheduler).__name__}"
    )


def _run_dask(
    fn: Callable[..., Any],
    todo: _Todo,
    settings: Mapping[str, Any],
    threads: int | None,
    scheduler: Any,
    done: _Done,
    progress: _Progress,
) -> None:
    """Every job submitted at once (the scheduler balances them); results are cached as they
    arrive. On a failure the jobs not yet finished are cancelled (a task already running on a
    worker runs to its end there; its result is dropped)."""
    from distributed import as_completed

    client, owned = _dask_client(scheduler)
    try:
        futures = {}
        for key, job in todo:
            # pure=False: a rerun (fresh=True) must run again, never reuse a held result.
            future = client.submit(_execute, fn, job, settings, threads, pure=False)
            futures[future] = (key, job)
            progress.started(key, job)
        for future in as_completed(list(futures)):
            key, job = futures[future]
            try:
                value, wall, memory = future.result()
            except Exception as error:
                client.cancel([f for f in futures if not f.done()])
                raise JobError(job, error) from error
            done(key, job, value, wall, memory)
    finally:
        if owned:
            client.close()


# ----------------------------------------------------------------------------- run_jobs


def run_jobs(
    fn: Callable[[Job, Mapping[str, Any]], Any],
    jobs: Sequence[Job],
    *,
    settings: Mapping[str, Any] = {},  # noqa: B006 (read only)
    workers: int = 1,
    cache_dir: str | Path | None = None,
    fresh: bool = False,
    scheduler: Any = None,
    revision: str = "",
    label: str = "",
    progress: bool | None = None,
    threads: int | None = 1,
) -> list[JobResult]:
    """Run ``fn(job, settings)`` for every job; return one ``JobResult`` per job, in order.

    ``fn`` is a top-level (picklable) function; its value must be picklable for ``workers > 1``,
    a scheduler or a cache. ``settings`` is passed to every call and is part of the cache key
    (JSON-able). ``workers``: 1 runs here, more in spawned processes; ignored with a
    ``scheduler`` (a ``tcp://`` address, a ``distributed.Client``, or a cluster object).
    ``threads``: torch threads per job (None leaves them alone). ``cache_dir``: where finished
    jobs are kept (None: no cache); ``fresh``: ignore it. ``revision`` and ``label`` (the
    project) go into the cache key. ``progress``: None picks by terminal detection, True the
    rich display, False plain lines. A job that raises stops the run with a ``JobError`` naming
    it; the jobs finished before it stay cached.
    """
    jobs = list(jobs)
    for job in jobs:
        if not isinstance(job, Job):
            raise TypeError(f"run_jobs takes papers_eval.jobs.Job objects, not {job!r}")
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    settings = dict(settings)
    canonical_json(settings, what="settings")
    function = _function_name(fn)
    keys = [
        job_key(job, settings=settings, revision=revision, label=label, function=function)
        for job in jobs
    ]
    unique = dict(zip(keys, jobs, strict=True))  # first occurrence of each key, in order
    if not unique:
        return []
    cache = _Cache(cache_dir) if cache_dir is not None else None
    results: dict[str, JobResult] = {}
    if cache is not None and not fresh:
        for key, job in unique.items():
            found = cache.load(key, job)
            if found is not None:
                results[key] = found
    todo = [(key, job) for key, job in unique.items() if key not in results]
    where = (
        f"on the Dask scheduler {scheduler if isinstance(scheduler, str) else ''}".rstrip()
        if scheduler is not None
        else f"on {min(workers, len(todo))} worker processes"
        if min(workers, len(todo)) > 1
        else "in this process"
    )
    about = {"label": label, "function": function, "revision": revision, "settings": settings}

    progress_ = _Progress(
        len(unique),
        len(todo),
        _use_display(progress),
        "in the cluster" if scheduler is not None else "running",
        None if scheduler is not None else max(1, min(workers, len(todo))),
    )
    try:
        head = f"jobs{f' [{label}]' if label else ''}: {len(unique)}"
        if cache is not None:
            head += f", {len(results)} cached in {cache.folder}"
            if cache.unreadable:
                head += f" ({cache.unreadable} unreadable entries run again)"
            if fresh:
                head += " (--fresh: the cache is ignored)"
            elif revision.endswith("dirty"):
                head += " (uncommitted changes: the cache cannot tell edits apart; --fresh reruns)"
        head += f", {len(todo)} to run {where}" if todo else ", nothing to run"
        progress_.line(head)
        for result in results.values():
            progress_.finished(result.key, result)
        progress_.begin()

        def done(key: str, job: Job, value: Any, wall: float, memory: float) -> None:
            result = JobResult(job, value, wall, memory, cached=False, key=key)
            if cache is not None:
                cache.store(result, {**about, "job": job.as_dict()})
            results[key] = result
            progress_.finished(key, result)

        if todo:
            if scheduler is not None:
                _run_dask(fn, todo, settings, threads, scheduler, done, progress_)
            elif workers > 1 and len(todo) > 1:
                _run_pool(fn, todo, settings, threads, workers, done, progress_)
            else:
                _run_here(fn, todo, settings, threads, done, progress_)
        ran = sum(not r.cached for r in results.values())
        progress_.line(
            f"jobs done: {len(unique)} ({ran} run, {len(unique) - ran} cached) in "
            f"{_duration(time.perf_counter() - progress_.start)}"
        )
    finally:
        progress_.close()
    return [dataclasses.replace(results[key], job=job) for key, job in zip(keys, jobs, strict=True)]


# ----------------------------------------------------------------------------- the record


def summarise_jobs(results: Sequence[JobResult]) -> dict[str, Any]:
    """What the record keeps of a run's jobs (JSON-able): counts (run now vs cached), wall time
    in total and per job, the largest peak memory, per-stage totals and one row per job.
    A job listed twice counts once. Cached jobs report the wall time of their original run."""
    unique: dict[Job, JobResult] = {}
    for result in results:
        unique.setdefault(result.job, result)
    rows = list(unique.values())

    def totals(subset: list[JobResult]) -> dict[str, Any]:
        walls = [r.wall_time_s for r in subset if math.isfinite(r.wall_time_s)]
        memory = [r.peak_memory_mb for r in subset if math.isfinite(r.peak_memory_mb)]
        return {
            "jobs": len(subset),
            "ran": sum(not r.cached for r in subset),
            "cached": sum(r.cached for r in subset),
            "wall_time_s": round(sum(walls), 1),
            "wall_time_s_ran": round(sum(r.wall_time_s for r in subset if not r.cached), 1),
            "max_job_wall_time_s": round(max(walls), 1) if walls else None,
            "peak_memory_mb": round(max(memory), 1) if memory else None,
        }

    stages = dict.fromkeys(r.job.stage for r in rows)
    return {
        **totals(rows),
        "per_stage": {s: totals([r for r in rows if r.job.stage == s]) for s in stages},
        "per_job": [
            {
                "name": r.job.name,
                **_plain(r.job.as_dict(), "a job"),
                "wall_time_s": round(r.wall_time_s, 2) if math.isfinite(r.wall_time_s) else None,
                "peak_memory_mb": round(r.peak_memory_mb, 1)
                if math.isfinite(r.peak_memory_mb)
                else None,
                "cached": r.cached,
            }
            for r in rows
        ],
    }


class ClaimJobs:
    """``run_jobs`` bound to one claim run, the wrapper every ``claim.py`` would otherwise write.

    It holds the job function, the settings, the cache folder, the code revision, the label and
    reproduce's shared flags (``runner_options``). Calling it with a batch of jobs runs (or loads
    from the cache) each one and returns ``{job: value}``; ``results`` returns the ``JobResult``
    list instead. Every result lands in ``ran``, in order, for the record
    (``summarise_jobs(runner.ran)``). ``settings=`` on a call overrides the bound settings for
    that batch (a claim whose stages use different settings)."""

    def __init__(
        self,
        fn: Callable[[Job, Mapping[str, Any]], Any],
        *,
        args: Any,
        cache_dir: str | Path,
        revision: str,
        label: str,
        settings: Mapping[str, Any] | None = None,
        default_workers: int = 2,
        threads: int | None = 1,
    ) -> None:
        self.fn = fn
        self.settings = settings
        self.options = runner_options(args, default_workers=default_workers)
        self.cache_dir, self.revision, self.label = cache_dir, revision, label
        self.threads = threads
        self.ran: list[JobResult] = []

    def results(
        self, jobs: Sequence[Job], settings: Mapping[str, Any] | None = None
    ) -> list[JobResult]:
        settings = self.settings if settings is None else settings
        if settings is None:
            raise ValueError(f"{self.label}: no settings bound and none given for this batch")
        done = run_jobs(
            self.fn,
            jobs,
            settings=settings,
            cache_dir=self.cache_dir,
            revision=self.revision,
            label=self.label,
            threads=self.threads,
            **self.options,
        )
        self.ran.extend(done)
        return done

    def __call__(
        self, jobs: Sequence[Job], settings: Mapping[str, Any] | None = None
    ) -> dict[Job, Any]:
        return {r.job: r.value for r in self.results(jobs, settings)}


def runner_options(args: Any, *, default_workers: int) -> dict[str, Any]:
    """``{workers, fresh, scheduler}`` for ``run_jobs`` from reproduce's shared flags
    (``--jobs N``, ``--fresh``, ``--scheduler ADDRESS``): ``--jobs`` unset means
    ``default_workers``, or 1 with ``--quick`` (starting processes costs more than it saves)."""
    jobs = getattr(args, "jobs", None)
    if jobs is None:
        jobs = 1 if getattr(args, "quick", False) else default_workers
    if int(jobs) < 1:
        raise ValueError(f"--jobs must be at least 1, not {jobs}")
    return {
        "workers": int(jobs),
        "fresh": bool(getattr(args, "fresh", False)),
        "scheduler": getattr(args, "scheduler", None) or None,
    }
