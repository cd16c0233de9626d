"""``train`` (LightningCLI) and ``reproduce`` (AIC vs fixed compute and the halting baselines
on (task, architecture) pairs, with the six-component protocol; writes results/)."""

from __future__ import annotations

import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import yaml  # noqa: E402

from aic.data import AicDataModule  # noqa: E402
from aic.evaluate import evaluate_pair  # noqa: E402
from aic.model import AicModule  # noqa: E402
from aic.tasks import get_task  # noqa: E402
from papers_cli import PapersCLI, UserError, cli_main, quiet_fit, reproduce_parser  # noqa: E402
from papers_eval import write_results  # noqa: E402
from papers_gpu import seed_everything  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


class AicCLI(PapersCLI):
    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.task", "model.task")
        parser.link_arguments("data.context", "model.context")
        parser.link_arguments("data.env_id", "model.env_id")


def train(args: list[str] | None = None) -> PapersCLI:
    """LightningCLI over the AIC module and the task data; returns the CLI (trainer, model)."""
    return cli_main(AicModule, AicDataModule, project_file=__file__, args=args, cli_class=AicCLI)


def main() -> None:
    """Console entry point of `uv run train` (and of the unique `aic` script)."""
    torch.set_num_threads(2)
    train()


def reproduce() -> None:
    """Console entry point of `uv run reproduce`."""
    torch.set_num_threads(2)
    run_claim_experiment()


def train_run(task: str, architecture: str, mode: str, budget: dict, seed: int):
    """Train one policy through the real CLI, quietly; returns (module, datamodule, seconds)."""
    overrides = [
        f"--data.task={task}",
        f"--model.architecture={architecture}",
        f"--model.mode={mode}",
        *[f"--{key}={value}" for key, value in budget.items()],
    ]
    start = time.perf_counter()
    cli = quiet_fit(
        AicModule,
        AicDataModule,
        project_file=__file__,
        seed=seed,
        overrides=overrides,
        cli_class=AicCLI,
    )
    cli.model.eval()
    return cli.model, cli.datamodule, time.perf_counter() - start


def pair_verdict(result: dict, task, settings: dict) -> dict:
    """Per pair: retention within tolerance, compute saved, targeted removal > random."""
    methods = result["methods"]
    fixed = next(v for k, v in methods.items() if k.startswith("fixed counterpart"))
    aic = next(v for k, v in methods.items() if k.startswith("AIC"))
    tolerance = (
        settings["lm_tolerance_nats"]
        if task.domain == "language"
        else settings["relative_tolerance"] * abs(fixed["return"]) + 1e-9
    )
    at = next(
        r for r in result["protocol"]["removal"] if r["fraction"] == settings["claim_fraction"]
    )
    verdict = {
        "aic_return": aic["return"],
        "fixed_return": fixed["return"],
        "tolerance": tolerance,
        "retains_return": aic["return"] >= fixed["return"] - tolerance,
        "compute_saved_pct": aic["compute_saved_pct"],
        "saves_compute": aic["compute_saved_pct"] >= settings["min_saving_pct"],
        "targeted_minus_random": at["targeted_minus_random"],
        "targeted_minus_random_ci": at["targeted_minus_random_ci"],
        "targeted_hurts_more": at["targeted_minus_random_ci"][0] > 0,
    }
    verdict["holds"] = (
        verdict["retains_return"] and verdict["saves_compute"] and verdict["targeted_hurts_more"]
    )
    return verdict


def plot_frontiers(path: Path, results: dict) -> None:
    """Return vs mean refinement steps: AIC's price sweep against fixed K, one panel per pair."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.3 * len(results), 3.1), dpi=110)
    for ax, (pair, result) in zip(np.atleast_1d(axes), results.items(), strict=True):
        frontier = result["protocol"]["frontier"]
        for name, rows, marker in (
            ("fixed K", frontier["fixed"], "s"),
            ("AIC", frontier["aic"], "o"),
        ):
            rows = sorted(rows, key=lambda r: r["mean_steps"])
            ax.plot([r["mean_steps"] for r in rows], [r["return"] for r in rows], marker=marker,
                    markersize=3, label=name)  # fmt: skip
        fixed = next(v for k, v in result["methods"].items() if k.startswith("fixed counterpart"))
        ax.scatter([fixed["mean_steps"]], [fixed["return"]], marker="*", s=60, color="k",
                   label="fixed counterpart", zorder=3)  # fmt: skip
        ax.set(title=pair, xlabel="mean refinement steps")
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("return (LM: log-lik)")
    np.atleast_1d(axes)[0].legend(fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_removal(path: Path, results: dict) -> None:
    """Return drop vs fraction of AIC's steps removed: targeted, random and reverse arms."""
    fig, axes = plt.subplots(1, len(results), figsize=(3.3 * len(results), 3.1), dpi=110)
    for ax, (pair, result) in zip(np.atleast_1d(axes), results.items(), strict=True):
        rows = result["protocol"]["removal"]
        fractions = [r["fraction"] for r in rows]
        for arm in ("targeted", "random", "reverse"):
            ax.plot(fractions, [r[f"drop_{arm}"] for r in rows], marker="o", markersize=3,
                    label=arm)  # fmt: skip
        ax.set(title=pair, xlabel="fraction of steps removed")
        ax.title.set_fontsize(8)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("drop in exact return")
    np.atleast_1d(axes)[0].legend(fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def load_plan(path: Path) -> dict:
    plan = yaml.safe_load(path.read_text())
    for pair in plan["pairs"]:
        get_task(pair["task"])
    return plan


def run_claim_experiment(argv: list[str] | None = None) -> dict:
    """Train AIC and its fixed counterpart on each (task, architecture) pair of the plan
    (configs/claim.yaml; --plan configs/all_tasks.yaml for all twelve tasks), evaluate every
    halting rule and the protocol, and write claim.json, claim.md and the plots."""
    parser = reproduce_parser(__doc__ or "", project_file=__file__)
    parser.add_argument("--plan", default=str(CONFIGS / "claim.yaml"), help="pairs and budgets")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    plan = load_plan(Path(args.plan))
    settings = plan["settings"]
    if args.quick:
        settings = {**settings, **plan["quick"]["settings"]}
    seeds = args.seeds or [args.seed]
    results, verdicts, train_s = {}, {}, {}
    for pair in plan["pairs"]:
        task = get_task(pair["task"])
        budget = {**plan["budget"][task.domain], **pair.get("budget", {})}
        if args.quick:
            budget = {**budget, **plan["quick"]["budget"]}
        domain_settings = {**settings, "price": settings["price"][task.domain]}
        for seed in seeds:
            name = f"{task.name}/{pair['architecture']}" + (
                f"/seed{seed}" if len(seeds) > 1 else ""
            )
            seed_everything(seed)
            aic, data, aic_s = train_run(task.name, pair["architecture"], "aic", budget, seed)
            fixed, _, fixed_s = train_run(task.name, pair["architecture"], "fixed", budget, seed)
            seed_everything(seed)
            result = evaluate_pair(task, aic.policy, fixed.policy, data, domain_settings, seed)
            results[name] = result
            verdicts[name] = pair_verdict(result, task, settings)
            train_s[name] = {"aic": aic_s, "fixed": fixed_s, "eval": result["eval_s"]}
            print(f"[aic] {name}: {verdicts[name]}", flush=True)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot_frontiers(out / "frontier.png", results)
    plot_removal(out / "removal.png", results)
    n_hold = sum(v["holds"] for v in verdicts.values())
    holds = n_hold >= settings["min_pairs_holding"] * len(verdicts)
    metrics = {}
    for name, result in results.items():
        for method, row in result["methods"].items():
            metrics[f"{name}: {method}"] = {
                k: row[k]
                for k in ("return", "mean_steps", "compute_saved_pct", "flops_per_decision")
            }
    headline = "; ".join(
        f"{name}: AIC {v['aic_return']:.3g} vs fixed {v['fixed_return']:.3g} at "
        f"{v['compute_saved_pct']:.0f}% less compute, targeted-random drop "
        f"{v['targeted_minus_random']:+.3g}"
        for name, v in verdicts.items()
    )
    write_results(
        out,
        project="aic",
        experiment=f"AIC vs fixed compute and halting baselines ({Path(args.plan).name})",
        claim=(
            "AIC keeps the fixed-compute policy's return with substantially less compute, and "
            "removing compute from the states AIC gives the most steps hurts more than removing "
            "the same number of steps from random states."
        ),
        criterion=(
            "Per (task, architecture): AIC's return at the configured price >= the fixed "
            f"counterpart's (K=K_max) minus {settings['relative_tolerance']:.0%} of its magnitude "
            f"(language: minus {settings['lm_tolerance_nats']} nats/char); compute saved >= "
            f"{settings['min_saving_pct']}% of K_max steps; and at removal fraction "
            f"{settings['claim_fraction']} the 95% bootstrap interval of (targeted drop - random "
            f"drop) lies above 0. The claim holds if at least "
            f"{settings['min_pairs_holding']:.0%} of the pairs pass all three."
        ),
        holds=holds,
        metrics=metrics,
        columns=["return", "mean_steps", "compute_saved_pct", "flops_per_decision"],
        config={"plan": plan, "quick": args.quick, "settings": settings},
        seeds=seeds,
        wall_time_s=time.perf_counter() - start,
        headline=headline,
        notes=f"{n_hold} of {len(verdicts)} pairs pass. Plots: frontier.png, removal.png.",
        extra={"verdicts": verdicts, "results": results, "timing_s": train_s},
    )
    if not results:
        raise UserError("the plan has no pairs")
    return {"holds": holds, "verdicts": verdicts, "results": results}
