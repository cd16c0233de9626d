"""vision_core by value where the closed-form tests of test_vision_core.py left a mutation
survivor: Eq. 8's spans, the view maker's edges (reflect and border padding, the blur radius,
per-view contrast means), the fixed augmentation's documented draw, the networks' layers, the
Adam preconditioner's bias correction and eps, the random direction's dtype and norm, the value's
perturbation radius, the patch map, the probes' upsampling, Eq. 9 with one labelled pixel, and
the per-image metrics at their edges."""

from __future__ import annotations

import inspect
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from vpretrain import vision_core as vc

BOUNDS = vc.ViewBounds(min_scale=0.6, max_brightness=0.2, max_contrast=0.4, max_blur_sigma=2.0)


def test_params_from_unit_at_the_corners_of_the_unit_cube():
    ones = vc.params_from_unit(torch.ones(6), BOUNDS)
    assert torch.allclose(ones, torch.tensor([1.0, 0.0, 0.0, 0.2, 1.4, 2.0]))
    zeros = vc.params_from_unit(torch.zeros(6), BOUNDS)
    assert torch.allclose(zeros, torch.tensor([0.6, -0.4, -0.4, -0.2, 0.6, 0.0]))


def test_identity_distance_is_eq_8_by_hand_per_view():
    params = torch.tensor(
        [[[0.8, 0.1, -0.2, 0.05, 1.2, 0.5], [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]],
         [[0.6, -0.4, 0.4, -0.2, 0.6, 2.0], [0.9, 0.0, 0.1, 0.1, 1.0, 1.0]]],
        dtype=torch.float64,
    )  # fmt: skip
    spans = [0.4, 0.4, 0.4, 0.4, 0.8, 2.0]  # 1 - min_scale (x3), 2 b, 2 c, max sigma
    identity = [1.0, 0.0, 0.0, 0.0, 1.0, 0.0]
    expected = torch.tensor(
        [[sum(((p - i) / s) ** 2 for p, i, s in zip(view, identity, spans, strict=True)) / 6
          for view in image] for image in params.tolist()],
        dtype=torch.float64,
    )  # fmt: skip
    distance = vc.identity_distance(params, BOUNDS)
    assert distance.shape == (2, 2) and distance.dtype == torch.float64
    assert torch.allclose(distance, expected, rtol=1e-12, atol=0)
    assert distance[0, 1] == 0
    # a zero range (no blur allowed) counts nothing at the identity and a lot off it
    no_blur = vc.ViewBounds(min_scale=0.6, max_brightness=0.2, max_contrast=0.4, max_blur_sigma=0)
    at_identity = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 0.0], dtype=torch.float64)
    assert vc.identity_distance(at_identity, no_blur) == 0
    off = at_identity.clone()
    off[5] = 1e-9
    assert vc.identity_distance(off, no_blur).item() == pytest.approx((1e-9 / 1e-8) ** 2 / 6)


def test_blur_keeps_a_constant_image_constant_up_to_its_border():
    """Reflect padding: no dark frame from zeros outside the image."""
    images = torch.full((2, 3, 9, 7), 0.7)
    blurred = vc.gaussian_blur(images, torch.tensor([1.0, 2.0]), radius=4)
    assert torch.allclose(blurred, images, atol=1e-6)


def test_a_view_reaching_past_the_image_repeats_its_border_pixels():
    """Border padding: a shift beyond the range Eq. 2 allows samples edge pixels, not black."""
    images = torch.rand(1, 1, 8, 8) * 0.5 + 0.5
    shifted = torch.tensor([[1.0, 1.5, 0.0, 0.0, 1.0, 0.0]])  # shift x by 3/4 of the image
    view = vc.apply_views(images, shifted, vc.ViewBounds(max_blur_sigma=0.0))
    assert view.min() >= 0.5 - 1e-6
    right_column = images[..., -1:].expand_as(images)
    assert torch.allclose(view[..., -2:], right_column[..., -2:], atol=1e-6)


def test_the_view_blur_reaches_three_sigma_of_the_widest_blur():
    images = torch.rand(2, 3, 16, 16)
    params = torch.tensor([[1.0, 0, 0, 0, 1.0, 2.0], [1.0, 0, 0, 0, 1.0, 0.5]])
    view = vc.apply_views(images, params, BOUNDS)  # max sigma 2: radius 6
    expected = vc.gaussian_blur(images, params[:, 5], radius=6).clamp(0, 1)
    assert torch.allclose(view, expected, atol=1e-5)
    narrow = vc.gaussian_blur(images, params[:, 5], radius=2).clamp(0, 1)
    assert not torch.allclose(view, narrow, atol=1e-4)


def test_contrast_works_around_each_views_own_mean():
    dark, light = torch.full((1, 3, 4, 4), 0.2), torch.full((1, 3, 4, 4), 0.6)
    dark[..., 0, 0], light[..., 0, 0] = 0.3, 0.7
    images = torch.cat([dark, light])
    params = torch.tensor([[1.0, 0, 0, 0, 1.4, 0], [1.0, 0, 0, 0, 1.4, 0]])
    views = vc.apply_views(images, params, vc.ViewBounds(max_blur_sigma=0.0))
    assert torch.allclose(views.mean(dim=(1, 2, 3)), images.mean(dim=(1, 2, 3)), atol=1e-6)
    mean = images.mean(dim=(1, 2, 3), keepdim=True)
    assert torch.allclose(views, (images - mean) * 1.4 + mean, atol=1e-6)


def fixed_by_hand(batch, seed, bounds):
    """The documented draw of fixed_augment_params, step by step."""
    generator = torch.Generator().manual_seed(seed)
    unit = torch.rand(batch, 2, 6, generator=generator)
    area = bounds.min_scale**2 + (1 - bounds.min_scale**2) * unit[..., 0]
    unit[..., 0] = (area.sqrt() - bounds.min_scale) / (1 - bounds.min_scale)
    jitter = torch.rand(batch, 2, 1, generator=generator) < 0.8
    unit[..., 3] = torch.where(jitter[..., 0], unit[..., 3], 0.5)
    unit[..., 4] = torch.where(jitter[..., 0], unit[..., 4], 0.5)
    blurred = torch.rand(batch, 2, generator=generator) < torch.tensor([1.0, 0.1])
    unit[..., 5] = torch.where(blurred, 0.1 + 0.9 * unit[..., 5], 0.0)
    return vc.params_from_unit(unit, bounds)


def test_the_fixed_augmentation_is_its_documented_draw():
    params = vc.fixed_augment_params(64, torch.Generator().manual_seed(3), BOUNDS)
    assert torch.allclose(params, fixed_by_hand(64, 3, BOUNDS), atol=1e-6)
    many = vc.fixed_augment_params(20_000, torch.Generator().manual_seed(4), BOUNDS)
    area = many[..., 0] ** 2  # uniform in [min_scale^2, 1] (RandomResizedCrop)
    assert area.min() >= 0.36 - 1e-6 and area.mean().item() == pytest.approx(0.68, abs=0.01)
    jittered = many[..., 3] != 0
    assert torch.equal(jittered, many[..., 4] != 1)  # brightness and contrast jitter together


def test_the_view_designer_layers():
    defaults = inspect.signature(vc.ViewDesigner.__init__).parameters
    assert (defaults["width"].default, defaults["noise_dim"].default) == (16, 8)
    designer = vc.ViewDesigner(3, BOUNDS)
    assert designer.bounds is BOUNDS and designer.noise_dim == 8
    first, second = designer.encoder[0], designer.encoder[2]
    for conv, (cin, cout) in ((first, (3, 16)), (second, (16, 32))):
        assert (conv.in_channels, conv.out_channels) == (cin, cout)
        assert (conv.kernel_size, conv.stride, conv.padding) == ((3, 3), (2, 2), (1, 1))
    kinds = [type(m) for m in designer.encoder]
    assert kinds == [nn.Conv2d, nn.GELU, nn.Conv2d, nn.GELU, nn.AdaptiveAvgPool2d, nn.Flatten]
    assert [type(m) for m in designer.head] == [nn.Linear, nn.GELU, nn.Linear]
    assert (designer.head[0].in_features, designer.head[0].out_features) == (40, 32)
    assert designer.head[2].out_features == vc.NUM_VIEW_PARAMS


def test_the_dino_head_layers_and_its_normalised_bottleneck():
    defaults = inspect.signature(vc.DinoHead.__init__).parameters
    assert [defaults[n].default for n in ("out_dim", "hidden_dim", "bottleneck_dim")] == [
        128, 128, 32
    ]  # fmt: skip
    head = vc.DinoHead(12)
    assert [type(m) for m in head.mlp] == [nn.Linear, nn.GELU, nn.Linear]
    assert (head.mlp[0].in_features, head.mlp[0].out_features) == (12, 128)
    assert (head.mlp[2].out_features, head.prototypes.out_features) == (32, 128)
    assert head.prototypes.bias is None
    features = torch.randn(2, 3, 12)  # [V, B, D]: the norm is per token, along the last axis
    expected = head.prototypes(F.normalize(head.mlp(features), dim=-1))
    assert torch.allclose(head(features), expected)
    assert not torch.allclose(head(features), head.prototypes(F.normalize(head.mlp(features))))


def test_the_student_temperature_divides_the_logits():
    student = torch.tensor([[[1.0, 0.0]], [[0.0, 2.0]]])
    teacher = torch.tensor([[[0.5, 0.5]], [[1.5, 0.0]]])
    center = torch.zeros(2)
    loss = vc.dino_loss(student, teacher, center, student_temp=0.5, teacher_temp=1.0)
    targets = F.softmax(teacher, -1)
    log_probs = F.log_softmax(student / 0.5, -1)
    expected = -(targets[0] * log_probs[1]).sum() / 2 - (targets[1] * log_probs[0]).sum() / 2
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_the_adam_preconditioner_corrects_the_bias_and_adds_eps():
    v = torch.tensor([0.04, 0.25])
    p = vc.adam_preconditioner({"w": v}, step=3, beta2=0.9, eps=0.1)["w"]
    v_hat = v / (1 - 0.9**3)
    assert torch.allclose(p, 1 / (v_hat.sqrt() + 0.1))


def test_the_downstream_direction_is_p_times_g():
    gradient = {"w": torch.tensor([2.0, -3.0], requires_grad=True)}
    u = vc.downstream_direction(gradient, {"w": torch.tensor([0.5, 4.0])})
    assert torch.equal(u["w"], torch.tensor([1.0, -12.0])) and not u["w"].requires_grad
    plain = vc.downstream_direction(gradient, None)
    assert torch.equal(plain["w"], gradient["w"].detach())


def test_the_random_direction_keeps_the_dtype_and_a_small_norm():
    direction = {"w": torch.tensor([0.01], dtype=torch.float64)}
    generator = torch.Generator().manual_seed(7)
    noise = torch.randn(1, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    assert noise.abs().item() < 1  # the noise norm is below 1: no floor may touch it
    random = vc.random_direction_like(direction, generator)
    assert random["w"].dtype == torch.float64
    assert random["w"].abs().item() == pytest.approx(0.01, rel=1e-12)


def test_the_value_perturbs_the_weights_by_exactly_the_radius():
    params = {"w": torch.tensor([1.0, 2.0], dtype=torch.float64)}
    direction = {"w": torch.tensor([0.03, 0.04], dtype=torch.float64)}  # norm 0.05 < 1
    seen = []

    def ssl_loss(weights):
        seen.append(weights["w"] - params["w"])
        return (weights["w"] ** 3).sum()

    value = vc.finite_difference_value(ssl_loss, params, direction, lr=0.1, radius=0.2)
    assert [d.norm().item() for d in seen] == pytest.approx([0.2, 0.2], rel=1e-12)
    eps = 0.2 / 0.05
    plus, minus = params["w"] + eps * direction["w"], params["w"] - eps * direction["w"]
    expected = 0.1 * ((plus**3).sum() - (minus**3).sum()) / (2 * eps)
    assert value.item() == pytest.approx(expected.item(), rel=1e-12)


def test_patch_grid_maps_tokens_to_their_row_and_column():
    hidden = torch.arange(2 * (1 + 6) * 4, dtype=torch.float32).view(2, 7, 4)  # 1 prefix, 2x3
    grid = vc.patch_grid(hidden, num_prefix_tokens=1, grid=(2, 3))
    assert grid.shape == (2, 4, 2, 3)
    for b in range(2):
        for i in range(2):
            for j in range(3):
                assert torch.equal(grid[b, :, i, j], hidden[b, 1 + 3 * i + j])


def test_the_dense_heads_are_1x1_probes_upsampled_without_corner_alignment():
    heads = vc.DenseHeads(4, 5)
    assert heads.segmentation.kernel_size == (1, 1) and heads.depth.kernel_size == (1, 1)
    assert heads.depth.out_channels == 1 and heads.segmentation.out_channels == 5
    features = torch.randn(2, 4, 3, 3)
    logits, depth = heads(features, (8, 8))
    expected = F.interpolate(heads.segmentation(features), size=(8, 8), mode="bilinear")
    assert torch.allclose(logits, expected, atol=1e-6)
    expected_depth = F.interpolate(heads.depth(features), size=(8, 8), mode="bilinear")[:, 0]
    assert torch.allclose(depth, expected_depth, atol=1e-6)


def zero_heads():
    heads = vc.DenseHeads(feature_dim=2, num_classes=3)
    with torch.no_grad():
        for p in heads.parameters():
            p.zero_()
        heads.depth.bias.fill_(1.0)  # predicts 1 m everywhere
    return heads


def test_eq_9_with_one_labelled_pixel_and_one_valid_depth_and_the_default_weight():
    heads = zero_heads()
    features = torch.randn(1, 2, 2, 2)
    masks = torch.full((1, 4, 4), 255)
    masks[0, 1, 2] = 2
    depth = torch.zeros(1, 4, 4)
    depth[0, 3, 3] = 3.0
    loss = vc.downstream_loss(heads, features, masks, depth, ignore_index=255)
    assert loss.item() == pytest.approx(math.log(3) + abs(1.0 - 3.0), rel=1e-6)


def test_fitting_the_heads_takes_adam_steps_at_the_given_rate_on_the_weighted_loss():
    features = torch.randn(1, 2, 2, 2)
    masks = torch.randint(0, 3, (1, 4, 4))
    depth = torch.rand(1, 4, 4) + 0.5
    heads, reference = zero_heads(), zero_heads()
    first = vc.downstream_loss(reference, features, masks, depth, 255, depth_weight=3.0)
    last = vc.fit_dense_heads(heads, features, masks, depth, steps=1, lr=0.2, ignore_index=255,
                              depth_weight=3.0)  # fmt: skip
    assert last == pytest.approx(first.item(), rel=1e-6)  # the loss before the one step
    optimizer = torch.optim.Adam(reference.parameters(), lr=0.2)
    first.backward()
    optimizer.step()
    for a, b in zip(heads.parameters(), reference.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert vc.fit_dense_heads(zero_heads(), features, masks, depth, 0, 0.2, 255) == 0.0
    default = vc.fit_dense_heads(zero_heads(), features, masks, depth, 1, 0.2, 255)
    weight_one = vc.downstream_loss(zero_heads(), features, masks, depth, 255, depth_weight=1.0)
    assert default == pytest.approx(weight_one.item(), rel=1e-6)


def test_per_image_miou_clamps_predictions_and_counts_single_pixel_classes():
    target = torch.tensor([[[0, 0], [0, 1]], [[2, 2], [2, 2]]])
    predicted = torch.tensor([[[-1, 0], [0, 1]], [[5, 5], [5, 5]]])  # -1 -> 0, 5 -> 2
    miou = vc.per_image_miou(predicted, target, num_classes=3, ignore_index=255)
    assert miou.tolist() == [1.0, 1.0]  # class 1 covers one pixel; image 2 has one class
    predicted[1, 0, 0] = 1
    miou = vc.per_image_miou(predicted, target, num_classes=3, ignore_index=255)
    assert miou[1].item() == pytest.approx((0 + 3 / 4) / 2)  # class 1: 0/1, class 2: 3/4


def test_per_image_depth_rmse_with_one_valid_pixel_per_image():
    target = torch.zeros(2, 2, 2)
    target[0, 0, 0], target[1, 1, 1] = 2.0, 5.0
    predicted = torch.full((2, 2, 2), 1.0)
    assert vc.per_image_depth_rmse(predicted, target).tolist() == pytest.approx([1.0, 4.0])
