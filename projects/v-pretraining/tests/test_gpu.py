from papers_gpu.testing import run_if
from vpretrain.cli import train


@run_if(min_cuda_gpus=1, bf16_cuda=True)
def test_bf16_mixed_vpretrain_steps(tiny_args, tmp_path):
    """The method's steps (JVP value, designer, learner) run in bf16-mixed on a GPU."""
    args = [a for a in tiny_args if "accelerator" not in a]
    cli = train(
        [
            *args,
            "--trainer.accelerator=gpu",
            "--trainer.devices=1",
            "--trainer.precision=bf16-mixed",
        ]
    )
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 4 and metrics["train/value"].isfinite()
