"""The LightningModule by value, in process (the mutation lane's selection for model.py): which
estimator it builds, how it trains (one closed-form fit or Adam steps), what test_step logs,
and what a checkpoint restores."""

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from monotone_preferences.core import (
    CrossFitRobust,
    IsotonicRegressor,
    NonNegativeLinear,
    excess_error,
    ordered_pairs,
    top_k_precision,
    violation_rate,
)
from monotone_preferences.data import MonotonePreferencesDataModule
from monotone_preferences.model import MonotonePreferencesModule


def trainer(tmp_path, **kwargs) -> Trainer:
    return Trainer(
        accelerator="cpu", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=tmp_path, **kwargs,
    )  # fmt: skip


def data(**kwargs) -> MonotonePreferencesDataModule:
    settings = {"family": "min", "n_train": 120, "n_val": 40, "n_test": 80, "batch_size": 40,
                "seed": 5, **kwargs}  # fmt: skip
    return MonotonePreferencesDataModule(**settings)


def test_the_module_builds_the_configured_estimator():
    robust = MonotonePreferencesModule(estimator="robust", folds=3, rule="aggregate", beta=2.0)
    built = robust.make_estimator(seed=7)
    assert isinstance(built, CrossFitRobust)
    assert (built.folds, built.rule, built.beta, built.seed) == (3, "aggregate", 2.0, 7)
    assert isinstance(MonotonePreferencesModule(estimator="nnls").make_estimator(0),
                      NonNegativeLinear)  # fmt: skip
    assert isinstance(MonotonePreferencesModule(estimator="isotonic").make_estimator(0),
                      IsotonicRegressor)  # fmt: skip


def test_the_default_module_is_the_documented_one():
    """`uv run train`'s model: configs/default.yaml sets estimator, folds and rule; the rest are
    these defaults (the README's network: 2 hidden layers of 32, Adam at 0.01; Eq. 6 beta 1)."""
    module = MonotonePreferencesModule(in_features=3)
    assert dict(module.hparams) == {
        "in_features": 3, "estimator": "robust", "folds": 5, "rule": "select", "beta": 1.0,
        "hidden": 32, "layers": 2, "lr": 0.01,
    }  # fmt: skip
    shapes = [tuple(w.shape) for w in module.net.raw_weights]
    assert shapes == [(32, 3), (32, 32), (1, 32)]
    deeper = MonotonePreferencesModule(in_features=3, hidden=4, layers=3)
    assert [tuple(w.shape) for w in deeper.net.raw_weights] == [(4, 3), (4, 4), (4, 4), (1, 4)]
    assert module.y_shift.dtype == module.y_scale.dtype == torch.float64  # targets stay double


def test_the_network_loss_is_the_mse_of_the_standardised_target_by_hand():
    module = MonotonePreferencesModule(estimator="monotone_net", in_features=2)
    module.y_shift.fill_(1.5)
    module.y_scale.fill_(4.0)
    x = torch.rand(6, 2, dtype=torch.float64)
    y = torch.tensor([0.0, 1.0, 2.0, 3.0, 9.0, -2.0], dtype=torch.float64)
    with pytest.warns(UserWarning, match="self.log"):  # no trainer attached: the log is skipped
        loss = module.training_step((x, y, torch.full((6,), torch.nan)), 0)
    with torch.no_grad():
        expected = ((module.net(x.float()) - ((y - 1.5) / 4.0).float()) ** 2).mean()
    torch.testing.assert_close(loss.detach(), expected)
    assert loss.requires_grad  # Adam steps on it


def test_closed_form_estimators_take_no_optimizer_and_the_network_takes_adam():
    closed = MonotonePreferencesModule(estimator="robust")
    assert closed.automatic_optimization is False and closed.configure_optimizers() is None
    net = MonotonePreferencesModule(estimator="monotone_net", lr=0.003)
    optimizer = net.configure_optimizers()
    assert net.automatic_optimization is True and isinstance(optimizer, torch.optim.Adam)
    assert optimizer.param_groups[0]["lr"] == 0.003
    assert {n for n, _ in net.named_buffers()} == {"y_shift", "y_scale"}
    with pytest.raises(RuntimeError, match="not been fitted"):
        closed(torch.zeros(2, 2, dtype=torch.float64))


def test_the_fit_is_one_closed_form_fit_on_the_training_split(tmp_path):
    module, datamodule = MonotonePreferencesModule(estimator="robust", folds=4), data()
    trained = trainer(tmp_path, max_epochs=3)
    trained.fit(module, datamodule)
    assert trained.global_step == 0 and trained.should_stop
    x, y, _ = (t.numpy() for t in datamodule.train_set.tensors)
    reference = CrossFitRobust(folds=4, seed=5).fit(x, y)
    x_test = datamodule.test_set.tensors[0].numpy()
    np.testing.assert_allclose(module.predict_numpy(x_test), reference.predict(x_test))
    metrics = trained.callback_metrics
    assert metrics["fit/weight_linear"] == reference.weights_["linear"]
    for name, loss in reference.cv_losses_.items():
        assert metrics[f"fit/cv_loss_{name}"].item() == pytest.approx(loss, rel=1e-6)
    # the network's target scaling is left alone by a closed-form fit
    assert (module.y_shift.item(), module.y_scale.item()) == (0.0, 1.0)
    x_val, y_val, _ = (t.numpy() for t in datamodule.val_set.tensors)
    val = np.mean((reference.predict(x_val) - y_val) ** 2)
    assert metrics["val/mse"].item() == pytest.approx(val, rel=1e-5)


def test_the_network_standardises_its_target_and_predicts_on_the_original_scale(tmp_path):
    module, datamodule = MonotonePreferencesModule(estimator="monotone_net"), data()
    run = trainer(tmp_path, max_epochs=1)
    run.fit(module, datamodule)
    assert run.global_step == 3 and "train/loss" in run.callback_metrics  # 120 rows / 40
    y = datamodule.train_set.tensors[1]
    assert module.y_shift.item() == pytest.approx(y.mean().item())
    assert module.y_scale.item() == pytest.approx(y.std().item())
    x = datamodule.test_set.tensors[0]
    with torch.no_grad():
        expected = module.net(x.float()).double() * module.y_scale + module.y_shift
        np.testing.assert_allclose(module(x).numpy(), expected.numpy())


@pytest.mark.parametrize("source", ["simulation", "rdataset"])
def test_test_step_logs_the_papers_metrics_by_hand(tmp_path, source):
    kwargs = (
        {"source": "rdataset", "rdataset": "satgpa", "in_features": 3}
        if source != ("simulation")
        else {}
    )
    module = MonotonePreferencesModule(estimator="nnls", in_features=kwargs.get("in_features", 2))
    datamodule = data(**kwargs)
    run = trainer(tmp_path, max_epochs=1)
    run.fit(module, datamodule)
    logged = run.test(module, datamodule, verbose=False)[0]
    x, y, f = (t.numpy() for t in datamodule.test_set.tensors)
    prediction = module.fitted.predict(x)
    assert logged["test/mse"] == pytest.approx(np.mean((prediction - y) ** 2), rel=1e-6)
    truth = f if source == "simulation" else y  # the noiseless f only when simulated
    assert logged["test/top10_precision"] == pytest.approx(top_k_precision(prediction, truth))
    low, high = ordered_pairs(x, 2000, np.random.default_rng(0))
    assert logged["test/violation_rate"] == violation_rate(module.fitted.predict, low, high)
    if source == "simulation":
        scale = datamodule.variance_f
        expected = excess_error(prediction, f, scale).mean()
        assert logged["test/excess_error"] == pytest.approx(expected, rel=1e-6)
    else:
        assert "test/excess_error" not in logged


def test_a_checkpoint_restores_the_fitted_estimator(tmp_path):
    module, datamodule = MonotonePreferencesModule(estimator="robust", folds=3), data()
    run = trainer(tmp_path, max_epochs=1)
    run.fit(module, datamodule)
    path = tmp_path / "fitted.ckpt"
    run.save_checkpoint(path)
    restored = MonotonePreferencesModule.load_from_checkpoint(path, weights_only=True)
    x = datamodule.test_set.tensors[0].numpy()
    np.testing.assert_array_equal(restored.predict_numpy(x), module.predict_numpy(x))
    assert restored.fitted.weights_ == module.fitted.weights_
    empty = MonotonePreferencesModule(estimator="robust")
    empty.on_load_checkpoint({})  # a checkpoint without a fit leaves the module unfitted
    assert empty.fitted is None
