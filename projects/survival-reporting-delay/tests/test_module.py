"""The LightningModule's own arithmetic by value, driven step by step with a stub trainer: one
epoch is one MCEM iteration of fitting.py, the estimate is the average of the last iterates,
the stopping rule counts calm iterations at the largest Monte Carlo size, and validation/test
log the transfer's shift, risk and IBNR count computed independently here."""

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from survival_delay.core import JointModel
from survival_delay.fitting import MCEMSchedule, default_start, fit_direct, mcem_iteration
from survival_delay.model import JointHazardModule
from survival_delay.persist import load_fit
from survival_delay.simulate import Truth, simulate_study


def _mean_over_one_process(value, reduce_op):
    # The module averages over processes (a sum would scale every objective by the world size).
    assert reduce_op == "mean", reduce_op
    return value


class StubTrainer(SimpleNamespace):
    """What the module reads from its trainer: the epoch, a mean all-reduce, the world size,
    the datamodule's truth and the stop flag."""

    def __init__(self, truth=None):
        super().__init__(
            current_epoch=0,
            should_stop=False,
            world_size=1,
            strategy=SimpleNamespace(reduce=_mean_over_one_process),
            datamodule=SimpleNamespace(target_truth=truth),
        )


def _module(logged, truth=None, world_size=1, **kwargs):
    module = JointHazardModule(**kwargs)
    module.trainer = StubTrainer(truth)
    module.trainer.world_size = world_size
    module.log_dict = lambda metrics, **_: logged.append(dict(metrics))
    return module


@pytest.fixture(scope="module")
def study():
    source, target = simulate_study(2, Truth(), n_source=400, n_target=200, target_window=0.5)
    return source, target


def test_training_epochs_are_mcem_iterations_averaged_with_the_stopping_rule(study):
    source, _ = study
    settings = dict(start_draws=4, max_draws=9, growth=1.5, tol=10.0, patience=2, average_last=3)
    logged: list[dict] = []
    module = _module(logged, **settings, m_step_iter=5)
    model = JointModel.build(1)
    schedule = MCEMSchedule(4, 9, 1.5, 10**9, 10.0, 2, 3, 5)
    chain = default_start(model, source.cohort)
    history, calm = [], 0
    for epoch in range(4):
        module.trainer.current_epoch = epoch
        torch.manual_seed(100 + epoch)
        torch.rand(5)  # another user of the global generator must not change the E-step draws
        module.training_step({"source": source.cohort}, 0)
        draws = schedule.draws(epoch)
        new = mcem_iteration(
            model, source.cohort, chain, ("theta", "phi"), draws,
            torch.Generator().manual_seed(100 + epoch), 5,
        )  # fmt: skip
        change = max(float((new[b] - chain[b]).abs().max()) for b in ("theta", "phi"))
        chain = new
        history = [*history, new][-3:]
        calm = calm + 1 if (change < 10.0 and draws == 9) else 0
        for name in ("theta", "phi"):
            expected = torch.stack([h[name] for h in history]).mean(0)
            torch.testing.assert_close(getattr(module, name).data, expected)
        assert logged[-1]["train/draws"] == float(draws) == [4, 6, 9, 9][epoch]
        assert logged[-1]["train/max_change"] == pytest.approx(change)
        loglik = model.loglik(module.theta.data, module.phi.data, source.cohort) / len(
            source.cohort
        )
        assert float(logged[-1]["train/source_loglik"]) == pytest.approx(float(loglik))
        # calm only counts at the largest Monte Carlo size: epochs 2 and 3 here
        assert module._calm == calm == [0, 0, 1, 2][epoch]
        assert module.trainer.should_stop == (epoch == 3)


def test_the_direct_method_counts_calm_from_the_first_epoch(study):
    source, _ = study
    logged: list[dict] = []
    module = _module(logged, method="direct", tol=1e-3, patience=2)
    module.trainer.current_epoch = 0
    module.training_step({"source": source.cohort}, 0)
    expected = fit_direct(
        JointModel.build(1), source.cohort, default_start(JointModel.build(1), source.cohort)
    )
    torch.testing.assert_close(module.theta.data, expected["theta"])
    assert module._calm == 0  # the first fit moves far from the start
    module.trainer.current_epoch = 1
    module.training_step({"source": source.cohort}, 0)
    assert module._calm == 1 and not module.trainer.should_stop
    module.training_step({"source": source.cohort}, 0)
    assert module.trainer.should_stop


def test_validation_fits_the_shift_and_test_evaluates_the_saved_parameters(study):
    source, target = study
    truth = torch.as_tensor(target.true_risk)
    logged: list[dict] = []
    # two processes with identical shards: the mean-reduced IBNR times the world size is the
    # sum over shards, twice this shard's count
    module = _module(logged, truth=truth, world_size=2, gamma_prior_sd=2.0, horizon=0.8)
    model = JointModel.build(1)
    fit = fit_direct(model, source.cohort)
    module.theta.data.copy_(fit["theta"])
    module.phi.data.copy_(fit["phi"])
    module.validation_step({"target": target.cohort}, 0)
    start = {**fit, "gamma": torch.zeros(1, dtype=torch.float64)}
    shifted = fit_direct(model, target.cohort, start, ("gamma",), None, 2.0)
    gamma = shifted["gamma"]
    risk = model.timely_risk(fit["theta"], target.cohort.x, 0.8, gamma).mean()
    ibnr = model.expected_ibnr(fit["theta"], fit["phi"], target.cohort, gamma)
    val = logged[-1]
    assert val["val/gamma"] == pytest.approx(float(gamma)) and abs(float(gamma)) > 0.05
    assert float(val["val/timely_risk"]) == pytest.approx(float(risk))
    assert float(val["val/ibnr"]) == pytest.approx(2 * float(ibnr)) and float(ibnr) > 1
    assert float(val["val/risk_error"]) == pytest.approx(float(risk) - float(truth.mean()))
    torch.testing.assert_close(module.gamma.data, gamma)
    # test: the saved (theta, phi, gamma) with no refit, even after gamma is moved by hand
    module.gamma.data.fill_(0.3)
    module.test_step({"target": target.cohort}, 0)
    gamma = torch.tensor([0.3], dtype=torch.float64)
    risk = model.timely_risk(fit["theta"], target.cohort.x, 0.8, gamma).mean()
    ibnr = model.expected_ibnr(fit["theta"], fit["phi"], target.cohort, gamma)
    test = logged[-1]
    assert test["test/gamma"] == pytest.approx(0.3)
    assert float(test["test/timely_risk"]) == pytest.approx(float(risk))
    assert float(test["test/ibnr"]) == pytest.approx(2 * float(ibnr))
    assert float(test["test/risk_error"]) == pytest.approx(float(risk) - float(truth.mean()))
    assert not math.isnan(float(np.mean([float(v) for v in test.values()])))


def test_every_fit_of_a_step_goes_through_the_cross_process_reduce(study):
    """Under DDP each process holds a shard: the M-step's objective and gradient, the direct
    fit's and validation's shift fit must all be all-reduced, or each rank fits its own shard.
    Counted with a reduce that records its calls (the mean of one process is the identity)."""
    source, target = study
    for method in ("mcem", "direct"):
        calls: list[tuple] = []
        module = _module([], method=method, start_draws=4, m_step_iter=5)
        module.trainer.strategy = SimpleNamespace(
            reduce=lambda value, reduce_op, calls=calls: calls.append(value.shape) or value
        )
        module.training_step({"source": source.cohort}, 0)
        # the shared start (3 blocks) and the logged log-likelihood (1), the rest from the fit
        assert len(calls) > 4 + 10, (method, len(calls))
        calls.clear()
        module.validation_step({"target": target.cohort}, 0)
        assert len(calls) > 2 + 5, len(calls)  # risk and IBNR (2), the rest from the shift fit


def test_validation_and_test_on_data_without_a_truth_log_no_risk_error(study):
    """Real data carry no true risk: the datamodule has no ``target_truth`` at all."""
    _, target = study
    logged: list[dict] = []
    module = _module(logged)
    module.trainer.datamodule = SimpleNamespace()
    module.validation_step({"target": target.cohort}, 0)
    module.test_step({"target": target.cohort}, 0)
    assert set(logged[0]) == {"val/gamma", "val/timely_risk", "val/ibnr"}
    assert set(logged[1]) == {"test/gamma", "test/timely_risk", "test/ibnr"}


def _fit_end_trainer(tmp_path, target, **flags):
    values = dict(global_rank=0, sanity_checking=False, fast_dev_run=False)
    values.update(flags)
    return SimpleNamespace(
        log_dir=str(tmp_path / "logs"),
        default_root_dir=str(tmp_path / "root"),
        datamodule=SimpleNamespace(
            target=target.cohort, target_ids=np.arange(len(target.cohort)) + 700
        ),
        **values,
    )


@pytest.mark.parametrize(
    "flags", [{}, {"global_rank": 1}, {"sanity_checking": True}, {"fast_dev_run": True}]
)
def test_the_fit_end_writes_the_fitted_model_once_on_rank_0_into_the_log_dir(
    study, tmp_path, flags
):
    """Rank 0 of a real fit writes fitted_params.json and timely_risk.csv (with the data's
    policy ids) into the trainer's log_dir; other ranks, the sanity check and fast_dev_run
    write nothing."""
    _, target = study
    module = _module([], horizon=0.8)
    module.theta.data.copy_(torch.tensor([0.1, 0.2, -0.3], dtype=torch.float64))
    module.trainer = _fit_end_trainer(tmp_path, target, **flags)
    module.on_fit_end()
    written = tmp_path / "logs" / "fitted_params.json"
    assert not (tmp_path / "root").exists()
    if flags:
        assert not written.exists()
        return
    joint, blocks, config = load_fit(written)
    torch.testing.assert_close(blocks["theta"], module.theta.data)
    assert config["horizon"] == 0.8
    table = pd.read_csv(Path(tmp_path / "logs" / "timely_risk.csv"))
    assert table["policy_id"].tolist() == list(range(700, 700 + len(target.cohort)))


def test_the_fit_end_numbers_policies_from_0_when_the_data_carry_no_ids(study, tmp_path):
    _, target = study
    module = _module([], horizon=0.8)
    module.trainer = _fit_end_trainer(tmp_path, target)
    module.trainer.datamodule = SimpleNamespace(target=target.cohort)  # no target_ids
    module.on_fit_end()
    table = pd.read_csv(tmp_path / "logs" / "timely_risk.csv")
    assert table["policy_id"].tolist() == list(range(len(target.cohort)))
