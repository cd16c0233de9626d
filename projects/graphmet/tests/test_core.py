import pytest
import torch

from graphmet.core import make_regressor, regression_loss


def test_loss_is_zero_only_at_the_target():
    y = torch.randn(10)
    assert regression_loss(y, y) == 0
    assert regression_loss(y + 1, y) == pytest.approx(1.0)


def test_loss_gradient_matches_finite_differences():
    prediction = torch.randn(6, dtype=torch.float64, requires_grad=True)
    target = torch.randn(6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda p: regression_loss(p, target), (prediction,))


def test_gradients_reach_every_parameter():
    net = make_regressor(4, 8)
    regression_loss(net(torch.randn(5, 4)).squeeze(-1), torch.randn(5)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="prediction"):
        regression_loss(torch.zeros(3), torch.zeros(4))
