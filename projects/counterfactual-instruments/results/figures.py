"""Figures of the claim record and of counterfactual views (run after `uv run reproduce`).

    uv run python results/figures.py            # results/metrics.png from results/claim.json
    uv run python results/figures.py --views    # + results/counterfactuals.png: trains the method
                                                # and translation on seed 0 (registered settings,
                                                # about 4 minutes on 2 cores) and draws views

Only reads the record for the first figure; the second trains through the claim's own `fit`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
PANELS = (
    ("psf_r2", "PSF R^2 from the intrinsic latent (lower: less leakage)"),
    ("cross_probe_r2", "probe R^2 across instruments (higher)"),
    ("recall_at_1", "recall@1 across instruments (higher)"),
    ("counterfactual_chi2", "counterfactual chi2 vs noise-free truth (lower)"),
)


def metrics_figure(record: dict, path: Path) -> None:
    subjects = list(record["metrics"])
    fig, axes = plt.subplots(1, len(PANELS), figsize=(4.2 * len(PANELS), 4.2))
    for ax, (metric, title) in zip(axes, PANELS, strict=True):
        means, lows, highs, names = [], [], [], []
        for s in subjects:
            cell = record["metrics"][s].get(metric)
            if cell is None or cell["mean"] is None or not np.isfinite(cell["mean"]):
                continue
            names.append(s)
            means.append(cell["mean"])
            lows.append(cell["mean"] - cell["ci"][0])
            highs.append(cell["ci"][1] - cell["mean"])
        y = np.arange(len(names))
        ax.barh(y, means, xerr=[lows, highs], color="tab:blue", alpha=0.7)
        ax.set_yticks(y, names, fontsize=8)
        ax.set_title(title, fontsize=9)
        if metric == "counterfactual_chi2":
            ax.set_xscale("log")
        if metric == "cross_probe_r2":
            ax.set_xlim(-1, 1)
    fig.suptitle(f"counterfactual-instruments, seeds {record['seeds']}: mean and 95% interval")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def views_figure(path: Path, n: int = 5) -> None:
    import torch
    import yaml

    from counterfactual_instruments.claim import fit

    spec = yaml.safe_load((HERE.parent / "configs" / "claim.yaml").read_text())
    record = json.loads((HERE / "claim.json").read_text())
    settings = dict(spec["settings"])
    rows = {}
    for subject in ("dual_counterfactual", "translation"):
        params = record["tuning"]["best"].get(subject) or {}
        cli = fit(subject, 0, settings, params)
        data = cli.datamodule
        batch = {k: v[:n] for k, v in data.test_set.arrays.items()}
        with torch.no_grad():
            rows[subject] = cli.model.counterfactual_view(batch).sum(1).numpy()
    columns = [
        ("A view (input)", batch["image_A"].sum(1).numpy()),
        ("partner's star (z_s)", batch["partner_neighbour_B"].sum(1).numpy()),
        ("method: counterfactual", rows["dual_counterfactual"]),
        ("translation", rows["translation"]),
        ("truth (noise-free)", batch["truth_B"].sum(1).numpy()),
    ]
    fig, axes = plt.subplots(n, len(columns), figsize=(2.2 * len(columns), 2.2 * n))
    for j, (title, images) in enumerate(columns):
        for i in range(n):
            ax = axes[i, j]
            ax.imshow(images[i], cmap="magma")
            ax.set_xticks([]), ax.set_yticks([])
            if i == 0:
                ax.set_title(title, fontsize=9)
    fig.suptitle("galaxy i seen by B under its partner's condition (band sum), seed 0")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    record = json.loads((HERE / "claim.json").read_text())
    metrics_figure(record, HERE / "metrics.png")
    if "--views" in sys.argv:
        views_figure(HERE / "counterfactuals.png")
