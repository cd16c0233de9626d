"""The claim experiment (`uv run reproduce`) on TOFU-mini, under the protocol of configs/claim.yaml.

1. Pretrain a base model once on generic QA about one-off people (no author fact).
2. Per seed (a seed draws the authors, the generic corpus mix and the initialisation order):
   fine-tune the base on every author (the *full* model) and on all but the forget authors (the
   *retain* model).
3. Every subject unlearns the forget authors from the full model with the same number of model
   updates, batches and retain weight; the learning rate is tuned on the validation forget
   authors of seed 0 (the test forget authors are never used for tuning).
4. Metrics against the retain model and the full model; papers_eval judges the checks on the
   method and the controls and writes results/claim.json and claim.md.

Every training (the base, the full and retain models, each unlearning run) is a job of the
shared runner (``papers_eval.jobs``: ``--jobs`` worker processes of one torch thread each, a
cache of finished jobs under runs/atwu/jobs). The model folders later jobs start from are kept
under runs/atwu/inputs, named by a digest of their files: a job names the digests in its params,
so its cache key changes when a model it starts from does.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import transformers
from lightning.pytorch import Callback, Trainer

from atwu.data import TOKEN_CLASSES, UnlearningDataModule, collate
from atwu.evaluate import (
    answer_token_logprobs,
    forget_gap,
    forget_quality,
    gap_to_reference,
    greedy_answers,
    normalised_answer_probability,
    rouge_l_recall,
    span_alignment,
    truth_ratios,
)
from atwu.model import UnlearningModule, load_pretrained
from papers_cli import project_dir_of, reproduce_parser
from papers_eval import contrast_interval, judge, load_claim_spec, run_seeds, tune, write_claim
from papers_eval.jobs import (
    Job,
    JobResult,
    canonical_json,
    run_jobs,
    runner_options,
    summarise_jobs,
)
from papers_eval.record import code_revision
from papers_eval.tuning import tuning_grids
from papers_gpu import seed_everything

PROJECT = project_dir_of(__file__)
CLAIM_FILE = PROJECT / "configs" / "claim.yaml"
JOBS_DIR = PROJECT.parents[1] / "runs" / "atwu" / "jobs"
INPUTS_DIR = PROJECT.parents[1] / "runs" / "atwu" / "inputs"
SUBJECTS = (
    "full_model",
    "atwu",
    "npo",
    "wga",
    "satimp",
    "graddiff",
    "simnpo",
    "atwu_uniform",
    "atwu_random_features",
    "atwu_raw_conflict",
    "annotator_oracle",
    "annotator_heuristic",
)
METRICS = (
    "forget_gap",
    "val_forget_gap",
    "utility",
    "template_gap",
    "value_gap",
    "name_gap",
    "collateral_prob",
    "forget_quality",
    "forget_rouge",
    "span_auroc",
    "frontier_area",
    "train_s",
)
BASE_SEED = 1000  # the generic corpus of the base model (shared by every seed)
BATCH = 32
QUICK_DATA = {
    "num_authors": 8,
    "num_forget_authors": 2,
    "num_collateral_authors": 1,
    "num_generic": 100,
}
MODELS = ("base", "full", "retain")  # the model folders of a seed's world, by kind
FINETUNE_ON = {"full": "all", "retain": "retain"}  # the data each fine-tuned model sees


def quiet_trainer(max_steps: int, callbacks=None) -> Trainer:
    return Trainer(
        callbacks=callbacks,
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )


def train_lm(data: UnlearningDataModule, steps: int, seed: int, pretrained=None) -> dict:
    """Train (pretrain or fine-tune) on ``data``'s fine-tuning split; return the files of the
    model and tokenizer folder (``save_pretrained``), which the caller stores in INPUTS_DIR."""
    seed_everything(seed)
    module = UnlearningModule(method="ga", finetune_steps=steps, pretrained=pretrained)
    quiet_trainer(steps).fit(module, data)
    with tempfile.TemporaryDirectory() as out:  # save_pretrained writes folders, jobs return data
        module.model.save_pretrained(out)
        data.tokenizer.save_pretrained(out)
        return {p.name: p.read_bytes() for p in sorted(Path(out).iterdir()) if p.is_file()}


def pretrain_job(job: Job, settings: Mapping[str, Any]) -> dict:
    """The base model, on generic QA only (top level, like every job function: worker processes
    import it by name)."""
    _quiet()
    data = UnlearningDataModule(
        seed=job.seed, finetune_on="generic", batch_size=BATCH, **settings["data"]
    )
    data.setup()
    return train_lm(data, settings["pretrain_steps"], job.seed)


def finetune_job(job: Job, settings: Mapping[str, Any]) -> dict:
    """The full (every author) or retain (no forget author) model of a seed, from the base."""
    _quiet()
    base = input_path("base", job.params["base"])
    data = UnlearningDataModule(
        finetune_on=FINETUNE_ON[job.subject], **data_kwargs(job.seed, base, settings)
    )
    data.setup()
    return train_lm(data, settings["finetune_steps"], job.seed, pretrained=str(base))


def reference_job(job: Job, settings: Mapping[str, Any]) -> dict:
    """Every metric of a seed's full and retain models (the references of its runs)."""
    _quiet()
    w = world_of(job.seed, job.params, settings)
    return {
        f"{kind}_model": w.evaluate(load_pretrained(str(input_path(kind, job.params[kind]))))
        for kind in ("full", "retain")
    }


def unlearn_job(job: Job, settings: Mapping[str, Any]) -> dict[str, Any]:
    """One unlearning run of the full model: its frontier points, and unless the stage is
    ``frontier`` (points only) its metrics and what the record keeps of it (ATWU's conflict
    scores before and after, the scorer's weight norm)."""
    _quiet()
    params = {k: v for k, v in job.params.items() if k not in MODELS}
    subject, seed, evaluate = job.subject, job.seed, job.stage != "frontier"
    w = world_of(seed, job.params, settings)
    seed_everything(seed)
    module = UnlearningModule(
        method=subject,
        pretrained=str(input_path("full", job.params["full"])),
        finetune_steps=0,
        burnin_steps=settings["burnin_steps"],
        **params,
    )
    out: dict[str, Any] = {}
    if subject == "atwu" and evaluate:
        module.build(w.tokenizer, w.data)
        module.reference.load_state_dict(module.model.state_dict())
        out["scores_before"] = conflict_by_class(module, w)
    probe = FrontierProbe(w, settings["frontier_every"])
    tick = time.perf_counter()
    quiet_trainer(settings["unlearn_steps"], callbacks=[probe]).fit(module, w.data)
    train_s = time.perf_counter() - tick - probe.seconds
    out["points"] = probe.points
    if not evaluate:
        return out
    if subject == "atwu":
        out["scores_after"] = conflict_by_class(module, w)
    metrics = w.evaluate(module.model)
    metrics["train_s"] = train_s
    weights = module.token_weights(w.forget_batch, w.retain_batch)
    if weights is not None:
        answer = w.forget_batch["labels"][:, 1:] != -100
        relevant = w.forget_batch["relevance"][:, 1:][answer].numpy()
        metrics["span_auroc"] = span_alignment(weights[answer].numpy(), relevant)["auroc"]
    if subject in ("atwu", "atwu_random_features"):
        out["scorer_weight_norm"] = float(module.scorer.linear.weight.detach().norm())
    out["metrics"] = metrics
    return out


def _quiet() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", ".*isinstance\\(treespec, LeafSpec\\).*")
    warnings.filterwarnings("ignore", ".*module\\(s\\) in eval mode.*")


def folder_digest(files: Mapping[str, bytes]) -> str:
    """A sha256 (16 hex digits) of a model folder: its file names and bytes."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"<{name}:{len(files[name])}>".encode())
        h.update(files[name])
    return h.hexdigest()[:16]


def input_path(kind: str, key: str) -> Path:
    return INPUTS_DIR / f"{kind}-{key}"


def store_input(kind: str, files: Mapping[str, bytes]) -> str:
    """Write a model folder into INPUTS_DIR under its digest (once); returns the digest."""
    key = folder_digest(files)
    path = input_path(kind, key)
    if not path.is_dir():
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        for name, data in files.items():
            (partial / name).write_bytes(data)
        try:
            partial.rename(path)
        except OSError:  # another process stored the same folder meanwhile
            shutil.rmtree(partial)
    return key


def data_kwargs(seed: int, base: Path, settings: Mapping[str, Any]) -> dict[str, Any]:
    """A seed's TOFU-mini (the base's tokenizer, the quick run's smaller world)."""
    return {"seed": seed, "tokenizer_path": str(base), "batch_size": BATCH, **settings["data"]}


class World:
    """One seed's TOFU-mini: the data, the items each metric reads and the retain model's
    numbers every unlearning run of the seed is measured against."""

    def __init__(self, seed: int, base: Path, retain: Path, settings: Mapping[str, Any]) -> None:
        self.data = UnlearningDataModule(**data_kwargs(seed, base, settings))
        self.data.setup()
        self.tokenizer, items = self.data.tokenizer, self.data.data
        n_val = settings["val_forget_authors"] * len(items.forget) // sizes_forget(items)
        self.val_items, self.test_items = items.forget[:n_val], items.forget[n_val:]
        self.utility_items = (
            items.retain[:64] + items.collateral + items.generic_eval + items.world_facts
        )
        retain_model = load_pretrained(str(retain)).eval()
        self.retain_val = answer_token_logprobs(retain_model, self.tokenizer, self.val_items)
        self.retain_test = answer_token_logprobs(retain_model, self.tokenizer, self.test_items)
        self.retain_ratios = truth_ratios(retain_model, self.tokenizer, self.test_items)
        self.forget_batch = collate(
            [self.data.forget_set.examples[i] for i in range(n_val, len(items.forget))],
            self.tokenizer.pad_token_id,
        )
        self.retain_batch = collate(self.data.retain_set.examples[:64], self.tokenizer.pad_token_id)

    @torch.no_grad()
    def frontier_point(self, model) -> tuple[float, float]:
        """(mean forget_gap on the test items, mean utility): one point of the frontier."""
        was_training = model.training
        model.eval()
        test = answer_token_logprobs(model, self.tokenizer, self.test_items)
        utility = answer_token_logprobs(model, self.tokenizer, self.utility_items)
        model.train(was_training)
        return (
            float(np.mean(forget_gap(test, self.retain_test))),
            float(normalised_answer_probability(utility).mean()),
        )

    def evaluate(self, model) -> dict[str, Any]:
        """Every metric of one model (see configs/claim.yaml for the checked ones)."""
        model.eval()
        test = answer_token_logprobs(model, self.tokenizer, self.test_items)
        val = answer_token_logprobs(model, self.tokenizer, self.val_items)
        utility = normalised_answer_probability(
            answer_token_logprobs(model, self.tokenizer, self.utility_items)
        )
        collateral = self.data.data.collateral
        generated = greedy_answers(model, self.tokenizer, [it.question for it in self.test_items])
        return {
            "forget_gap": forget_gap(test, self.retain_test),
            "val_forget_gap": float(np.mean(forget_gap(val, self.retain_val))),
            "utility": utility,
            "template_gap": float(
                np.nanmean(gap_to_reference(test, self.retain_test, TOKEN_CLASSES["template"]))
            ),
            "value_gap": float(
                np.nanmean(gap_to_reference(test, self.retain_test, TOKEN_CLASSES["value"]))
            ),
            "name_gap": float(
                np.nanmean(gap_to_reference(test, self.retain_test, TOKEN_CLASSES["name"]))
            ),
            "collateral_prob": float(
                normalised_answer_probability(
                    answer_token_logprobs(model, self.tokenizer, collateral)
                ).mean()
            ),
            "forget_quality": forget_quality(
                truth_ratios(model, self.tokenizer, self.test_items), self.retain_ratios
            ),
            "forget_rouge": float(
                rouge_l_recall(generated, [it.answer for it in self.test_items]).mean()
            ),
        }


# The worlds this process built, by seed, model digests and settings: a worker builds a seed's
# world once for all the jobs of that seed it runs.
_WORLDS: dict[str, World] = {}


def world_of(seed: int, models: Mapping[str, Any], settings: Mapping[str, Any]) -> World:
    """The world of ``seed`` whose models' digests ``models`` names (``base``, ``retain``)."""
    key = canonical_json({"seed": seed, "models": [models[k] for k in MODELS], **settings})
    if key not in _WORLDS:
        _WORLDS[key] = World(
            seed,
            input_path("base", models["base"]),
            input_path("retain", models["retain"]),
            settings,
        )
    return _WORLDS[key]


def sizes_forget(items) -> int:
    """Number of forget authors."""
    return len({it.subject for it in items.forget})


class Runner:
    """Runs the claim's jobs through the shared runner (``options`` from ``runner_options``;
    cache under runs/atwu/jobs) and keeps every result for the record."""

    def __init__(self, settings: dict[str, Any], options: Mapping[str, Any]) -> None:
        self.settings, self.options = settings, dict(options)
        self.results: list[JobResult] = []

    def run(self, fn, jobs: list[Job]) -> list[JobResult]:
        done = run_jobs(
            fn,
            jobs,
            settings=self.settings,
            cache_dir=JOBS_DIR,
            revision=code_revision(PROJECT),
            label="atwu",
            **self.options,
        )
        self.results.extend(done)
        return done


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation, run every subject on every seed, judge, write results/."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)  # --jobs (default 2, the 2 cores; 1 with --quick), --fresh
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    start = time.perf_counter()
    torch.set_num_threads(1)  # tiny matrices: a second thread only adds contention
    _quiet()
    settings = dict(spec.settings)
    # what the jobs see: the settings and the size of the world (smaller with --quick)
    job_settings = {**settings, "data": QUICK_DATA if args.quick else {}}
    runner = Runner(job_settings, runner_options(args, default_workers=2))

    (pretrained,) = runner.run(pretrain_job, [Job("base", BASE_SEED, {}, "pretrain")])
    base = store_input("base", pretrained.value)
    finetuned = runner.run(
        finetune_job,
        [
            Job(kind, seed, {"base": base}, "finetune")
            for seed in spec.seeds
            for kind in FINETUNE_ON
        ],
    )
    timings = {
        "pretrain_s": pretrained.wall_time_s,
        "finetune_s": sum(result.wall_time_s for result in finetuned),
    }
    models = {seed: {"base": base} for seed in spec.seeds}  # a seed's model digests, by kind
    for result in finetuned:
        models[result.job.seed][result.job.subject] = store_input(result.job.subject, result.value)
    references = {
        result.job.seed: result.value
        for result in runner.run(
            reference_job,
            [Job("reference", seed, models[seed], "reference") for seed in spec.seeds],
        )
    }
    for seed, reference in references.items():
        print(
            f"seed {seed}: "
            + ", ".join(
                f"{name} gap {np.mean(m['forget_gap']):.3f} rouge {m['forget_rouge']:.2f}"
                for name, m in reference.items()
            ),
            flush=True,
        )

    runs: dict[tuple, dict[str, Any]] = {}  # run_key -> the unlearning job's value
    trajectories: dict[tuple, list[tuple[int, float, float]]] = {}  # (step, forget_gap, utility)
    recorded: set[tuple] = set()  # the evaluated runs whose evidence is in the record
    evidence: dict[str, Any] = {"scorer_weight_norm": {}, "scores": {}}

    def prefetch(wanted: list[tuple[str, dict[str, Any], int, str]]) -> None:
        """Run the unlearning runs (subject, params, seed, stage) not run yet; stage
        ``frontier`` takes only the frontier points, which an evaluated run has too."""
        todo: dict[tuple, Job] = {}
        for subject, params, seed, stage in wanted:
            key = run_key(subject, params, seed)
            if key in runs or (stage == "frontier" and key in trajectories) or key in todo:
                continue
            todo[key] = Job(subject, seed, {**params, **models[seed]}, stage)
        for key, result in zip(todo, runner.run(unlearn_job, list(todo.values())), strict=True):
            trajectories[key] = result.value["points"]
            if "metrics" in result.value:
                runs[key] = result.value

    def unlearn(subject: str, params: dict[str, Any], seed: int) -> dict[str, Any]:
        """The metrics of an evaluated (prefetched) run; the first read puts its evidence in
        the record, so the record's order is the order of the reads, whatever the workers."""
        key = run_key(subject, params, seed)
        run = runs[key]
        if key not in recorded:
            recorded.add(key)
            if subject == "atwu":
                evidence["scores"].setdefault(f"full model, seed {seed}", run["scores_before"])
                label = f"after unlearning (lr {params.get('lr')}), seed {seed}"
                evidence["scores"][label] = run["scores_after"]
            if "scorer_weight_norm" in run:
                label = f"{subject} lr {params.get('lr')} seed {seed}"
                evidence["scorer_weight_norm"][label] = run["scorer_weight_norm"]
        return run["metrics"]

    grids = tuning_grids(spec.tuning, spec.subjects)
    prefetch(
        [(s, p, spec.seeds[0], "tune") for s, grid in grids.items() if grid != [{}] for p in grid]
    )
    tuning = tune(
        spec, lambda subject, params, seed: unlearn(subject, params, seed)["val_forget_gap"]
    )
    unlearned = [s for s in spec.subjects if s != "full_model"]
    prefetch(
        [(s, tuning.best[s], seed, "test") for seed in spec.seeds for s in unlearned]
        + [
            (s, trial["params"], seed, "frontier")
            for seed in spec.seeds
            for s in unlearned
            for trial in tuning.trials[s]
        ]
    )

    def run_one(subject: str, seed: int) -> dict[str, Any]:
        full = references[seed]["full_model"]
        if subject == "full_model":  # the model before unlearning: the utility reference
            return {**full, "frontier_area": 0.0}
        metrics = dict(unlearn(subject, tuning.best[subject], seed))
        points = []
        for trial in tuning.trials[subject]:  # every learning rate of the grid, on this seed
            points += trajectories[run_key(subject, trial["params"], seed)]
        frontiers[f"{subject} seed {seed}"] = points
        metrics["frontier_area"] = frontier_area(
            [(gap, util) for _, gap, util in points],
            gap_ref=float(np.mean(full["forget_gap"])),
            utility_full=float(np.mean(full["utility"])),
            utility_ratio=settings["utility_ratio"],
        )
        return metrics

    frontiers: dict[str, list] = {}
    results = run_seeds(spec, run_one)
    judgement = judge(spec, results)
    overhead = wall_time_overhead(results)
    reference = {
        f"{name} seed {seed}": {k: float(np.mean(v)) for k, v in m.items()}
        for seed, r in references.items()
        for name, m in r.items()
    }
    write_claim(
        args.out,
        project="atwu",
        spec=spec,
        results=results,
        judgement=judgement,
        config={"settings": settings, "quick": args.quick, "torch_threads": 1, **timings},
        wall_time_s=time.perf_counter() - start,
        tuning=tuning,
        evidence={
            "atwu_wall_time_overhead_vs_uniform": overhead,
            "scorer_weight_norm_after_unlearning": evidence["scorer_weight_norm"],
            "conflict_scores_by_token_class": evidence["scores"],
            "frontier_area_differences": frontier_contrasts(results),
            "frontier_points": frontiers,
            "reference_models": reference,
        },
        notes=notes(overhead),
        jobs=summarise_jobs(runner.results),
    )
    frontier_plot(Path(args.out) / "frontier.png", frontiers, spec.seeds[0])
    return {"verdict": judgement.verdict, "results": results}


def run_key(subject: str, params: dict[str, Any], seed: int) -> tuple:
    """The key of one unlearning run in the caches of ``_run``."""
    return (subject, tuple(sorted(params.items())), seed)


class FrontierProbe(Callback):
    """Every ``every`` model updates, the (forget_gap, utility) point of the model being
    unlearned; its own wall time is kept out of the run's training time."""

    def __init__(self, world: World, every: int) -> None:
        self.world, self.every = world, every
        self.points: list[tuple[int, float, float]] = []
        self.seconds = 0.0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every == 0:
            tick = time.perf_counter()
            gap, util = self.world.frontier_point(pl_module.model)
            self.points.append((trainer.global_step, gap, util))
            self.seconds += time.perf_counter() - tick


def frontier_area(
    points: list[tuple[float, float]], gap_ref: float, utility_full: float, utility_ratio: float
) -> float:
    """Share of the box [0, gap_ref] x [floor, utility_full], floor = utility_ratio *
    utility_full, that the (forget_gap, utility) points dominate (lower gap and higher utility
    are better): the 2-D hypervolume of the frontier, bounded by the full model's gap and the
    utility floor. More forgetting at every utility level, a larger area; the full model's own
    point has area 0."""
    utility_floor = utility_ratio * utility_full
    inside = sorted((g, u) for g, u in points if g < gap_ref and u > utility_floor)
    if not inside:
        return 0.0
    area, best = 0.0, utility_floor
    next_gaps = [g for g, _ in inside[1:]] + [gap_ref]
    for (gap, util), next_gap in zip(inside, next_gaps, strict=True):
        best = max(best, util)
        area += (next_gap - gap) * (best - utility_floor)
    box = gap_ref * (utility_full - utility_floor)
    return float(area / box)


def frontier_contrasts(results) -> dict[str, dict[str, Any]]:
    """ATWU's frontier area minus each other subject's, paired over seeds (t interval)."""
    atwu = results["atwu"]["frontier_area"]
    return {
        other: contrast_interval(
            [(1.0, atwu), (-1.0, results[other]["frontier_area"])], paired=True
        ).as_dict()
        for other in results
        if other not in ("atwu", "full_model") and "frontier_area" in results[other]
    }


def frontier_plot(path: Path, frontiers: dict[str, list], seed: int) -> None:
    """One seed's (forget_gap, utility) points of every subject (all learning rates, every
    probe step) and each subject's Pareto front."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2), dpi=120)
    for label, points in frontiers.items():
        subject, _, s = label.rpartition(" seed ")
        if int(s) != seed or not points:
            continue
        gaps, utils = np.array([p[1] for p in points]), np.array([p[2] for p in points])
        (dots,) = ax.plot(gaps, utils, ".", alpha=0.4)
        order = np.argsort(gaps)
        front = np.maximum.accumulate(utils[order])
        ax.step(gaps[order], front, where="post", color=dots.get_color(), label=subject)
    ax.set(
        xlabel="forget_gap (lower: closer to the retain model)",
        ylabel="utility",
        title=f"unlearning frontier, seed {seed} (every lr, every probe step)",
    )
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def wall_time_overhead(results) -> float:
    """ATWU's unlearning wall time over uniform token NPO's (same steps, batches)."""
    return float(np.mean(results["atwu"]["train_s"]) / np.mean(results["atwu_uniform"]["train_s"]))


@torch.no_grad()
def conflict_by_class(module: UnlearningModule, w: World) -> dict[str, dict[str, float]]:
    """Quartiles of ATWU's conflict scores c_t on the forget test items, per token class (on
    the module's current parameters, against its NPO reference)."""
    forget = w.forget_batch
    with torch.enable_grad():
        logp, mask = module_logprobs(module, w.retain_batch)
        retain_loss = -(logp * mask).sum() / mask.sum()
        scores = module.conflict_scores(forget, retain_loss, module.reference_logprobs(forget))
    classes = forget["token_class"][:, 1:]
    out = {}
    for name, label in TOKEN_CLASSES.items():
        values = scores[classes == label].numpy()
        if values.size:
            q1, median, q3 = np.quantile(values, [0.25, 0.5, 0.75])
            out[name] = {"q1": float(q1), "median": float(median), "q3": float(q3)}
    return out


def module_logprobs(module: UnlearningModule, batch: dict):
    from atwu.core import answer_logprobs

    return answer_logprobs(module(batch).logits, batch["labels"])


def notes(overhead: float) -> str:
    return (
        "Model updates: every subject takes the same number of unlearning steps; ATWU's first "
        "burn-in steps use uniform weights while its scorer already learns, and each later step "
        "is one scorer step followed by one model step (strict alternation). ATWU's unlearning "
        f"wall time is {overhead:.2f}x that of uniform token weights (one retain-gradient "
        "backward and one JVP per step)."
    )


def main() -> None:
    """Console entry point of `uv run reproduce` (entry point group papers.reproduce)."""
    run_claim_experiment()
