"""What every fit gets from the shared CLI: an optional progress bar that reads right, per-rank
and resumable noise, a checkpoint even without optimizer steps, `test` from a checkpoint, and the
resume check."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

from papers_cli import cli_main
from papers_cli.lightning_cli import PapersProgressBar
from papers_cli.testing import check_resume, check_summaries
from papers_gpu import SeedEveryStep, derived_seed


@pytest.fixture
def project(tmp_path, monkeypatch):
    root = tmp_path / "demo"
    (root / "configs").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0"\n')
    (root / "configs" / "default.yaml").write_text(
        "seed_everything: 1\ntrainer:\n  max_steps: 4\n  limit_val_batches: 1\n  logger: false\n"
    )
    monkeypatch.setattr(sys, "argv", ["train"])
    monkeypatch.chdir(tmp_path)
    return root


def run(project, *args, model=BoringModel, data=BoringDataModule):
    return cli_main(model, data, project_file=project / "cli.py", args=list(args))


class SameBatchesData(BoringDataModule):
    """Every batch holds the same values, so only the noise a model draws can tell batches
    apart (Lightning's restarted epoch re-reads a plain loader's first batch after a resume)."""

    def train_dataloader(self):
        return torch.utils.data.DataLoader(torch.ones(64, 32), batch_size=2)


class AdamModel(BoringModel):
    """Adam has per-parameter state, and the loss draws noise, so resuming can go wrong."""

    def training_step(self, batch, batch_idx):
        loss = self.step(batch + 0.1 * torch.randn_like(batch))
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=0.01)


class ForgetfulModel(AdamModel):
    """Scales its loss by a counter that the checkpoint does not save."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def training_step(self, batch, batch_idx):
        self.calls += 1
        return super().training_step(batch, batch_idx) * self.calls


class NoStepModel(BoringModel):
    """Manual optimisation without an optimizer step (a closed-form fit): global_step stays 0."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        with torch.no_grad():
            self.layer.weight.add_(0.01)

    def configure_optimizers(self):
        return None


def test_progress_bar_can_be_switched_off(project):
    cli = run(project, "--trainer.enable_progress_bar=false")
    assert cli.trainer.progress_bar_callback is None and cli.trainer.global_step == 4
    assert isinstance(run(project).trainer.progress_bar_callback, PapersProgressBar)


def test_progress_bar_reads_epoch_without_a_negative_bound(project):
    bar = run(project).trainer.progress_bar_callback
    assert bar.trainer.max_epochs == -1  # max_steps drives the run
    assert bar._get_train_description(3).strip() == "Epoch 3"
    bounded = run(project, "--trainer.max_epochs=2", "--trainer.max_steps=-1")
    assert bounded.trainer.progress_bar_callback._get_train_description(0).strip() == "Epoch 0/1"


def test_a_fit_without_optimizer_steps_still_writes_a_checkpoint_that_test_loads(project):
    cli = run(project, "--trainer.max_steps=-1", "--trainer.max_epochs=1", model=NoStepModel)
    assert cli.trainer.global_step == 0
    path = Path(cli.trainer.checkpoint_callback.last_model_path)
    assert path.name == "last.ckpt" and path.is_file()
    fitted = cli.model.layer.weight.detach().clone()
    tested = run(project, "test", f"--ckpt_path={path}", model=NoStepModel)
    assert torch.equal(tested.model.layer.weight, fitted)


EPOCH_OF_4 = ["--trainer.limit_train_batches=4"]


def test_check_resume_passes_when_state_is_checkpointed(project, tmp_path):
    differences = check_resume(
        lambda argv: run(project, *argv, model=AdamModel), EPOCH_OF_4, 8, tmp_path / "r"
    )
    assert differences["parameters"] < 1e-6 and differences["optimizer"] < 1e-6


def test_check_resume_catches_state_left_out_of_the_checkpoint(project, tmp_path):
    with pytest.raises(AssertionError, match="parameter"):
        check_resume(
            lambda argv: run(project, *argv, model=ForgetfulModel), EPOCH_OF_4, 8, tmp_path / "r"
        )


def test_check_resume_asks_for_a_checkpoint_at_an_epoch_end(project, tmp_path):
    with pytest.raises(ValueError, match="not a multiple of the 4 batches"):
        check_resume(lambda argv: run(project, *argv), EPOCH_OF_4, 6, tmp_path / "r")


class FakeTrainer:
    """What SeedEveryStep reads: rank, batches per epoch and the count of batches so far."""

    def __init__(self, rank, epoch=0, batch=0, per_epoch=10):
        self.global_rank, self.num_training_batches = rank, per_epoch
        index = epoch * per_epoch + batch if per_epoch != float("inf") else batch
        self.fit_loop = SimpleNamespace(epoch_loop=SimpleNamespace(total_batch_idx=index))


def test_ranks_draw_different_noise_and_reruns_repeat_it(monkeypatch):
    monkeypatch.setenv("PL_GLOBAL_SEED", "7")
    callback = SeedEveryStep()
    callback.on_fit_start(None, None)

    def draw(rank, epoch, batch, per_epoch=10):
        callback.on_train_batch_start(FakeTrainer(rank, epoch, batch, per_epoch), None, None, batch)
        return torch.rand(4)

    assert not torch.equal(draw(0, 0, 3), draw(1, 0, 3))
    assert not torch.equal(draw(0, 0, 3), draw(0, 0, 4))
    assert not torch.equal(draw(0, 0, 3), draw(0, 1, 3))
    assert torch.equal(draw(1, 2, 5), draw(1, 2, 5))
    assert not torch.equal(draw(0, 0, 3, float("inf")), draw(0, 0, 4, float("inf")))
    # the key is the uninterrupted run's (epoch, batch index), the one the committed runs used
    drawn = draw(1, 2, 5)
    torch.manual_seed(derived_seed(7, 1, 2, 5))
    assert torch.equal(drawn, torch.rand(4))
    callback.on_train_epoch_start(FakeTrainer(0, 3, -1), None)  # the next batch opens epoch 3
    epoch_start = torch.rand(4)
    torch.manual_seed(derived_seed(7, 0, 3, -1))
    assert torch.equal(epoch_start, torch.rand(4))


def test_noise_resumes_exactly_from_a_checkpoint_written_at_an_epoch_end(project, tmp_path):
    """Without validation the checkpoint is written after the epoch's last batch and before
    Lightning closes the epoch; the resumed run then numbers its first batch past the restored
    epoch's end, so noise keyed on Lightning's (epoch, batch_idx) would differ from the
    uninterrupted run's."""
    train = lambda argv: run(project, *argv, model=AdamModel, data=SameBatchesData)  # noqa: E731
    args = [*EPOCH_OF_4, "--trainer.limit_val_batches=0"]
    differences = check_resume(train, args, 8, tmp_path / "r")
    assert differences["parameters"] < 1e-6


def test_check_summaries_catches_ranks_drawing_the_same_noise():
    rank = {"world_size": 2, "strategy": "DDPStrategy", "noise_seed": 5}
    with pytest.raises(AssertionError, match="same noise"):
        check_summaries([rank, rank], devices=2)
    check_summaries([rank, {**rank, "noise_seed": 6}], devices=2)
