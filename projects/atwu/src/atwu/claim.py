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
"""

from __future__ import annotations

import logging
import multiprocessing
import shutil
import tempfile
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
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
from papers_gpu import seed_everything

CLAIM_FILE = project_dir_of(__file__) / "configs" / "claim.yaml"
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


def train_lm(data: UnlearningDataModule, steps: int, out: Path, seed: int, pretrained=None):
    """Train (pretrain or fine-tune) on ``data``'s fine-tuning split; save model and tokenizer."""
    seed_everything(seed)
    module = UnlearningModule(method="ga", finetune_steps=steps, pretrained=pretrained)
    quiet_trainer(steps).fit(module, data)
    module.model.save_pretrained(out)
    data.tokenizer.save_pretrained(out)
    return out


def _finetune_job(job) -> None:
    which, kwargs, steps, out, seed, base = job
    torch.set_num_threads(1)
    _quiet()
    data = UnlearningDataModule(finetune_on=which, **kwargs)
    data.setup()
    train_lm(data, steps, out, seed, pretrained=base)


def _quiet() -> None:
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", ".*isinstance\\(treespec, LeafSpec\\).*")
    warnings.filterwarnings("ignore", ".*module\\(s\\) in eval mode.*")


class World:
    """One seed's TOFU-mini: data, full and retain models, and the fixed reference numbers."""

    def __init__(
        self, seed: int, base: Path, work: Path, settings: dict, sizes: dict, pool=None
    ) -> None:
        self.seed = seed
        kwargs = {"seed": seed, "tokenizer_path": str(base), "batch_size": BATCH, **sizes}
        tick = time.perf_counter()
        self.full_dir, self.retain_dir = work / f"full-{seed}", work / f"retain-{seed}"
        steps = settings["finetune_steps"]
        jobs = [
            (which, kwargs, steps, out, seed, str(base))
            for which, out in (("all", self.full_dir), ("retain", self.retain_dir))
        ]
        # the two fine-tunings are independent: one process each (one torch thread each)
        list(pool.map(_finetune_job, jobs)) if pool is not None else [
            _finetune_job(job) for job in jobs
        ]
        self.finetune_s = time.perf_counter() - tick
        self.data = UnlearningDataModule(**kwargs)
        self.data.setup()
        self.tokenizer, items = self.data.tokenizer, self.data.data
        n_val = settings["val_forget_authors"] * len(items.forget) // sizes_forget(items)
        self.val_items, self.test_items = items.forget[:n_val], items.forget[n_val:]
        self.utility_items = (
            items.retain[:64] + items.collateral + items.generic_eval + items.world_facts
        )
        retain = load_pretrained(str(self.retain_dir)).eval()
        full = load_pretrained(str(self.full_dir)).eval()
        self.retain_val = answer_token_logprobs(retain, self.tokenizer, self.val_items)
        self.retain_test = answer_token_logprobs(retain, self.tokenizer, self.test_items)
        self.retain_ratios = truth_ratios(retain, self.tokenizer, self.test_items)
        self.reference = {
            "full_model": self.evaluate(full),
            "retain_model": self.evaluate(retain),
        }
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


def sizes_forget(items) -> int:
    """Number of forget authors."""
    return len({it.subject for it in items.forget})


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation, run every subject on every seed, judge, write results/."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    start = time.perf_counter()
    torch.set_num_threads(1)  # tiny matrices: a second thread only adds contention
    _quiet()
    settings = dict(spec.settings)
    sizes = QUICK_DATA if args.quick else {}
    work = Path(tempfile.mkdtemp(prefix="atwu-reproduce-"))
    # the full run fine-tunes each seed's full and retain models in two processes (one torch
    # thread each); --quick stays in this process (starting workers costs more than it saves)
    pool = None
    if not args.quick:
        pool = ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("spawn"))
    try:
        return _run(args, spec, settings, sizes, work, start, pool)
    finally:
        if pool is not None:
            pool.shutdown()
        shutil.rmtree(work, ignore_errors=True)  # the model folders never outlive the run


def _run(args, spec, settings, sizes, work: Path, start: float, pool) -> dict[str, Any]:
    tick = time.perf_counter()
    base_data = UnlearningDataModule(
        seed=BASE_SEED, finetune_on="generic", batch_size=BATCH, **sizes
    )
    base_data.setup()
    base = train_lm(base_data, settings["pretrain_steps"], work / "base", BASE_SEED)
    timings = {"pretrain_s": time.perf_counter() - tick}
    print(f"base model pretrained in {timings['pretrain_s']:.0f} s", flush=True)
    worlds: dict[int, World] = {}

    def world(seed: int) -> World:
        if seed not in worlds:
            worlds[seed] = World(seed, base, work, settings, sizes, pool)
            print(
                f"seed {seed}: full/retain fine-tuned in {worlds[seed].finetune_s:.0f} s; "
                + ", ".join(
                    f"{name} gap {np.mean(m['forget_gap']):.3f} rouge {m['forget_rouge']:.2f}"
                    for name, m in worlds[seed].reference.items()
                ),
                flush=True,
            )
        return worlds[seed]

    cache: dict[tuple, dict[str, Any]] = {}
    trajectories: dict[tuple, list[tuple[int, float, float]]] = {}  # (step, forget_gap, utility)
    evidence: dict[str, Any] = {"scorer_weight_norm": {}, "span_auroc_start": {}, "scores": {}}

    def unlearn(
        subject: str, params: dict[str, Any], seed: int, evaluate: bool = True
    ) -> dict[str, Any]:
        """One unlearning run; every metric when ``evaluate``, else only its frontier points."""
        key = run_key(subject, params, seed)
        if key in cache or (not evaluate and key in trajectories):
            return cache.get(key, {})
        w = world(seed)
        seed_everything(seed)
        module = UnlearningModule(
            method=subject,
            pretrained=str(w.full_dir),
            finetune_steps=0,
            burnin_steps=settings["burnin_steps"],
            **params,
        )
        if subject == "atwu" and f"full model, seed {seed}" not in evidence["scores"]:
            module.build(w.tokenizer, w.data)
            module.reference.load_state_dict(module.model.state_dict())
            evidence["scores"][f"full model, seed {seed}"] = conflict_by_class(module, w)
        probe = FrontierProbe(w, settings["frontier_every"])
        tick = time.perf_counter()
        quiet_trainer(settings["unlearn_steps"], callbacks=[probe]).fit(module, w.data)
        train_s = time.perf_counter() - tick - probe.seconds
        trajectories[key] = probe.points
        if not evaluate:
            return {}
        if subject == "atwu":
            label = f"after unlearning (lr {params.get('lr')}), seed {seed}"
            evidence["scores"][label] = conflict_by_class(module, w)
        metrics = w.evaluate(module.model)
        metrics["train_s"] = train_s
        weights = module.token_weights(w.forget_batch, w.retain_batch)
        if weights is not None:
            answer = w.forget_batch["labels"][:, 1:] != -100
            relevant = w.forget_batch["relevance"][:, 1:][answer].numpy()
            metrics["span_auroc"] = span_alignment(weights[answer].numpy(), relevant)["auroc"]
        if subject in ("atwu", "atwu_random_features"):
            evidence["scorer_weight_norm"][f"{subject} lr {params.get('lr')} seed {seed}"] = float(
                module.scorer.linear.weight.detach().norm()
            )
        cache[key] = metrics
        print(
            f"{subject:22s} seed {seed} {params} gap={np.mean(metrics['forget_gap']):.3f} "
            f"val={metrics['val_forget_gap']:.3f} util={np.mean(metrics['utility']):.3f} "
            f"auroc={metrics.get('span_auroc', float('nan')):.2f} {train_s:.1f}s "
            f"[{time.perf_counter() - start:.0f}s]",
            flush=True,
        )
        return metrics

    tuning = tune(
        spec, lambda subject, params, seed: unlearn(subject, params, seed)["val_forget_gap"]
    )

    def run_one(subject: str, seed: int) -> dict[str, Any]:
        full = world(seed).reference["full_model"]
        if subject == "full_model":  # the model before unlearning: the utility reference
            return {**full, "frontier_area": 0.0}
        metrics = dict(unlearn(subject, tuning.best[subject], seed))
        points = []
        for trial in tuning.trials[subject]:  # every learning rate of the grid, on this seed
            unlearn(subject, trial["params"], seed, evaluate=False)
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
    timings["finetune_s"] = sum(w.finetune_s for w in worlds.values())
    overhead = wall_time_overhead(results)
    reference = {
        f"{name} seed {seed}": {k: float(np.mean(v)) for k, v in m.items()}
        for seed, w in worlds.items()
        for name, m in w.reference.items()
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
