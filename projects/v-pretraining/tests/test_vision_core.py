import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from vpretrain.vision_core import (
    NUM_VIEW_PARAMS,
    DenseHeads,
    DinoHead,
    ViewBounds,
    ViewDesigner,
    adam_preconditioner,
    apply_views,
    dino_loss,
    downstream_loss,
    ema_update,
    finite_difference_value,
    fit_dense_heads,
    fixed_augment_params,
    global_norm,
    identity_distance,
    params_from_unit,
    per_image_depth_rmse,
    per_image_miou,
    random_direction_like,
    random_view_params,
    update_center,
)

BOUNDS = ViewBounds(min_scale=0.5, max_brightness=0.3, max_contrast=0.3, max_blur_sigma=1.0)


def assert_in_bounds(params: torch.Tensor, bounds: ViewBounds = BOUNDS) -> None:
    scale, shift_x, shift_y, brightness, contrast, sigma = params.unbind(-1)
    tol = 1e-6
    assert ((scale >= bounds.min_scale - tol) & (scale <= 1 + tol)).all()
    assert (shift_x.abs() <= 1 - scale + tol).all() and (shift_y.abs() <= 1 - scale + tol).all()
    assert (brightness.abs() <= bounds.max_brightness + tol).all()
    assert ((contrast - 1).abs() <= bounds.max_contrast + tol).all()
    assert ((sigma >= -tol) & (sigma <= bounds.max_blur_sigma + tol)).all()


def test_identity_params_reproduce_the_input():
    images = torch.rand(3, 2, 16, 16, generator=torch.Generator().manual_seed(0))
    views = apply_views(images, BOUNDS.identity(3), BOUNDS)
    torch.testing.assert_close(views, images, atol=1e-5, rtol=0)
    assert identity_distance(BOUNDS.identity(3), BOUNDS).abs().max() == 0


def test_extreme_designer_outputs_stay_in_bounds():
    designer = ViewDesigner(in_channels=1, bounds=BOUNDS)
    with torch.no_grad():
        for p in designer.parameters():
            p.mul_(1e4)
    images = torch.rand(8, 1, 16, 16) * 100
    params = designer(images, torch.randn(8, 2, designer.noise_dim) * 100)
    assert params.shape == (8, 2, NUM_VIEW_PARAMS) and torch.isfinite(params).all()
    assert_in_bounds(params)
    # the saturated corners of the unit cube, where the crop is at the image's edge
    corners = params_from_unit(torch.tensor([[0.0, 0, 1, 0, 1, 1], [1, 1, 0, 1, 0, 0]]), BOUNDS)
    assert_in_bounds(corners)
    assert corners[0, 0] == BOUNDS.min_scale and corners[0, 1] == -(1 - BOUNDS.min_scale)
    views = apply_views(torch.rand(2, 1, 16, 16), corners, BOUNDS)
    assert torch.isfinite(views).all() and views.min() >= 0 and views.max() <= 1


def test_crop_zooms_into_the_window_the_params_name():
    images = torch.rand(1, 1, 16, 16, generator=torch.Generator().manual_seed(1))
    params = torch.tensor([[0.5, 0.5, -0.5, 0.0, 1.0, 0.0]])  # right half in x, top half in y
    view = apply_views(images, params, BOUNDS)
    quadrant = images[..., :8, 8:]  # rows = y (top), columns = x (right)
    expected = F.interpolate(quadrant, size=(16, 16), mode="bilinear", align_corners=False)
    # the outermost ring reads neighbouring pixels of the full image, not the quadrant's edge
    torch.testing.assert_close(view[..., 1:-1, 1:-1], expected[..., 1:-1, 1:-1])


def test_brightness_contrast_and_blur_in_closed_form():
    image = torch.tensor([0.2, 0.6]).repeat(8).view(1, 1, 4, 4)  # mean 0.4
    params = torch.tensor([[1.0, 0.0, 0.0, 0.1, 1.3, 0.0]])
    view = apply_views(image, params, BOUNDS)
    torch.testing.assert_close(view, (image - 0.4) * 1.3 + 0.4 + 0.1)
    impulse = torch.zeros(1, 1, 9, 9)
    impulse[..., 4, 4] = 1.0
    blurred = apply_views(impulse, torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0, 1.0]]), BOUNDS)
    weights = torch.exp(-0.5 * torch.arange(-3.0, 4.0) ** 2)
    weights = weights / weights.sum()
    torch.testing.assert_close(blurred[0, 0, 1:8, 1:8], torch.outer(weights, weights))


def test_fixed_and_random_params_are_seeded_and_in_bounds():
    def draw(fn, seed):
        return fn(256, torch.Generator().manual_seed(seed), BOUNDS)

    for fn in (fixed_augment_params, random_view_params):
        first = draw(fn, 0)
        assert first.shape == (256, 2, NUM_VIEW_PARAMS)
        assert_in_bounds(first)
        assert torch.equal(first, draw(fn, 0)) and not torch.equal(first, draw(fn, 1))
    fixed = draw(fixed_augment_params, 0)
    assert (fixed[:, 0, 5] > 0).all()  # DINO's first view is always blurred
    assert 0.02 < (fixed[:, 1, 5] > 0).float().mean() < 0.25  # the second one 10% of the time
    assert 0.7 < (fixed[..., 3] != 0).float().mean() < 0.9  # jitter with probability 0.8


def test_dino_loss_closed_form():
    student = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]])  # [V=2, B=1, K=2]
    teacher = torch.tensor([[[0.5, 0.5]], [[1.5, 0.0]]])
    center = torch.tensor([0.5, 0.0])
    loss = dino_loss(student, teacher, center, student_temp=1.0, teacher_temp=0.5)

    def softmax(a, b):
        return [
            math.exp(a) / (math.exp(a) + math.exp(b)),
            math.exp(b) / (math.exp(a) + math.exp(b)),
        ]

    t0, t1 = softmax(0.0, 1.0), softmax(2.0, 0.0)  # (teacher - center) / 0.5
    s0, s1 = softmax(1.0, 0.0), softmax(0.0, 2.0)
    cross_01 = -(t0[0] * math.log(s1[0]) + t0[1] * math.log(s1[1]))
    cross_10 = -(t1[0] * math.log(s0[0]) + t1[1] * math.log(s0[1]))
    assert loss.item() == pytest.approx((cross_01 + cross_10) / 2, rel=1e-6)


def test_center_and_ema_updates_closed_form():
    logits = torch.tensor([[[1.0, 3.0], [3.0, 5.0]], [[5.0, 7.0], [7.0, 9.0]]])  # mean [4, 6]
    center = update_center(torch.tensor([2.0, 2.0]), logits, momentum=0.9)
    torch.testing.assert_close(center, torch.tensor([0.9 * 2 + 0.1 * 4, 0.9 * 2 + 0.1 * 6]))
    teacher, student = nn.Linear(2, 1), nn.Linear(2, 1)
    with torch.no_grad():
        teacher.weight.fill_(1.0), teacher.bias.fill_(0.0)
        student.weight.fill_(3.0), student.bias.fill_(-2.0)
    ema_update(teacher, student, momentum=0.75)
    torch.testing.assert_close(teacher.weight, torch.full((1, 2), 0.75 + 0.25 * 3))
    torch.testing.assert_close(teacher.bias, torch.tensor([0.25 * -2.0]))


def tiny_learner_loss(views: torch.Tensor):
    """A float64 learner (conv encoder + DINO head) and L_ssl(params) on ``views``."""
    torch.manual_seed(0)
    learner = nn.Sequential(
        nn.Conv2d(1, 4, 3, stride=2),
        nn.GELU(),
        nn.Flatten(),
        nn.Linear(36, 8),
        DinoHead(8, 6, 8, 4),
    ).double()
    teacher = torch.randn(2, views.shape[0] // 2, 6, dtype=torch.float64)
    center = torch.zeros(6, dtype=torch.float64)

    def ssl_loss(params):
        logits = functional_call(learner, params, (views,)).view(2, -1, 6)
        return dino_loss(logits, teacher, center, 0.1, 0.04)

    return learner, ssl_loss


def test_finite_difference_value_equals_the_autograd_inner_product_in_float64():
    views = torch.rand(8, 1, 8, 8, dtype=torch.float64, requires_grad=True)
    learner, ssl_loss = tiny_learner_loss(views)
    params = {n: p.detach() for n, p in learner.named_parameters()}
    generator = torch.Generator().manual_seed(3)
    u = {
        n: torch.randn(p.shape, generator=generator, dtype=torch.float64) for n, p in params.items()
    }
    live = {n: p.clone().requires_grad_() for n, p in params.items()}
    gradient = torch.autograd.grad(ssl_loss(live), list(live.values()), create_graph=True)
    exact = 0.01 * sum((u[n] * g).sum() for n, g in zip(live, gradient, strict=True))
    value = finite_difference_value(ssl_loss, params, u, lr=0.01, radius=1e-5)
    assert abs(exact.item()) > 1e-6  # a non-trivial case
    assert value.item() == pytest.approx(exact.item(), rel=1e-6)
    flipped = finite_difference_value(ssl_loss, params, {n: -d for n, d in u.items()}, 0.01, 1e-5)
    assert flipped.item() == pytest.approx(-exact.item(), rel=1e-6)
    # the designer's gradient: d V / d views matches the mixed second derivative
    (fd_grad,) = torch.autograd.grad(value, views)
    (exact_grad,) = torch.autograd.grad(exact, views)
    torch.testing.assert_close(fd_grad, exact_grad, rtol=1e-5, atol=1e-9)
    assert all(p.grad is None for p in learner.parameters())  # theta is never differentiated


def test_adam_preconditioner_after_one_step():
    weight = nn.Parameter(torch.tensor([1.0, 2.0]))
    optimizer = torch.optim.Adam([weight], lr=0.1, betas=(0.9, 0.99), eps=1e-8)
    weight.grad = torch.tensor([0.5, -4.0])
    optimizer.step()
    state = optimizer.state[weight]
    p = adam_preconditioner({"w": state["exp_avg_sq"]}, int(state["step"]), 0.99, 1e-8)["w"]
    torch.testing.assert_close(p, 1 / (torch.tensor([0.5, 4.0]) + 1e-8))  # v_hat = g^2


def test_random_direction_has_the_norm_not_the_direction():
    u = {"a": torch.arange(12.0).view(3, 4), "b": torch.ones(5)}
    random = random_direction_like(u, torch.Generator().manual_seed(0))
    assert global_norm(random).item() == pytest.approx(global_norm(u).item(), rel=1e-6)
    cosine = sum((u[k] * random[k]).sum() for k in u) / global_norm(u) ** 2
    assert abs(cosine.item()) < 0.6
    again = random_direction_like(u, torch.Generator().manual_seed(0))
    assert all(torch.equal(random[k], again[k]) for k in u)


def test_per_image_metrics_closed_form():
    target = torch.tensor([[[0, 0], [1, 1]], [[255, 255], [255, 255]]])
    predicted = torch.tensor([[[0, 1], [1, 1]], [[0, 0], [0, 0]]])
    miou = per_image_miou(predicted, target, num_classes=3, ignore_index=255)
    assert miou[0].item() == pytest.approx((1 / 2 + 2 / 3) / 2)  # class 0: 1/2, class 1: 2/3
    assert torch.isnan(miou[1])  # no labelled pixel
    ignored = torch.tensor([[[0, 255], [1, 1]]])
    assert per_image_miou(torch.tensor([[[0, 1], [1, 1]]]), ignored, 3, 255).item() == 1.0
    depth = torch.tensor([[[1.0, 2.0], [0.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]]])
    rmse = per_image_depth_rmse(torch.full((2, 2, 2), 2.0), depth)
    assert rmse[0].item() == pytest.approx(math.sqrt((1 + 0 + 4) / 3))  # the 0 is not counted
    assert torch.isnan(rmse[1])


def test_downstream_loss_closed_form_and_its_fit():
    heads = DenseHeads(feature_dim=4, num_classes=5)
    with torch.no_grad():
        for p in heads.parameters():
            p.zero_()
    features = torch.randn(2, 4, 2, 2)
    masks = torch.randint(0, 5, (2, 8, 8))
    masks[0, :4] = 255  # ignored pixels
    depth = torch.rand(2, 8, 8) + 0.5
    depth[1, :, :3] = 0.0  # invalid depth
    loss = downstream_loss(heads, features, masks, depth, ignore_index=255, depth_weight=2.0)
    valid = depth > 0
    expected = math.log(5) + 2.0 * depth[valid].mean().item()  # uniform logits, zero depth
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    no_labels = torch.full_like(masks, 255)
    only_depth = downstream_loss(heads, features, no_labels, depth, 255, 2.0)
    assert only_depth.item() == pytest.approx(2.0 * depth[valid].mean().item(), rel=1e-5)
    final = fit_dense_heads(heads, features, masks, depth, steps=50, lr=0.05, ignore_index=255)
    assert final < downstream_loss(DenseHeads(4, 5), features, masks, depth, 255).item()
    assert all(p.grad is None for p in heads.parameters())
