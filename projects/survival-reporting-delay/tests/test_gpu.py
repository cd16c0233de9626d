import torch

from papers_gpu.testing import run_if
from survival_delay.cli import train


@run_if(min_cuda_gpus=1)
def test_mcem_iteration_on_a_gpu(tmp_path):
    """One MCEM iteration and one transfer validation with the cohort on the GPU. The
    statistics are float64 (precision 64-true); bf16 has no role in a likelihood fit."""
    cli = train(
        [
            "--trainer.accelerator=gpu",
            "--trainer.devices=1",
            "--trainer.precision=64-true",
            "--trainer.fast_dev_run=1",
            f"--trainer.default_root_dir={tmp_path}",
            "--data.n_source=400",
            "--data.n_target=200",
            "--model.max_draws=40",
        ]
    )
    assert cli.trainer.fit_loop.epoch_loop.batch_progress.total.completed == 1
    assert cli.model.theta.device.type == "cuda"
    assert torch.isfinite(cli.trainer.callback_metrics["val/timely_risk"])
