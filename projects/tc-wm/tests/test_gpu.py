from papers_gpu.testing import run_if
from tcwm.cli import train


@run_if(min_cuda_gpus=1, bf16_cuda=True)
def test_bf16_mixed_training_step(tmp_path):
    cli = train(
        [
            "--trainer.accelerator=gpu",
            "--trainer.devices=1",
            "--trainer.precision=bf16-mixed",
            "--trainer.fast_dev_run=1",
            f"--trainer.default_root_dir={tmp_path}",
        ]
    )
    assert cli.trainer.global_step == 1
