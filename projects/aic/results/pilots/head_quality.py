"""Head quality (AUC / Spearman vs the exact one-step gain) on LavaCrossing validation states,
regression (Eq. 5) vs class-balanced classifier (Eq. 5'), one seed, a reduced claim budget.

    python results/pilots/head_quality.py {regression,classifier} EPOCHS N_TRAIN
"""

import json
import sys
import time

import torch

from aic.claim import fit_policy, rebuild_policy
from aic.core import step_returns
from aic.data import AicDataModule
from aic.evaluate import head_quality, readout_table
from aic.tasks import get_task

torch.set_num_threads(1)
objective, epochs, n_train = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
budget = {
    "model.architecture": "conv",
    "model.dim": 16,
    "model.k_max": 8,
    "model.eval_episodes": 0,
    "model.voc_horizon": "one_step",
    "model.halt_objective": objective,
    "trainer.max_epochs": epochs,
    "data.n_train": n_train,
    "data.n_val": 1000,
    "data.batch_size": 32,
}
start = time.time()
fitted = fit_policy(get_task("lava-crossing"), 10, {"budget": budget}, "aic")
policy = rebuild_policy(fitted)
data = AicDataModule(**fitted["data"])
data.setup()
val = data.val_arrays
table = readout_table(policy, torch.from_numpy(val["obs"]))
returns = step_returns("q", table["actions"], None, torch.from_numpy(val["q"]))
quality = head_quality(table["halt"], returns, 0.01)
row = {"objective": objective, "epochs": epochs, "n_train": n_train, "seed": 10, **quality}
print(json.dumps({**row, "s": time.time() - start}))
