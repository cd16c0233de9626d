"""Re-analysis of the record at 611117b (seeds 0-2, per_prompt.json.gz): why both oracles lost
to single-reference DGO at matched tokens, and what a routing oracle gains when the decodes are
the same (issue 49, third round). No training: the recorded per-prompt arrays only.

- P(fast) by (source, digit count) of each subject, and forced-fast greedy accuracy by k;
- the oracle (slow iff k >= t) applied to decodes D (a rival's own, the method's, the
  exact-partition oracle's, SFT's as registered, the warm start's), against each rival R moved
  to the same mean tokens along its own P(fast) ranking (the registered ranked rule);
- the method-family subjects against each rival (as recorded).

`uv run python results/analysis/oracles_at_611117b.py` (output: oracles_at_611117b.txt).
Caveat: seed 2's warm start never learned the slow trace, so on seed 2 no routing can gain.
"""

import gzip
import json
from pathlib import Path

import numpy as np

from dual_dgo.evaluation import gain_at_matched_tokens

RECORD = Path(__file__).resolve().parents[1] / "per_prompt.json.gz"
RIVALS = ("single_reference", "sft", "rft")


def arrays(x: dict) -> dict:
    return {k: np.asarray(v, dtype=float) for k, v in x.items()}


def main() -> None:
    with gzip.open(RECORD) as f:
        seeds = json.load(f)["registered"]["seeds"]
    print("P(fast) by digit count 1-8, source a (8 fast / 1 slow) | source b (1 / 8), test")
    for seed, subjects in seeds.items():
        for name in ("dual", "exact_partition", "single_reference", "rft", "sft"):
            t = arrays(subjects[name]["test"])
            k, src = t["difficulty"], t["source"]
            rows = [
                [round(float(t["p_fast"][(k == j) & (src == b)].mean()), 2) for j in range(1, 9)]
                for b in (0, 1)
            ]
            print(seed, f"{name:18s}", rows[0], "|", rows[1])
        for name in ("single_reference", "sft", "dual"):
            t = arrays(subjects[name]["test"])
            acc = [
                round(float(t["fast_correct"][t["difficulty"] == j].mean()), 2) for j in range(1, 9)
            ]
            print(seed, f"forced-fast accuracy by k {name:16s}", acc)
    print("\noracle (slow iff k >= t) on decodes D vs rival R at matched tokens (ranked rule)")
    for t in (2, 3):
        for decodes in ("own", "dual", "exact_partition", "sft", "warm_start"):
            for rival in RIVALS:
                gains = []
                for subjects in seeds.values():
                    base = arrays(subjects[rival]["test"])
                    dec = arrays(subjects[rival if decodes == "own" else decodes]["test"])
                    p_slow = (dec["difficulty"] >= t).astype(float)
                    gains.append(float(gain_at_matched_tokens(dec, base, p_slow).mean()))
                print(f"t={t} D={decodes:16s} R={rival:16s} per seed "
                      f"{np.round(gains, 3).tolist()} mean {np.mean(gains):+.3f}")  # fmt: skip
    print("\nmethod-family subjects vs each rival (their own P(fast), as recorded)")
    for name in ("dual", "exact_partition", "fixed_prior"):
        for rival in RIVALS:
            gains = [
                float(
                    gain_at_matched_tokens(arrays(s[name]["test"]), arrays(s[rival]["test"])).mean()
                )
                for s in seeds.values()
            ]
            rounded = np.round(gains, 3).tolist()
            print(f"{name:16s} vs {rival:16s} {rounded} mean {np.mean(gains):+.3f}")


if __name__ == "__main__":
    main()
