"""Job functions for tests/test_jobs.py, in a module of their own: spawned pool workers and Dask
workers import a job function by name, which a test module (imported by pytest under
--import-mode=importlib) cannot offer. test_jobs.py puts this folder on sys.path, which
spawned processes inherit."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def record_call(job, settings):
    """Leaves one marker file per call (the calls happen in other processes) and returns a
    value made from the job; raises while ``settings["fail_file"]`` exists, for the job whose
    seed is ``settings["fail_seed"]``."""
    marks = Path(settings["marks"])
    marks.mkdir(parents=True, exist_ok=True)
    (marks / f"{job.subject}-{job.stage}-{job.seed}-{uuid.uuid4().hex}").touch()
    fail_file = settings.get("fail_file")
    if fail_file and job.seed == settings.get("fail_seed") and os.path.exists(fail_file):
        raise ValueError(f"planned failure on seed {job.seed}")
    return {"subject": job.subject, "seed": job.seed, "x": job.seed * job.params.get("scale", 1)}


def calls(settings) -> list[str]:
    marks = Path(settings["marks"])
    return sorted(p.name.rsplit("-", 1)[0] for p in marks.iterdir()) if marks.exists() else []


def sgd(job, settings):
    """A few SGD steps of a tiny linear model, seeded by the job: deterministic on one thread."""
    import torch

    torch.manual_seed(job.seed)
    model = torch.nn.Linear(8, 1)
    x, y = torch.randn(256, 8), torch.randn(256, 1)
    optimiser = torch.optim.SGD(model.parameters(), lr=job.params["lr"])
    losses = []
    for _ in range(settings["steps"]):
        optimiser.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimiser.step()
        losses.append(loss.detach())
    return {
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "losses": torch.stack(losses),
        "threads": torch.get_num_threads(),
        "pid": os.getpid(),
    }


def lightning_fit(job, settings):
    """One tiny Lightning fit with the settings a claim's quiet fit uses."""
    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(3, 1)

        def training_step(self, batch, index):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    pl.seed_everything(job.seed)
    data = TensorDataset(torch.randn(64, 3), torch.randn(64, 1))
    trainer = pl.Trainer(
        max_steps=4,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        devices=1,
        accelerator="cpu",
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8))
    return trainer.global_step
