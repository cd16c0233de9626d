"""Re-analysis of the record at c731642 from results/per_prompt.json.gz (no retraining).

`uv run python results/analysis/ranking_at_c731642.py > results/analysis/ranking_at_c731642.txt`

Per seed and subject on the test prompts: mean P(fast), Spearman(k, P(slow)), forced-mode
accuracies; the ranked matched-token gain of the method over single-reference DGO on the
registered and on the swapped count schedules; and routing by the true digit count (slow from
k >= t) scored by the same rule against the subject's own P(fast) ranking, with the same decodes.
"""

import gzip
import json
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from dual_dgo.evaluation import gain_at_matched_tokens

with gzip.open(Path(__file__).parents[1] / "per_prompt.json.gz") as file:
    record = json.loads(file.read())
for seed, subjects in record["registered"]["seeds"].items():
    test = {s: {k: np.asarray(v) for k, v in a["test"].items()} for s, a in subjects.items()}
    for name in ("sft", "dual", "single_reference", "dual_swapped", "single_reference_swapped"):
        a = test[name]
        rho = spearmanr(a["difficulty"], 1 - a["p_fast"])[0]
        print(
            f"seed {seed} {name:25s} P(fast) {a['p_fast'].mean():.2f}  Spearman {rho:.2f}  "
            f"forced-fast acc {a['fast_correct'].mean():.2f}  forced-slow acc "
            f"{a['slow_correct'].mean():.2f}"
        )
    for method, rival in (
        ("dual", "single_reference"),
        ("dual_swapped", "single_reference_swapped"),
    ):
        gain = gain_at_matched_tokens(test[method], test[rival]).mean()
        print(f"seed {seed} ranked gain {method} over {rival}: {gain:+.3f}")
    for name in ("sft", "single_reference_swapped", "dual_swapped"):
        a = test[name]
        gains = [
            gain_at_matched_tokens(a, a, p_slow=(a["difficulty"] >= t).astype(float)).mean()
            for t in (2, 3, 4, 5)
        ]
        shown = ", ".join(f"t={t}: {g:+.3f}" for t, g in zip((2, 3, 4, 5), gains, strict=True))
        print(f"seed {seed} true-difficulty routing over {name}'s own ranking: {shown}")
