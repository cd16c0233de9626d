import torch

from papers_gpu.testing import run_if
from permflow.cli import train


@run_if(min_cuda_gpus=1, bf16_cuda=True)
def test_bf16_mixed_training_step(tiny_args):
    cli = train(
        [
            *tiny_args,
            "--trainer.accelerator=gpu",
            "--trainer.precision=bf16-mixed",
            "--trainer.fast_dev_run=1",
        ]
    )
    assert cli.trainer.global_step == 1
    model = cli.model.cuda().eval()
    batch = {k: v.cuda() for k, v in next(iter(cli.datamodule.val_dataloader())).items()}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        _, violation = model.sample_permutations(batch, 4)
    assert violation.max() < 1e-4  # the projector keeps the constraints exact under bf16 autocast
