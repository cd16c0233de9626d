"""The claim experiment (`uv run reproduce`), under the protocol of configs/claim.yaml.

Claim (one task, where computation pays): on MiniGrid LavaCrossing with the recurrent conv net,
AIC keeps at least 95 % of the fixed-compute policy's episode return while spending at most
75 % of its FLOPs per decision. Every subject runs on every seed (the seed sets the expert data,
the initialisation and the test episodes):

- ``aic``: the method (halting head trained on the value-of-computation target), price tuned;
- ``fixed_k``: the fixed counterpart, the same network trained on its K_max-th readout only;
- ``pondernet``, ``act``, ``confidence_exit``: halting baselines on AIC's backbone, tuned;
- ``one_step`` (negative control): the AIC network stopping after one step everywhere;
- ``random_halting`` (negative control): halting at random with AIC's mean steps per decision
  measured in the same test rollouts;
- ``oracle_halting`` (positive control): halting on the exact cumulative gain of AIC's readouts
  under the exact Q*, price tuned like AIC's.

Allocation at equal compute (``return_over_random``): per test episode, a subject's return minus
that of random halting on AIC's backbone with the subject's own measured mean steps per decision
(random halting pays no halting head, so it never uses more FLOPs).

Pre-registered precondition (``settings.precondition``): the pair is judged only if the fixed
network learns the task (validation success >= ``fixed_min_success``) and computation pays (the
one-step network's validation return is below ``retain_ratio`` x the fixed network's). Both are
measured and recorded; a failed precondition is written into the record's headline and notes.

FLOPs are analytic (``core.count_flops`` + ``core.flops_per_decision``): fixed K pays the encoder,
K core steps and ONE readout; a halting-head rule pays its head at every step it runs.

The trainings (AIC and the fixed network, per seed) are the jobs of the shared job runner
(``papers_eval.jobs``): ``--jobs`` worker processes of one torch thread each, finished fits
cached under runs/aic/jobs. The rollouts and the evidence are computed here from the fitted
weights; random halting draws from a generator seeded per (seed, split, mean steps), so its
draws do not depend on which rules ran before it.

Protocol v3: ``--replicate`` judges the same checks on the replication seeds (trained, tuned on
their first seed by the same rule, rolled out); when the method fails a check on either seed set,
the budget evidence trains AIC and the fixed network again on the first registered seed at 2x
``trainer.max_epochs`` and measures the failed check's metric for the method and its rival at
1x and 2x; ``diagnose`` writes the findings, each citing the record's numbers.
"""

from __future__ import annotations

import copy
import functools
import math
import time
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

from aic import baselines  # noqa: E402
from aic.cli import AicCLI  # noqa: E402
from aic.core import (  # noqa: E402
    AICPolicy,
    count_flops,
    flops_per_decision,
    halting_steps,
    step_returns,
)
from aic.data import AicDataModule  # noqa: E402
from aic.evaluate import (  # noqa: E402
    compacted_rule,
    head_quality,
    readout_table,
    rollout,
    table_rule,
)
from aic.model import AicModule  # noqa: E402
from aic.protocol import addition_control, removal_curve, validity  # noqa: E402
from aic.tasks import Task, get_task  # noqa: E402
from papers_cli import project_dir_of, quiet_fit, reproduce_parser  # noqa: E402
from papers_eval import (  # noqa: E402
    Replication,
    judge,
    load_claim_spec,
    run_seeds,
    tune,
    write_claim,
)
from papers_eval.diagnosis import finding  # noqa: E402
from papers_eval.jobs import Job, JobResult, run_jobs, runner_options, summarise_jobs  # noqa: E402
from papers_eval.mechanism import budget_evidence  # noqa: E402
from papers_eval.record import code_revision  # noqa: E402

PROJECT = project_dir_of(__file__)
CLAIM_FILE = PROJECT / "configs" / "claim.yaml"
JOBS_DIR = PROJECT.parents[1] / "runs" / "aic" / "jobs"
SUBJECTS = (
    "aic",
    "fixed_k",
    "pondernet",
    "act",
    "confidence_exit",
    "one_step",
    "random_halting",
    "oracle_halting",
)
METRICS = (
    "episode_return",
    "flops_per_decision",
    "mean_steps",
    "success",
    "val_score",
    "return_over_random",
    "halting_head_auc",
)
VAL_EPISODES, TEST_EPISODES = 20_000, 30_000  # episode seeds, disjoint from training data


class Pair:
    """AIC and its fixed counterpart trained on one seed (``fit_policy``'s results), with every
    halting rule built on the AIC backbone; rollouts are cached by (split, rule, parameter)."""

    def __init__(
        self,
        task: Task,
        seed: int,
        settings: dict[str, Any],
        aic: dict[str, Any],
        fixed: dict[str, Any] | None = None,
    ):
        self.task, self.seed, self.settings = task, seed, settings
        self.initial = aic["initial"]
        self.aic: AICPolicy = rebuild_policy(aic)
        self.data = AicDataModule(**aic["data"])
        self.data.setup()  # the arrays the fit generated (cached on disk by their config)
        self.fixed: AICPolicy | None = rebuild_policy(fixed) if fixed is not None else None
        self.train_s = aic["train_s"] + (fixed["train_s"] if fixed is not None else 0.0)
        self.train_seconds = {
            "aic": float(aic["train_s"]),
            "fixed": float(fixed["train_s"]) if fixed is not None else float("nan"),
        }
        self.k_max = self.aic.k_max
        val_obs = torch.from_numpy(self.data.val_arrays["obs"])
        self.flops = count_flops(self.aic, val_obs)
        train = self.data.train_arrays
        n_fit = min(len(train["obs"]), settings["n_fit_states"])
        table = readout_table(self.aic, torch.from_numpy(train["obs"][:n_fit]))
        self.features = table["features"]
        self.step_losses = baselines.per_sample_step_losses(
            task.action_kind, table["actions"], torch.from_numpy(train["target"][:n_fit])
        )
        self.units: dict[tuple, baselines.HaltingUnit] = {}
        self.cache: dict[tuple, dict] = {}
        self.train_price = float(aic["model"]["price_per_step"])
        self._head_quality: dict[str, float] | None = None

    @classmethod
    def train(
        cls, task: Task, seed: int, settings: dict[str, Any], with_fixed: bool = True
    ) -> Pair:
        """Train the pair in this process (the ablations and pilots; the claim uses jobs)."""
        aic = fit_policy(task, seed, settings, "aic")
        fixed = fit_policy(task, seed, settings, "fixed") if with_fixed else None
        return cls(task, seed, settings, aic, fixed)

    def unit(self, kind: str, value: float) -> baselines.HaltingUnit:
        """A PonderNet / ACT halting unit fitted on AIC's frozen training-state features."""
        key = (kind, value)
        if key not in self.units:
            if kind == "pondernet":
                loss = lambda lam, losses: baselines.ponder_loss(lam, losses, value)  # noqa: E731
            else:
                loss = lambda h, losses: baselines.act_loss(h, losses, value)  # noqa: E731
            self.units[key] = baselines.fit_halting_unit(
                self.features, self.step_losses, loss, seed=self.seed
            )
        return self.units[key]

    def unit_flops(self, unit: baselines.HaltingUnit) -> int:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            unit(self.features[:1, :1])
        return int(counter.get_total_flops())

    def head_quality(self) -> dict[str, float]:
        """The AIC halting head's AUC for "the next step pays its training price" and Spearman
        with the exact one-step gain, on the validation states (exact Q*; evaluate.head_quality)."""
        if self._head_quality is None:
            val = self.data.val_arrays
            table = readout_table(self.aic, torch.from_numpy(val["obs"]))
            returns = step_returns("q", table["actions"], None, torch.from_numpy(val["q"]))
            self._head_quality = head_quality(table["halt"], returns, self.train_price)
        return self._head_quality

    def random_generator(self, split: str, mean_steps: float) -> torch.Generator:
        """The random-halting control's own stream, seeded by (seed, split, mean steps): its draws
        do not depend on which rules (tuning grid, frontier sweep) ran before it."""
        return torch.Generator().manual_seed(random_seed(self.seed, split, mean_steps))

    def rule(
        self, name: str, value: float | None, split: str = "test"
    ) -> tuple[Any, str, int | None]:
        """(act function for rollouts, per-step work, halting-head FLOPs) of a halting rule."""
        k_max = self.k_max
        if name == "aic":
            return compacted_rule(self.aic, value), "readout_halt", None
        if name == "fixed_k":
            return table_rule(self.fixed, self.task, lambda t, r: full(r, k_max)), "none", None
        if name == "fixed_k_of_aic":  # the AIC network's own readout after K steps
            return table_rule(self.aic, self.task, lambda t, r: full(r, value)), "none", None
        if name == "one_step":
            return table_rule(self.aic, self.task, lambda t, r: full(r, 1)), "none", None
        if name in ("pondernet", "act"):
            unit = self.unit(name, value)
            pick = baselines.ponder_steps if name == "pondernet" else baselines.act_steps
            act = table_rule(self.aic, self.task, lambda t, r: pick(unit(t["features"])))
            return act, "halt", self.unit_flops(unit)
        if name == "confidence_exit":
            choose = lambda t, r: baselines.confidence_steps(  # noqa: E731
                t["actions"], self.task.action_kind, value
            )
            return table_rule(self.aic, self.task, choose), "readout", None
        if name == "oracle_halting":
            choose = lambda t, r: baselines.oracle_steps(r, value)  # noqa: E731
            return table_rule(self.aic, self.task, choose), "readout", None
        if name == "random_halting":
            generator = self.random_generator(split, value)
            choose = lambda t, r: baselines.random_steps(  # noqa: E731
                len(r), k_max, value, generator
            )
            return table_rule(self.aic, self.task, choose), "none", None
        raise ValueError(f"unknown halting rule {name!r}")

    def run(self, split: str, name: str, value: float | None = None) -> dict[str, Any]:
        """Roll the rule out on the split's episodes; per-episode return, steps and FLOPs."""
        key = (split, name, value)
        if key not in self.cache:
            act, per_step, halt_flops = self.rule(name, value, split)
            n = self.settings["episodes"]
            first = VAL_EPISODES if split == "val" else TEST_EPISODES + 1000 * self.seed
            roll = rollout(self.task, act, n, first)
            steps = roll["episode_mean_steps"]
            flops = flops_per_decision(self.flops, steps, per_step, halt_flops)
            self.cache[key] = {
                "episode_return": roll["episode_returns"],
                "success": roll["episode_success"],
                "mean_steps": steps,
                "flops_per_decision": np.asarray(flops, dtype=float),
                "decision_mean_steps": roll["mean_steps"],
            }
        return self.cache[key]

    def return_over_random(self, row: dict[str, Any]) -> np.ndarray:
        """Per test episode, ``row``'s return minus that of random halting on AIC's backbone with
        ``row``'s measured mean steps per decision (allocation at equal compute)."""
        matched = self.run("test", "random_halting", row["decision_mean_steps"])
        return row["episode_return"] - matched["episode_return"]

    def fixed_flops(self) -> float:
        return float(flops_per_decision(self.flops, self.k_max, "none"))

    def score(self, row: dict[str, Any]) -> float:
        """Validation score: return minus ``compute_weight`` x FLOPs relative to fixed K_max."""
        weight = self.settings["compute_weight"]
        relative = row["flops_per_decision"].mean() / self.fixed_flops()
        return float(row["episode_return"].mean() - weight * relative)

    def moved(self) -> float:
        """||theta - theta_0|| / ||theta_0|| of the AIC network: how far training moved it."""
        before = torch.cat([v.flatten().float() for v in self.initial.values()])
        after = torch.cat([v.flatten().float() for v in self.aic.state_dict().values()])
        return float((after - before).norm() / before.norm())


def random_seed(seed: int, split: str, mean_steps: float) -> int:
    """A seed for one (training seed, split, mean steps) of random halting (mean steps to 1e-6)."""
    key = [seed, ("val", "test").index(split), int(round(float(mean_steps) * 1e6))]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


def full(returns: torch.Tensor, k: float) -> torch.Tensor:
    return baselines.fixed_steps(len(returns), int(k))


class InitialWeights(Callback):
    """Keeps the policy's parameters as they were before the first optimizer step."""

    def on_fit_start(self, trainer, pl_module) -> None:
        self.state = {k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()}


def fit(task: Task, seed: int, settings: dict[str, Any], mode: str, callbacks=()):
    """One run of the real CLI (no logger, no checkpoints)."""
    overrides = [
        f"--data.task={task.name}",
        f"--data.seed={seed}",
        f"--model.mode={mode}",
        *[f"--{key}={value}" for key, value in settings["budget"].items()],
    ]
    if settings.get("env_id"):
        overrides.append(f"--data.env_id={settings['env_id']}")
    return quiet_fit(
        AicModule,
        AicDataModule,
        project_file=__file__,
        seed=seed,
        overrides=overrides,
        cli_class=AicCLI,
        callbacks=callbacks,
    )


def fit_policy(task: Task, seed: int, settings: dict[str, Any], mode: str) -> dict[str, Any]:
    """Train one network (``mode`` "aic" or "fixed") and return what rebuilds it (plain,
    picklable): the module's and the data's constructor arguments, the policy's weights before
    and after training, and the training time."""
    start = time.perf_counter()
    snapshot = InitialWeights()
    cli = fit(task, seed, settings, mode, callbacks=[snapshot])
    return {
        "model": constructor_args(cli.model.hparams),
        "data": constructor_args(cli.datamodule.hparams),
        "policy": cli.model.policy.state_dict(),
        "initial": snapshot.state,
        "train_s": time.perf_counter() - start,
    }


def constructor_args(hparams) -> dict[str, Any]:
    """LightningCLI adds private keys (``_instantiator``) to saved hyper-parameters."""
    return {k: v for k, v in dict(hparams).items() if not k.startswith("_")}


def rebuild_policy(fitted: dict[str, Any]) -> AICPolicy:
    module = AicModule(**fitted["model"])
    module.policy.load_state_dict(fitted["policy"])
    return module.policy.eval()


FIT_MODE = {"aic": "aic", "fixed_k": "fixed"}  # the trained subjects and their model.mode


def fit_job(job: Job, settings: dict[str, Any]) -> dict[str, Any]:
    """One training of the claim (top level: worker processes import it by name): the subject
    ``aic`` or ``fixed_k`` (the fixed network) on ``job.seed``; ``job.params["multiplier"]``
    (the budget evidence) scales ``trainer.max_epochs``."""
    task = get_task(settings["task"], settings.get("env_id"))
    settings = scaled_budget(settings, float(job.params.get("multiplier", 1)))
    return fit_policy(task, job.seed, settings, FIT_MODE[job.subject])


def scaled_budget(settings: dict[str, Any], multiplier: float) -> dict[str, Any]:
    """``settings`` with ``trainer.max_epochs`` times ``multiplier`` (same data, same batches
    per epoch: ``multiplier`` x the optimizer steps)."""
    if multiplier == 1:
        return settings
    out = copy.deepcopy(settings)
    epochs = out["budget"]["trainer.max_epochs"]
    out["budget"]["trainer.max_epochs"] = max(1, int(round(epochs * multiplier)))
    return out


KNOB = {
    "aic": "price",
    "pondernet": "prior",
    "act": "tau",
    "confidence_exit": "threshold",
    "oracle_halting": "price",
}


def subject_row(
    p: Pair, subject: str, chosen: dict[str, Any], random_means: dict[int, float]
) -> dict[str, Any]:
    """Every metric of ``subject`` on ``p``'s seed: test episodes, with its tuned knob."""
    if subject == "random_halting":  # AIC's mean steps per decision in the same rollouts
        random_means[p.seed] = p.run("test", "aic", chosen["aic"])["decision_mean_steps"]
        row = p.run("test", subject, random_means[p.seed])
        val_mean = p.run("val", "aic", chosen["aic"])["decision_mean_steps"]
        val = p.run("val", subject, val_mean)
    else:
        row = p.run("test", subject, chosen[subject])
        val = p.run("val", subject, chosen[subject])
    # the AIC backbone's halting head (the precondition, judged on aic only; every subject
    # carries the number because every metric is collected per subject); NaN (no paying
    # validation step) counts as a blind head
    auc = p.head_quality()["auc"]
    return {
        "halting_head_auc": 0.5 if np.isnan(auc) else auc,
        "return_over_random": p.return_over_random(row),
        "episode_return": row["episode_return"],
        "flops_per_decision": row["flops_per_decision"],
        "mean_steps": row["mean_steps"],
        "success": row["success"],
        "val_score": p.score(val),
    }


def experiment(spec, task: Task, settings: dict[str, Any], run) -> dict[str, Any]:
    """Train AIC and the fixed network on every seed of ``spec`` (jobs), tune on validation
    episodes of its first seed, run every subject on every seed. ``run(jobs)`` returns
    {job: value}."""
    fits = {(s, seed): Job(s, seed, {}, "fit") for seed in spec.seeds for s in FIT_MODE}
    done = run(list(fits.values()))
    pairs: dict[int, Pair] = {}

    def pair(seed: int) -> Pair:
        if seed not in pairs:
            aic, fixed = done[fits["aic", seed]], done[fits["fixed_k", seed]]
            pairs[seed] = Pair(task, seed, settings, aic, fixed)
        return pairs[seed]

    def validation_score(subject: str, params: dict[str, Any], seed: int) -> float:
        return pair(seed).score(pair(seed).run("val", subject, params[KNOB[subject]]))

    tuning = tune(spec, validation_score)
    chosen = {s: tuning.best[s].get(KNOB.get(s, ""), None) for s in SUBJECTS}
    random_means: dict[int, float] = {}
    results = run_seeds(spec, lambda s, seed: subject_row(pair(seed), s, chosen, random_means))
    return {
        "results": results,
        "tuning": tuning,
        "pairs": pairs,
        "chosen": chosen,
        "random_means": random_means,
    }


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation episodes, run every subject on every seed (and on the replication
    seeds with ``--replicate``), judge, add the budget evidence and the diagnosis when the
    method fails a check, write results/."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)  # --jobs (default 2; 1 with --quick), --fresh, --replicate
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    torch.set_num_threads(1)  # the rollouts here: one thread, as in the jobs
    start = time.perf_counter()
    settings = dict(spec.settings)
    task = get_task(settings["task"], settings.get("env_id"))
    options = runner_options(args, default_workers=2)
    ran: list[JobResult] = []

    def run(jobs: list[Job]) -> dict[Job, Any]:
        results = run_jobs(
            fit_job,
            jobs,
            settings=settings,
            cache_dir=JOBS_DIR,
            revision=code_revision(PROJECT),
            label="aic",
            **options,
        )
        ran.extend(results)
        return {r.job: r.value for r in results}

    registered = experiment(spec, task, settings, run)
    results, pairs, chosen = registered["results"], registered["pairs"], registered["chosen"]
    judgement = judge(spec, results)
    replication, replicated = None, None
    if args.replicate:
        rspec = spec.for_replication()
        replicated = experiment(rspec, task, settings, run)
        replication = Replication(
            rspec, replicated["results"], judge(rspec, replicated["results"]),
            replicated["tuning"],
        )  # fmt: skip

    frontier = {seed: frontier_rows(p) for seed, p in pairs.items()}
    precondition = check_precondition(pairs, settings)
    evidence = gather_evidence(pairs, chosen, registered["random_means"], settings)
    if replicated is not None:
        evidence["replication"] = {
            "precondition": check_precondition(replicated["pairs"], settings),
            "halting_head_quality": {s: p.head_quality() for s, p in replicated["pairs"].items()},
            "chosen": replicated["chosen"],
            "train_seconds": {s: p.train_seconds for s, p in replicated["pairs"].items()},
        }
    judgements = [judgement] + ([replication.judgement] if replication else [])
    failed = [
        c
        for c in spec.checks
        if any(not j.outcomes[spec.method][c.name].passed for j in judgements)
    ]
    budget = method_budget(spec, task, settings, registered, failed[0], run) if failed else None

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_frontier(out / "frontier.png", frontier)
    pre_text = (
        "precondition met"
        if precondition["met"]
        else "PRECONDITION FAILED (the pair should not be judged)"
    )
    notes = [
        f"Task {task.env_id}, architecture {settings['budget']['model.architecture']}, "
        f"K_max {pairs[spec.seeds[0]].k_max}; {settings['episodes']} test episodes per seed and "
        "subject (episode seeds disjoint from training and validation).",
        f"Pre-registered precondition: {pre_text}: {precondition['text']}.",
        "return_over_random: per test episode, the subject's return minus that of random "
        "halting on AIC's backbone with the subject's own measured mean steps per decision.",
        "Units: episode_return is MiniGrid's episode return (1 - 0.9 steps/max_steps on success, "
        "0 otherwise); flops_per_decision is analytic FLOPs per environment decision; "
        "mean_steps is refinement steps per decision, averaged within each episode.",
        "FLOPs: fixed K = encoder + K core + one readout; AIC / PonderNet / ACT = encoder + K "
        "(core + feature + halting head) + one readout; confidence exit and the oracle read out "
        "at every step. The oracle's FLOPs are idealised: it halts on a look-ahead over every "
        "readout up to K_max but is charged only the K steps it halts at.",
        "frontier.png: mean return vs mean FLOPs per decision over every rule's parameter sweep "
        "(test episodes, mean over seeds); the numbers are in evidence.frontier.",
    ]
    if budget is not None:
        notes.append(
            f"Budget evidence ({budget['check']}): AIC and the fixed network trained again on "
            f"seed {budget['seed']} at {budget['multipliers']} x trainer.max_epochs, the "
            f"method against {budget['rival']} on {budget['metric']} (same tuned knobs)."
        )
    write_claim(
        out,
        project="aic",
        spec=spec,
        results=results,
        judgement=judgement,
        replication=replication,
        config={"settings": settings, "quick": args.quick, "chosen": chosen},
        wall_time_s=time.perf_counter() - start,
        tuning=registered["tuning"],
        evidence={**evidence, "precondition": precondition, "frontier": frontier},
        headline=f"{pre_text}; AIC at threshold {chosen['aic']}",
        notes=notes,
        figures=["frontier.png"],
        jobs=summarise_jobs(ran),
        budget=budget,
        diagnosis=functools.partial(diagnose, failed=[c.name for c in failed]),
    )
    return {"verdict": judgement.verdict, "results": results, "precondition": precondition}


def method_budget(spec, task: Task, settings, registered, check, run) -> dict[str, Any]:
    """The budget evidence for the method's first failed check: AIC and the fixed network
    trained on the first registered seed at each of ``settings.budget_multipliers`` x
    ``trainer.max_epochs`` (the 1x fits are the registered ones), the check's metric for the
    method and its rival (the check's reference subject; random halting at AIC's mean steps
    for the threshold check at equal compute) with the registered tuned knobs. Wall time:
    the training seconds of the network the subject runs on."""
    seed, metric = spec.seeds[0], check.metric
    against = check.against if isinstance(check.against, (list, tuple)) else [check.against]
    rival = next((s for s in against if s), None) or "random_halting"
    chosen = registered["chosen"]
    budget_pairs: dict[float, Pair] = {}

    def pair_at(multiplier: float) -> Pair:
        if multiplier == 1:
            return registered["pairs"][seed]
        if multiplier not in budget_pairs:
            jobs = {s: Job(s, seed, {"multiplier": multiplier}, "budget") for s in FIT_MODE}
            done = run(list(jobs.values()))
            budget_pairs[multiplier] = Pair(
                task, seed, settings, done[jobs["aic"]], done[jobs["fixed_k"]]
            )
        return budget_pairs[multiplier]

    def point(subject: str, multiplier: float, seed: int) -> dict[str, float]:
        p = pair_at(multiplier)
        row = subject_row(p, subject, chosen, {})
        network = "fixed" if subject == "fixed_k" else "aic"
        return {
            "metric": float(np.mean(row[metric])),
            "wall_time_s": p.train_seconds[network],
        }

    evidence = budget_evidence(
        point,
        method=spec.method,
        rival=rival,
        goal=check.goal,
        seed=seed,
        multipliers=[float(m) for m in settings["budget_multipliers"]],
    )
    halting = {f"{m:g}": pair_at(m).head_quality() for m in settings["budget_multipliers"]}
    return {"check": check.name, "metric": metric, **evidence, "halting_head_quality": halting}


def _precondition_finding(pre: dict[str, Any], path: str, label: str):
    """A failed precondition on the AIC halting head's AUC: the head does not rank where the
    next step pays, so the allocation the checks judge is not the paper's mechanism at work."""
    return finding(
        "implementation",
        f"{pre['name']} ({label}): the learned halting head's AUC for 'the next step pays its "
        "price' is below the pre-registered floor, so the checks were not judged: the head does "
        "not rank where computation pays",
        (f"{path}.advantage.estimate", "mean AUC minus the floor"),
    )


def _metric_path(prefix: str, subject: str, metric: str, part: str = "mean") -> str:
    root = "metrics" if prefix == "outcomes" else "replication.metrics"
    return f"{root}.{subject}.{metric}.{part}"


HALTING_RULES = ("pondernet", "act", "confidence_exit")  # baselines that allocate steps


def _node(record: dict[str, Any], prefix: str) -> dict[str, Any]:
    node = record
    for part in prefix.split("."):
        node = node[part]
    return node


def _every_seed_clears(metrics, subject: str, metric: str, bar: float, goal: str) -> bool:
    seeds = metrics.get(subject, {}).get(metric, {}).get("per_seed") or []
    good = (lambda v: v > bar) if goal == "higher" else (lambda v: v < bar)
    return bool(seeds) and all(good(v) for v in seeds)


def _every_seed_beats_reference(metrics, subject: str, spec: dict[str, Any]) -> bool:
    """Every seed's mean of ``subject`` on the good side of ratio x the reference's mean."""
    metric, ratio = spec["metric"], spec.get("ratio", 1.0)
    mine = metrics.get(subject, {}).get(metric, {}).get("per_seed") or []
    theirs = metrics.get(spec["against"][0], {}).get(metric, {}).get("per_seed") or []
    if not mine or len(mine) != len(theirs):
        return False
    margin = spec.get("margin", 0.0)
    if spec["goal"] == "higher":
        return all(a > ratio * b + margin for a, b in zip(mine, theirs, strict=True))
    return all(a < ratio * b - margin for a, b in zip(mine, theirs, strict=True))


def _seed_cites(prefix: str, subject: str, metric: str, seeds: list) -> list[tuple[str, str]]:
    return [
        (_metric_path(prefix, subject, metric, f"per_seed.{i}"), f"{subject}, seed {seed}")
        for i, seed in enumerate(seeds)
    ]


def diagnose(record: dict[str, Any], failed: list[str]) -> list:
    """Why the verdict is not ``held``, from the record's numbers (protocol v3).

    - a failed precondition: the learned head does not rank the gain (implementation);
    - a control that misbehaved, and a method check that fails although every seed's mean is on
      the good side of a threshold bar: the interval (t over the seed means, the wider of that and
      the bootstrap) cannot resolve the effect at this many seeds (check);
    - otherwise, for the threshold check at equal compute: halting baselines on the same backbone
      that clear the bar the AIC head misses (implementation), none clearing it (check), or AIC
      on the wrong side while the oracle on the same network clears it (idea);
    - the budget evidence: whether twice the training raises AIC's advantage over its rival.
    """
    if record["verdict"] in ("held", "held, not replicated"):
        return []
    method = record["method"]
    checks = {c["name"]: c for c in record["checks"]}
    findings = []
    runs = [("registered seeds", "outcomes", record["metrics"])]
    seed_sets = {"outcomes": record["seeds"]}
    if record.get("replication", {}).get("run"):
        runs.append(("replication seeds", "replication.outcomes", record["replication"]["metrics"]))
        seed_sets["replication.outcomes"] = record["replication"]["seeds"]
    for i, pre in enumerate(record.get("preconditions", [])):
        if not pre["passed"]:
            findings.append(_precondition_finding(pre, f"preconditions.{i}", "registered seeds"))
    for name, pre in (record.get("replication", {}).get("preconditions") or {}).items():
        if not pre["passed"]:
            findings.append(
                _precondition_finding(
                    {**pre, "name": name}, f"replication.preconditions.{name}", "replication seeds"
                )
            )
    controls = {
        "outcomes": record.get("controls", []),
        "replication.outcomes": record.get("replication", {}).get("controls", []),
    }
    for label, prefix, metrics in runs:
        node = _node(record, prefix)
        for control in controls[prefix]:
            if control["behaved"]:
                continue
            name = control["name"]
            must_pass = control["role"] == "positive"
            wrong = [c for c, o in node[name].items() if o["passed"] != must_pass]
            for check in wrong:
                spec = checks[check]
                where = f"{prefix}.{name}.{check}.advantage"
                cites = [(f"{where}.estimate", "its advantage"), (f"{where}.ci.0", "low end")]
                resolves = spec.get("threshold") is not None and _every_seed_clears(
                    metrics, name, spec["metric"], spec["threshold"], spec["goal"]
                )
                n = len(seed_sets[prefix])
                if resolves:
                    cites += _seed_cites(prefix, name, spec["metric"], seed_sets[prefix])
                    if "random_halting" in metrics:  # the reference's spread over seeds
                        cites += _seed_cites(
                            prefix, "random_halting", "episode_return", seed_sets[prefix]
                        )
                findings.append(
                    finding(
                        "check",
                        f"the {control['role']} control {name} misbehaved on {check} on the "
                        f"{label}"
                        + (
                            f": every seed's mean clears the bar, but the interval over {n} "
                            "seed means reaches it (the per-seed spread of the random-halting "
                            "reference at these few steps dominates): the check cannot resolve "
                            "the control at this many seeds"
                            if resolves
                            else ": the miniature cannot tell working allocation from broken"
                        ),
                        *cites,
                    )
                )
        for check in failed:
            if node[method][check]["passed"]:
                continue
            spec = checks[check]
            metric, bar, goal = spec["metric"], spec.get("threshold"), spec["goal"]
            where = f"{prefix}.{method}.{check}.advantage"
            advantage = node[method][check]["advantage"]
            auc = (_metric_path(prefix, method, "halting_head_auc"), "the halting head's AUC")
            head = [(f"{where}.estimate", "the method's advantage"), (f"{where}.ci.0", "low end")]
            rivals = [
                b
                for b in HALTING_RULES
                if bar is not None and _every_seed_clears(metrics, b, metric, bar, goal)
                and metrics[b][metric]["ci"][0] is not None
                and (metrics[b][metric]["ci"][0] > bar if goal == "higher" else
                     metrics[b][metric]["ci"][1] < bar)
            ]  # fmt: skip
            oracle = node.get("oracle_halting", {}).get(check, {})
            if advantage["estimate"] is None:
                findings.append(
                    finding(
                        "undetermined",
                        f"{check} ({label}): the advantage has no estimate",
                        (_metric_path(prefix, method, metric), "the method's mean"),
                    )
                )
            elif (
                not bar
                and spec.get("against")
                and _every_seed_beats_reference(metrics, method, spec)
            ):
                n = len(seed_sets[prefix])
                reference = spec["against"][0]
                findings.append(
                    finding(
                        "check",
                        f"{check} ({label}): AIC's mean clears {spec.get('ratio', 1):g} x "
                        f"{reference} on every one of the {n} seeds, but the interval over {n} "
                        "seed means reaches the bar: at this many seeds the check cannot "
                        "resolve it",
                        *head,
                        *_seed_cites(prefix, method, metric, seed_sets[prefix]),
                        *_seed_cites(prefix, reference, metric, seed_sets[prefix]),
                        auc,
                    )
                )
            elif bar is not None and _every_seed_clears(metrics, method, metric, bar, goal):
                n = len(metrics[method][metric]["per_seed"])
                findings.append(
                    finding(
                        "check",
                        f"{check} ({label}): AIC's mean clears the bar on every one of the {n} "
                        f"seeds, but the interval over {n} seed means reaches it"
                        + (
                            "; so does the oracle's on the same network"
                            if oracle and not oracle.get("passed")
                            else ""
                        )
                        + ": at this many seeds the check cannot resolve the effect",
                        *head,
                        *_seed_cites(prefix, method, metric, seed_sets[prefix]),
                        auc,
                    )
                )
            elif rivals:
                findings.append(
                    finding(
                        "implementation",
                        f"{check} ({label}): on the same backbone "
                        + ", ".join(rivals)
                        + " clear the bar the AIC halting head misses: the network's readouts "
                        "carry the allocation signal, the learned head does not use it as well",
                        *head,
                        *[
                            (_metric_path(prefix, b, metric, "ci.0"), f"{b}'s low end")
                            for b in rivals
                        ],
                        auc,
                    )
                )
            elif advantage["estimate"] > 0:
                findings.append(
                    finding(
                        "check",
                        f"{check} ({label}): the method's advantage is positive but its "
                        "interval reaches 0 and no halting baseline clears the bar either",
                        *head,
                        auc,
                    )
                )
            else:
                cites = [*head, auc]
                if oracle:
                    cites.append(
                        (f"{prefix}.oracle_halting.{check}.advantage.ci.0", "oracle low end")
                    )
                findings.append(
                    finding(
                        "idea" if oracle.get("passed") else "undetermined",
                        f"{check} ({label}): the method is on the wrong side of the bar"
                        + (
                            " while the oracle on the same network clears it"
                            if oracle.get("passed")
                            else ""
                        ),
                        *cites,
                    )
                )
    budget = record.get("budget")
    if budget:
        keys = list(budget["gap"])
        change = budget["gap"][keys[-1]] - budget["gap"][keys[0]]
        sign = 1.0 if budget["goal"] == "higher" else -1.0
        own = budget["points"][budget["method"]]
        moved = sign * (own[keys[-1]]["metric"] - own[keys[0]]["metric"])
        # the gap must grow by more than a tenth of itself AND through the method's own number
        # (a rival that gets worse at the longer budget narrows the gap without AIC improving)
        gains = change > 0.1 * abs(budget["gap"][keys[0]]) and moved > 0.5 * change > 0
        cites = [
            (f"budget.gap.{keys[0]}", f"gap at {keys[0]}x"),
            (f"budget.gap.{keys[-1]}", f"gap at {keys[-1]}x"),
        ]
        for key in (keys[0], keys[-1]):
            value = budget.get("halting_head_quality", {}).get(key, {}).get("auc")
            if isinstance(value, float) and math.isfinite(value):
                cites.append((f"budget.halting_head_quality.{key}.auc", f"head AUC at {key}x"))
        findings.append(
            finding(
                "implementation" if gains else "undetermined",
                f"{budget['check']}: training AIC {keys[-1]}x longer "
                + (
                    "raises its own number and its advantage over the rival by more than a "
                    "tenth: the registered budget costs it"
                    if gains
                    else "does not raise its own number enough to move its advantage over the "
                    "rival by a tenth (a gap that narrows through the rival's number is not "
                    "counted): the training budget is not what the check is missing"
                ),
                *cites,
                (f"budget.points.{budget['method']}.{keys[0]}.metric", f"AIC at {keys[0]}x"),
                (f"budget.points.{budget['method']}.{keys[-1]}.metric", f"AIC at {keys[-1]}x"),
            )
        )
    if not findings:  # the method passed where it was judged: the controls decided
        findings.append(
            finding(
                "check",
                "the method passed its checks; the verdict follows from the controls or the "
                "precondition",
                (f"metrics.{method}.halting_head_auc.mean", "the halting head's AUC"),
            )
        )
    return findings


def check_precondition(pairs: dict[int, Pair], settings: dict[str, Any]) -> dict[str, Any]:
    """Validation episodes: the fixed network learns the task and one step does not suffice."""
    rule = settings["precondition"]
    fixed_success = float(
        np.mean([p.run("val", "fixed_k")["success"].mean() for p in pairs.values()])
    )
    fixed_return = float(
        np.mean([p.run("val", "fixed_k")["episode_return"].mean() for p in pairs.values()])
    )
    one_step = float(
        np.mean([p.run("val", "one_step")["episode_return"].mean() for p in pairs.values()])
    )
    learns = fixed_success >= rule["fixed_min_success"]
    pays = one_step < rule["retain_ratio"] * fixed_return
    return {
        "met": bool(learns and pays),
        "fixed_val_success": fixed_success,
        "fixed_val_return": fixed_return,
        "one_step_val_return": one_step,
        "text": (
            f"fixed network validation success {fixed_success:.3f} "
            f"({'>=' if learns else '<'} {rule['fixed_min_success']}); one-step validation "
            f"return {one_step:.3f} {'<' if pays else '>='} {rule['retain_ratio']} x fixed "
            f"{fixed_return:.3f}"
        ),
    }


def frontier_rows(p: Pair) -> dict[str, list[dict[str, float]]]:
    """Return and FLOPs on the test episodes over each rule's parameter sweep."""
    sweep = p.settings["frontier"]
    rows: dict[str, list[dict[str, float]]] = {}
    plan = {
        "aic": sweep["halt_threshold"],
        "fixed_k_of_aic": list(range(1, p.k_max + 1)),
        "fixed_k": [None],
        "pondernet": sweep["prior"],
        "act": sweep["tau"],
        "confidence_exit": sweep["threshold"],
        "random_halting": sweep["random_mean_steps"],
        "oracle_halting": sweep["price"],
    }
    for name, values in plan.items():
        rows[name] = []
        for value in values:
            row = p.run("test", name, value)
            rows[name].append(
                {
                    "param": value,
                    "return": float(row["episode_return"].mean()),
                    "flops": float(row["flops_per_decision"].mean()),
                    "mean_steps": float(row["decision_mean_steps"]),
                }
            )
    return rows


def gather_evidence(pairs, chosen, random_means, settings) -> dict[str, Any]:
    """What the learned parts do: how far training moved AIC, how its steps spread over
    decisions, and the offline removal protocol (targeted, random, reverse) on validation
    states with exact Q*."""
    evidence: dict[str, Any] = {"relative_parameter_change_of_aic": {}, "flops_parts": {}}
    evidence["random_halting_target_mean_steps"] = random_means
    evidence["oracle_flops"] = (
        "idealised: oracle_halting halts at K on the exact gain of readouts up to K_max (a "
        "look-ahead over all K_max steps) but is charged K x (core + feature + policy head)"
    )
    evidence["train_seconds"] = {s: p.train_s for s, p in pairs.items()}
    removal, valid, added = {}, {}, {}
    evidence["halting_head_quality"] = {s: p.head_quality() for s, p in pairs.items()}
    for seed, p in pairs.items():
        evidence["relative_parameter_change_of_aic"][seed] = p.moved()
        evidence["flops_parts"][seed] = p.flops
        val = p.data.val_arrays
        table = readout_table(p.aic, torch.from_numpy(val["obs"]))
        returns = step_returns("q", table["actions"], None, torch.from_numpy(val["q"]))
        steps = halting_steps(table["halt"], chosen["aic"])
        evidence.setdefault("steps_histogram", {})[seed] = np.bincount(
            steps.numpy(), minlength=p.k_max + 1
        )[1:].tolist()
        removal[seed] = removal_curve(
            returns, steps, settings["removal_fractions"], settings["n_random"], seed
        )
        valid[seed] = validity(steps, torch.from_numpy(val["difficulty"]), returns, seed)
        added[seed] = addition_control(returns, steps, 0.3, settings["n_random"], seed)
    evidence["removal_offline"] = removal
    evidence["addition_offline"] = added
    evidence["validity_offline"] = valid
    return evidence


def plot_frontier(path: Path, frontier: dict[int, dict[str, list[dict]]]) -> None:
    """Mean return vs mean FLOPs per decision (over seeds) for every rule's sweep."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    names = next(iter(frontier.values())).keys()
    for name in names:
        per_seed = [rows[name] for rows in frontier.values()]
        flops = np.mean([[r["flops"] for r in rows] for rows in per_seed], 0)
        returns = np.mean([[r["return"] for r in rows] for rows in per_seed], 0)
        order = np.argsort(flops)
        marker = "*" if name == "fixed_k" else "o"
        ax.plot(flops[order] / 1e6, returns[order], marker=marker, markersize=4, label=name)
    ax.set(xlabel="MFLOPs per decision", ylabel="episode return (mean over seeds)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main() -> None:
    """Console entry point of `uv run reproduce` (entry point group papers.reproduce)."""
    torch.set_num_threads(1)
    run_claim_experiment()
