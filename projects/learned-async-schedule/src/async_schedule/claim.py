"""The claim experiment (`uv run reproduce`), under the protocol of configs/claim.yaml.

Claim: the learned schedule (LAS: probe from the synchronous start, window average, freeze)
beats the synchronous schedule and matches (within 5%) the best hand-tuned asynchronous
schedule, at equal main-stage training, on the MNIST miniature whose semantic latent is a
global class-level code. Every subject runs on every seed through the real CLI:

- ``las``: the method, untuned (the paper's point: no grid search);
- ``synchronous`` (baseline): f = identity;
- ``power`` (baseline): f = tau^p, p tuned on validation (p = 1 is the synchronous baseline),
  with the same schedule-corrected lag weight as LAS;
- ``sfd`` (baseline): SFD's shifted path, D tuned on validation, with the same correction; SFD
  beating synchronous is the precondition ``asynchrony_pays``;
- ``zero_probe`` (negative control): LAS with a zero-length probe, i.e. its start schedule
  (numerically the identity) frozen: no learning of f, must fail;
- ``in_family_lag`` (positive control, in-family): the member of LAS's own 8-bin convex family
  closest to SFD's path at ``settings.hand_lag_sfd_delta`` (``core.fit_schedule_to_path``),
  frozen and trained like LAS's main stage: it must beat synchronous, or the miniature cannot
  reward any schedule LAS can express.

Quality = FD-digit (Frechet distance in a separately trained digit classifier's features) of
unconditional samples against the test digits; also precision / recall and the class coverage
(total variation between the evaluator's class histogram of the samples and of the real
digits). Tuning scores the same samples against the validation digits. The record also holds
the family's reach (Hausdorff distances between schedule paths), the probe run long from two
starts, the budget evidence and a diagnosis (``diagnose``).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from async_schedule.baselines import PowerSchedule, SFDShiftedPath
from async_schedule.core import (
    ConvexSchedule,
    fit_schedule_to_path,
    path_hausdorff,
    schedule_path,
)
from async_schedule.data import MultiRepDataModule
from async_schedule.evaluate import class_coverage_tv, digit_quality
from async_schedule.model import CURVE_GRID, AsyncDiffusionModule
from papers_cli import project_dir_of, quiet_fit, reproduce_parser
from papers_eval import (
    grid_edges,
    judge,
    load_claim_spec,
    run_seeds,
    tune,
    tuning_grids,
    write_claim,
)
from papers_eval.claim_record import Replication
from papers_eval.diagnosis import control_findings, finding
from papers_eval.jobs import (
    Job,
    JobResult,
    canonical_json,
    run_jobs,
    runner_options,
    summarise_jobs,
)
from papers_eval.mechanism import budget_evidence
from papers_eval.record import code_revision

PROJECT_DIR = project_dir_of(__file__)
JOBS_DIR = PROJECT_DIR.parents[1] / "runs" / "learned-async-schedule" / "jobs"
CLAIM_FILE = PROJECT_DIR / "configs" / "claim.yaml"
ABLATION_FILE = PROJECT_DIR / "configs" / "ablations.yaml"
SUBJECTS = ("las", "synchronous", "power", "sfd", "zero_probe", "in_family_lag")
METRICS = ("fd_digit", "val_fd_digit", "precision", "recall", "class_tv", "max_lag")
PATH_POINTS = 401  # points along a schedule's path for the Hausdorff distances and the fit
QUICK_FLAGS = (
    "--data.train_subset=256",
    "--data.batch_size=32",
    "--model.width=32",
    "--model.depth=1",
    "--model.heads=2",
    "--data.encoder_epochs=1",
    "--data.evaluator_epochs=1",
)


def hand_path(subject: str, params: Mapping[str, Any]) -> torch.Tensor:
    """A hand-designed schedule's path (t_lead, t_lag) [PATH_POINTS, 2] over global time."""
    tau = torch.linspace(0, 1, PATH_POINTS, dtype=torch.float64)
    if subject == "sfd":
        return torch.stack(SFDShiftedPath(float(params["sfd_delta"])).times(tau), 1)
    if subject == "power":
        return schedule_path(PowerSchedule(float(params["power_exponent"])), PATH_POINTS)
    if subject == "synchronous":
        return torch.stack([tau, tau], 1)
    raise ValueError(f"{subject!r} is not a hand-designed schedule")


@functools.lru_cache(maxsize=8)
def closest_member(subject: str, value: float, fit_steps: int) -> tuple[float, ...]:
    """The normalised knot slopes of the 8-bin member closest to a hand schedule's path
    (``core.fit_schedule_to_path``; deterministic, so every process gets the same flags)."""
    param = {"sfd": "sfd_delta", "power": "power_exponent"}[subject]
    member = fit_schedule_to_path(hand_path(subject, {param: value}), steps=fit_steps)
    return tuple(member.normalised_slopes().tolist())


def member(slopes) -> ConvexSchedule:
    """The member of the family with these normalised knot slopes (float64 on the way in:
    a fitted member's first slopes can differ in the fifth digit)."""
    return ConvexSchedule.from_normalised_slopes(torch.tensor(slopes, dtype=torch.float64))


def frozen_flags(slopes: tuple[float, ...]) -> list[str]:
    """The CLI flags of a frozen member of the family (corrected loss, like LAS's main stage)."""
    return [
        "--model.schedule=frozen",
        f"--model.frozen_slopes=[{','.join(repr(s) for s in slopes)}]",
        "--model.corrected=true",
    ]


def schedule_flags(subject: str, params: dict[str, Any], settings: dict[str, Any]) -> list[str]:
    """The CLI flags that make ``subject`` (with tuned ``params``) on top of default.yaml."""
    if subject == "las":
        return ["--model.schedule=learned", f"--model.probe_steps={settings['probe_steps']}"]
    if subject == "zero_probe":
        return ["--model.schedule=learned", "--model.probe_steps=0"]
    if subject == "synchronous":
        return ["--model.schedule=synchronous"]
    if subject == "in_family_lag":
        delta, steps = float(settings["hand_lag_sfd_delta"]), int(settings["fit_steps"])
        return frozen_flags(closest_member("sfd", delta, steps))
    if subject == "power":
        p = float(params["power_exponent"])
        return ["--model.schedule=power", f"--model.power_exponent={p}", "--model.corrected=true"]
    if subject == "sfd":
        return ["--model.schedule=sfd", f"--model.sfd_delta={params['sfd_delta']}"] + [
            "--model.corrected=true"
        ]
    raise ValueError(f"unknown subject {subject!r}")


def long_probe_flags(settings: dict[str, Any], strong_lag: bool) -> list[str]:
    """LAS's probe alone, ``settings.long_probe_steps`` long, from the synchronous start or from
    a strong lag (``settings.strong_lag_init``); the run stops when the probe freezes f*."""
    steps = int(settings["long_probe_steps"])
    flags = ["--model.schedule=learned", f"--model.probe_steps={steps}"]
    if strong_lag:
        flags.append(f"--model.schedule_init={settings['strong_lag_init']}")
    return [*flags, f"--trainer.max_steps={steps}"]


def budget_flags(subject: str, settings: dict[str, Any], multiplier: float) -> list[str]:
    """``subject`` with ``multiplier`` x the registered main-stage steps (LAS keeps its probe)."""
    probe = int(settings["probe_steps"]) if subject == "las" else 0
    steps = int(round(multiplier * settings["main_steps"])) + probe
    return [*schedule_flags(subject, {}, settings), f"--trainer.max_steps={steps}"]


class Runner:
    """Trains configurations through the real CLI and scores them; a configuration trained once
    on a seed (e.g. during tuning) is not trained again (training is deterministic).
    ``prefetch`` trains a list of configurations as jobs of the shared runner
    (``papers_eval.jobs``: worker processes of one thread, a resumable cache under runs/)."""

    def __init__(self, settings: dict[str, Any], quick: bool) -> None:
        self.settings, self.quick = settings, quick
        self.data = MultiRepDataModule(
            **({"encoder_epochs": 1, "evaluator_epochs": 1} if quick else {})
        )
        self.data.setup()
        self.evaluator = self.data.evaluator()
        self.references = {split: self.data.reference(split) for split in ("val", "test")}
        self.cache: dict[tuple, dict[str, Any]] = {}
        self.jobs: list[JobResult] = []  # every job the runner ran or loaded, for the record
        _RUNNERS[canonical_json(self.job_settings())] = self  # in-process jobs reuse the data

    def job_settings(self) -> dict[str, Any]:
        """The settings of every job (its cache key): the claim's settings, less the worker
        count (which does not change a result), and whether the run is --quick."""
        return {**{k: v for k, v in self.settings.items() if k != "workers"}, "quick": self.quick}

    def run(self, flags: list[str], seed: int) -> dict[str, Any]:
        key = (tuple(flags), seed)
        if key not in self.cache:
            self.cache[key] = self.train_and_score(flags, seed)
        return self.cache[key]

    def prefetch(self, jobs: list[tuple[list[str], int, str]], **options: Any) -> None:
        """Train and score every (flags, seed) not yet cached, as jobs of ``run_jobs`` in the
        given stage (each one thread; the slowest, LAS with its probe, first so the workers
        finish together). ``options``: ``runner_options(args, ...)`` (workers, fresh,
        scheduler)."""
        stages = {(tuple(f), s): stage for f, s, stage in reversed(jobs)}  # the first one wins
        todo = list(dict.fromkeys((tuple(f), s) for f, s, _ in jobs))
        todo = [job for job in todo if job not in self.cache]
        todo.sort(key=lambda job: not any(f.startswith("--model.probe_steps=") for f in job[0]))
        if not todo:
            return
        done = run_jobs(
            train_job,
            [Job(job_subject(f), s, {"flags": list(f)}, stages[f, s]) for f, s in todo],
            settings=self.job_settings(),
            cache_dir=JOBS_DIR,
            revision=code_revision(PROJECT_DIR),
            label="learned-async-schedule",
            **options,
        )
        for job, result in zip(todo, done, strict=True):
            self.cache[job] = result.value
        self.jobs.extend(done)

    def train_and_score(self, flags: list[str], seed: int) -> dict[str, Any]:
        s = self.settings
        learned_probe = next(
            (int(f.split("=")[1]) for f in flags if f.startswith("--model.probe_steps=")), 0
        )
        overrides = [
            "--trainer.accelerator=cpu",
            f"--trainer.max_steps={s['main_steps'] + learned_probe}",
            *(QUICK_FLAGS if self.quick else ()),
            *flags,
        ]
        start = time.perf_counter()
        cli = quiet_fit(
            AsyncDiffusionModule,
            MultiRepDataModule,
            project_file=__file__,
            seed=seed,
            overrides=overrides,
        )
        seconds = time.perf_counter() - start
        result = self.score(cli.model, seed)
        result["train_s"] = seconds
        return result

    def score(self, model: AsyncDiffusionModule, seed: int) -> dict[str, Any]:
        """FD-digit etc. of ``num_samples`` unconditional samples (EMA weights, Euler), and 64
        samples from a fixed generator for the figure."""
        s = self.settings
        generator = torch.Generator().manual_seed(10_000 + seed)
        model.eval()
        _, texture = model.generate(s["num_samples"], s["sample_steps"], generator)
        texture = texture.cpu()
        test_images, test_labels = self.references["test"]
        test = digit_quality(self.evaluator, texture, test_images)
        val = digit_quality(self.evaluator, texture, self.references["val"][0])
        _, preview = model.generate(64, s["sample_steps"], torch.Generator().manual_seed(0))
        with torch.no_grad():
            lag = float((CURVE_GRID - model.schedule_curve()).max())
        return {
            "fd_digit": test["fd_digit"],
            "val_fd_digit": val["fd_digit"],
            "precision": test["precision"],
            "recall": test["recall"],
            "class_tv": class_coverage_tv(self.evaluator, texture, test_labels),
            "max_lag": lag,
            "probe": dict(model.probe_report),
            "slopes": model.schedule_slopes() if hasattr(model.schedule, "raw_increments") else [],
            "schedule_init": float(model.hparams.schedule_init),
            "preview": preview.cpu().numpy(),
        }


_RUNNERS: dict[str, Runner] = {}  # one per process and settings: the data is built once


def job_subject(flags: tuple[str, ...] | list[str]) -> str:
    """A job's subject for display: the schedule its flags select (the flags are its params)."""
    schedules = [f.split("=", 1)[1] for f in flags if f.startswith("--model.schedule=")]
    return schedules[-1] if schedules else "default"


def train_job(job: Job, settings: Mapping[str, Any]) -> dict[str, Any]:
    """One job of the runner (top level: a worker process imports it by name): train the flags
    ``job.params["flags"]`` on ``job.seed`` and score them (``Runner.train_and_score``)."""
    runner = _RUNNERS.get(canonical_json(settings))
    if runner is None:
        plain = {k: v for k, v in settings.items() if k != "quick"}
        runner = Runner(plain, bool(settings["quick"]))
    return runner.train_and_score(list(job.params["flags"]), job.seed)


def stage_of(grid: list[dict[str, Any]]) -> str:
    """A job of a tuning grid is in the stage "tune"; an untuned subject's, "test"."""
    return "test" if grid == [{}] else "tune"


def experiment(
    spec, runner: Runner, options: Mapping[str, Any], tuning=None, extra_jobs=()
) -> dict[str, Any]:
    """Tune the hand-designed baselines on validation (unless ``tuning`` is given: the
    replication keeps the registered choices), run every subject on every seed of ``spec``;
    ``extra_jobs`` (flags, seed, stage) are trained with the first batch."""
    settings = runner.settings

    def validation_score(subject: str, params: dict[str, Any], seed: int) -> float:
        return runner.run(schedule_flags(subject, params, settings), seed)["val_fd_digit"]

    # Everything that does not depend on the tuning's outcome, in parallel: the grids on the
    # tuning seed and the untuned subjects on every seed. Then the tuned baselines' other seeds.
    grids = tuning_grids(spec.tuning, spec.subjects)
    untuned = [
        (schedule_flags(subject, {}, settings), seed, "test")
        for seed in spec.seeds
        for subject, grid in grids.items()
        if grid == [{}]
    ] + list(extra_jobs)
    if tuning is None:
        runner.prefetch(
            [
                (schedule_flags(subject, params, settings), spec.seeds[0], stage_of(grid))
                for subject, grid in grids.items()
                for params in grid
            ]
            + untuned,
            **options,
        )
        tuning = tune(spec, validation_score)
    runner.prefetch(
        [
            (schedule_flags(subject, tuning.best.get(subject, {}), settings), seed, "test")
            for seed in spec.seeds
            for subject in spec.subjects
        ],
        **options,
    )
    extras: dict[str, dict[int, dict[str, Any]]] = {s: {} for s in spec.subjects}

    def run_one(subject: str, seed: int) -> dict[str, Any]:
        result = runner.run(schedule_flags(subject, tuning.best.get(subject, {}), settings), seed)
        extras[subject][seed] = result
        return {m: result[m] for m in METRICS}

    results = run_seeds(spec, run_one)
    evidence = learned_schedule_evidence(extras["las"], extras["zero_probe"])
    return {"results": results, "tuning": tuning, "extras": extras, "evidence": evidence}


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune the hand-designed baselines on validation, run every subject on every seed, judge
    (and with ``--replicate`` the same checks on the replication seeds, the registered tuning
    kept); the family's reach, the long probes, the budget evidence when LAS fails a check, a
    diagnosis; write results/ (claim.json, claim.md, the learned-schedule and sample
    figures)."""
    parser = reproduce_parser((__doc__ or "").splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    torch.set_num_threads(1)  # a 2-thread pool on shared cores spends most of its time waiting
    start = time.perf_counter()
    settings = dict(spec.settings)
    runner = Runner(settings, args.quick)
    options = runner_options(args, default_workers=int(settings.get("workers", 1)))
    long_probes = {
        "identity_start": long_probe_flags(settings, strong_lag=False),
        "strong_lag_start": long_probe_flags(settings, strong_lag=True),
    }
    # The long probes depend on nothing else: they join the first batch of jobs.
    first = [(flags, spec.seeds[0], "evidence") for flags in long_probes.values()]
    registered = experiment(spec, runner, options, extra_jobs=first)
    judgement = judge(spec, registered["results"])
    replication = None
    evidence = registered["evidence"]
    if args.replicate:
        rspec = spec.for_replication()
        replicated = experiment(rspec, runner, options, tuning=registered["tuning"])
        replication = Replication(rspec, replicated["results"], judge(rspec, replicated["results"]))
        evidence["replication"] = {"las_probe": replicated["evidence"]["las_probe"]}
    judgements = [judgement] + ([replication.judgement] if replication else [])
    failed = any(
        not j.outcomes[spec.method][c.name].passed for j in judgements for c in spec.checks
    )
    budget = las_budget(spec, runner, options) if failed else None
    tuning, extras = registered["tuning"], registered["extras"]
    grids = tuning_grids(spec.tuning, spec.subjects)
    evidence["tuning_edges"] = {
        **grid_edges(tuning, grids, "power_exponent"),
        **grid_edges(tuning, grids, "sfd_delta"),
    }
    evidence["reach"] = reach_evidence(registered["results"], tuning.best, extras, settings)
    evidence["long_probe"] = long_probe_evidence(
        {name: runner.run(flags, spec.seeds[0]) for name, flags in long_probes.items()},
        settings,
        hand_path(evidence["reach"]["winner"], tuning.best[evidence["reach"]["winner"]]),
    )
    evidence["train_s"] = {
        s: float(np.mean([r["train_s"] for r in by_seed.values()])) for s, by_seed in extras.items()
    }
    evidence["data"] = {
        "encoder_test_accuracy": float(runner.data.miniature["encoder_accuracy"]),
        "evaluator_test_accuracy": float(runner.data.miniature["evaluator_accuracy"]),
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    figures = write_figures(out, extras, tuning.best, settings)
    write_claim(
        out,
        project="learned-async-schedule",
        spec=spec,
        results=registered["results"],
        judgement=judgement,
        replication=replication,
        config={"settings": settings, "quick": args.quick, "flags": flag_table(tuning, settings)},
        wall_time_s=time.perf_counter() - start,
        tuning=tuning,
        evidence=evidence,
        headline=headline(registered["results"], judgement.verdict, tuning.best),
        notes=notes(evidence, settings),
        figures=figures,
        jobs=summarise_jobs(runner.jobs),
        budget=budget,
        diagnosis=functools.partial(diagnose, spec=spec),
    )
    return {"verdict": judgement.verdict, "results": registered["results"], "evidence": evidence}


def las_budget(spec, runner: Runner, options: Mapping[str, Any]) -> dict[str, Any]:
    """The budget evidence (papers_eval.mechanism.budget_evidence): LAS and synchronous (the
    first check's bar) at 1x and 2x the registered main-stage steps on the first seed."""
    seed, settings, multipliers = spec.seeds[0], runner.settings, (1.0, 2.0)

    def flags(subject: str, multiplier: float) -> list[str]:
        if multiplier == 1.0:  # the registered run itself
            return schedule_flags(subject, {}, settings)
        return budget_flags(subject, settings, multiplier)

    runner.prefetch(
        [(flags(s, m), seed, "budget") for s in ("las", "synchronous") for m in multipliers],
        **options,
    )

    def point(subject: str, multiplier: float, seed: int) -> dict[str, float]:
        result = runner.run(flags(subject, multiplier), seed)
        return {
            "metric": float(result["fd_digit"]),
            "wall_time_s": float(result["train_s"]),
            "updates": float(round(multiplier * settings["main_steps"])),
        }

    evidence = budget_evidence(
        point, method="las", rival="synchronous", goal="lower", seed=seed, multipliers=multipliers
    )
    return {"check": "beats_synchronous", "metric": "fd_digit", **evidence}


def reach_evidence(results, best: dict, extras: dict, settings: dict) -> dict[str, Any]:
    """How close LAS's family comes to the winning hand schedule (the tuned power law or SFD
    path with the lower mean validation FD-digit): Hausdorff distances between paths in the
    (t_lead, t_lag) plane from the synchronous path, from each seed's f*, from the in-family
    control's member and from the member closest to the winner (found by the same fit) to the
    winner's path; and the in-family member's distance to the SFD path it was fitted to."""
    winner = min(("power", "sfd"), key=lambda s: float(np.mean(results[s]["val_fd_digit"])))
    target = hand_path(winner, best[winner])
    fit_steps = int(settings["fit_steps"])
    value = next(iter(best[winner].values()))
    best_slopes = closest_member(winner, float(value), fit_steps)
    best_member = member(best_slopes)
    in_family = member(closest_member("sfd", float(settings["hand_lag_sfd_delta"]), fit_steps))
    hand_lag = hand_path("sfd", {"sfd_delta": settings["hand_lag_sfd_delta"]})

    def to_target(schedule) -> float:
        with torch.no_grad():
            return float(path_hausdorff(schedule_path(schedule, PATH_POINTS), target))

    with torch.no_grad():
        member_to_hand_lag = float(path_hausdorff(schedule_path(in_family, PATH_POINTS), hand_lag))
    return {
        "winner": winner,
        "winner_params": dict(best[winner]),
        "synchronous_to_winner": float(path_hausdorff(hand_path("synchronous", {}), target)),
        "las_to_winner": {
            str(seed): to_target(member(r["slopes"])) for seed, r in extras["las"].items()
        },
        "best_member_to_winner": to_target(best_member),
        "in_family_member_to_winner": to_target(in_family),
        "in_family_member_to_its_sfd_path": member_to_hand_lag,
        "best_member_slopes": list(best_slopes),
    }


def long_probe_evidence(runs: dict[str, dict], settings: dict, target: torch.Tensor) -> dict:
    """The probe run ``settings.long_probe_steps`` steps from the synchronous start and from a
    strong lag (first seed): where each froze f* (f*(0.5), its largest lag, its distance to the
    winning hand schedule), how much f still moved over the probe's last tenth, and the sup
    distance between the two f* (the same f* from both starts: below 0.01)."""
    curves, out = {}, {}
    for name, result in runs.items():
        schedule = member(result["slopes"])
        with torch.no_grad():
            curves[name] = schedule(CURVE_GRID)
            distance = float(path_hausdorff(schedule_path(schedule, PATH_POINTS), target))
        report = result["probe"]
        out[name] = {
            "f_half_start": report.get("f_half_start"),
            "f_half_final": report.get("f_half_final"),  # the last probe iterate
            "f_half_frozen": report.get("f_half_frozen"),
            "window_start": report.get("window_start"),
            "max_lag_frozen": report.get("max_lag_frozen"),
            "last_tenth_movement_sup": report.get("last_tenth_movement_sup"),
            "window_length": report.get("window_length"),
            "to_winner": distance,
        }
    a, b = curves.values()
    return {
        "steps": int(settings["long_probe_steps"]),
        "starts": out,
        "f_star_sup_distance": float((a - b).abs().max()),
    }


NEAR_IDENTITY = 0.05  # an f* whose largest lag is below this is "at synchrony" for the diagnosis
SAME_F_STAR = 0.02  # two f* closer than this (sup norm) are "the same" for the diagnosis


def diagnose(record: dict[str, Any], *, spec) -> list:
    """Findings for a verdict that is not ``held``, each citing the record's numbers:

    - a failed precondition (``asynchrony_pays``), registered or replication seeds: ``check``
      (no asynchronous schedule is rewarded, so the checks cannot decide);
    - the in-family control fails ``beats_synchronous``: ``check`` (the member of LAS's family
      closest to SFD's path, at its Hausdorff distance, is not rewarded: the miniature cannot
      reward the family, whatever the probe finds); other misbehaving controls: ``check``;
    - LAS fails ``beats_synchronous`` while the in-family control passes it: with the long
      probes from the identity and from a strong lag landing on the same f* near synchrony,
      ``idea`` (the probe's objective leads f back to synchrony from both starts, while a
      member of its family away from synchrony wins), citing the budget evidence; probes that
      land apart or still move: ``undetermined`` (the probe has not converged);
    - a hand schedule's tuned value on an end of its grid: ``check``;
    - anything else: ``undetermined``, citing LAS's checks and the family's reach.
    """
    if record["verdict"] in ("held", "held, not replicated"):
        return []
    method = spec.method
    evidence = record.get("evidence") or {}
    replication = record.get("replication") or {}
    findings = control_findings(
        record, {c.name: c.checks for c in spec.controls if c.name != "in_family_lag"}
    )
    judged = [(f"preconditions.{i}", p) for i, p in enumerate(record["preconditions"])]
    judged += [(f"replication.preconditions.{name}", p)
              for name, p in (replication.get("preconditions") or {}).items()]  # fmt: skip
    for path, p in judged:
        if not p["passed"]:
            seeds = " on the replication seeds" if path.startswith("replication") else ""
            findings.append(
                finding(
                    "check",
                    f"the precondition {p.get('name') or path.rsplit('.', 1)[-1]} failed{seeds}: "
                    "tuned SFD does not beat synchronous, so this miniature rewards no "
                    "asynchronous schedule and the checks cannot decide",
                    (f"{path}.advantage.estimate", "SFD's advantage over synchronous"),
                )
            )
    check = "beats_synchronous"
    seed_sets = [("", record)] + ([("replication.", replication)] if replication else [])
    control_failed = [
        where
        for where, judged_set in seed_sets
        if "in_family_lag" in (judged_set.get("outcomes") or {})
        and not judged_set["outcomes"]["in_family_lag"][check]["passed"]
    ]
    reach = evidence.get("reach") or {}
    if control_failed:
        where = control_failed[0]
        seeds = " on the replication seeds" if where else ""
        findings.append(
            finding(
                "check",
                f"the in-family control failed {check}{seeds}: the member of LAS's family "
                "closest to SFD's shifted path (fitted to it, frozen, trained like LAS's main "
                "stage) is not better than synchronous, so the miniature does not reward the "
                "convex family; a probe that finds no lag cannot be told apart from one that "
                "could not",
                (
                    f"{where}outcomes.in_family_lag.{check}.advantage.estimate",
                    "the in-family member's advantage over synchronous",
                ),
                (
                    "evidence.reach.in_family_member_to_its_sfd_path",
                    "its Hausdorff distance to the SFD path",
                ),
            )  # fmt: skip
        )
    outcomes = record["outcomes"][method]
    long = evidence.get("long_probe") or {}
    if not outcomes[check]["passed"] and not control_failed and long:
        starts = long["starts"]
        same = long["f_star_sup_distance"] < SAME_F_STAR
        at_sync = all(v["max_lag_frozen"] < NEAR_IDENTITY for v in starts.values())
        cites = [
            (f"outcomes.{method}.{check}.advantage.estimate", "LAS's advantage over synchronous"),
            (f"outcomes.in_family_lag.{check}.advantage.estimate",
             "the in-family member's advantage over synchronous"),
            ("evidence.long_probe.f_star_sup_distance",
             "sup distance between the f* of the two long probes"),
            ("evidence.long_probe.starts.strong_lag_start.max_lag_frozen",
             "largest lag of f* from the strong-lag start"),
        ]  # fmt: skip
        if record.get("budget"):
            cites += [
                ("budget.gap.1", "LAS minus synchronous (FD), registered steps, first seed"),
                ("budget.gap.2", "the same at twice the main steps"),
            ]
        if same and at_sync:
            findings.append(
                finding(
                    "idea",
                    f"the probe run {long['steps']} steps from the synchronous start and from a "
                    "strong lag lands on the same f*, at synchrony, while a member of its own "
                    "family away from synchrony beats synchronous: the probe's objective "
                    "(corrected loss plus speed term) does not lead to the schedules that pay "
                    "at sampling",
                    *cites,
                )
            )
        else:
            findings.append(
                finding(
                    "undetermined",
                    f"LAS fails {check} while a member of its family passes it, and the probe "
                    f"run {long['steps']} steps "
                    + (
                        "lands on different f* from the two starts"
                        if not same
                        else "lands away from synchrony"
                    )
                    + ": the probe has not found (or not converged to) a rewarded schedule",
                    *cites,
                )  # fmt: skip
            )
    for subject, edge in (evidence.get("tuning_edges") or {}).items():
        if edge["at_edge"]:
            findings.append(
                finding(
                    "check",
                    f"{subject}'s tuned {edge['param']} ({edge['chosen']:g}) sits at an end of "
                    f"its grid [{edge['low']:g}, {edge['high']:g}]: the comparison with it may "
                    "move with a wider grid",
                    (f"evidence.tuning_edges.{subject}.chosen", f"{subject}'s chosen value"),
                )
            )
    if not findings:
        failed = [c for c, o in outcomes.items() if not o["passed"]]
        findings.append(
            finding(
                "undetermined",
                f"LAS failed {', '.join(failed)}; no recorded number separates the causes",
                *[(f"outcomes.{method}.{c}.advantage.estimate", f"LAS on {c}") for c in failed],
                *(
                    [
                        (
                            "evidence.reach.best_member_to_winner",
                            "the closest member's distance to the winning hand schedule",
                        )
                    ]
                    if reach
                    else []
                ),  # fmt: skip
            )
        )
    return findings


def flag_table(tuning, settings) -> dict[str, list[str]]:
    return {s: schedule_flags(s, tuning.best.get(s, {}), settings) for s in SUBJECTS}


def learned_schedule_evidence(las: dict, zero: dict) -> dict[str, Any]:
    """What the probe did, per seed: how far f moved, where f* sits, its window."""
    per_seed = {}
    for seed, result in las.items():
        report = result["probe"]
        per_seed[str(seed)] = {
            k: report.get(k)
            for k in (
                "f_half_start",
                "f_half_final",
                "f_half_frozen",
                "max_lag_frozen",
                "movement_sup",
                "frozen_from_start_sup",
                "window_start",
                "window_length",
                "probe_steps",
                "probe_wall_s",
            )
        } | {"slopes": result["slopes"]}
    return {
        "las_probe": per_seed,
        "zero_probe_max_lag": [r["max_lag"] for r in zero.values()],
    }


def headline(results, verdict: str, best: dict) -> str:
    def mean(subject):
        return float(np.mean(results[subject]["fd_digit"]))

    return (
        f"FD-digit LAS {mean('las'):.1f}, synchronous {mean('synchronous'):.1f}, in-family lag "
        f"{mean('in_family_lag'):.1f}, power p={best.get('power', {}).get('power_exponent')} "
        f"{mean('power'):.1f}, SFD D={best.get('sfd', {}).get('sfd_delta')} {mean('sfd'):.1f}; "
        f"{verdict}"
    )


def notes(evidence: dict, settings: dict) -> str:
    moved = [v["movement_sup"] for v in evidence["las_probe"].values()]
    lags = [v["max_lag_frozen"] for v in evidence["las_probe"].values()]
    reach, long = evidence["reach"], evidence["long_probe"]
    starts = long["starts"]
    return (
        f"LAS probe ({settings['probe_steps']} steps, on top of the {settings['main_steps']} "
        f"main steps every subject gets): f moved by {', '.join(f'{m:.3f}' for m in moved)} "
        f"(sup norm) per seed; the frozen f* lags the identity by at most "
        f"{', '.join(f'{v:.3f}' for v in lags)}. The zero-length probe keeps the start schedule "
        f"(max lag {max(evidence['zero_probe_max_lag']):.4f}). Reach (Hausdorff distance to the "
        f"winning hand schedule, {reach['winner']} {reach['winner_params']}): synchronous "
        f"{reach['synchronous_to_winner']:.3f}, LAS's f* "
        f"{', '.join(f'{v:.3f}' for v in reach['las_to_winner'].values())}, the closest member "
        f"{reach['best_member_to_winner']:.3f}, the in-family control's member "
        f"{reach['in_family_member_to_winner']:.3f} (to the SFD path it was fitted to: "
        f"{reach['in_family_member_to_its_sfd_path']:.3f}). Probe run {long['steps']} steps: "
        f"f*(0.5) {starts['identity_start']['f_half_frozen']:.3f} from the identity, "
        f"{starts['strong_lag_start']['f_half_frozen']:.3f} from a strong lag (start "
        f"{starts['strong_lag_start']['f_half_start']:.3f}); sup distance between the two f* "
        f"{long['f_star_sup_distance']:.3f}."
    )


def write_figures(out: Path, extras: dict, best: dict, settings: dict) -> list:
    """learned_schedule.png (f* per seed, the start schedule, the tuned hand-designed schedules)
    and samples.png (LAS vs synchronous samples, seed of the first run)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tau = torch.linspace(0, 1, 201, dtype=torch.float64)
    fig, ax = plt.subplots(figsize=(4.8, 4.4), dpi=120)
    ax.plot(tau, tau, color="gray", lw=1, label="synchronous")
    start = ConvexSchedule(8, next(iter(extras["las"].values()))["schedule_init"])
    with torch.no_grad():
        ax.plot(tau, start(tau), ":", color="black", lw=1.5, label="LAS start (zero-length probe)")
        for seed, result in extras["las"].items():
            ax.plot(tau, member(result["slopes"])(tau), lw=2, label=f"learned f*, seed {seed}")
        hand = settings["hand_lag_sfd_delta"]
        in_family = member(closest_member("sfd", float(hand), int(settings["fit_steps"])))
        ax.plot(tau, in_family(tau), ":", lw=1.5, label=f"in-family lag (closest to SFD D={hand})")
    p = best.get("power", {}).get("power_exponent")
    if p is not None:
        ax.plot(tau, PowerSchedule(p)(tau), "-.", lw=1, label=f"tuned power tau^{p:g}")
    delta = best.get("sfd", {}).get("sfd_delta")
    if delta is not None:
        lead, lag = SFDShiftedPath(delta).times(tau)
        ax.plot(lead, lag, "--", lw=1, label=f"tuned SFD D={delta}")
    ax.set(xlabel="t_lead (semantic time)", ylabel="t_lag (texture time)", title="Schedules")
    ax.legend(fontsize=7, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "learned_schedule.png")
    plt.close(fig)

    seed = min(extras["las"])
    fig, axes = plt.subplots(1, 2, figsize=(7, 3.6), dpi=120)
    for ax, subject in zip(axes, ("las", "synchronous"), strict=True):
        preview = torch.from_numpy(extras[subject][seed]["preview"])
        ax.imshow(sample_grid(preview), cmap="gray", vmin=-1, vmax=1)
        ax.set_title(f"{subject}, seed {seed}", fontsize=9)
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(out / "samples.png")
    plt.close(fig)
    return ["learned_schedule.png", "samples.png"]


def sample_grid(images: torch.Tensor, columns: int = 8) -> np.ndarray:
    """[N, 1, H, W] -> one [rows H, columns W] array (row-major tiles)."""
    n, _, h, w = images.shape
    rows = -(-n // columns)
    grid = torch.full((rows * h, columns * w), -1.0)
    for i in range(n):
        r, c = divmod(i, columns)
        grid[r * h : (r + 1) * h, c * w : (c + 1) * w] = images[i, 0].clamp(-1, 1)
    return grid.numpy()


# The design note's ablations of LAS (not part of the claim's verdict): flags on top of `las`.
ABLATIONS = {
    "las": [],
    "no_correction": ["--model.corrected=false"],
    "last_iterate": ["--model.average=last"],
    "speed_weight_0": ["--model.speed_weight=0"],
    "start_strong_lag": ["--model.schedule_init=1.0"],
    # f learned for the whole run: the probe never ends, no reset (same total steps as LAS)
    "learned_throughout": ["--model.probe_steps=1000000000"],
}


def run_ablations(argv: list[str] | None = None) -> dict[str, Any]:
    """Each ablation on every seed of configs/claim.yaml with its settings; writes
    ``ablations.json`` and ``ablations.md`` (mean and Student-t 95% interval over seeds)."""
    from papers_eval.stats import contrast_interval

    parser = reproduce_parser("LAS ablations (design note)", project_file=__file__)
    parser.add_argument("--only", nargs="+", choices=sorted(ABLATIONS), default=None)
    args = parser.parse_args(argv)
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    torch.set_num_threads(1)  # a 2-thread pool on shared cores spends most of its time waiting
    start = time.perf_counter()
    settings = dict(spec.settings)
    runner = Runner(settings, args.quick)
    las = schedule_flags("las", {}, settings)
    total = settings["main_steps"] + settings["probe_steps"]
    rows: dict[str, dict[str, Any]] = {}
    names = args.only or list(ABLATIONS)

    def ablation_flags(name: str) -> list[str]:
        extra = [f"--trainer.max_steps={total}"] if name == "learned_throughout" else []
        return [*las, *ABLATIONS[name], *extra]

    runner.prefetch(
        [(ablation_flags(name), seed, "ablation") for name in names for seed in spec.seeds],
        **runner_options(args, default_workers=int(settings.get("workers", 1))),
    )
    for name in names:
        flags = ablation_flags(name)
        per_seed = {seed: runner.run(flags, seed) for seed in spec.seeds}
        row = {"flags": flags, "per_seed": {}}
        for metric in ("fd_digit", "class_tv", "max_lag"):
            values = [per_seed[s][metric] for s in spec.seeds]
            interval = contrast_interval([(1.0, values)])
            row[metric] = {"mean": interval.estimate, "ci": [interval.low, interval.high]}
            row["per_seed"][metric] = values
        row["probe"] = {str(s): per_seed[s]["probe"].get("f_half_frozen") for s in spec.seeds}
        rows[name] = row
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {
        "seeds": list(spec.seeds),
        "settings": settings,
        "quick": args.quick,
        "rows": rows,
        "wall_time_s": round(time.perf_counter() - start, 1),
    }
    import json

    (out / "ablations.json").write_text(json.dumps(record, indent=2, default=float) + "\n")
    lines = [
        f"# LAS ablations (seeds {list(spec.seeds)}, {settings['main_steps']} main steps; "
        f"not part of the claim's verdict)",
        "",
        "| variant | FD-digit (test) | class TV | max lag of f* | f*(0.5) per seed |",
        "|---|---|---|---|---|",
    ]
    for name, row in rows.items():

        def cell(m, row=row):
            return f"{row[m]['mean']:.3g} [{row[m]['ci'][0]:.3g}, {row[m]['ci'][1]:.3g}]"

        halves = ", ".join(f"{v:.3f}" if v is not None else "-" for v in row["probe"].values())
        lines.append(
            f"| {name} | {cell('fd_digit')} | {cell('class_tv')} | {cell('max_lag')} | {halves} |"
        )
    lines += ["", f"Wall time {record['wall_time_s']} s; command `{' '.join(['ablations'])}`."]
    (out / "ablations.md").write_text("\n".join(lines) + "\n")
    return record


def main() -> None:
    """Console entry point of `uv run reproduce` (entry point group papers.reproduce)."""
    run_claim_experiment()


def ablations() -> None:
    """Console entry point of `learned-async-schedule-ablations` (not part of the verdict)."""
    run_ablations()
