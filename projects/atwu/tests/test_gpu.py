from atwu.cli import train
from papers_gpu.testing import run_if


@run_if(min_cuda_gpus=1, bf16_cuda=True)
def test_bf16_mixed_atwu_steps_on_gpu(tiny_args):
    """One fine-tuning and one ATWU step (retain gradient + JVP + scorer) in bf16-mixed."""
    cli = train(
        [
            *tiny_args,
            "--trainer.accelerator=gpu",
            "--trainer.devices=1",
            "--trainer.precision=bf16-mixed",
            "--trainer.max_steps=2",
            "--trainer.val_check_interval=2",
            "--model.finetune_steps=1",
            "--model.burnin_steps=0",
        ]
    )
    assert cli.trainer.global_step == 2
    assert cli.trainer.callback_metrics["train/scorer_bce"].isfinite()
