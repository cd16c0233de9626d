"""The claim experiment (`uv run reproduce`), under the protocol of configs/claim.yaml.

1. One base checkpoint: the tiny Qwen2 pretrained on the base stream (news, other Wikipedia
   articles, clean arithmetic narratives, practice problems), shared by every arm and seed.
2. Wall-clock matching: each arm's time per learner step is measured on one thread from the
   base; each arm then gets ``settings.budget_s / step_time`` steps (steps, tokens and the
   measured wall time are recorded).
3. Language arms from the base on the noisy CPT stream, through the real CLI, per seed (the seed
   sets the stream's order and narratives, the designer's initialisation and every draw):
   ``vpretrain`` (the method), ``plain``, ``fixed_soft``, ``alignment_reweight`` (baselines),
   ``feedback_sft`` (breaks the rule: feedback problems mixed into the stream as supervision;
   reported), ``plain_clean`` (plain on the clean stream: the precondition's reference),
   ``random_gradient`` (negative control) and ``oracle`` (positive control).
4. The learner learning rate is tuned for every arm on the same grid, on validation problems.
5. A smaller vision run (vision_claim.py): DINO-style continued pretraining of a tiny DINOv3
   with learned views (the method), fixed augmentations and random views (baselines), the
   designer fed a random direction (negative control).
6. The precondition: corruption hurts plain CPT, and predicted and realised decreases agree
   for small steps (``value_agreement``). papers_eval judges.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback

from papers_cli import project_dir_of, quiet_fit, reproduce_parser
from papers_eval import judge, load_claim_spec, run_seeds, tune, tuning_grids, write_claim
from papers_eval.jobs import Job, JobResult, run_jobs, runner_options, summarise_jobs
from papers_eval.record import code_revision
from vpretrain import core, evaluation
from vpretrain.cli import VPretrainCLI
from vpretrain.data import VPretrainDataModule
from vpretrain.model import VPretrainModule

PROJECT_DIR = project_dir_of(__file__)
CLAIM_FILE = PROJECT_DIR / "configs" / "claim.yaml"
JOBS_DIR = PROJECT_DIR.parents[1] / "runs" / "v-pretraining" / "jobs"
# The checkpoints later jobs start from (the language base, a vision base per seed), named by a
# digest of their content: the jobs name the digest in their params, so a job's cache key
# changes when its base does, and a worker process finds the file by it.
INPUTS_DIR = PROJECT_DIR.parents[1] / "runs" / "v-pretraining" / "inputs"
LANGUAGE = {  # subject -> its CLI overrides on top of the CPT settings
    "vpretrain": {"model.arm": "vpretrain"},
    "random_gradient": {"model.arm": "random_gradient"},
    "plain": {"model.arm": "plain"},
    "fixed_soft": {"model.arm": "fixed_soft"},
    "alignment_reweight": {"model.arm": "alignment_reweight"},
    "feedback_sft": {"model.arm": "plain", "data.mix_feedback": True},
    "oracle": {"model.arm": "oracle"},
    "plain_clean": {"model.arm": "plain", "data.stream": "clean"},
}
VISION = {  # subject -> vision arm
    "vpretrain": "v_views",
    "random_gradient": "random_direction",
    "fixed_augment": "fixed_augment",
    "random_views": "random_views",
}
LANGUAGE_METRICS = (
    "test_answer_nll",
    "test_prose_nll",
    "test_pass_at_1",
    "val_answer_nll",
    "perplexity",
    "value_correlation",
    "steps",
    "tokens",
    "wall_s",
)
VISION_METRICS = ("vision_seg", "vision_depth_rmse", "vision_probe_correct", "vision_steps")


def _flags(settings: dict[str, Any]) -> list[str]:
    return [f"--{key}={value}" for key, value in settings.items()]


def _key(job: tuple) -> str:
    return json.dumps(job, sort_keys=True, default=str)


class Curve(Callback):
    """Validation answer NLL at a few points of a run against the wall time of training alone
    (the evaluation's own time is excluded), for the downstream-loss-vs-time plot; keeps a copy
    of the designer as it started."""

    def __init__(self, every: int) -> None:
        self.every, self.points, self.initial_designer = every, [], None
        self.training_s, self._since = 0.0, None

    def on_train_start(self, trainer, module) -> None:
        self.problems = trainer.datamodule.val_problems
        if module.designer is not None:
            self.initial_designer = copy.deepcopy(module.designer)

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._since = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.training_s += time.perf_counter() - self._since
        if trainer.global_step % self.every == 0:
            module.eval()
            nll = float(evaluation.answer_nll(module, self.problems).mean())
            module.train()
            self.points.append((self.training_s, nll))


class StepTimer(Callback):
    """Seconds per learner step after ``warmup`` steps."""

    def __init__(self, warmup: int = 2) -> None:
        self.warmup, self.times, self._since = warmup, [], None

    def on_train_batch_start(self, trainer, module, batch, batch_idx) -> None:
        self._since = time.perf_counter()

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        if trainer.global_step > self.warmup:
            self.times.append(time.perf_counter() - self._since)


def fit(seed: int, overrides: list[str], callbacks=()) -> Any:
    return quiet_fit(
        VPretrainModule,
        VPretrainDataModule,
        project_file=__file__,
        seed=seed,
        overrides=overrides,
        callbacks=callbacks,
        cli_class=VPretrainCLI,
    )


def language_overrides(settings: dict, subject: str, params: dict, seed: int) -> list[str]:
    return _flags(
        {
            **settings["common"],
            **settings["cpt"],
            **LANGUAGE[subject],
            **{f"model.{k}": v for k, v in params.items()},
            "data.seed": seed,
        }
    )


def run_job(job: tuple, settings: dict, base_path: Path | None) -> dict:
    """One job: ``("base",)``, ``("time", subject)``, ``("language", subject, params, seed,
    steps)``, ``("agreement", seed)``, ``("vision_base", seed)`` or ``("vision", arm, seed,
    steps)``. ``base_path``: the checkpoint a job starts from (the language base, or the vision
    base of the seed for ``"vision"``). The base returns its scores and the learner's state,
    a vision base its Lightning checkpoint (the caller stores them in ``INPUTS_DIR``)."""
    kind = job[0]
    # The base runs alone (both threads); every other job shares the cores with another worker.
    torch.set_num_threads(settings["workers"] if kind == "base" else 1)
    if kind == "base":
        cli = fit(0, _flags({**settings["common"], **settings["base"]}))
        return {
            "score": score(cli.model.eval(), cli.datamodule),
            "learner": cli.model.learner.state_dict(),
        }
    if kind == "time":
        timer = StepTimer()
        steps = settings["timing_steps"]
        fit(
            0,
            language_overrides(settings, job[1], {}, 0)
            + [
                f"--model.init_from={base_path}",
                f"--trainer.max_steps={steps}",
            ],
            [timer],
        )
        return {"step_time_s": float(np.median(timer.times))}
    if kind == "language":
        _, subject, params, seed, steps = job
        overrides = language_overrides(settings, subject, params, seed)
        overrides += [f"--model.init_from={base_path}", f"--trainer.max_steps={steps}"]
        curve = Curve(max(1, steps // settings["curve_points"]))
        start = time.perf_counter()
        cli = fit(seed, overrides, [curve])
        wall = time.perf_counter() - start
        module, data = cli.model.eval(), cli.datamodule
        out = score(module, data)
        out.update(
            steps=cli.trainer.global_step,
            tokens=cli.trainer.global_step * data.hparams.batch_size * data.hparams.block_size,
            wall_s=wall,
            training_s=curve.training_s,
            curve=curve.points,
        )
        if subject in ("vpretrain", "random_gradient"):
            out.update(designer_evidence(curve.initial_designer, module, data, settings))
        return out
    if kind == "agreement":
        return value_agreement(job[1], settings, base_path)
    from vpretrain import vision_claim

    if kind == "vision_base":
        return vision_claim.pretrain_vision_base(job[1], settings["vision"])
    _, arm, seed, steps = job
    base = torch.load(base_path, weights_only=True)
    return vision_claim.run_vision_arm(arm, base, seed, {**settings["vision"], "steps": steps})


def score(module: VPretrainModule, data: VPretrainDataModule) -> dict:
    """Per-item test metrics and the validation answer NLL (the tuning metric)."""
    with torch.no_grad():
        return {
            "test_answer_nll": evaluation.answer_nll(module, data.test_problems),
            "test_pass_at_1": evaluation.pass_at_1(module, data, data.test_problems),
            "test_prose_nll": evaluation.prose_nll(module, data.perplexity["test"]),
            "val_answer_nll": float(evaluation.answer_nll(module, data.val_problems).mean()),
        }


@torch.no_grad()
def mass_moved(module: VPretrainModule, blocks: dict[str, torch.Tensor], designer=None):
    """Per target token of ``blocks``: the designer's mass moved off the observed token,
    1 - q_t(y_t), with the mixing weight lambda_t; flattened [N] arrays. ``designer`` replaces
    the module's own (e.g. its state before training)."""
    designer = designer or module.designer
    inputs, observed = blocks["ids"][:, :-1], blocks["ids"][:, 1:]
    out = module.learner(input_ids=inputs, output_hidden_states=True)
    log_probs = core.log_softmax_at_least_fp32(out.logits)
    slots = core.candidates(log_probs, observed, module.hparams.top_k)
    at = log_probs.gather(-1, slots)
    mixing, scores = designer(out.hidden_states[-1].float(), at)
    q = core.soft_targets(mixing, scores, module.hparams.temperature)
    on_observed = (q * (slots == observed.unsqueeze(-1))).sum(-1)
    return (1 - on_observed).flatten().numpy(), mixing.flatten().numpy()


def designer_evidence(initial_designer, trained, data, settings) -> dict:
    """What the designer learned: mean lambda at the start and the end, the AUROC of mass moved
    on corrupted vs clean result digits, and how far its parameters moved."""
    from sklearn.metrics import roc_auc_score

    n = settings["diagnostic_blocks"]
    blocks = {k: v[:n] for k, v in data.train_set.blocks.items()}
    moved, mixing = mass_moved(trained, blocks)
    _, mixing_start = mass_moved(trained, blocks, initial_designer)
    result = blocks["result"][:, 1:].flatten().numpy()
    corrupted = blocks["corrupted"][:, 1:].flatten().numpy()
    auroc = (
        float(roc_auc_score(corrupted[result], moved[result]))
        if 0 < corrupted[result].sum() < result.sum()
        else float("nan")
    )
    before = torch.cat([p.detach().flatten() for p in initial_designer.parameters()])
    after = torch.cat([p.detach().flatten() for p in trained.designer.parameters()])
    return {
        "mixing_start": float(mixing_start.mean()),
        "mixing_end": float(mixing.mean()),
        "mass_moved_corrupted": float(moved[result & corrupted].mean()),
        "mass_moved_clean_results": float(moved[result & ~corrupted].mean()),
        "mass_moved_other": float(moved[~result].mean()),
        "mass_auroc": auroc,
        "designer_relative_change": float((after - before).norm() / before.norm()),
    }


def designer_summary(runs: list[dict]) -> dict[str, list[float]]:
    """The designer evidence of one subject, one value per seed."""
    keys = [k for k in runs[0] if k.startswith(("mixing", "mass", "designer"))]
    return {k: [r[k] for r in runs] for k in keys}


def value_agreement(seed: int, settings: dict, base_path: Path) -> dict:
    """Predicted (eq. 3) vs realised decrease of the downstream loss for one small SGD step
    from the base, over ``agreement_batches`` CPT batches with random designer-like targets
    (random mixing and scores, so the values spread); g_down on one fixed feedback minibatch,
    P = identity. Returns the Pearson correlation and the pairs."""
    cli = fit(
        seed,
        language_overrides(settings, "vpretrain", {}, seed)
        + [
            f"--model.init_from={base_path}",
            "--trainer.max_steps=0",
        ],
    )
    module, data = cli.model, cli.datamodule
    module.feedback = data.feedback
    learner = module.learner
    named = dict(learner.named_parameters())
    batch = module.feedback_minibatch(0)
    downstream = lambda: module.downstream_loss(batch)  # noqa: E731
    g_down = dict(zip(named, torch.autograd.grad(downstream(), list(named.values())), strict=True))
    lr, k = settings["agreement_lr"], module.hparams.top_k
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    for i in range(settings["agreement_batches"]):
        ids = data.train_set.blocks["ids"][i * 8 : (i + 1) * 8]
        inputs, observed = ids[:, :-1], ids[:, 1:]
        log_probs, directions, _ = core.log_probs_and_directions(learner, named, g_down, inputs)
        slots = core.candidates(log_probs, observed, k)
        mixing = torch.rand(observed.shape, generator=generator)
        q = core.soft_targets(mixing, torch.randn(*observed.shape, k, generator=generator))
        predicted = core.predicted_decrease(q, directions.gather(-1, slots), lr).item()
        before = downstream().item()
        ssl = core.soft_cross_entropy(module.learner_log_probs(inputs).gather(-1, slots), q)
        grads = torch.autograd.grad(ssl, list(named.values()))
        saved = [p.detach().clone() for p in named.values()]
        with torch.no_grad():
            for p, g in zip(named.values(), grads, strict=True):
                p -= lr * g
        realised = before - downstream().item()
        with torch.no_grad():
            for p, value in zip(named.values(), saved, strict=True):
                p.copy_(value)
        pairs.append((predicted, realised))
    a = np.asarray(pairs)
    return {"value_correlation": float(np.corrcoef(a[:, 0], a[:, 1])[0, 1]), "pairs": pairs}


def digest(value: Any) -> str:
    """A sha256 (16 hex digits) of a state dict or checkpoint: names, tensors' dtypes, shapes
    and bytes, and every other leaf's repr."""
    h = hashlib.sha256()

    def feed(x: Any) -> None:
        if isinstance(x, Mapping):
            for k, v in x.items():
                h.update(f"<{k!r}>".encode())
                feed(v)
        elif isinstance(x, (list, tuple)):
            h.update(f"[{len(x)}".encode())
            for v in x:
                feed(v)
        elif isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        else:
            h.update(repr(x).encode())

    feed(value)
    return h.hexdigest()[:16]


def input_path(kind: str, key: str) -> Path:
    return INPUTS_DIR / f"{kind}-{key}.pt"


def store_input(kind: str, value: Any) -> str:
    """Save a base in ``INPUTS_DIR`` under its digest (once); returns the digest."""
    key = digest(value)
    path = input_path(kind, key)
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        torch.save(value, partial)
        os.replace(partial, path)
    return key


def as_job(job: tuple, bases: Mapping[str, str]) -> Job:
    """A job tuple as a ``Job`` of the shared runner (the stage is the kind); a job that starts
    from a base names its digest in ``params["base"]``."""
    kind = job[0]
    if kind == "base":
        return Job("base", 0, {}, kind)
    if kind == "time":
        return Job(job[1], 0, {"base": bases["base"]}, kind)
    if kind == "language":
        _, subject, params, seed, steps = job
        return Job(subject, seed, {"params": params, "steps": steps, "base": bases["base"]}, kind)
    if kind == "agreement":
        return Job("vpretrain", job[1], {"base": bases["base"]}, kind)
    if kind == "vision_base":
        return Job("fixed_augment", job[1], {}, kind)
    _, arm, seed, steps = job
    return Job(arm, seed, {"steps": steps, "base": bases[f"vision_base {seed}"]}, kind)


def as_tuple(job: Job) -> tuple:
    """The inverse of ``as_job`` (without the base)."""
    if job.stage == "base":
        return ("base",)
    if job.stage == "time":
        return ("time", job.subject)
    if job.stage == "language":
        return ("language", job.subject, job.params["params"], job.seed, job.params["steps"])
    if job.stage in ("agreement", "vision_base"):
        return (job.stage, job.seed)
    return ("vision", job.subject, job.seed, job.params["steps"])


def claim_job(job: Job, settings: Mapping[str, Any]) -> dict:
    """One job of the shared runner (top level: worker processes import it by name)."""
    kind = "vision_base" if job.stage == "vision" else "base"
    base = input_path(kind, job.params["base"]) if "base" in job.params else None
    return run_job(as_tuple(job), dict(settings), base)


class Runner:
    """Runs each job once (a cache keyed by the job); ``prefetch`` runs the uncached jobs of a
    list as jobs of the shared runner (``papers_eval.jobs``: ``options`` from
    ``runner_options``, worker processes with one thread each, a resumable cache under runs/).
    A job's result depends only on the job, so the order does not matter."""

    def __init__(self, settings: dict, options: Mapping[str, Any]) -> None:
        self.settings, self.options, self.cache = settings, dict(options), {}
        self.bases: dict[str, str] = {}  # "base" / "vision_base <seed>" -> digest (INPUTS_DIR)
        self.jobs: list[JobResult] = []  # every job run or loaded, for the record

    def __call__(self, *job) -> dict:
        key = _key(job)
        if key not in self.cache:
            self.prefetch([job])
        return self.cache[key]

    def prefetch(self, jobs: list[tuple]) -> None:
        todo = list({_key(j): j for j in jobs if _key(j) not in self.cache}.values())
        if not todo:
            return
        done = run_jobs(
            claim_job,
            [as_job(j, self.bases) for j in todo],
            settings=self.settings,
            cache_dir=JOBS_DIR,
            revision=code_revision(PROJECT_DIR),
            label="v-pretraining",
            **self.options,
        )
        for job, result in zip(todo, done, strict=True):
            self.cache[_key(job)] = result.value
            if job[0] == "base":
                self.bases["base"] = store_input("base", result.value["learner"])
            elif job[0] == "vision_base":
                self.bases[f"vision_base {job[1]}"] = store_input("vision_base", result.value)
        self.jobs.extend(done)


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Base, timing, tuning, every subject on every seed, the vision run; judge; write."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)
    language = tuple(LANGUAGE)
    spec = load_claim_spec(
        CLAIM_FILE,
        subjects=(*language, "fixed_augment", "random_views"),
        metrics=(*LANGUAGE_METRICS, *VISION_METRICS),
        args=args,
    )
    settings = dict(spec.settings)
    start = time.perf_counter()
    options = runner_options(args, default_workers=int(settings.get("workers", 2)))
    runner = Runner(settings, options)
    base = runner("base")["score"]
    runner.prefetch([("time", s) for s in language])
    step_time = {s: runner("time", s)["step_time_s"] for s in language}
    steps = {s: max(1, int(settings["budget_s"] / step_time[s])) for s in language}

    grids = {s: g for s, g in tuning_grids(spec.tuning, spec.subjects).items() if g != [{}]}
    runner.prefetch(
        [("language", s, p, spec.seeds[0], steps[s]) for s, grid in grids.items() for p in grid]
    )
    tuning = tune(
        spec, lambda s, p, seed: runner("language", s, p, seed, steps[s])["val_answer_nll"]
    )
    jobs = [
        ("language", s, tuning.best[s], seed, steps[s]) for s in language for seed in spec.seeds
    ]
    jobs += [("agreement", seed) for seed in spec.seeds]
    jobs += [("vision_base", seed) for seed in spec.seeds]
    runner.prefetch(jobs)
    # The vision arms at equal wall time too: each arm's step time from a short run on the
    # first seed's base, then steps = vision budget_s / step time.
    vision = settings["vision"]
    runner.prefetch(
        [("vision", arm, spec.seeds[0], vision["timing_steps"]) for arm in VISION.values()]
    )
    vision_steps = {
        arm: max(
            1,
            int(
                vision["budget_s"]
                / runner("vision", arm, spec.seeds[0], vision["timing_steps"])["step_time_s"]
            ),
        )
        for arm in VISION.values()
    }
    runner.prefetch(
        [("vision", arm, seed, vision_steps[arm]) for arm in VISION.values() for seed in spec.seeds]
    )

    def run_one(subject: str, seed: int) -> dict:
        out = {m: float("nan") for m in (*LANGUAGE_METRICS, *VISION_METRICS)}
        if subject in LANGUAGE:
            r = runner("language", subject, tuning.best[subject], seed, steps[subject])
            out.update(
                {
                    k: r[k]
                    for k in (
                        "test_answer_nll",
                        "test_prose_nll",
                        "test_pass_at_1",
                        "val_answer_nll",
                        "steps",
                        "tokens",
                        "wall_s",
                    )
                }
            )
            out["perplexity"] = float(np.exp(np.mean(r["test_prose_nll"])))
            if subject == "vpretrain":
                out["value_correlation"] = runner("agreement", seed)["value_correlation"]
        # A subject without a vision run gets NaN per scene (never a passed check).
        v = runner(
            "vision",
            VISION.get(subject, "fixed_augment"),
            seed,
            vision_steps[VISION.get(subject, "fixed_augment")],
        )
        if subject not in VISION:
            v = {
                k: np.full_like(v[k], np.nan)
                if k in ("seg_miou", "depth_rmse", "probe_correct")
                else float("nan")
                for k in v
            }
        out.update(
            vision_seg=v["seg_miou"],
            vision_depth_rmse=v["depth_rmse"],
            vision_probe_correct=v["probe_correct"],
            vision_steps=v["steps"],
        )
        return out

    results = run_seeds(spec, run_one)
    judgement = judge(spec, results)
    evidence = {
        "base": {k: float(np.mean(v)) for k, v in base.items()},
        "step_time_s": step_time,
        "steps": steps,
        "vision_steps": vision_steps,
        "designer": {
            s: designer_summary(
                [runner("language", s, tuning.best[s], seed, steps[s]) for seed in spec.seeds]
            )
            for s in ("vpretrain", "random_gradient")
        },
    }
    figures = plots(args.out, runner, spec, tuning, steps, language)
    write_claim(
        args.out,
        project="v-pretraining",
        spec=spec,
        results=results,
        judgement=judgement,
        config={"settings": settings, "quick": args.quick},
        wall_time_s=time.perf_counter() - start,
        tuning=tuning,
        evidence=evidence,
        figures=figures,
        jobs=summarise_jobs(runner.jobs),
    )
    return {"verdict": judgement.verdict, "results": results}


def plots(out, runner, spec, tuning, steps, language) -> list[str]:
    """Downstream loss vs wall time per arm (seed 0), predicted vs realised decrease."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    seed = spec.seeds[0]
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in language:
        points = runner("language", s, tuning.best[s], seed, steps[s])["curve"]
        if points:
            t, nll = zip(*points, strict=True)
            ax.plot(t, nll, marker="o", label=s)
    ax.set_xlabel("training wall time (s, one thread)")
    ax.set_ylabel("validation answer NLL")
    ax.set_title(f"Downstream loss vs wall time (seed {seed})")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "downstream_vs_time.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(4.5, 4))
    for seed in spec.seeds:
        pairs = np.asarray(runner("agreement", seed)["pairs"])
        ax.scatter(pairs[:, 0], pairs[:, 1], s=12, label=f"seed {seed}")
    low, high = ax.get_xlim()
    ax.plot([low, high], [low, high], "k--", lw=0.8)
    ax.set_xlabel("predicted decrease (eq. 3)")
    ax.set_ylabel("realised decrease")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "predicted_vs_realised.png", dpi=120)
    plt.close(fig)
    return ["downstream_vs_time.png", "predicted_vs_realised.png"]


def main() -> None:
    """Console entry point of `uv run reproduce` (entry point group papers.reproduce)."""
    run_claim_experiment()
