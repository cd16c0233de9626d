"""Pilot for issue 54 (seed 10, outside the claim's seed sets; run before the re-specification):
can a frozen member of LAS's 8-bin convex family, fitted to SFD's shifted path, beat the
synchronous schedule at the claim's budget? Trains synchronous, SFD (D = 0.5 and 0.7) and the
members closest to those two paths (``core.fit_schedule_to_path``) through the claim's runner.

    uv run python results/pilots/in_family_pilot.py > results/pilots/in_family_seed10.txt
"""

import torch
import yaml

from async_schedule import claim
from async_schedule.baselines import SFDShiftedPath
from async_schedule.core import fit_schedule_to_path, path_hausdorff, schedule_path

SEED = 10


def main() -> None:
    settings = dict(yaml.safe_load(claim.CLAIM_FILE.read_text())["settings"])
    runner = claim.Runner(settings, quick=False)
    tau = torch.linspace(0, 1, 401, dtype=torch.float64)
    configs = {"synchronous": ["--model.schedule=synchronous"]}
    for delta in (0.5, 0.7):
        target = torch.stack(SFDShiftedPath(delta).times(tau), 1)
        member = fit_schedule_to_path(target)
        slopes = member.normalised_slopes().tolist()
        reach = float(path_hausdorff(schedule_path(member), target))
        print(
            f"member fitted to SFD D={delta}: Hausdorff {reach:.3f}, f(0.5) "
            f"{float(member(torch.tensor([0.5], dtype=torch.float64))[0]):.4f}, slopes "
            f"{[round(s, 4) for s in slopes]}"
        )
        configs[f"sfd_{delta}"] = claim.schedule_flags("sfd", {"sfd_delta": delta}, settings)
        configs[f"member_{delta}"] = [
            "--model.schedule=frozen",
            f"--model.frozen_slopes=[{','.join(repr(s) for s in slopes)}]",
            "--model.corrected=true",
        ]
    runner.prefetch([(flags, SEED, "pilot") for flags in configs.values()], workers=2)
    for name, flags in configs.items():
        r = runner.run(flags, SEED)
        print(
            f"{name}: val FD {r['val_fd_digit']:.2f}, test FD {r['fd_digit']:.2f}, "
            f"recall {r['recall']:.3f}, class TV {r['class_tv']:.3f}, train {r['train_s']:.0f} s"
        )


if __name__ == "__main__":  # the runner's workers import this file: run only here
    main()
