import numpy as np
import pytest

from aic.rl import evaluate_policy, train_a2c
from aic.tasks import get_task


@pytest.mark.slow  # 13.5 s on an idle core, 100 s in the 2026-12-06 lane under load
def test_a2c_with_aic_learns_a_small_grid_world():
    """The RL path: A2C + deep supervision + critic-only VoC halting, no expert anywhere."""
    task = get_task("simple-crossing", "MiniGrid-Empty-6x6-v0")
    policy, returns = train_a2c(task, "iru", dim=32, k_max=3, updates=150, seed=0)
    fifth = len(returns) // 5
    assert np.mean(returns[-fifth:]) > np.mean(returns[:fifth]) + 0.15
    mean_return, mean_steps = evaluate_policy(policy, task, 0.01, episodes=10, seed=7, sample=True)
    assert mean_return > np.mean(returns[:fifth]) and 1 <= mean_steps <= 3
