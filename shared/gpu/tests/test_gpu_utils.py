import random

import numpy as np
import torch
from papers_gpu import (
    PeakMemoryMonitor,
    infer_batch_size,
    seed_everything,
    select_precision,
    select_strategy,
    set_tf32,
    throughput_monitor,
    trainer_defaults,
)
from papers_gpu.testing import missing_hardware, run_if


def test_cpu_defaults_are_fp32_single_process():
    assert select_precision("cpu") == "32-true"
    if not torch.cuda.is_available():
        defaults = trainer_defaults()
        assert defaults["accelerator"] == "cpu"
        assert defaults["precision"] == "32-true"
        assert defaults["strategy"] == "auto"


def test_ddp_only_with_several_devices():
    assert select_strategy(1) == "auto"
    assert select_strategy(2) == "ddp"


def test_seed_everything_repeats_all_generators():
    def draw():
        return random.random(), np.random.rand(), torch.rand(1).item()  # noqa: NPY002 (global state on purpose)

    seed_everything(123)
    first = draw()
    seed_everything(123)
    assert draw() == first
    seed_everything(124)
    assert draw() != first


def test_tf32_policy_round_trips():
    set_tf32(False)
    assert torch.get_float32_matmul_precision() == "highest"
    assert not torch.backends.cuda.matmul.allow_tf32
    set_tf32(True)
    assert torch.get_float32_matmul_precision() == "high"
    set_tf32(False)


def test_infer_batch_size_handles_nested_batches():
    x = torch.zeros(7, 3)
    assert infer_batch_size(x) == 7
    assert infer_batch_size((x, torch.zeros(7))) == 7
    assert infer_batch_size({"meta": "id", "x": x}) == 7
    assert throughput_monitor().batch_size_fn((x,)) == 7


def test_peak_memory_monitor_logs_a_positive_value():
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel

    monitor = PeakMemoryMonitor()
    trainer = pl.Trainer(
        max_epochs=1,
        limit_train_batches=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[monitor],
    )
    trainer.fit(BoringModel())
    assert monitor.last_peak_mb > 1.0
    assert trainer.callback_metrics["peak_memory_mb"] > 1.0


def test_run_if_marks_and_skips_by_hardware():
    @run_if(min_cuda_gpus=1)
    def needs_gpu():
        pass

    marks = {m.name: m for m in needs_gpu.pytestmark}
    assert "gpu" in marks
    assert marks["skipif"].args[0] == (torch.cuda.device_count() < 1)
    assert missing_hardware() == []
    if not torch.cuda.is_available():
        assert missing_hardware(min_cuda_gpus=1)
