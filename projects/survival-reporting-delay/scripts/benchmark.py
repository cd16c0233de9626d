"""Timing of the joint fit at scale, and beside lifelines on delay-free data (2 CPU cores).

    uv run python scripts/benchmark.py [--sizes 100000 1000000] [--lifelines_sizes 10000 100000]

An empty size list skips that section; a section that runs replaces its entry in ``--out`` and
the others are kept, each with the torch thread count it ran with.

1. Delay-free data (every event reported at once, so the joint model's event part is a plain
   right-censored Weibull fit): the joint direct ML fit of (theta, phi) vs lifelines'
   ``WeibullFitter`` on (T, event), n = 1e4 and 1e5; estimates and wall times. One torch
   thread by default: lifelines runs on one core (numpy/autograd), and at these sizes a second
   torch thread costs more in hand-offs than it saves (2 threads made the n = 1e4 fit ~4x slower).
2. The miniature's design (windows U(0, 3) y, Weibull delays) at n = 1e5 and 1e6: the direct ML
   fit and one MCEM E-step with M = 200 draws (bounded-memory chunks), wall time and peak RSS.
Times are the best of ``--repeats`` runs after one warm-up call (the first torch call of a
process pays a one-off start-up of several seconds).
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path

import numpy as np
import torch

from survival_delay.core import Cohort, JointModel
from survival_delay.fitting import e_step_rows, fit_direct
from survival_delay.simulate import Truth, simulate_cohort

F64 = torch.float64


def delay_free(n: int, seed: int = 0) -> tuple[Cohort, np.ndarray, np.ndarray]:
    """Weibull(alpha 3, rho 1.2) event times censored at U(0.5, 3); reports arrive within days
    (Weibull delays with scale 0.01 y) and windows run 100 years past exposure."""
    rng = np.random.default_rng(seed)
    t_true = 3.0 * rng.weibull(1.2, n)
    exposure = rng.uniform(0.5, 3.0, n)
    event = t_true <= exposure
    t = np.minimum(t_true, exposure)
    d = 0.01 * rng.weibull(1.0, n)
    cohort = Cohort(
        torch.zeros(n, 0, dtype=F64),
        torch.as_tensor(exposure + 100.0),
        torch.as_tensor(exposure),
        torch.as_tensor(event),
        torch.as_tensor(np.where(event, t, np.nan)),
        torch.as_tensor(np.where(event, d, np.nan)),
    ).check()
    return cohort, t, event.astype(float)


def best_time(fn, repeats: int) -> tuple[float, object]:
    if repeats > 1:
        fn()  # warm-up (a single-repeat size runs after smaller, warmed-up ones)
    times, out = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return min(times), out


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[100_000, 1_000_000])
    parser.add_argument("--lifelines_sizes", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2, help="torch threads at scale")
    parser.add_argument("--lifelines_threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/benchmark.json"))
    args = parser.parse_args()
    from lifelines import WeibullFitter

    report = json.loads(args.out.read_text()) if args.out.exists() else {}
    report.pop("threads", None)  # the first version kept one count for both sections
    if args.lifelines_sizes:
        report["lifelines"] = {"threads": args.lifelines_threads}
    if args.sizes:
        report["scale"] = {"threads": args.threads}
    torch.set_num_threads(args.lifelines_threads)
    model = JointModel.build(0)
    for n in args.lifelines_sizes:
        cohort, t, e = delay_free(n)
        joint_s, fit = best_time(lambda cohort=cohort: fit_direct(model, cohort), args.repeats)
        ref_s, ref = best_time(lambda t=t, e=e: WeibullFitter().fit(t, e), args.repeats)
        report["lifelines"][str(n)] = {
            "joint_fit_s": joint_s,
            "lifelines_weibull_s": ref_s,
            "ratio": joint_s / ref_s,
            "alpha_joint": float(fit["theta"][0].exp()),
            "alpha_lifelines": float(ref.lambda_),
            "rho_joint": float(fit["theta"][1].exp()),
            "rho_lifelines": float(ref.rho_),
        }
        print(n, report["lifelines"][str(n)], flush=True)
    torch.set_num_threads(args.threads)
    truth = Truth()
    model = JointModel.build(1)
    blocks = {"theta": truth.theta(), "phi": truth.phi(), "gamma": torch.zeros(1, dtype=F64)}
    for n in args.sizes:
        cohort = simulate_cohort(n, (0.0, 3.0), truth, 0.0, np.random.default_rng(n)).cohort
        repeats = 1 if n >= 1_000_000 else args.repeats
        fit_s, fit = best_time(lambda cohort=cohort: fit_direct(model, cohort), repeats)
        e_s, rows = best_time(
            lambda cohort=cohort: e_step_rows(
                model, blocks, cohort, 200, torch.Generator().manual_seed(0)
            ),
            repeats,
        )
        report["scale"][str(n)] = {
            "direct_fit_s": fit_s,
            "e_step_200_draws_s": e_s,
            "e_step_rows": len(rows.event_time),
            "unreported": int((~cohort.reported).sum()),
            "peak_rss_mb_so_far": peak_rss_mb(),
            "risk_error_of_fit": float(
                model.timely_risk(fit["theta"], cohort.x, 1.0).mean()
                - model.timely_risk(truth.theta(), cohort.x, 1.0).mean()
            ),
        }
        print(n, report["scale"][str(n)], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
