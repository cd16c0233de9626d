"""Accelerator, precision and strategy choice, seeding and the TF32 policy."""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import torch
from lightning.pytorch import seed_everything as _lightning_seed_everything


def cuda_supports_bf16() -> bool:
    """True when a CUDA device is visible and runs bf16 natively (Ampere or newer)."""
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported(including_emulation=False)


def select_accelerator() -> str:
    """``"gpu"`` when CUDA is available, else ``"cpu"`` (MPS is not targeted by these projects)."""
    return "gpu" if torch.cuda.is_available() else "cpu"


def device_count(accelerator: str | None = None) -> int:
    """Number of devices Lightning's ``devices="auto"`` would use for ``accelerator``."""
    accelerator = accelerator or select_accelerator()
    return torch.cuda.device_count() if accelerator in ("gpu", "cuda") else 1


def select_precision(accelerator: str | None = None) -> str:
    """bf16-mixed on GPUs that support it, 16-mixed on older GPUs, 32-true on CPU.

    CPU bf16 autocast exists but is slower than fp32 on most CPUs and changes numerics, so the
    CPU miniatures stay in fp32.
    """
    accelerator = accelerator or select_accelerator()
    if accelerator not in ("gpu", "cuda"):
        return "32-true"
    return "bf16-mixed" if cuda_supports_bf16() else "16-mixed"


def select_strategy(devices: int) -> str:
    """DDP across several devices, Lightning's single-device default otherwise."""
    return "ddp" if devices > 1 else "auto"


def trainer_defaults() -> dict[str, Any]:
    """Trainer keyword defaults for this machine; config files and flags override them."""
    accelerator = select_accelerator()
    return {
        "accelerator": accelerator,
        "devices": "auto",
        "precision": select_precision(accelerator),
        "strategy": select_strategy(device_count(accelerator)),
    }


def set_tf32(enabled: bool = True) -> None:
    """TF32 policy: on by default for matmuls and cuDNN (about 3x faster on A100/H100, ~1e-3
    relative error); switch it off for numerics tests that compare against float32 references."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    torch.set_float32_matmul_precision("high" if enabled else "highest")


def seed_everything(seed: int, deterministic: bool = False) -> int:
    """Seed Python, NumPy and torch (and dataloader workers through Lightning).

    ``deterministic=True`` also asks torch for deterministic kernels, which CUDA needs for
    bit-identical reruns (it sets ``CUBLAS_WORKSPACE_CONFIG`` as cuBLAS requires).
    """
    seed = _lightning_seed_everything(seed, workers=True, verbose=False)
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    return seed


def run_seed(default: int = 0) -> int:
    """The seed of the current run: what ``seed_everything`` (the CLI's ``seed_everything``
    key) last set, else ``default``."""
    return int(os.environ.get("PL_GLOBAL_SEED", default))


def derived_seed(*keys: int) -> int:
    """A 63-bit seed that depends on every key (run seed, rank, epoch, batch, ...); nearby keys
    give unrelated streams (NumPy's SeedSequence hashing)."""
    state = np.random.SeedSequence([k & 0xFFFFFFFF for k in keys]).generate_state(2, np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def seed_all_generators(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CUDA included) with one seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the global generator is what is re-seeded)
    torch.manual_seed(seed)
