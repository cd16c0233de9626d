from pathlib import Path

import pytest
import torch

from papers_cli.testing import check_resume, user_error_message
from vpretrain.vision_cli import train
from vpretrain.vision_core import dino_loss
from vpretrain.vision_data import DigitScenesDataModule
from vpretrain.vision_model import VisionVPretrainModule

PROJECT_CONFIGS = Path(__file__).resolve().parents[1] / "configs"
TINY_MODEL = {
    "hidden_size": 16,
    "num_layers": 1,
    "num_heads": 2,
    "dino_out_dim": 16,
    "refresh_every": 3,
    "head_refit_steps": 2,
    "eval_head_steps": 60,
}
TINY_DATA = {
    "n_unlabeled": 32,
    "batch_size": 8,
    "n_feedback": 16,
    "feedback_batch_size": 8,
    "n_evaluation": 16,
    "n_probe_train": 32,
    "n_probe_test": 16,
}


@pytest.fixture
def tiny_vision_args(tmp_path):
    """configs/vision.yaml shrunk to seconds: CPU, a 1-layer DINOv3 of width 16, 4 batches an
    epoch, the direction refreshed every 3 steps (so a resume at step 4 needs the cached one)."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}",
        *[f"--model.{k}={v}" for k, v in TINY_MODEL.items()],
        *[f"--data.{k}={v}" for k, v in TINY_DATA.items()],
    ]


@pytest.fixture
def module_and_batch():
    """The tiny module in float64 with a cached downstream direction, and an unlabeled batch."""
    torch.manual_seed(0)
    data = DigitScenesDataModule(seed=0, **TINY_DATA)
    data.setup()
    model = VisionVPretrainModule(**{**TINY_MODEL, "identity_weight": 0.0}).double()
    feedback = {
        k: v.double() if v.is_floating_point() else v for k, v in data.feedback_batch(0).items()
    }
    model.refresh_direction(feedback, preconditioner=None, refresh_index=0)
    return model, data.splits["unlabeled"].tensors["image"][:8].double()


def learner_params(model):
    return [*model.backbone.parameters(), *model.head.parameters()]


def test_no_downstream_gradient_reaches_the_learner(module_and_batch):
    model, images = module_and_batch
    assert all(p.grad is None for p in model.parameters())  # the refresh accumulated nothing
    torch.manual_seed(1)
    out = model.losses(images)
    (out["ssl"] + out["designer"]).backward()  # what training_step returns
    student = model.student_logits(out["views"].detach()).view(2, images.shape[0], -1)
    h = model.hparams
    ssl_alone = dino_loss(
        student, out["teacher_logits"], model.center, h.student_temp, h.teacher_temp
    )
    expected = torch.autograd.grad(
        ssl_alone, learner_params(model), allow_unused=True, materialize_grads=True
    )
    for param, grad in zip(learner_params(model), expected, strict=True):
        torch.testing.assert_close(
            param.grad if param.grad is not None else torch.zeros_like(param), grad
        )
    assert sum(p.grad.abs().sum() for p in model.designer.parameters()) > 0
    assert all(
        p.grad is None for p in [*model.teacher_backbone.parameters(), *model.heads.parameters()]
    )


def test_one_designer_step_raises_the_value_on_the_same_batch(module_and_batch):
    model, images = module_and_batch

    def value_and_designer_grads():
        torch.manual_seed(1)  # the same noise, hence the same views but for the designer
        model.zero_grad(set_to_none=True)
        out = model.losses(images)
        out["designer"].backward()
        return out["value"].item(), [p.grad.clone() for p in model.designer.parameters()]

    before, grads = value_and_designer_grads()
    norm = torch.sqrt(sum(g.pow(2).sum() for g in grads))
    with torch.no_grad():  # a small plain gradient step on the designer's objective (-V)
        for param, grad in zip(model.designer.parameters(), grads, strict=True):
            param.sub_(1e-2 * grad / norm)
    after, _ = value_and_designer_grads()
    with torch.no_grad():  # and the same step the other way lowers it
        for param, grad in zip(model.designer.parameters(), grads, strict=True):
            param.add_(2e-2 * grad / norm)
    against, _ = value_and_designer_grads()
    assert after > before > against


def test_random_direction_keeps_the_norm_of_the_downstream_one():
    torch.manual_seed(0)
    data = DigitScenesDataModule(seed=0, **TINY_DATA)
    data.setup()
    directions = []
    for value_direction in ("downstream", "random"):
        torch.manual_seed(0)
        model = VisionVPretrainModule(**TINY_MODEL, value_direction=value_direction)
        model.refresh_direction(data.feedback_batch(0), preconditioner=None, refresh_index=0)
        directions.append(model.direction)
    downstream, random = directions
    assert random.norm().item() == pytest.approx(downstream.norm().item(), rel=1e-5)
    assert abs(torch.nn.functional.cosine_similarity(downstream, random, dim=0).item()) < 0.2


def test_resuming_continues_exactly_designer_teacher_and_cached_direction(
    tiny_vision_args, tmp_path
):
    # refresh every 3 steps: the resumed half (steps 4-7) starts on the direction cached at 3
    check_resume(train, tiny_vision_args, steps=8, root_dir=tmp_path / "resume")


def test_test_subcommand_scores_a_checkpoint(tiny_vision_args, tmp_path):
    fitted = train(
        [*tiny_vision_args, "--trainer.max_steps=4", "--trainer.enable_checkpointing=true"]
    )
    checkpoint = fitted.trainer.checkpoint_callback.best_model_path
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    assert state["direction"].norm() > 0 and state["center"].abs().sum() > 0
    assert any(k.startswith("teacher_backbone.") for k in state)
    assert any(k.startswith("designer.") for k in state)
    args = [a for a in tiny_vision_args if "checkpointing" not in a]
    tested = train(["test", *args, f"--ckpt_path={checkpoint}"])
    metrics = tested.trainer.callback_metrics
    items = tested.model.per_item_results()
    assert items["seg_miou"].shape == items["depth_rmse"].shape == (16,)
    assert set(items["probe_correct"].tolist()) <= {0.0, 1.0} and len(items["probe_correct"]) == 16
    assert 0 < metrics["test/seg_miou"] <= 1 and 0 <= metrics["test/probe_accuracy"] <= 1
    depth = tested.datamodule.splits["evaluation"].tensors["depth"]
    predict_nothing = depth.pow(2).mean(dim=(1, 2)).sqrt().mean()  # RMSE of depth 0
    assert metrics["test/depth_rmse"] < 0.5 * predict_nothing  # the fitted depth probe works


@pytest.mark.parametrize("config", ["vision.yaml", "vision_paper.yaml"])
def test_vision_configs_parse(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(PROJECT_CONFIGS / config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_a_missing_pretrained_folder_is_a_user_error(tiny_vision_args, tmp_path, capsys):
    message = user_error_message(
        train, [*tiny_vision_args, f"--model.pretrained={tmp_path}/none"], capsys
    )
    assert "pretrained" in message and "config.json" in message
