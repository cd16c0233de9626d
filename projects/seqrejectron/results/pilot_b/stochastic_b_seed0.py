"""Why the stochastic stop on (B) stops the safe episodes: per-episode length, cost, route and
cumulative H^2 of sampled pi-hat's test rollouts (seed 0, claim sizes, Lambda 20)."""

import numpy as np
import torch

from seqrejectron.experiment import episode_seeds
from seqrejectron.pointmaze import SIZES_B, build_pointmaze_world
from seqrejectron.stochastic import HellingerStopRule, hellinger_search, sampling_policy

torch.set_num_threads(1)
world = build_pointmaze_world(0, tuple(SIZES_B.items()))
validators, _ = hellinger_search(world.pihat, world.train, world.test, 0.05, lam=20.0, seed=0)


def sampled(env, split, count):
    return [env.rollout(sampling_policy(world.pihat, s), s) for s in episode_seeds(0, split, count)]


calibration = sampled(world.train_env, 12, 150)
test = sampled(world.test_env, 16, 200)
rule = HellingerStopRule(world.pihat, validators).calibrate(calibration, 0.05)
taus, cumulative = rule.stop_times(test), rule.cumulative(test)
top = np.array([t.feats[0, 1] > 0 for t in test])
for name, mask in (("top route", top), ("bottom route", ~top)):
    idx = np.where(mask)[0]
    print(
        f"{name}: {len(idx)} episodes, cost {np.mean([test[i].cost for i in idx]):.3f}, "
        f"length {np.mean([len(test[i]) for i in idx]):.1f}, final cumulative H2 "
        f"{np.mean([cumulative[i][-1] for i in idx]):.3f}, per-step H2 "
        f"{np.mean([cumulative[i][-1] / len(test[i]) for i in idx]):.4f}, stopped "
        f"{np.mean([taus[i] < len(test[i]) for i in idx]):.3f}"
    )
print(
    f"eta {rule.eta:.3f}; calibration episodes' length {np.mean([len(t) for t in calibration]):.1f}"
)
