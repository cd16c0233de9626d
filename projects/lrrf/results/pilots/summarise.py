"""Markdown tables of the pilot files (issue 57), pasted into the README's "Pilots".

uv run python results/pilots/summarise.py
"""

import json
from pathlib import Path

HERE = Path(__file__).parent
TERMS = ("drm", "ctir", "kco_replay", "kco_supcon")


def later_mean(diagnostics: list[dict], key: str) -> str:
    values = [d[key] for d in diagnostics[1:] if key in d]  # tasks 2-4
    return f"{sum(values) / len(values):.3f}" if values else "-"


def table(name: str) -> None:
    rows = [json.loads(line) for line in (HERE / name).read_text().splitlines() if line]
    print(f"\n{name}\n")
    print(
        "| tag | seed | val AA | test AA | forgetting | clean | "
        + " | ".join(f"share {t} (tasks 2-4)" for t in TERMS)
        + " | DRM weight (tasks 2-4) |"
    )
    print("|---" * (7 + len(TERMS)) + "|")
    for r in rows:
        d = r["diagnostics"]
        print(
            f"| {r['tag']} | {r['seed']} | {r['val_aa']:.3f} | {r['aa']:.3f} | "
            f"{r['forgetting']:.3f} | {r['clean_acc']:.3f} | "
            + " | ".join(later_mean(d, f"share_{t}") for t in TERMS)
            + f" | {later_mean(d, 'drm_weight')} |"
        )


for name in ("dynamic_weight.jsonl", "alternatives.jsonl", "dynamic_weight_mmd_only.jsonl"):
    if (HERE / name).exists():
        table(name)
