"""Sweeps and plots beyond the claim (`uv run seqrejectron-sweeps`), written to results/sweeps/.

Parts (``--parts``; each writes ``<part>.json`` with the numbers and ``<part>.png``):

- ``thresholds``: test cost before stopping against the train stop rate, every stop rule swept
  over its threshold (the per-state rules and the random time over their calibration target,
  SeqRejectron, exact and per-step over epsilon) on environment (A), horizon 80.
- ``horizon``: train stop, test cost and executed share against the horizon, read from the
  committed claim record (results/claim.json, per seed); no computation.
- ``demos``: the same rates (and |V|) against the number of labelled demonstrations (and
  unlabelled test trajectories, equal counts), horizon 80.
- ``extensions``: the two extensions, each swept to show the degradation: a misspecified expert
  (the demonstrator takes a uniformly random action with probability p, in the labelled train
  demos and the unlabelled test trajectories; no deterministic policy reproduces it) and a
  different expert in test (a share q of the unlabelled test trajectories comes from another
  expert, one that turns towards a closer side cell before going forward).
- ``pointmaze``: environment (B) once (pointmaze.py).

Every rule is fitted with the claim run's tuned parameters (results/claim.json, ``tuning.best``)
and the claim's data sizes (configs/claim.yaml), at the seeds given (default 0 and 1).
"""

from __future__ import annotations

import argparse
import functools
import json
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from papers_cli import project_dir_of
from seqrejectron.baselines import (
    DomainClassifierRule,
    EnsembleRule,
    NoveltyRule,
    RandomTimeRule,
)
from seqrejectron.envs import EXPERT_TABLE, FORWARD, LEFT, N_ACTIONS, RIGHT, Layout
from seqrejectron.experiment import (
    SIZES,
    World,
    WorldConfig,
    build_world,
    episode_metrics,
    episode_seeds,
    fit_method,
    world_from_demonstrations,
)

PROJECT = project_dir_of(__file__)
PARTS = ("thresholds", "horizon", "demos", "extensions", "pointmaze")
TARGETS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.3)
EPSILONS = (0.02, 0.05, 0.1, 0.2, 0.3)
DEMOS = (25, 50, 100, 200)
NOISES = (0.0, 0.1, 0.3)
MIXES = (0.0, 0.5, 1.0)
# Another expert: turn towards a closer side cell first, forward only when no side is closer.
OTHER_EXPERT_TABLE = np.array(
    [LEFT if z & 2 else RIGHT if z & 1 else FORWARD if z & 4 else RIGHT for z in range(8)]
)


def claim_settings() -> tuple[dict, dict]:
    """The claim's settings (configs/claim.yaml) and tuned parameters (results/claim.json)."""
    spec = yaml.safe_load((PROJECT / "configs" / "claim.yaml").read_text())
    record = PROJECT / "results" / "claim.json"
    best = json.loads(record.read_text())["tuning"]["best"] if record.exists() else {}
    return spec["settings"], best


def base_config(settings: dict, horizon: int = 80, quick: bool = False) -> WorldConfig:
    keys = ("shift", "strength", "n_train", "n_test", "n_calibration", "n_val", "n_eval")
    config = WorldConfig(horizon=horizon, **{k: settings[k] for k in keys})
    if quick:
        config = replace(config, n_train=30, n_test=30, n_calibration=30, n_val=10, n_eval=30)
    return config


def means(outcome: dict[str, np.ndarray]) -> dict[str, float]:
    return {k: float(v.mean()) for k, v in outcome.items()}


def evaluate(world: World, name: str, epsilon: float, best: dict) -> dict[str, float]:
    """One subject fitted (tuned parameters, baselines calibrated to the method's stop rate
    floored at epsilon / 2, as in the claim) and evaluated on the world's evaluation rollouts."""
    method = dict(best.get("seqrejectron", {}))
    fitted = fit_method(world, name, epsilon, dict(best.get(name, {})), method)
    row = means(episode_metrics(fitted.rule, world.eval_p, world.eval_q))
    if "n_validators" in fitted.diagnostics:
        row["n_validators"] = float(fitted.diagnostics["n_validators"])
    return row


# ---------------------------------------------------------------------------------------------


def thresholds(seeds, settings, best, quick) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        world = build_world(base_config(settings, quick=quick), seed)
        cfg = world.config
        rules = {
            "novelty": NoveltyRule(world.train, best.get("novelty", {}).get("k", 1)),
            "domain_classifier": DomainClassifierRule(
                world.train,
                world.test,
                best.get("domain_classifier", {}).get("hidden", 16),
                300,
                0.01,
                seed,
            ),
            "ensemble": EnsembleRule(
                world.pihat,
                world.train,
                best.get("ensemble", {}).get("members", 3),
                cfg.hidden,
                cfg.bc_steps,
                cfg.bc_lr,
                seed,
            ),
            "random_time": RandomTimeRule(seed),
        }
        for name, rule in rules.items():
            for target in TARGETS:
                rule.calibrate(world.calibration, target)
                outcome = means(episode_metrics(rule, world.eval_p, world.eval_q))
                rows.append({"subject": name, "knob": "target", "value": target, "seed": seed})
                rows[-1].update(outcome)
        for name in ("seqrejectron", "seqrejectron_exact", "per_step_rejectron"):
            for eps in EPSILONS:
                row = {"subject": name, "knob": "epsilon", "value": eps, "seed": seed}
                rows.append(row | evaluate(world, name, eps, best))
        for name in ("bc", "oracle_stop"):
            rows.append({"subject": name, "knob": None, "value": None, "seed": seed})
            rows[-1].update(evaluate(world, name, 0.05, best))
    return {"horizon": 80, "rows": rows}


def horizon_from_record() -> dict[str, Any]:
    record = json.loads((PROJECT / "results" / "claim.json").read_text())
    horizons = [int(h) for h in record["settings"]["horizons"]]
    rows = []
    for subject, metrics in record["metrics"].items():
        for horizon in horizons:
            for i, seed in enumerate(record["seeds"]):
                row = {"subject": subject, "horizon": horizon, "seed": seed}
                for key in ("train_stop", "test_cost", "test_executed", "n_validators"):
                    entry = metrics.get(f"{key}_H{horizon}")
                    if entry is not None:
                        row[key] = entry["per_seed"][i]
                rows.append(row)
    return {"source": "results/claim.json", "git_revision": record["git_revision"], "rows": rows}


def demos(seeds, settings, best, quick) -> dict[str, Any]:
    rows = []
    counts = (10, 30) if quick else DEMOS
    for seed in seeds:
        for n in counts:
            config = replace(base_config(settings, quick=quick), n_train=n, n_test=n)
            world = build_world(config, seed)
            for name in ("seqrejectron", "bc", "novelty", "oracle_stop"):
                row = {"subject": name, "n_demos": n, "seed": seed}
                rows.append(row | evaluate(world, name, 0.05, best))
    return {"horizon": 80, "rows": rows}


@functools.lru_cache(maxsize=64)
def variant_world(config: WorldConfig, seed: int, noise: float, mix: float) -> World:
    """build_world with the extensions: demonstrator noise ``noise`` (train demos, labelled with
    the actions taken, and test trajectories) and a share ``mix`` of the test trajectories from
    OTHER_EXPERT_TABLE. pi-hat's rollouts still carry the clean BFS expert's action as
    ``expert`` (what the oracle stop and the dense cost compare with)."""
    size, crossings = SIZES[config.horizon]
    train_env = Layout(size, crossings, config.horizon, layout_seed=seed * 1000 + size)
    test_env = train_env.with_shift(config.shift, config.strength)
    rng = np.random.default_rng(seed + 12_345)

    def demonstrator(table):
        def act(feats, z):
            if noise > 0 and rng.random() < noise:
                return int(rng.integers(N_ACTIONS))
            return int(table[z])

        return act

    train = [
        train_env.rollout(demonstrator(EXPERT_TABLE), s)
        for s in episode_seeds(seed, 0, config.n_train)
    ]
    for t in train:
        t.expert = t.actions.copy()  # the learner's labels: what the demonstrator did
    n_other = int(round(mix * config.n_test))
    test = [
        test_env.rollout(demonstrator(OTHER_EXPERT_TABLE if j < n_other else EXPERT_TABLE), s)
        for j, s in enumerate(episode_seeds(seed, 1, config.n_test))
    ]
    return world_from_demonstrations(config, seed, train_env, test_env, train, test)


def extensions(seeds, settings, best, quick) -> dict[str, Any]:
    rows = []
    config = base_config(settings, quick=quick)
    sweeps = [("misspecified", p, p, 0.0) for p in NOISES] + [
        ("other_test_expert", q, 0.0, q) for q in MIXES
    ]
    for seed in seeds:
        for extension, value, noise, mix in sweeps:
            world = (
                build_world(config, seed)  # the claim's world (equal to the variant, tested)
                if noise == 0 and mix == 0
                else variant_world(config, seed, noise, mix)
            )
            for name in ("seqrejectron", "bc", "novelty", "domain_classifier", "oracle_stop"):
                row = {"extension": extension, "value": value, "subject": name, "seed": seed}
                rows.append(row | evaluate(world, name, 0.05, best))
    return {"horizon": 80, "noises": NOISES, "mixes": MIXES, "rows": rows}


# ---------------------------------------------------------------------------------------------
# Plots (matplotlib, Agg): one figure per part, means over seeds.


def mean_by(rows, keys, metric):
    groups: dict[tuple, list[float]] = {}
    for row in rows:
        if metric in row:
            groups.setdefault(tuple(row[k] for k in keys), []).append(row[metric])
    return {k: float(np.mean(v)) for k, v in groups.items()}


def plot(part: str, data: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = data["rows"]
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = list(dict.fromkeys(r["subject"] for r in rows))
    color = {n: palette[i % len(palette)] for i, n in enumerate(names)}
    if part == "thresholds":
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        panels = (
            ("train_stop", "test_cost", "train stop rate (P)", "test cost before stop (Q)"),
            ("train_stop", "test_executed", "train stop rate (P)", "test episodes executed"),
            ("test_executed", "test_cost", "test episodes executed", "test cost before stop (Q)"),
        )
        for subject in dict.fromkeys(r["subject"] for r in rows):
            pts = [r for r in rows if r["subject"] == subject]
            for ax, (x_metric, y_metric, x_label, y_label) in zip(axes, panels, strict=True):
                xs = mean_by(pts, ("value",), x_metric)
                ys = mean_by(pts, ("value",), y_metric)
                keys = sorted(xs, key=lambda k: (k[0] is not None, k[0]))
                ax.plot(
                    [xs[k] for k in keys],
                    [ys[k] for k in keys],
                    "o-",
                    label=subject,
                    color=color[subject],
                )
                ax.set_xlabel(x_label)
                ax.set_ylabel(y_label)
        axes[0].legend(fontsize=7)
        fig.suptitle("Threshold sweeps, horizon 80 (means over seeds)")
    else:
        x_key = {"horizon": "horizon", "demos": "n_demos", "extensions": "value"}[part]
        panels = ("train_stop", "test_cost", "test_executed", "n_validators")
        groups = (
            ["all"] if part != "extensions" else list(dict.fromkeys(r["extension"] for r in rows))
        )
        fig, axes = plt.subplots(len(groups), 4, figsize=(16, 3.6 * len(groups)), squeeze=False)
        for gi, group in enumerate(groups):
            sub = [r for r in rows if group == "all" or r["extension"] == group]
            for ax, metric in zip(axes[gi], panels, strict=True):
                for subject in dict.fromkeys(r["subject"] for r in sub):
                    ys = mean_by([r for r in sub if r["subject"] == subject], (x_key,), metric)
                    if ys:
                        keys = sorted(ys)
                        ax.plot(
                            [k[0] for k in keys],
                            [ys[k] for k in keys],
                            "o-",
                            label=subject,
                            color=color[subject],
                        )
                ax.set_xlabel(x_key if group == "all" else f"{group}: {x_key}")
                ax.set_ylabel(metric)
                if part == "horizon":
                    ax.set_xscale("log", base=2)
                    ax.set_xticks([40, 80, 160], ["40", "80", "160"])
            axes[gi][0].legend(fontsize=7)
        fig.suptitle(
            {
                "horizon": "Rates vs horizon (claim record)",
                "demos": "Rates vs demonstrations, horizon 80",
                "extensions": "Extensions, horizon 80",
            }[part]
        )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def git_revision() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=PROJECT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--out", default=str(PROJECT / "results" / "sweeps"))
    parser.add_argument("--quick", action="store_true", help="tiny data (the tests)")
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw the figures from the JSON files in --out"
    )
    args = parser.parse_args(argv)
    if args.plot_only:
        for part in args.parts:
            if part != "pointmaze" and (Path(args.out) / f"{part}.json").exists():
                data = json.loads((Path(args.out) / f"{part}.json").read_text())
                plot(part, data, Path(args.out) / f"{part}.png")
        return {}
    torch.set_num_threads(1)
    settings, best = claim_settings()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for part in args.parts:
        start = time.perf_counter()
        if part == "horizon":
            data = horizon_from_record()
        elif part == "pointmaze":
            from seqrejectron.pointmaze import run_pointmaze

            data = run_pointmaze(args.seeds, quick=args.quick, params=best)
        else:
            data = {"thresholds": thresholds, "demos": demos, "extensions": extensions}[part](
                args.seeds, settings, best, args.quick
            )
        data["command"] = " ".join(
            ["seqrejectron-sweeps", *(sys.argv[1:] if argv is None else argv)]
        )
        data.update(
            part=part,
            seeds=args.seeds,
            quick=args.quick,
            tuned=best,
            code_revision=git_revision(),
            wall_time_s=round(time.perf_counter() - start, 1),
            hardware="CPU, torch threads 1",
        )
        (out / f"{part}.json").write_text(json.dumps(data, indent=1))
        if part != "pointmaze":
            plot(part, data, out / f"{part}.png")
        written[part] = data
        print(f"{part}: {data['wall_time_s']} s -> {out / part}.json", flush=True)
    return written


def cli() -> None:
    """Console entry point of `uv run seqrejectron-sweeps`."""
    main()
