"""Pilot on non-claim seeds: with a larger training budget and more test episodes, does the
exact-value oracle clear 0.95 x fixed, and does random halting at AIC's compute still fail?

uv run --no-sync python results/pilots/budget_pilot.py SEED EPOCHS N_TRAIN EPISODES [ENV_ID]
"""

import copy
import sys
import time

import numpy as np
import torch
import yaml

from aic.claim import CLAIM_FILE, Pair
from aic.tasks import get_task

torch.set_num_threads(1)
settings = copy.deepcopy(yaml.safe_load(CLAIM_FILE.read_text())["settings"])
seed, epochs, n_train, episodes = (int(a) for a in sys.argv[1:5])
settings["budget"]["trainer.max_epochs"] = epochs
settings["budget"]["data.n_train"] = n_train
settings["episodes"] = episodes
if len(sys.argv) > 5:
    settings["env_id"] = sys.argv[5]
task = get_task(settings["task"], settings.get("env_id"))
start = time.perf_counter()
p = Pair.train(task, seed, settings)
print(f"seed {seed} epochs {epochs} n_train {n_train} episodes {episodes}: ", end="")
print(f"trained in {p.train_s:.0f} s")
fixed = p.run("test", "fixed_k")["episode_return"]
print(f"fixed_k {fixed.mean():.3f}  bar {0.95 * fixed.mean():.3f}")
for k in (1, 2, 3, 4, 8):
    print(f"aic readout K={k}: {p.run('test', 'fixed_k_of_aic', k)['episode_return'].mean():.3f}")


def against_bar(returns):
    gap = returns - 0.95 * fixed
    return f"minus bar {gap.mean():+.3f} (sd/sqrt(n) {gap.std() / np.sqrt(len(gap)):.3f})"


for price in (0.0, 0.001, 0.01):
    row = p.run("test", "oracle_halting", price)
    print(
        f"oracle price {price}: {row['episode_return'].mean():.3f} steps "
        f"{row['mean_steps'].mean():.2f} {against_bar(row['episode_return'])}"
    )
for price in (0.001, 0.01):
    row = p.run("test", "aic", price)
    steps = row["mean_steps"].mean()
    print(f"aic price {price}: {row['episode_return'].mean():.3f} steps {steps:.2f}")
print(f"total {time.perf_counter() - start:.0f} s")
for price in (0.001, 0.01):
    mean = p.run("test", "aic", price)["decision_mean_steps"]
    returns = p.run("test", "random_halting", mean)["episode_return"]
    print(f"random halting at aic({price}) mean {mean:.2f}: ", end="")
    print(f"{returns.mean():.3f} {against_bar(returns)}")
for threshold in (0.6, 0.8, 0.95):
    row = p.run("test", "confidence_exit", threshold)
    steps = row["mean_steps"].mean()
    print(f"confidence {threshold}: {row['episode_return'].mean():.3f} steps {steps:.2f}")
aic_flops = p.run("test", "aic", 0.001)["flops_per_decision"].mean()
print(f"flops fixed {p.fixed_flops():.0f}; aic(0.001) {aic_flops:.0f}")
