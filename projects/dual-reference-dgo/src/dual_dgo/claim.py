"""The claim experiment (`uv run reproduce`), under the protocol of configs/claim.yaml.

Per seed: the miniature's offline data (prompts and scripted responses), one warm start (SFT
on the mixture, ``settings.warm_start``), then every objective trained from it with the same
budget (``settings.budget``) through the real CLI:

- ``dual`` (the method), ``single_reference``, ``sft``, ``rft``, ``always_fast``,
  ``always_slow`` (baselines), ``fixed_prior`` (negative control), ``exact_partition``
  (positive control): the module's objectives;
- ``oracle_router`` (positive control): the SFT model's forced decodes routed by the true digit
  count (slow from a threshold tuned on validation);
- ``warm_start``: the precondition's subject.

Ablations (reported, not judged): the method and single-reference DGO trained on the swapped
sample counts (the count-swap check), the method with a per-sequence token-mean loss, a
length-cost sweep on seed 0, and on seed 0 the method and single-reference DGO trained on a file
whose fast responses the warm start sampled (generate.py: the warm-start model as the fast
behaviour policy). papers_eval applies the checks and computes the verdict.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any, get_args

import numpy as np
import torch
from scipy.stats import spearmanr

from dual_dgo.baselines import oracle_route
from dual_dgo.cli import DualDgoCLI
from dual_dgo.data import DualDgoDataModule, collate_prompts
from dual_dgo.evaluation import (
    accuracy_by_difficulty,
    fast_rate_by_difficulty,
    gain_at_matched_tokens,
    ridge_probe_r2,
)
from dual_dgo.generate import generate_offline, load_fast_policy
from dual_dgo.miniature import TaskConfig
from dual_dgo.model import DualDgoModule, Objective, chosen, summary_metrics
from papers_cli import project_dir_of, quiet_fit, reproduce_parser
from papers_eval import judge, load_claim_spec, run_seeds, tune, tuning_grids, write_claim

CLAIM_FILE = project_dir_of(__file__) / "configs" / "claim.yaml"
TRAINED = get_args(Objective)  # every objective of the module is a trained subject
SUBJECTS = (*TRAINED, "oracle_router", "warm_start")
AGAINST = ("single_reference", "sft", "rft")
METRICS = (
    "fast_rate",
    "slow_rank_correlation",
    *(f"gain_vs_{name}" for name in AGAINST),
    "count_swap_shift",
    "fast_accuracy_drop",
    "slow_advantage_on_hard",
    "easy_fast_reward_advantage",
    "difficulty_probe_r2",
    "last_token_probe_r2",
    "accuracy",
    "tokens",
    "reward",
    "val_reward",
)


def _flags(settings: dict[str, Any]) -> list[str]:
    return [f"--{key}={value}" for key, value in settings.items()]


def _key(job: tuple) -> str:
    return json.dumps(job, sort_keys=True)


class Runner:
    """Trains and evaluates each job once; the cache serves tuning, the per-seed runs and the
    ablations alike. A job is ``("warm", seed)`` or ``("train", objective, params, seed, data)``.
    ``prefetch`` runs a list of jobs in ``settings.workers`` spawned processes (one thread each);
    each job's result depends only on the job, so the order does not matter."""

    def __init__(self, settings: dict[str, Any], workdir: Path) -> None:
        self.settings, self.workdir = settings, workdir
        self.cache: dict[str, dict] = {}

    def warm_start(self, seed: int) -> dict:
        return self.result(("warm", seed))

    def trained(
        self, objective: str, params: dict[str, Any], seed: int, data: dict | None = None
    ) -> dict:
        return self.result(("train", objective, params, seed, data or {}))

    def result(self, job: tuple) -> dict:
        key = _key(job)
        if key not in self.cache:
            if job[0] == "train":
                self.warm_start(job[3])
            self.cache[key] = run_job(job, self.settings, self.workdir)
        return self.cache[key]

    def prefetch(self, jobs: list[tuple]) -> None:
        """Run the jobs not yet cached (warm starts first) in parallel processes."""
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        workers = int(self.settings.get("workers", 1))
        warm = [j for j in jobs if j[0] == "warm"] + [
            ("warm", j[3]) for j in jobs if j[0] == "train"
        ]
        for stage in (warm, [j for j in jobs if j[0] == "train"]):
            todo = list({_key(j): j for j in stage if _key(j) not in self.cache}.values())
            if workers <= 1 or len(todo) <= 1:
                for job in todo:
                    self.result(job)
                continue
            context = multiprocessing.get_context("spawn")  # forking after torch started can hang
            with ProcessPoolExecutor(
                min(workers, len(todo)),
                mp_context=context,
                initializer=torch.set_num_threads,
                initargs=(1,),
            ) as pool:
                futures = {
                    _key(j): pool.submit(run_job, j, self.settings, self.workdir) for j in todo
                }
                for key, future in futures.items():
                    self.cache[key] = future.result()


def run_job(job: tuple, settings: dict[str, Any], workdir: Path) -> dict:
    """Train one job through the real CLI (no logger, no checkpoints) and evaluate it."""
    if job[0] == "warm":
        seed = job[1]
        overrides = ["--model.objective=sft", *_flags(settings["warm_start"])]
    else:
        _, objective, params, seed, _ = job
        model_flags = {f"model.{k}": v for k, v in params.items()}
        overrides = [
            f"--model.objective={objective}",
            f"--model.init_checkpoint={workdir / f'warm_seed{seed}.ckpt'}",
            *_flags({**settings["budget"], **model_flags}),
        ]
    data = {**settings["data"], **(job[4] if job[0] == "train" else {})}
    cli = quiet_fit(
        DualDgoModule,
        DualDgoDataModule,
        project_file=__file__,
        seed=seed,
        overrides=[*overrides, *_flags(data), "--trainer.limit_val_batches=0"],
        cli_class=DualDgoCLI,
    )
    if job[0] == "warm":
        cli.trainer.save_checkpoint(workdir / f"warm_seed{seed}.ckpt")
    return evaluate(cli.model, cli.datamodule, settings["probe_train_prompts"])


def evaluate(model: DualDgoModule, data: DualDgoDataModule, n_probe: int) -> dict:
    """Per-prompt arrays on val and test, the difficulty probe and the reward's constants."""
    model.eval()
    out = {"max_length": data.max_length, "length_cost": data.hparams.length_cost}
    for split in ("val", "test"):
        items = data.splits[split]
        parts = [model.evaluate_prompts(items[i : i + 512]) for i in range(0, len(items), 512)]
        out[split] = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    with torch.no_grad():  # the fast mass the objective's weights put on each training prompt
        batch = collate_prompts(data.splits["train"])
        weights = model.response_weights(batch)[0].double()
        per_prompt = torch.zeros(batch["n_prompts"], dtype=torch.float64)
        total = per_prompt.index_add(0, batch["prompts"], weights)
        fast = per_prompt.clone().index_add(0, batch["prompts"], weights * (batch["modes"] == 0))
        mass = (fast / total.clamp_min(1e-300)).numpy()
    k = np.array([i.difficulty for i in data.splits["train"]])
    out["target_fast_by_difficulty"] = [
        float(mass[k == level].mean()) if (k == level).any() else float("nan")
        for level in range(1, data.hparams.k_max + 1)
    ]
    train_items = data.splits["train"][:n_probe]
    train_features, val_features = (
        prompt_features(model, train_items),
        prompt_features(model, data.splits["val"]),
    )
    for name in ("image_mean", "last_token"):
        out[f"probe_r2_{name}"] = ridge_probe_r2(
            train_features[name],
            np.array([i.difficulty for i in train_items], dtype=np.float64),
            val_features[name],
            out["val"]["difficulty"],
        )
    return out


@torch.no_grad()
def prompt_features(model: DualDgoModule, items) -> dict[str, torch.Tensor]:
    """The last layer's mean state over each prompt's image tokens (the registered probe's
    features) and its state at the prompt's last token (where the mode is chosen; reported)."""
    parts = [
        model.prompt_end([i.prompt for i in items[s : s + 64]]) for s in range(0, len(items), 64)
    ]
    return {
        "last_token": torch.cat([p[1] for p in parts]).float(),
        "image_mean": torch.cat([p[2] for p in parts]).float(),
    }


def probes(result: dict) -> dict[str, float]:
    """The registered difficulty probe (image tokens) and the reported one (last token)."""
    return {
        "difficulty_probe_r2": result["probe_r2_image_mean"],
        "last_token_probe_r2": result["probe_r2_last_token"],
    }


def subject_metrics(
    arrays: dict[str, np.ndarray],
    baselines: dict[str, dict[str, np.ndarray]],
    length_cost: float,
    max_length: int,
    k_max: int,
    p_slow: np.ndarray | None = None,
) -> dict[str, Any]:
    """Every metric of METRICS that one model (or routing rule) has on one seed's test set."""
    picked = chosen(arrays, p_slow)
    slow = 1 - arrays["p_fast"] if p_slow is None else p_slow
    fast_rate = 1 - slow
    easy, hard = [1, 2], [k_max - 1, k_max]
    rewards = {
        mode: arrays[f"{mode}_correct"] - length_cost * arrays[f"{mode}_tokens"] / max_length
        for mode in ("fast", "slow")
    }
    one_digit = arrays["difficulty"] == 1
    return {
        "fast_rate": fast_rate,
        "slow_rank_correlation": float(spearmanr(arrays["difficulty"], slow).statistic)
        if np.ptp(slow) > 0
        else 0.0,
        **{
            f"gain_vs_{name}": gain_at_matched_tokens(arrays, baselines[name], p_slow)
            for name in AGAINST
        },
        "fast_accuracy_drop": accuracy_by_difficulty(arrays, "fast", easy)
        - accuracy_by_difficulty(arrays, "fast", hard),
        "slow_advantage_on_hard": accuracy_by_difficulty(arrays, "slow", hard)
        - accuracy_by_difficulty(arrays, "fast", hard),
        "easy_fast_reward_advantage": float(
            (rewards["fast"][one_digit] - rewards["slow"][one_digit]).mean()
        ),
        "accuracy": picked["correct"],
        "tokens": picked["tokens"],
        "reward": picked["correct"] - length_cost * picked["tokens"] / max_length,
    }


def run_claim_experiment(argv: list[str] | None = None) -> dict[str, Any]:
    """Tune on validation, run every subject on every seed, judge, write results/."""
    parser = reproduce_parser(__doc__.splitlines()[0], project_file=__file__)
    args = parser.parse_args(argv)
    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, args=args)
    start = time.perf_counter()
    settings = dict(spec.settings)
    k_max = 8
    with tempfile.TemporaryDirectory(prefix="dual-dgo-claim-") as workdir:
        runner = Runner(settings, Path(workdir))

        def val_reward(result: dict, p_slow: np.ndarray | None = None) -> float:
            arrays = result["val"]
            picked = chosen(arrays, p_slow)
            cost = result["length_cost"] * picked["tokens"] / result["max_length"]
            return float((picked["correct"] - cost).mean())

        def validation_score(subject: str, params: dict[str, Any], seed: int) -> float:
            if subject == "oracle_router":
                result = runner.trained("sft", {}, seed)
                route = oracle_route(
                    torch.from_numpy(result["val"]["difficulty"]), params["threshold"]
                )
                return val_reward(result, route.numpy().astype(np.float64))
            return val_reward(runner.trained(subject, params, seed))

        grids = tuning_grids(spec.tuning, spec.subjects)
        first = spec.seeds[0]
        runner.prefetch(
            [("warm", seed) for seed in spec.seeds]
            + [("train", "sft", {}, first, {})]
            + [
                ("train", subject, params, first, {})
                for subject, grid in grids.items()
                if subject in TRAINED
                for params in grid
                if params
            ]
        )
        tuning = tune(spec, validation_score)
        best = tuning.best
        swapped = settings["swapped_counts"]
        token_mean = {**best["dual"], "reduction": "token_mean"}
        # the warm-start model as the fast behaviour policy (seed 0; written once, reported)
        warm_fast_file = Path(workdir) / f"warm_fast_seed{first}"
        data = DualDgoDataModule(
            **{k.removeprefix("data."): v for k, v in settings["data"].items()}
        )
        warm_fast_behaviour = generate_offline(
            warm_fast_file,
            first,
            data.task,
            {s: data.hparams[f"n_{s}"] for s in ("train", "val", "test")},
            load_fast_policy(Path(workdir) / f"warm_seed{first}.ckpt"),
            settings["warm_fast_policy"]["temperature"],
        )
        warm_fast = {"data.root": str(warm_fast_file), "data.max_length": TaskConfig().max_length}
        runner.prefetch(
            [("train", s, best.get(s, {}), seed, {}) for seed in spec.seeds for s in TRAINED]
            + [("train", s, best[s], first, warm_fast) for s in ("dual", "single_reference")]
            + [
                ("train", s, best[s], seed, swapped)
                for seed in spec.seeds
                for s in ("dual", "single_reference")
            ]
            + [("train", "dual", token_mean, seed, {}) for seed in spec.seeds]
            + [
                ("train", s, best[s], first, {"data.length_cost": cost})
                for cost in settings["length_cost_sweep"]
                for s in ("dual", "single_reference")
            ]
        )
        per_seed: dict[int, dict[str, dict]] = {}
        ablations: dict[str, list] = {}

        def compute_seed(seed: int) -> dict[str, dict]:
            results = {s: runner.trained(s, best.get(s, {}), seed) for s in TRAINED}
            warm = runner.warm_start(seed)
            tests = {s: r["test"] for s, r in results.items()}
            length_cost, max_length = warm["length_cost"], warm["max_length"]
            out = {}
            for subject in (*TRAINED, "warm_start"):
                result = warm if subject == "warm_start" else results[subject]
                out[subject] = (
                    subject_metrics(result["test"], tests, length_cost, max_length, k_max)
                    | probes(result)
                    | {"val_reward": val_reward(result)}
                )
            sft = results["sft"]
            route = (
                oracle_route(
                    torch.from_numpy(sft["test"]["difficulty"]), best["oracle_router"]["threshold"]
                )
                .numpy()
                .astype(np.float64)
            )
            val_route = (
                oracle_route(
                    torch.from_numpy(sft["val"]["difficulty"]), best["oracle_router"]["threshold"]
                )
                .numpy()
                .astype(np.float64)
            )
            out["oracle_router"] = (
                subject_metrics(sft["test"], tests, length_cost, max_length, k_max, p_slow=route)
                | probes(sft)
                | {"val_reward": val_reward(sft, val_route)}
            )
            # the count swap (judged on the method) and the ablations (reported)
            for subject in TRAINED:
                out[subject]["count_swap_shift"] = float("nan")
            out["oracle_router"]["count_swap_shift"] = 0.0  # routes on the digit count only
            out["warm_start"]["count_swap_shift"] = float("nan")
            entry: dict[str, Any] = {"seed": seed}
            for subject in ("dual", "single_reference"):
                moved = runner.trained(subject, best[subject], seed, swapped)
                shift = abs(moved["test"]["p_fast"].mean() - tests[subject]["p_fast"].mean())
                out[subject]["count_swap_shift"] = float(shift)
                entry[f"{subject}_swapped"] = summary_metrics(
                    moved["test"], length_cost, max_length
                )
            token_mean_run = runner.trained("dual", token_mean, seed)
            entry["dual_token_mean"] = summary_metrics(
                token_mean_run["test"], length_cost, max_length
            )
            entry["fast_rate_by_difficulty"] = {
                s: fast_rate_by_difficulty(a, k_max)
                for s, a in {
                    **tests,
                    "warm_start": warm["test"],
                    "dual_token_mean": token_mean_run["test"],
                }.items()
            }
            entry["target_fast_by_difficulty"] = {
                s: r["target_fast_by_difficulty"] for s, r in results.items()
            }
            entry["summary"] = {
                s: summary_metrics(a, length_cost, max_length)
                for s, a in {**tests, "warm_start": warm["test"]}.items()
            }
            ablations.setdefault("per_seed", []).append(entry)
            return out

        def run_one(subject: str, seed: int) -> dict[str, Any]:
            if seed not in per_seed:
                per_seed[seed] = compute_seed(seed)
            return per_seed[seed][subject]

        results = run_seeds(spec, run_one)
        sweep = length_cost_sweep(runner, settings, best, spec.seeds[0])
        warm_fast_runs = {
            s: runner.trained(s, best[s], first, warm_fast) for s in ("dual", "single_reference")
        }
        warm_fast_evidence = {
            "seed": first,
            "fast_accuracy_by_difficulty": {
                "warm_start_sampled": warm_fast_behaviour["train"],
                "scripted": [TaskConfig().fast_accuracy(k) for k in range(1, k_max + 1)],
            },
            **{
                s: summary_metrics(r["test"], r["length_cost"], r["max_length"])
                | {"fast_rate_by_difficulty": fast_rate_by_difficulty(r["test"], k_max)}
                for s, r in warm_fast_runs.items()
            },
        }
    judgement = judge(spec, results)
    figures = write_plots(args.out, ablations["per_seed"], sweep, k_max)
    write_claim(
        args.out,
        project="dual-reference-dgo",
        spec=spec,
        results=results,
        judgement=judgement,
        config={"settings": settings, "quick": args.quick},
        wall_time_s=time.perf_counter() - start,
        tuning=tuning,
        evidence={
            "ablations": ablations,
            "length_cost_sweep": sweep,
            "warm_start_fast_policy": warm_fast_evidence,
        },
        figures=figures,
    )
    return {"verdict": judgement.verdict, "results": results}


def length_cost_sweep(runner: Runner, settings: dict, best: dict, seed: int) -> list[dict]:
    """Accuracy and tokens of the method and single-reference DGO as the length cost varies
    (seed 0; each length cost re-scores the same offline responses)."""
    rows = []
    default = settings["data"]["data.length_cost"]
    for cost in [default, *settings["length_cost_sweep"]]:
        data = {} if cost == default else {"data.length_cost": cost}
        for subject in ("dual", "single_reference"):
            result = runner.trained(subject, best[subject], seed, data)
            metrics = summary_metrics(result["test"], result["length_cost"], result["max_length"])
            rows.append({"subject": subject, "length_cost": cost, **metrics})
    return rows


def write_plots(out: str | Path, per_seed: list[dict], sweep: list[dict], k_max: int) -> list[str]:
    """fast_rate.png (P(fast) per digit count, seed mean) and tradeoff.png (accuracy vs tokens)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    levels = np.arange(1, k_max + 1)
    fig, ax = plt.subplots(figsize=(6, 4))
    names = [*TRAINED, "warm_start", "dual_token_mean"]
    for name in names:
        curves = np.array([entry["fast_rate_by_difficulty"][name] for entry in per_seed])
        line = ax.plot(
            levels,
            np.nanmean(curves, axis=0),
            marker="o",
            label=name,
            lw=2.5 if name == "dual" else 1,
        )
        if name in ("dual", "single_reference"):  # the masses the objective trains toward
            target = np.array([entry["target_fast_by_difficulty"][name] for entry in per_seed])
            ax.plot(
                levels,
                np.nanmean(target, axis=0)[: len(levels)],
                ls="--",
                color=line[0].get_color(),
                label=f"{name} target rho_F",
            )
    ax.set(xlabel="digits in the image (difficulty)", ylabel="P(fast), exact", ylim=(0, 1))
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(out / "fast_rate.png", dpi=120)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(5, 4))
    for subject, marker in (("dual", "o"), ("single_reference", "s")):
        rows = sorted((r for r in sweep if r["subject"] == subject), key=lambda r: r["length_cost"])
        ax.plot(
            [r["tokens"] for r in rows], [r["accuracy"] for r in rows], marker=marker, label=subject
        )
        for r in rows:
            ax.annotate(f"λ={r['length_cost']:g}", (r["tokens"], r["accuracy"]), fontsize=7)
    ax.set(xlabel="mean generated tokens (greedy)", ylabel="accuracy (greedy)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "tradeoff.png", dpi=120)
    plt.close(fig)
    return ["fast_rate.png", "tradeoff.png"]


def main() -> None:
    """Console entry point of `uv run reproduce` (entry point group papers.reproduce)."""
    run_claim_experiment()
