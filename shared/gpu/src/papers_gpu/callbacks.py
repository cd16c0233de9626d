"""Throughput and peak-memory reporting as Lightning callbacks."""

from __future__ import annotations

import resource
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ThroughputMonitor


def infer_batch_size(batch: Any) -> int:
    """Leading dimension of the first tensor found in a (nested) batch."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0]
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, Sequence) and not isinstance(batch, str):
        for item in batch:
            try:
                return infer_batch_size(item)
            except TypeError:
                continue
    raise TypeError(f"cannot infer a batch size from a {type(batch).__name__}")


def throughput_monitor(batch_size_fn: Callable[[Any], int] = infer_batch_size) -> ThroughputMonitor:
    """Lightning's ThroughputMonitor (samples/s, batches/s, and FLOP-based MFU when the model
    reports FLOPs) with a batch-size function that understands tensors, tuples and dicts."""
    return ThroughputMonitor(batch_size_fn=batch_size_fn)


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
        pl_module.log("peak_memory_mb", self.last_peak_mb, rank_zero_only=True, sync_dist=False)
