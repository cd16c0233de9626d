"""How large a table the isotonic and robust fits handle on 2 CPU cores.

    uv run python scripts/benchmark.py [--sizes 1000 2000 5000] [--out results/benchmark.json]

A min-type (Leontief) evaluator in d = 4 with correlated criteria (rho = 0.6), as in the claim's
hardest cells. For each n: the reduced-edge count, one isotonic fit (Eq. 3-4) and the 5-fold
robust fit (six isotonic fits plus NNLS); the robust fit is skipped once one isotonic fit takes
longer than ``--robust_limit`` seconds (it would take about six times as long).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from monotone_preferences.core import CrossFitRobust, IsotonicRegressor
from monotone_preferences.simulate import simulate


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 5000])
    parser.add_argument("--dimension", type=int, default=4)
    parser.add_argument("--robust_limit", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("results/benchmark.json"))
    args = parser.parse_args()
    report = {"family": "min", "dimension": args.dimension, "rho": 0.6, "sizes": {}}
    for n in args.sizes:
        sim = simulate("min", n, args.dimension, 0.6, 0.5, seed=n)
        iso_s, iso = timed(lambda sim=sim: IsotonicRegressor().fit(sim.x, sim.y))
        row = {"edges": int(len(iso.edges_)), "isotonic_fit_s": iso_s}
        if iso_s <= args.robust_limit:
            row["robust_fit_s"], _ = timed(lambda sim=sim: CrossFitRobust().fit(sim.x, sim.y))
        report["sizes"][str(n)] = row
        print(n, row, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
