"""pytest helpers: ``run_if`` marks and skips tests by the hardware they need.

    @run_if(min_cuda_gpus=1, bf16_cuda=True)
    def test_bf16_step(): ...

A test that needs a GPU gets the ``gpu`` marker (so ``-m "not gpu"`` deselects it) and is skipped
with a reason where the hardware is missing. Import this module from tests only (it needs pytest).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest
import torch

from papers_gpu.hardware import cuda_supports_bf16

F = TypeVar("F", bound=Callable)


def missing_hardware(min_cuda_gpus: int = 0, bf16_cuda: bool = False) -> list[str]:
    """Reasons the current machine cannot run a test with these needs (empty when it can)."""
    reasons = []
    if min_cuda_gpus and torch.cuda.device_count() < min_cuda_gpus:
        reasons.append(f"needs {min_cuda_gpus} CUDA GPU(s), found {torch.cuda.device_count()}")
    if bf16_cuda and not cuda_supports_bf16():
        reasons.append("needs a CUDA GPU with native bf16")
    return reasons


def run_if(*, min_cuda_gpus: int = 0, bf16_cuda: bool = False) -> Callable[[F], F]:
    """Decorator: mark a test ``gpu`` when it needs CUDA and skip it where the needs are unmet."""
    needs_gpu = min_cuda_gpus > 0 or bf16_cuda
    reasons = missing_hardware(min_cuda_gpus, bf16_cuda)

    def decorate(test: F) -> F:
        if needs_gpu:
            test = pytest.mark.gpu(test)
        return pytest.mark.skipif(bool(reasons), reason="; ".join(reasons))(test)

    return decorate
