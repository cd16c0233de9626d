"""Each baseline's loss against its formula, computed by hand with the math module."""

import math

import pytest
import torch

from atwu import baselines as B

P = (0.5, 0.25)  # the probabilities of a two-token answer; a padded third position
LOGP = torch.tensor([[math.log(P[0]), math.log(P[1]), 0.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0]])
REF_LOGP = torch.tensor([[math.log(0.5), math.log(0.5), 0.0]])


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def test_gradient_ascent():
    assert B.ga_loss(LOGP, MASK).item() == pytest.approx((math.log(0.5) + math.log(0.25)) / 2)


def test_gradient_difference():
    expected = (math.log(0.5) + math.log(0.25)) / 2 + 0.5 * 2.0
    assert B.graddiff_loss(LOGP, MASK, torch.tensor(2.0), 0.5).item() == pytest.approx(expected)


def test_npo():
    beta = 0.1
    log_ratio = math.log(0.5 * 0.25) - math.log(0.5 * 0.5)
    expected = -(2 / beta) * math.log(sigmoid(-beta * log_ratio))
    assert B.npo_loss(LOGP, REF_LOGP, MASK, beta).item() == pytest.approx(expected, rel=1e-6)


def test_npo_is_zero_gradient_free_at_the_reference_only_through_log2():
    # at pi = pi_ref the NPO loss is (2/beta) log 2 for every beta
    for beta in (0.1, 1.0):
        value = B.npo_loss(REF_LOGP, REF_LOGP, MASK, beta).item()
        assert value == pytest.approx(2 / beta * math.log(2), rel=1e-6)


def test_simnpo():
    beta, gamma = 2.5, 0.3
    normalised = math.log(0.5 * 0.25) / 2
    expected = -(2 / beta) * math.log(sigmoid(-beta * normalised - gamma))
    assert B.simnpo_loss(LOGP, MASK, beta, gamma).item() == pytest.approx(expected, rel=1e-6)


def test_wga():
    beta = 2.0
    expected = (P[0] ** beta * math.log(P[0]) + P[1] ** beta * math.log(P[1])) / 2
    weights = B.wga_weights(LOGP, beta)
    assert B.probability_weighted_loss(LOGP, MASK, weights).item() == pytest.approx(expected)


def test_satimp():
    b1, b2 = 5.0, 1.0
    w = [p**b1 * (1 - p) ** b2 for p in P]
    expected = (w[0] * math.log(P[0]) + w[1] * math.log(P[1])) / 2
    weights = B.satimp_weights(LOGP, b1, b2)
    assert B.probability_weighted_loss(LOGP, MASK, weights).item() == pytest.approx(expected)


def test_probability_weights_carry_no_gradient():
    logp = LOGP.clone().requires_grad_(True)
    B.probability_weighted_loss(logp, MASK, B.satimp_weights(logp, 5.0, 1.0)).backward()
    w = torch.tensor([p**5 * (1 - p) for p in P])
    torch.testing.assert_close(logp.grad[0, :2], w / 2)


def test_heuristic_annotator_marks_capitalised_numeric_and_rare_tokens():
    strings = ["The", " city", " 1990", "zz", " of", "<eos>"]
    counts = torch.tensor([100.0, 100, 100, 2, 100, 0])
    marks = B.heuristic_vocab_weights(strings, counts, rare_max_count=10)
    assert marks.tolist() == [1.0, 0.0, 1.0, 1.0, 0.0, 0.0]
