import pytest
import torch

from tcwm.core import make_regressor, regression_loss, squared_errors
from tcwm.model import TcwmModule


def test_loss_is_zero_only_at_the_target():
    y = torch.randn(10)
    assert regression_loss(y, y) == 0
    assert regression_loss(y + 1, y) == pytest.approx(1.0)


def test_per_item_errors_by_hand():
    errors = squared_errors(torch.tensor([1.0, 2.0, 4.0]), torch.tensor([1.0, 0.0, 1.0]))
    assert errors.tolist() == [0.0, 4.0, 9.0]


def test_loss_gradient_matches_finite_differences():
    prediction = torch.randn(6, dtype=torch.float64, requires_grad=True)
    target = torch.randn(6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda p: regression_loss(p, target), (prediction,))


def test_gradients_reach_every_parameter():
    net = make_regressor(4, 8)
    regression_loss(net(torch.randn(5, 4)).squeeze(-1), torch.randn(5)).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())


def test_predictions_do_not_depend_on_the_batch_partition():
    torch.manual_seed(0)
    net, x = make_regressor(4, 8), torch.randn(10, 4)
    whole = net(x)
    # same call, same shapes: bitwise determinism on one machine
    assert torch.equal(whole, net(x))
    # Batches of 3 + 7 vs one of 10: matrix kernels block float32 sums per batch shape (and per
    # CPU), so the last bits may differ; a row mixed up with another differs by far more.
    parts = torch.cat([net(x[:3]), net(x[3:])])
    torch.testing.assert_close(parts, whole, rtol=1e-5, atol=1e-6)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="prediction"):
        regression_loss(torch.zeros(3), torch.zeros(4))


def test_the_default_training_loss_has_the_hand_computed_value():
    """The loss the default config trains on, through the LightningModule: with the output
    layer zeroed the network predicts 0, so the loss is mean(y^2) = (1 + 4 + 9) / 3."""
    module = TcwmModule(in_features=2)
    torch.nn.init.zeros_(module.net[-1].weight)
    torch.nn.init.zeros_(module.net[-1].bias)
    batch = (torch.randn(3, 2), torch.tensor([1.0, -2.0, 3.0]))
    assert module.training_step(batch, 0).item() == pytest.approx(14 / 3)


def test_a_training_step_moves_the_module_downhill():
    torch.manual_seed(0)
    module = TcwmModule(in_features=3)
    x = torch.randn(64, 3)
    batch = (x, x @ torch.tensor([1.0, -1.0, 0.5]))
    optimizer = module.configure_optimizers()
    before = module.training_step(batch, 0)
    before.backward()
    optimizer.step()
    assert module.training_step(batch, 0).item() < before.item()
