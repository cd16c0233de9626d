"""Mechanism and budget evidence: gradient shares against a closed form, the Lightning monitor
on a real fit, movement and input change, and the budget curve's gap."""

from __future__ import annotations

import math

import lightning as L
import pytest
import torch

from papers_eval.mechanism import (
    GradientShareMonitor,
    budget_evidence,
    gradient_shares,
    input_change,
    relative_change,
)


def test_gradient_shares_match_the_closed_form():
    w = torch.tensor([1.0, 2.0], requires_grad=True)
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([0.0, -4.0])
    terms = {"fit": (a * w).sum(), "penalty": (b * w).sum()}  # gradients a and b
    shares = gradient_shares(terms, [w])
    assert shares["fit"]["share"] == pytest.approx(3 / 7)
    assert shares["penalty"]["share"] == pytest.approx(4 / 7)
    # cos(a, a + b) = 9 / (3 * 5); cos(b, a + b) = 16 / (4 * 5)
    assert shares["fit"]["cosine"] == pytest.approx(0.6)
    assert shares["penalty"]["cosine"] == pytest.approx(0.8)
    total = sum(terms.values())
    total.backward()  # the graph is kept for the real backward
    assert torch.equal(w.grad, a + b)  # exact: integer-valued float sums, one order


def test_a_term_that_does_not_reach_the_parameters_has_no_share():
    w = torch.ones(2, requires_grad=True)
    unrelated = torch.ones(1, requires_grad=True)
    shares = gradient_shares({"fit": (w**2).sum(), "dead": unrelated.sum() * 0 + 1.0}, [w])
    assert shares["dead"] == {"share": 0.0, "cosine": 0.0, "norm": 0.0}
    assert shares["fit"]["share"] == 1.0
    with pytest.raises(ValueError, match="scalar"):
        gradient_shares({"vector": w * 2}, [w])


class TwoTermModule(L.LightningModule):
    """A regression whose loss is a data term plus a weighted ridge term."""

    def __init__(self, ridge: float):
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.ridge = ridge

    def training_step(self, batch, _):
        x, y = batch
        fit = torch.nn.functional.mse_loss(self.layer(x), y)
        penalty = self.ridge * self.layer.weight.pow(2).sum()
        self.loss_terms = {"fit": fit, "ridge": penalty}
        return fit + penalty

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


def fit_with_monitor(ridge: float) -> GradientShareMonitor:
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)
    monitor = GradientShareMonitor(every_n_steps=2)
    trainer = L.Trainer(
        max_steps=8,
        callbacks=[monitor],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
    )
    trainer.fit(TwoTermModule(ridge), loader)
    return monitor


def test_the_monitor_measures_every_n_steps_of_a_real_fit_and_sees_a_weak_term():
    monitor = fit_with_monitor(ridge=1e-4)
    assert [h["step"] for h in monitor.history] == [0, 2, 4, 6]
    summary = monitor.summary()
    assert summary["ridge"]["mean_share"] < 0.01 < summary["fit"]["mean_share"]
    assert summary["fit"]["steps_measured"] == 4
    strong = fit_with_monitor(ridge=1.0).summary()
    assert strong["ridge"]["mean_share"] > 10 * summary["ridge"]["mean_share"]


def test_the_monitor_says_what_to_set_when_the_module_has_no_terms():
    monitor = GradientShareMonitor()
    with pytest.raises(AttributeError, match="self.loss_terms"):
        monitor.measure(torch.nn.Linear(2, 2), 0)


def test_relative_change_and_input_change():
    before = [torch.ones(4)]
    assert relative_change(before, [torch.ones(4)]) == 0.0
    assert relative_change(before, [torch.ones(4) * 1.5]) == pytest.approx(0.5)
    assert relative_change([torch.zeros(2)], [torch.ones(2)]) == math.inf
    x = torch.randn(8, 5)
    assert input_change(x, x) == 0.0
    assert input_change(x, 2 * x) == pytest.approx(1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        input_change(x, x[:, :2])


def test_budget_evidence_records_whether_the_gap_closes():
    # lower is better; the method improves faster with budget than the rival
    errors = {("m", 1.0): 0.50, ("m", 2.0): 0.30, ("r", 1.0): 0.40, ("r", 2.0): 0.38}

    def run(subject, multiplier, seed):
        assert seed == 5
        cost = 2.0 if subject == "m" else 1.0  # the method costs twice as much per update
        return {"metric": errors[subject, multiplier], "wall_time_s": cost * multiplier}

    evidence = budget_evidence(run, method="m", rival="r", goal="lower", seed=5)
    assert evidence["gap"] == {"1": pytest.approx(-0.10), "2": pytest.approx(0.08)}
    assert evidence["gap_closes"] and evidence["gap_change"] == pytest.approx(0.18)
    assert evidence["method_to_rival_time_ratio"] == pytest.approx(2.0)
    # at 1x the method took 2 s, the rival's 2x run also took 2 s: 0.38 vs 0.50
    assert evidence["equal_wall_time_gap"]["1"] == pytest.approx(-0.12)
    assert evidence["equal_wall_time_gap"]["2"] is None  # 4 s is beyond the rival's runs
    flat = budget_evidence(lambda s, m, seed: 0.5, method="m", rival="r", goal="higher", seed=0)
    assert not flat["gap_closes"]
    with pytest.raises(ValueError, match="increasing"):
        budget_evidence(run, method="m", rival="r", goal="lower", seed=5, multipliers=(2, 1))
