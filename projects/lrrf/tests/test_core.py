"""Value tests of the default losses, the L1 projection, the buffer and the metrics."""

import numpy as np
import pytest
import torch

from lrrf import core


def test_drm_is_zero_for_identical_batches_and_grows_with_a_shift():
    torch.manual_seed(0)
    z = torch.randn(32, 8)
    y = torch.arange(32) % 4
    assert core.drm_loss(z, z.clone(), y).item() == pytest.approx(0.0, abs=1e-6)
    losses = [core.drm_loss(z, z + shift, y).item() for shift in (0.1, 0.5, 2.0)]
    assert 0 < losses[0] < losses[1] < losses[2]
    # the class-mean term alone: a shift of s in every coordinate gives ||s 1||^2 = 8 s^2
    assert core.class_mean_gap(z, z + 0.5, y).item() == pytest.approx(8 * 0.25, rel=1e-5)
    # DRM works on normalised features: a rescaled batch is already aligned
    assert core.drm_loss(z, 3.0 * z, y).item() == pytest.approx(0.0, abs=1e-6)
    # without class means only the MMD of the normalised features remains
    u, v = (torch.nn.functional.normalize(a, dim=1) for a in (z, z + 0.5))
    assert core.drm_loss(z, z + 0.5, y, class_means=False).item() == pytest.approx(
        core.gaussian_mmd2(u, v).item()
    )


def test_mmd_matches_a_hand_computation():
    x = torch.tensor([[0.0], [1.0]])
    y = torch.tensor([[2.0]])
    # pooled squared distances: 1, 4, 1 -> median 1; kernel sum_s exp(-d / s)
    k = lambda d: sum(np.exp(-d / s) for s in (0.5, 1.0, 2.0))  # noqa: E731
    kxx = (2 * k(0) + 2 * k(1)) / 4
    kyy = k(0)
    kxy = (k(4) + k(1)) / 2
    assert core.gaussian_mmd2(x, y).item() == pytest.approx(kxx + kyy - 2 * kxy, rel=1e-5)


def test_drm_weight_follows_the_clean_robust_gap():
    clean = torch.tensor([1, 1, 1, 1])
    adv = torch.tensor([1, 0, 0, 0])
    assert core.drm_weight(2.0, clean, adv, dynamic=True) == pytest.approx(2.0 * 0.75)
    assert core.drm_weight(2.0, adv, clean, dynamic=True) == 0.0  # clamped at 0
    assert core.drm_weight(2.0, clean, adv, dynamic=False) == 2.0


def test_ctir_is_zero_when_the_networks_agree_and_scale_free():
    torch.manual_seed(1)
    z = torch.randn(16, 8)
    assert core.ctir_loss(z, z.clone()).item() == pytest.approx(0.0, abs=1e-7)
    assert core.ctir_loss(z, 3.0 * z).item() == pytest.approx(0.0, abs=1e-6)  # normalised
    other = torch.randn(16, 8)
    assert core.ctir_loss(z, other).item() > 0.1
    # pointwise part by hand, gram weight 0
    u = z / z.norm(dim=1, keepdim=True)
    v = other / other.norm(dim=1, keepdim=True)
    expected = ((u - v) ** 2).sum(1).mean()
    assert core.ctir_loss(z, other, gram_weight=0.0).item() == pytest.approx(expected.item())


def test_accumulated_network_is_the_average_of_three_task_end_points():
    points = [{"w": torch.tensor([float(i), 2.0 * i]), "n": torch.tensor(i)} for i in (1, 4, 7)]
    acc = None
    for t, point in enumerate(points, start=1):
        acc = core.accumulate(acc, point, t, "mean")
    assert torch.allclose(acc["w"], torch.tensor([4.0, 8.0]))
    assert acc["n"].item() == 7  # integer counters take the current value
    ema = None
    for t, point in enumerate(points, start=1):
        ema = core.accumulate(ema, point, t, "ema", ema=0.5)
    assert torch.allclose(
        ema["w"],
        torch.tensor([0.25 * 1 + 0.25 * 4 + 0.5 * 7] * 1 + [2 * (0.25 * 1 + 0.25 * 4 + 0.5 * 7)]),
    )


def test_supcon_and_kco_match_a_hand_computation():
    z = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    z_adv = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 1])
    temperature = 0.5
    # items: a0=(1,0) c0, a1=(0,1) c1, a2=(1,0) c0, a3=(0,1) c1; similarities 1 or 0
    # for each i: positive sim 1, others (two items) sim 0 -> -log(e^2 / (e^2 + 2))
    per_item = -np.log(np.exp(2) / (np.exp(2) + 2))
    assert core.supervised_contrastive(torch.cat([z, z_adv]), torch.cat([y, y]), temperature
                                       ).item() == pytest.approx(per_item, rel=1e-5)  # fmt: skip
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    ce = torch.nn.functional.cross_entropy(logits, y).item()
    loss = core.kco_loss(z, z_adv, logits, logits, y, temperature).item()
    assert loss == pytest.approx(per_item + 2 * ce, rel=1e-5)


def test_l1_projection_matches_the_sort_based_reference(reference_l1_projection):
    rng = np.random.default_rng(0)
    v = rng.normal(size=(50, 20)) * rng.uniform(0.1, 3, size=(50, 1))
    for radius in (0.5, 2.0, 10.0):
        got = core.project_l1_ball(torch.from_numpy(v), radius).numpy()
        want = np.stack([reference_l1_projection(row, radius) for row in v])
        np.testing.assert_allclose(got, want, atol=1e-10)
        assert (np.abs(got).sum(1) <= radius + 1e-9).all()


def test_sparse_direction_moves_the_top_coordinates_with_unit_l1_norm():
    grad = torch.tensor([[0.1, -3.0, 0.2, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    d = core.sparse_l1_direction(grad, 0.2)
    assert torch.allclose(d, torch.tensor([[0, -0.5, 0, 0.5, 0, 0, 0, 0, 0, 0]]))


def test_buffer_stays_class_balanced_across_tasks():
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 30)
    per_class = 6
    tasks = np.zeros(0, np.int64)
    stored = np.zeros(0, np.int64)
    for t in range(1, 4):
        keep, add = core.merge_buffer(tasks, stored, labels, per_class, t, rng)
        stored = np.concatenate([stored[keep], labels[add]])
        tasks = np.concatenate([tasks[keep], np.full(len(add), t - 1)])
        counts = np.bincount(stored, minlength=10)
        assert (counts == per_class).all(), counts
        for c in range(10):  # each task seen holds per_class // t or more slots of the class
            shares = np.bincount(tasks[stored == c], minlength=t)
            assert shares.min() >= per_class // t and shares.sum() == per_class


def test_matrix_metrics_match_a_hand_computed_matrix():
    r = np.array([[0.8, 0.2, 0.1], [0.6, 0.7, 0.3], [0.5, 0.4, 0.9]])
    assert core.average_accuracy(r) == pytest.approx((0.5 + 0.4 + 0.9) / 3)
    # forgetting: attack 0: max(0.8, 0.6) - 0.5 = 0.3; attack 1: 0.7 - 0.4 = 0.3
    assert core.average_forgetting(r) == pytest.approx(0.3)
    # bwt: (0.5 - 0.8 + 0.4 - 0.7) / 2
    assert core.backward_transfer(r) == pytest.approx(-0.3)


def test_per_item_metrics_average_to_the_matrix_metrics():
    rng = np.random.default_rng(3)
    correct = rng.integers(0, 2, size=(4, 4, 200))
    r = correct.mean(-1)
    items = core.per_item_metrics(correct)
    assert items["aa"].mean() == pytest.approx(core.average_accuracy(r))
    assert items["forgetting"].mean() == pytest.approx(core.average_forgetting(r))
    assert items["bwt"].mean() == pytest.approx(core.backward_transfer(r))


def test_ewc_penalty_and_distillation_values():
    w = torch.tensor([1.0, 2.0])
    penalty = core.ewc_penalty([("w", w)], {"w": torch.tensor([0.0, 0.0])},
                               {"w": torch.tensor([2.0, 1.0])})  # fmt: skip
    assert penalty.item() == pytest.approx(0.5 * (2 * 1 + 1 * 4))
    logits = torch.randn(4, 3)
    assert core.distillation_kl(logits, logits, 2.0).item() == pytest.approx(0.0, abs=1e-6)
    assert core.distillation_kl(logits, -logits, 2.0).item() > 0


def test_ctir_matches_a_hand_computation_with_its_gram_term():
    z = torch.tensor([[2.0, 0.0], [0.0, 1.0]])  # normalised: e0, e1
    z_bar = torch.tensor([[0.0, 3.0], [0.0, 1.0]], requires_grad=True)  # normalised: e1, e1
    # pointwise: (||e0 - e1||^2 + 0) / 2 = 1; Gram: I - [[1, 1], [1, 1]] -> 2 entries of 1 of 4
    assert core.ctir_loss(z, z_bar).item() == pytest.approx(1.0 + 0.5)  # default gamma = 1
    assert core.ctir_loss(z, z_bar, gram_weight=2.0).item() == pytest.approx(1.0 + 2 * 0.5)
    z = z.clone().requires_grad_(True)
    core.ctir_loss(z, z_bar).backward()
    assert z_bar.grad is None and z.grad.abs().sum() > 0  # the accumulated network is a target


def test_accumulate_defaults_to_the_mean_and_rejects_bad_input():
    points = [{"w": torch.tensor([1.0])}, {"w": torch.tensor([3.0])}]
    acc = core.accumulate(None, points[0], 1)
    assert torch.equal(core.accumulate(acc, points[1], 2)["w"], torch.tensor([2.0]))
    ema = core.accumulate(acc, points[1], 2, "ema")  # default ema 0.5
    assert torch.equal(ema["w"], torch.tensor([2.0]))
    assert torch.equal(core.accumulate(acc, points[1], 2, "ema", ema=0.75)["w"],
                       torch.tensor([1.5]))  # fmt: skip
    with pytest.raises(ValueError, match="unknown accumulation rule"):
        core.accumulate(acc, points[1], 2, "median")
    with pytest.raises(ValueError, match="from 1"):
        core.accumulate(None, points[0], 0)


def test_supcon_skips_items_without_a_positive_and_kco_defaults_to_temperature_half():
    z = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    y = torch.tensor([0, 0, 1])  # the third item has no positive: skipped
    expected = -np.log(np.exp(2) / (np.exp(2) + 1))  # T = 0.5: similarities 1 and 0
    assert core.supervised_contrastive(z, y, 0.5).item() == pytest.approx(expected, rel=1e-5)
    logits = torch.randn(3, 2)
    assert core.kco_loss(z, z, logits, logits, y).item() == pytest.approx(
        core.kco_loss(z, z, logits, logits, y, temperature=0.5).item()
    )


def test_l1_projection_takes_a_radius_per_row(reference_l1_projection):
    rng = np.random.default_rng(1)
    v = rng.normal(size=(3, 8))
    radius = np.array([0.5, 2.0, 100.0])  # the last row is already inside
    got = core.project_l1_ball(torch.from_numpy(v), torch.from_numpy(radius)).numpy()
    want = np.stack([reference_l1_projection(row, r) for row, r in zip(v, radius, strict=True)])
    np.testing.assert_allclose(got, want, atol=1e-10)
    np.testing.assert_array_equal(got[2], v[2])


def test_sparse_direction_rounds_the_number_of_coordinates_and_moves_at_least_one():
    grad = torch.tensor([[0.1, -3.0, 0.2, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    one = core.sparse_l1_direction(grad, 0.01)  # 0.1 coordinates -> at least 1
    assert torch.equal(one, torch.tensor([[0, -1.0, 0, 0, 0, 0, 0, 0, 0, 0]]))
    three = core.sparse_l1_direction(grad, 0.26)  # round(2.6) = 3
    assert torch.allclose(three, torch.tensor([[0, -1, 1, 1, 0, 0, 0, 0, 0, 0]]) / 3)


# ---------------------------------------------------------------- value tests for the survivors
# of the mutation lane (README, "Mutation lane"): each pins a value the tests above left open.


def test_mmd_hand_computation_holds_off_a_unit_median_bandwidth():
    """The hand computation above has median 1, where d / (s m), d * s m and d m / s coincide
    (the scales 0.5 and 2 swap): here the median squared distance is 0.25."""
    x = torch.tensor([[0.0], [0.5]])
    y = torch.tensor([[1.0]])
    # pooled squared distances 0.25, 1, 0.25 -> median 0.25: d / (s 0.25) = 1, 4, 1 as above
    k = lambda d: sum(np.exp(-d / s) for s in (0.5, 1.0, 2.0))  # noqa: E731
    expected = (2 * k(0) + 2 * k(1)) / 4 + k(0) - 2 * (k(4) + k(1)) / 2
    assert core.gaussian_mmd2(x, y).item() == pytest.approx(expected, rel=1e-6)
    # the bandwidth follows the features' scale: a rescaled pair of samples gives the same MMD
    assert core.gaussian_mmd2(10 * x, 10 * y).item() == pytest.approx(expected, rel=1e-6)


def test_drm_default_adds_the_class_mean_gap_of_the_normalised_features():
    torch.manual_seed(0)
    z = torch.randn(32, 8)
    y = torch.arange(32) % 4
    u, v = (torch.nn.functional.normalize(a, dim=1) for a in (z, z + 0.5))
    gap = core.class_mean_gap(u, v, y).item()
    assert gap > 0.05
    assert core.drm_loss(z, z + 0.5, y).item() == pytest.approx(
        core.gaussian_mmd2(u, v).item() + gap, rel=1e-6
    )


def supcon_reference(features: np.ndarray, labels: np.ndarray, temperature: float) -> float:
    """SupCon (Khosla et al. 2020, L_out) with loops: per anchor i with positives P(i),
    -1/|P(i)| sum_p log(exp(s_ip / T) / sum_{a != i} exp(s_ia / T)), averaged over anchors."""
    u = features / np.linalg.norm(features, axis=1, keepdims=True)
    losses = []
    for i in range(len(u)):
        positives = [p for p in range(len(u)) if p != i and labels[p] == labels[i]]
        if not positives:
            continue
        denominator = sum(np.exp(u[i] @ u[a] / temperature) for a in range(len(u)) if a != i)
        terms = [np.log(np.exp(u[i] @ u[p] / temperature) / denominator) for p in positives]
        losses.append(-np.mean(terms))
    return float(np.mean(losses))


def test_supcon_matches_a_loop_reference_with_unequal_positive_counts():
    """Anchors with 2, 1 and 0 positives and different normalisers per row (the hand
    computations above have one positive each and rows with equal normalisers)."""
    rng = np.random.default_rng(4)
    features = rng.normal(size=(6, 3))
    labels = np.array([0, 0, 0, 1, 1, 2])
    got = core.supervised_contrastive(torch.from_numpy(features), torch.from_numpy(labels), 0.7)
    assert got.item() == pytest.approx(supcon_reference(features, labels, 0.7), rel=1e-10)


def test_buffer_keeps_a_class_that_an_earlier_task_alone_holds():
    """Class 0 is in the buffer only from task 0, class 1 only from task 1: each keeps
    per_class // t of its entries, from the task that holds it."""
    rng = np.random.default_rng(0)
    old_tasks = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    old_labels = np.array([0, 0, 0, 0, 1, 1, 1, 1])
    new_labels = np.repeat([0, 1], 10)
    keep, add = core.merge_buffer(old_tasks, old_labels, new_labels, 4, 2, rng)
    assert np.bincount(old_labels[keep], minlength=2).tolist() == [2, 2]
    assert np.bincount(new_labels[add], minlength=2).tolist() == [2, 2]
    assert len(np.unique(keep)) == len(keep) and len(np.unique(add)) == len(add)


def test_buffer_draws_without_replacement_and_returns_integer_indices():
    """No buffer slot holds the same item twice (the draws are without replacement); the
    indices are int64 even when empty (they index tensors)."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(10), 6)  # the new task has exactly per_class items per class
    tasks = np.zeros(0, np.int64)
    stored = np.zeros(0, np.int64)
    for t in range(1, 4):
        keep, add = core.merge_buffer(tasks, stored, labels, 6, t, rng)
        assert len(np.unique(keep)) == len(keep) and len(np.unique(add)) == len(add)
        assert keep.dtype == np.int64 and add.dtype == np.int64
        stored = np.concatenate([stored[keep], labels[add]])
        tasks = np.concatenate([tasks[keep], np.full(len(add), t - 1)])
    keep, add = core.merge_buffer(tasks, stored, np.zeros(0, np.int64), 6, 4, rng)
    assert (keep.dtype, add.dtype, len(keep), len(add)) == (np.int64, np.int64, 0, 0)


def test_per_item_metrics_match_a_hand_computation_per_item():
    """Two items, three tasks: every per-item value by hand (the test above checks means only)."""
    item0 = [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    item1 = [[1, 1, 0], [0, 1, 1], [0, 0, 1]]
    correct = np.stack([item0, item1], axis=-1)  # [T, T, N] = [3, 3, 2]
    # R = [[1, .5, 0], [.5, 1, .5], [0, .5, 1]]: i*_0 = 0, i*_1 = 1
    items = core.per_item_metrics(correct)
    np.testing.assert_allclose(items["aa"], [2 / 3, 1 / 3])  # mean of the last row per item
    np.testing.assert_allclose(items["forgetting"], [(1 + 0) / 2, (1 + 1) / 2])
    np.testing.assert_allclose(items["bwt"], [(-1 + 0) / 2, (-1 - 1) / 2])
    for key in ("aa", "forgetting", "bwt"):
        assert items[key].dtype == np.float64 and items[key].shape == (2,)


def test_l1_projection_keeps_the_radius_exactly_in_float64_and_the_input_dtype(
    reference_l1_projection,
):
    """A radius that float32 cannot hold (0.1) is used at the input's precision; a float64
    radius per row leaves a float32 input float32."""
    rng = np.random.default_rng(2)
    v = rng.normal(size=(20, 16))
    got = core.project_l1_ball(torch.from_numpy(v), 0.1).numpy()
    np.testing.assert_allclose(np.abs(got).sum(1), 0.1, rtol=0, atol=1e-14)
    want = np.stack([reference_l1_projection(row, 0.1) for row in v])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)
    v32 = torch.from_numpy(v).float()
    assert core.project_l1_ball(v32, torch.full((20,), 0.1, dtype=torch.float64)).dtype == (
        torch.float32
    )


def test_l1_projection_returns_rows_on_the_sphere_bit_for_bit():
    """A row whose L1 norm equals the radius is inside: returned as it is, not re-projected
    (the sorted cumulative sum may differ from the sum in the last bit)."""
    torch.manual_seed(0)
    v = torch.randn(200, 64)
    assert torch.equal(core.project_l1_ball(v, v.abs().sum(1)), v)


def test_ctir_matches_a_loop_reference_with_its_gram_term_when_batch_and_width_differ():
    """Random features, B = 5 items of D = 3 (so a D x D Gram, or |.| for (.)^2, cannot pass),
    against a plain double loop: mean_i ||n(z_i) - n(zb_i)||^2
    + gamma / B^2 sum_ij (<n(z_i), n(z_j)> - <n(zb_i), n(zb_j)>)^2."""
    gen = torch.Generator().manual_seed(5)
    z = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    z_bar = 2.0 * torch.randn(5, 3, generator=gen, dtype=torch.float64)
    u = [row / row.norm() for row in z]
    v = [row / row.norm() for row in z_bar]
    pointwise = sum(float(((a - b) ** 2).sum()) for a, b in zip(u, v, strict=True)) / 5
    relational = (
        sum((float(u[i] @ u[j]) - float(v[i] @ v[j])) ** 2 for i in range(5) for j in range(5)) / 25
    )
    assert relational > 0.05  # the Gram term matters here
    for gamma in (1.0, 0.3):
        value = core.ctir_loss(z, z_bar, gamma).item()
        assert value == pytest.approx(pointwise + gamma * relational, rel=1e-12)
    assert core.ctir_loss(z, z_bar).item() == pytest.approx(pointwise + relational, rel=1e-12)


def test_kco_without_supcon_is_the_replay_cross_entropy_and_its_weight_scales_supcon():
    gen = torch.Generator().manual_seed(2)
    z, z_adv = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen)
    logits, logits_adv = torch.randn(6, 3, generator=gen), torch.randn(6, 3, generator=gen)
    y = torch.tensor([0, 1, 2, 0, 1, 2])
    ce = torch.nn.functional.cross_entropy
    replay = ce(logits, y) + ce(logits_adv, y)
    supcon = core.supervised_contrastive(torch.cat([z, z_adv]), torch.cat([y, y]), 0.5)
    no_supcon = core.kco_loss(z, z_adv, logits, logits_adv, y, contrast_weight=0.0)
    assert no_supcon.item() == pytest.approx(replay.item(), rel=1e-6)
    # at lam3 = 0.5 that is ER's replay loss: the mean CE over the two views
    er = ce(torch.cat([logits, logits_adv]), torch.cat([y, y]))
    assert 0.5 * no_supcon.item() == pytest.approx(er.item(), rel=1e-6)
    weighted = core.kco_loss(z, z_adv, logits, logits_adv, y, contrast_weight=0.25)
    assert weighted.item() == pytest.approx(replay.item() + 0.25 * supcon.item(), rel=1e-6)
