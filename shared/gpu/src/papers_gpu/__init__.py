"""Hardware choices every paper project makes the same way.

- ``select_accelerator`` / ``select_precision`` / ``select_strategy`` / ``trainer_defaults``:
  bf16-mixed on a GPU that supports it (fp16-mixed on older GPUs), 32-true on CPU, DDP when
  several CUDA devices are visible.
- ``seed_everything``: one call that seeds Python, NumPy and torch (and dataloader workers);
  ``run_seed`` reads it back (data generation defaults to it); ``SeedEveryStep`` re-seeds from
  (run seed, rank, epoch, batch) so DDP ranks draw different noise and resumed runs repeat
  the uninterrupted run's draws.
- ``set_tf32``: the TF32 policy for matmuls and cuDNN convolutions on Ampere and newer GPUs.
- ``PeakMemoryMonitor`` and ``throughput_monitor``: peak memory and samples/s in the logs.
"""

from papers_gpu.callbacks import (
    PeakMemoryMonitor,
    SeedEveryStep,
    infer_batch_size,
    throughput_monitor,
)
from papers_gpu.hardware import (
    cuda_supports_bf16,
    derived_seed,
    device_count,
    run_seed,
    seed_all_generators,
    seed_everything,
    select_accelerator,
    select_precision,
    select_strategy,
    set_tf32,
    trainer_defaults,
)

__all__ = [
    "PeakMemoryMonitor",
    "SeedEveryStep",
    "cuda_supports_bf16",
    "derived_seed",
    "device_count",
    "infer_batch_size",
    "run_seed",
    "seed_all_generators",
    "seed_everything",
    "select_accelerator",
    "select_precision",
    "select_strategy",
    "set_tf32",
    "throughput_monitor",
    "trainer_defaults",
]
