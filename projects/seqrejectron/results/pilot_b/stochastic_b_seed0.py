"""Why the stochastic stop on (B) stops the safe episodes: per-episode length, cost, route and
cumulative H^2 of sampled pi-hat's test rollouts (seed 0, claim sizes, Lambda 20)."""
import numpy as np, torch
torch.set_num_threads(1)
from seqrejectron.pointmaze import SIZES_B, build_pointmaze_world
from seqrejectron.experiment import episode_seeds
from seqrejectron.stochastic import hellinger_search, HellingerStopRule, sampling_policy
w = build_pointmaze_world(0, tuple(SIZES_B.items()))
vals, rounds = hellinger_search(w.pihat, w.train, w.test, 0.05, lam=20.0, seed=0)
def sampled(env, split, n):
    return [env.rollout(sampling_policy(w.pihat, s), s) for s in episode_seeds(0, split, n)]
cal = sampled(w.train_env, 12, 150); q = sampled(w.test_env, 16, 200)
rule = HellingerStopRule(w.pihat, vals).calibrate(cal, 0.05)
taus = rule.stop_times(q); cum = rule.cumulative(q)
top = np.array([t.feats[0, 1] > 0 for t in q])
for name, m in (("top route", top), ("bottom route", ~top)):
    idx = np.where(m)[0]
    print(f"{name}: {len(idx)} episodes, cost {np.mean([q[i].cost for i in idx]):.3f}, "
          f"length {np.mean([len(q[i]) for i in idx]):.1f}, final cumulative H2 "
          f"{np.mean([cum[i][-1] for i in idx]):.3f}, per-step H2 "
          f"{np.mean([cum[i][-1] / len(q[i]) for i in idx]):.4f}, stopped "
          f"{np.mean([taus[i] < len(q[i]) for i in idx]):.3f}")
print(f"eta {rule.eta:.3f}; calibration episodes' length {np.mean([len(t) for t in cal]):.1f}")
