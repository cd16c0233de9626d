"""Second pilot for issue 54 (seed 10, outside the claim's seed sets; after
``in_family_pilot.py``, before the re-specification): the members of LAS's family closest to
SFD's paths (D = 0.5, 0.7) lost badly to synchronous when sampled on a uniform global grid
(FD 74 and 96 against 40): they move most of the texture in their last bin, i.e. in two of 16
Euler steps. Sampled on a grid uniform in the path's L-infinity length
(``core.arclength_time_grid``, the length SFD's own sampler is uniform in), do they beat
synchronous? And the power law p = 5 on both grids.

    uv run python results/pilots/arclength_pilot.py > results/pilots/arclength_seed10.txt
"""

import torch
import yaml

from async_schedule import claim
from async_schedule.baselines import SFDShiftedPath
from async_schedule.core import fit_schedule_to_path

SEED = 10
ARC = "--model.sample_grid=arclength"


def main() -> None:
    settings = dict(yaml.safe_load(claim.CLAIM_FILE.read_text())["settings"])
    runner = claim.Runner(settings, quick=False)
    tau = torch.linspace(0, 1, 401, dtype=torch.float64)
    configs = {}
    for delta in (0.5, 0.7):
        target = torch.stack(SFDShiftedPath(delta).times(tau), 1)
        slopes = tuple(fit_schedule_to_path(target).normalised_slopes().tolist())
        configs[f"member_{delta}_arclength"] = [*claim.frozen_flags(slopes), ARC]
    power = claim.schedule_flags("power", {"power_exponent": 5.0}, settings)
    configs["power_5_uniform"] = power
    configs["power_5_arclength"] = [*power, ARC]
    runner.prefetch([(flags, SEED, "pilot") for flags in configs.values()], workers=2)
    for name, flags in configs.items():
        r = runner.run(flags, SEED)
        print(
            f"{name}: val FD {r['val_fd_digit']:.2f}, test FD {r['fd_digit']:.2f}, "
            f"recall {r['recall']:.3f}, class TV {r['class_tv']:.3f}, train {r['train_s']:.0f} s"
        )


if __name__ == "__main__":  # the runner's workers import this file: run only here
    main()
