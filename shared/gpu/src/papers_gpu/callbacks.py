"""Throughput and peak-memory reporting as Lightning callbacks."""

from __future__ import annotations

import dataclasses
import math
import resource
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ThroughputMonitor

from papers_gpu.hardware import derived_seed, run_seed, seed_all_generators


def infer_batch_size(batch: Any) -> int:
    """Samples in a batch: a graph batch's ``num_graphs``, else the leading dimension of the
    first tensor found in a (nested) tuple, list, dict or dataclass."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(getattr(batch, "num_graphs", None), int):  # torch_geometric Batch
        return batch.num_graphs
    if dataclasses.is_dataclass(batch) and not isinstance(batch, type):
        batch = [getattr(batch, field.name) for field in dataclasses.fields(batch)]
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        for item in batch:
            try:
                return infer_batch_size(item)
            except TypeError:
                continue
    raise TypeError(f"cannot infer a batch size from a {type(batch).__name__}")


def throughput_monitor(
    batch_size_fn: Callable[[Any], int] = infer_batch_size, window_size: int = 5
) -> ThroughputMonitor:
    """Lightning's ThroughputMonitor (samples/s, batches/s, and FLOP-based MFU when the module
    defines ``flops_per_batch``) with a batch-size function that understands tensors, tuples,
    dicts and graph batches. A short window so the miniatures' short runs report it too."""
    return ThroughputMonitor(batch_size_fn=batch_size_fn, window_size=window_size)


def peak_memory_mb(device: torch.device | None = None) -> float:
    """Peak memory in MiB: CUDA's allocator peak on a GPU, the process's max RSS on CPU."""
    if device is not None and device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024  # bytes on macOS, KiB on Linux


class PeakMemoryMonitor(Callback):
    """Logs ``peak_memory_mb`` at the end of every training epoch (and keeps the last value)."""

    def __init__(self) -> None:
        self.last_peak_mb: float | None = None

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.last_peak_mb = peak_memory_mb(pl_module.device)
        # The largest process's peak is what a device must hold.
        pl_module.log("peak_memory_mb", self.last_peak_mb, sync_dist=True, reduce_fx="max")


class SeedEveryStep(Callback):
    """Re-seeds the global generators from (run seed, rank, epoch, batch) at the start of every
    training epoch and batch.

    Two things follow that a single ``seed_everything`` at start-up cannot give: under DDP every
    rank draws different noise (the same seed on every rank would repeat one draw ``world_size``
    times), and a run resumed from a checkpoint draws exactly what the uninterrupted run drew
    (Lightning does not checkpoint generator states). Model initialisation and data generation
    happen before fit starts and stay identical on every rank.

    The (epoch, batch) key is the uninterrupted run's, computed from the count of training
    batches so far, which a checkpoint restores exactly: after a resume from a checkpoint written
    at an epoch's end, Lightning's ``current_epoch`` and ``batch_idx`` lag one batch behind (it
    finishes the restored epoch with one more batch numbered past its end).
    """

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.run_seed = run_seed()

    def _seed(self, trainer: Trainer, batch: int, within_epoch: bool) -> None:
        per_epoch = trainer.num_training_batches
        epoch, index = divmod(batch, per_epoch) if math.isfinite(per_epoch) else (0, batch)
        key = (epoch, index if within_epoch else -1)
        seed_all_generators(derived_seed(self.run_seed, trainer.global_rank, *key))

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # before the epoch's shuffle is drawn; keyed on the epoch of the batch that comes next
        self._seed(trainer, trainer.fit_loop.epoch_loop.total_batch_idx + 1, within_epoch=False)

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._seed(trainer, trainer.fit_loop.epoch_loop.total_batch_idx, within_epoch=True)
