"""Figures of a claim record: success by distractor strength, probe R^2 by horizon.

`uv run python -m tcwm.plots results/claim.json` writes results/success_by_strength.png and
results/probe_by_horizon.png from the record's numbers (nothing is recomputed).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

SHOWN = ("tcwm", "dino_wm", "pldm", "state_oracle", "shuffled_alignment", "persistence")


def success_by_strength(record: dict, out: Path) -> Path:
    subjects = [
        s
        for s in record["metrics"]
        if s in SHOWN or s.endswith("projection") or s.startswith("no_")
    ]
    fig, ax = plt.subplots(figsize=(8, 3.5))
    strengths = [
        (key, label)
        for key, label in (("k0", "kappa 0"), ("k05", "kappa 0.5"), ("k1", "kappa 1"))
        if f"success_{key}" in record["metrics"][subjects[0]]
    ]
    width = 0.8 / len(strengths)
    for i, (key, label) in enumerate(strengths):
        offset = (i - (len(strengths) - 1) / 2) * width
        means, lows, highs = [], [], []
        for subject in subjects:
            entry = record["metrics"][subject][f"success_{key}"]
            mean = _number(entry.get("mean"))
            low, high = (_number(v) for v in (entry.get("ci") or [None, None]))
            means.append(mean)
            lows.append(mean - low if np.isfinite(low) else 0.0)
            highs.append(high - mean if np.isfinite(high) else 0.0)
        x = np.arange(len(subjects)) + offset
        ax.bar(
            x,
            np.nan_to_num(means),
            width,
            yerr=[np.nan_to_num(lows), np.nan_to_num(highs)],
            label=label,
            capsize=2,
        )
    ax.set_xticks(np.arange(len(subjects)), subjects, rotation=30, ha="right")
    ax.set_ylabel("planning success")
    ax.set_ylim(0, 1.05)
    ax.legend()
    ax.set_title("Success by distractor strength (95% intervals; missing bars: not run)")
    fig.tight_layout()
    path = out / "success_by_strength.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def probe_by_horizon(record: dict, out: Path) -> Path:
    per_subject = record["evidence"]["per_subject"]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for subject in SHOWN:
        curves = per_subject.get(subject, {}).get("probe_by_horizon_k1")
        if curves:
            curve = np.mean(np.asarray(curves, float), axis=0)
            ax.plot(np.arange(1, len(curve) + 1), curve, marker="o", label=subject)
    ax.set_xlabel("open-loop horizon")
    ax.set_ylabel("probe R^2 (position)")
    ax.set_title("Open-loop prediction, kappa 1 (seed mean)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = out / "probe_by_horizon.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _number(value) -> float:
    return float("nan") if value is None else float(value)


def main(argv: list[str] | None = None) -> None:
    path = Path((argv or sys.argv[1:] or ["results/claim.json"])[0])
    record = json.loads(path.read_text())
    for figure in (success_by_strength(record, path.parent), probe_by_horizon(record, path.parent)):
        print(figure)


if __name__ == "__main__":
    main()
