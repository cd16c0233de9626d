"""Math of PermFlow and the Sinkhorn baselines: invariants, brute-force checks, gradients."""

import itertools

import numpy as np
import pytest
import torch

from permflow import baselines, core
from permflow.networks import AxialNet, SortingNet


def all_permutation_matrices(n: int) -> torch.Tensor:
    perms = torch.tensor(list(itertools.permutations(range(n))))
    return core.permutation_matrices(perms)  # [n!, n, n]


def test_tangent_projector_is_idempotent_self_adjoint_and_zeroes_sums():
    torch.manual_seed(0)
    a, b = torch.randn(2, 7, 7, dtype=torch.float64)
    pa = core.tangent_project(a)
    assert torch.allclose(core.tangent_project(pa), pa, atol=1e-12)
    assert torch.allclose((pa * b).sum(), (a * core.tangent_project(b)).sum(), atol=1e-12)
    assert pa.sum(-1).abs().max() < 1e-12 and pa.sum(-2).abs().max() < 1e-12
    h = torch.eye(7, dtype=torch.float64) - 1 / 7
    assert torch.allclose(pa, h @ a @ h, atol=1e-12)  # equals H V H
    # A tangent vector is left unchanged; a matrix already in A_n too.
    assert torch.allclose(core.tangent_project(pa), pa)
    x = core.affine_project(a)
    assert torch.allclose(core.affine_project(x), x, atol=1e-12)
    assert core.constraint_violation(x.unsqueeze(0)).item() < 1e-12


def test_base_distribution_lies_on_affine_subspace():
    x0 = core.sample_base(64, 6, sigma=2.0, generator=torch.Generator().manual_seed(0))
    assert core.constraint_violation(x0).max() < 1e-5
    assert x0.std() > 0.5  # really spread out, not collapsed at J/n


@pytest.mark.parametrize("method", ["euler", "heun"])
def test_100_step_trajectory_stays_on_subspace_in_float32(method):
    torch.manual_seed(0)
    weight = torch.randn(6 * 6, 6 * 6) * 3.0

    def wild_velocity(x, t):  # arbitrary nonlinear field, O(1) like a trained one, unstructured
        return torch.tanh(x.flatten(1) @ weight).view_as(x) * 2 + t.view(-1, 1, 1)

    x0 = core.sample_base(32, 6, sigma=1.0)
    x1 = core.integrate(wild_velocity, x0, steps=100, method=method, project=True)
    assert core.constraint_violation(x1).max() < 1e-5
    drift = core.integrate(wild_velocity, x0, steps=100, method=method, project=False)
    assert core.constraint_violation(drift).max() > 1e-2  # without the projector it leaves A_n


def test_flow_reaches_the_target_with_the_exact_velocity():
    x0 = core.sample_base(4, 5, sigma=1.0)
    target = core.permutation_matrices(torch.stack([torch.randperm(5) for _ in range(4)]))
    x1 = core.integrate(lambda x, t: core.target_velocity(x0, target), x0, steps=3, project=True)
    assert torch.allclose(x1, target, atol=1e-5)
    assert core.cfm_loss(core.target_velocity(x0, target), x0, target).item() < 1e-12


@pytest.mark.parametrize("n", [3, 4, 5, 6])
def test_nearest_target_coupling_matches_brute_force(n):
    gen = torch.Generator().manual_seed(n)
    candidates = all_permutation_matrices(n)  # [n!, n, n]
    x0 = core.sample_base(40, n, sigma=1.0, generator=gen)
    pick = torch.stack([torch.randperm(len(candidates), generator=gen)[:2] for _ in range(40)])
    targets = candidates[pick]  # [B, 2, n, n]
    num_valid = torch.randint(1, 3, (40,), generator=gen)
    x1, chosen = core.nearest_target_coupling(x0, targets, num_valid)
    for b in range(40):
        valid = targets[b, : num_valid[b]]
        distances = ((x0[b] - valid) ** 2).sum(dim=(-2, -1))
        assert torch.equal(x1[b], valid[distances.argmin()])
        assert chosen[b] < num_valid[b]


def test_both_voronoi_cells_are_visited_for_adjacent_transposes():
    targets = core.permutation_matrices(torch.tensor([[0, 1, 2, 3, 4], [0, 2, 1, 3, 4]]))
    x0 = core.sample_base(2000, 5, sigma=0.5, generator=torch.Generator().manual_seed(0))
    _, chosen = core.nearest_target_coupling(
        x0, targets.expand(2000, -1, -1, -1), torch.full((2000,), 2)
    )
    assert abs(chosen.float().mean().item() - 0.5) < 0.05  # symmetric split


def test_independent_coupling_only_picks_valid_targets():
    targets = core.permutation_matrices(torch.tensor([[[0, 1, 2], [1, 0, 2]]] * 500))
    num_valid = torch.tensor([1, 2] * 250)
    _, chosen = core.independent_coupling(targets, num_valid, torch.Generator().manual_seed(0))
    assert (chosen[num_valid == 1] == 0).all()
    assert 0.4 < chosen[num_valid == 2].float().mean() < 0.6


def test_hungarian_decode_is_the_nearest_permutation_by_brute_force():
    candidates = all_permutation_matrices(5)
    x = torch.randn(20, 5, 5, generator=torch.Generator().manual_seed(1))
    perms = core.hungarian_decode(x)
    assert perms.dtype == np.int64  # indices, usable to index and compare exactly
    for b in range(20):
        best = candidates[((x[b] - candidates) ** 2).sum(dim=(-2, -1)).argmin()]
        assert torch.equal(core.permutation_matrices(torch.as_tensor(perms[b])), best)


def test_log_sinkhorn_is_close_to_doubly_stochastic_but_not_exactly():
    logits = torch.randn(8, 6, 6, generator=torch.Generator().manual_seed(0)) * 3
    s = baselines.log_sinkhorn(logits, tau=3.0, n_iters=200).exp()
    assert core.constraint_violation(s).max() < 1e-4
    truncated = baselines.log_sinkhorn(logits, tau=0.1, n_iters=3).exp()
    assert torch.allclose(truncated.sum(-2), torch.ones(8, 6), atol=1e-5)  # last axis exact
    assert core.constraint_violation(truncated).max() > 1e-3  # the other axis is not


def test_sinkhorn_and_cfm_gradients_float64():
    logits = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    target = core.permutation_matrices(torch.tensor([[1, 0, 3, 2], [0, 1, 2, 3]])).double()
    assert torch.autograd.gradcheck(
        lambda z: baselines.sinkhorn_loss(baselines.log_sinkhorn(z, 0.5, 5), target), (logits,)
    )
    x0 = core.sample_base(2, 4, 1.0, dtype=torch.float64)
    v = torch.randn(2, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda w: core.cfm_loss(w, x0, target), (v,))


def test_noisy_gumbel_decode_can_produce_both_modes_noiseless_cannot():
    logits = torch.tensor([[[5.0, 5.0, 0.0], [5.0, 5.0, 0.0], [0.0, 0.0, 9.0]]])  # tied modes
    noiseless = baselines.decode_noiseless(logits, 16)
    noisy = baselines.decode_noisy(logits, 64, generator=torch.Generator().manual_seed(0))
    assert len({tuple(p) for p in noiseless[0]}) == 1
    assert {tuple(p) for p in noisy[0]} >= {(0, 1, 2), (1, 0, 2)}


def test_sorting_net_is_permutation_equivariant_over_items():
    torch.manual_seed(0)
    net = SortingNet(n=5, flow=True, width=32, depth=2, heads=4, image_dim=16).eval()
    images, x, t = torch.rand(2, 5, 1, 14, 14), torch.randn(2, 5, 5), torch.rand(2)
    order = torch.tensor([3, 0, 4, 1, 2])
    out = net(net.encode_items(images), x, t)
    out_perm = net(net.encode_items(images[:, order]), x[:, order], t)
    assert torch.allclose(out[:, order], out_perm, atol=1e-5)


def test_axial_net_is_equivariant_to_row_and_column_permutations():
    torch.manual_seed(0)
    net = AxialNet(flow=True, width=16, depth=2, heads=2).eval()
    cost, x, t = torch.rand(2, 6, 6), torch.randn(2, 6, 6), torch.rand(2)
    rows, cols = torch.randperm(6), torch.randperm(6)
    out = net(cost, x, t)
    out_perm = net(cost[:, rows][:, :, cols], x[:, rows][:, :, cols], t)
    assert torch.allclose(out[:, rows][:, :, cols], out_perm, atol=1e-5)
    assert not np.allclose(out.detach(), out.detach().transpose(1, 2))  # not trivially symmetric


# ---------------------------------------------------------------- closed forms (mutation lane)


def test_interpolant_is_one_minus_t_x0_plus_t_x1():
    x0, x1 = torch.full((1, 3, 3), 2.0), torch.full((1, 3, 3), 10.0)
    x_t = core.interpolate(x0, x1, torch.tensor([0.25]))
    assert torch.allclose(x_t, torch.full((1, 3, 3), 0.75 * 2 + 0.25 * 10))
    assert torch.equal(core.target_velocity(x0, x1), x1 - x0)


def test_velocity_from_endpoint_divides_by_one_minus_t():
    x, x1_hat = torch.zeros(2, 3, 3), torch.ones(2, 3, 3)
    v = core.velocity_from_endpoint(x1_hat, x, torch.tensor([0.25, 1.0]))
    assert torch.allclose(v[0], torch.full((3, 3), 1 / 0.75))
    assert torch.allclose(v[1], torch.full((3, 3), 1 / 1e-3))  # floored at min_gap


def test_endpoint_cross_entropy_matches_the_row_softmax_formula():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 5, 5, generator=gen, dtype=torch.float64)
    x1 = core.permutation_matrices(
        torch.stack([torch.randperm(5, generator=gen) for _ in range(4)])
    )
    x1 = x1.double()
    z = logits.numpy()
    log_rows = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))  # softmax over ranks (columns j)
    expected = -(x1.numpy() * log_rows).sum(axis=(-2, -1)).mean() / 5
    assert core.endpoint_cross_entropy(logits, x1).item() == pytest.approx(expected, rel=1e-12)
    # minimised at the one-hot target: sharper logits along the target lower the loss towards 0
    losses = [core.endpoint_cross_entropy(c * x1, x1).item() for c in (0.0, 1.0, 5.0, 30.0)]
    assert losses[0] == pytest.approx(np.log(5)) and losses == sorted(losses, reverse=True)
    assert losses[-1] < 1e-10
    # its gradient vanishes exactly when the row softmax equals the target's rows
    mixed = 0.5 * x1 + 0.5 * x1.roll(1, dims=-1)  # rows sum to 1, a non-one-hot target
    at_target = mixed.log().clamp(min=-50).requires_grad_(True)
    core.endpoint_cross_entropy(at_target, mixed).backward()
    assert at_target.grad.abs().max() < 1e-12


def test_heun_and_euler_steps_match_their_closed_forms():
    """dx/dt = -x: an Euler step multiplies by (1 - h), a Heun step by (1 - h + h^2 / 2); the
    last step is Euler (at t = 1 an endpoint field is undefined)."""
    x0 = torch.randn(3, 4, 4, dtype=torch.float64)
    h = 0.25
    euler = core.integrate(lambda x, t: -x, x0, steps=4, method="euler", project=False)
    heun = core.integrate(lambda x, t: -x, x0, steps=4, method="heun", project=False)
    assert torch.allclose(euler, x0 * (1 - h) ** 4, atol=1e-12)
    assert torch.allclose(heun, x0 * (1 - h + h * h / 2) ** 3 * (1 - h), atol=1e-12)
    # a field that depends on t: the slope is read at t = step * h
    ramp = core.integrate(lambda x, t: t.view(-1, 1, 1).expand_as(x), x0, steps=4, project=False)
    assert torch.allclose(ramp - x0, torch.full_like(x0, h * (0 + 0.25 + 0.5 + 0.75)))


def test_constraint_violation_checks_rows_and_columns():
    rows_ok = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])  # rows sum to 1, columns to 2 and 0
    assert core.constraint_violation(rows_ok).item() == pytest.approx(1.0)
    assert core.constraint_violation(rows_ok.transpose(1, 2)).item() == pytest.approx(1.0)
    assert core.constraint_violation(torch.eye(3).unsqueeze(0)).item() == 0.0
    off = torch.eye(3).unsqueeze(0) * 1.5
    assert core.constraint_violation(off).item() == pytest.approx(0.5)


def test_negative_mass_counts_only_negative_entries():
    x = torch.tensor([[[1.5, -0.5], [-0.25, 1.25]]])
    assert core.negative_mass(x).item() == pytest.approx(0.75 / 2)
    assert core.negative_mass(torch.eye(4).unsqueeze(0)).item() == 0.0


def test_cfm_loss_is_the_mse_of_the_projected_velocity():
    x0 = core.sample_base(3, 4, 1.0, generator=torch.Generator().manual_seed(0))
    x1 = core.permutation_matrices(torch.tensor([[1, 0, 3, 2], [0, 1, 2, 3], [3, 2, 1, 0]]))
    u = x1 - x0
    offset = torch.ones(3, 4, 4) * 0.7  # normal to T_n: the projector removes it
    assert core.cfm_loss(u + offset, x0, x1).item() < 1e-12
    assert core.cfm_loss(u + offset, x0, x1, project=False).item() == pytest.approx(0.49)
    assert core.cfm_loss(torch.zeros(3, 4, 4), x0, x1).item() == pytest.approx(
        u.pow(2).mean().item()
    )
    assert core.endpoint_loss(x1 + offset, x1).item() < 1e-12
    assert core.endpoint_loss(x1 + offset, x1, project=False).item() == pytest.approx(0.49)


def test_sinkhorn_losses_match_their_formulas():
    logits = torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(0))
    log_s = baselines.log_sinkhorn(logits, 1.0, 5)
    target = core.permutation_matrices(torch.tensor([[2, 0, 1], [0, 1, 2]]))
    mse = (log_s.exp() - target).pow(2).mean()
    ce = -(target * log_s).sum(dim=(-2, -1)).mean() / 3
    assert baselines.sinkhorn_loss(log_s, target, "mse").item() == pytest.approx(mse.item())
    assert baselines.sinkhorn_loss(log_s, target, "ce").item() == pytest.approx(ce.item())
    assert baselines.sinkhorn_loss(log_s, target, "ce").item() > 0
    with pytest.raises(ValueError, match="mse"):
        baselines.sinkhorn_loss(log_s, target, "l1")


def test_gumbel_noise_has_the_gumbel_moments():
    g = baselines.sample_gumbel((200_000,), torch.Generator().manual_seed(0))
    assert g.mean().item() == pytest.approx(0.5772, abs=0.01)  # Euler-Mascheroni constant
    assert g.var().item() == pytest.approx(np.pi**2 / 6, abs=0.03)
    assert (g > 3).float().mean().item() == pytest.approx(1 - np.exp(-np.exp(-3.0)), abs=3e-3)


# ---------------------------------------------------------------- the oracle (positive control)


def two_mode_targets(batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    targets = core.permutation_matrices(torch.tensor([[0, 1, 2, 3, 4], [0, 2, 1, 3, 4]]))
    return targets.expand(batch, -1, -1, -1), torch.full((batch,), 2)


def test_posterior_endpoint_limits():
    targets, num_valid = two_mode_targets(500)
    x0 = core.sample_base(500, 5, 0.45, generator=torch.Generator().manual_seed(0))
    nearest, chosen = core.nearest_target_coupling(x0, targets, num_valid)
    # at t = 0 the cell of x0 decides: the posterior is the nearest target itself
    at_zero = core.posterior_endpoint(x0, torch.zeros(500), targets, num_valid, 0.45)
    assert torch.allclose(at_zero, nearest, atol=1e-6)
    # one valid target: the posterior is that target at every t
    single = core.posterior_endpoint(x0, torch.full((500,), 0.5), targets, torch.ones(500), 0.45)
    assert torch.allclose(single, targets[:, 0])
    # on the way from x0 to its target, the posterior stays on that target
    x_half = core.interpolate(x0, nearest, torch.full((500,), 0.6))
    midway = core.posterior_endpoint(x_half, torch.full((500,), 0.6), targets, num_valid, 0.45)
    assert (midway - nearest).abs().amax(dim=(-2, -1)).median() < 1e-3


@pytest.mark.parametrize("method", ["euler", "heun"])
def test_the_exact_posterior_field_reaches_each_starts_target(method):
    """The positive control: integrate(velocity_from_endpoint(E[x1 | x_t])) moves every x0 to its
    nearest valid target, both targets about half the time, exactly on A_n (Heun included)."""
    targets, num_valid = two_mode_targets(2000)
    x0 = core.sample_base(2000, 5, 0.45, generator=torch.Generator().manual_seed(1))
    nearest, chosen = core.nearest_target_coupling(x0, targets, num_valid)

    def velocity(x, t):
        endpoint = core.posterior_endpoint(x, t, targets, num_valid, 0.45)
        return core.velocity_from_endpoint(endpoint, x, t)

    x1 = core.integrate(velocity, x0, steps=20, method=method, project=True)
    assert (x1 - nearest).abs().max() < 1e-4
    assert core.constraint_violation(x1).max() < 1e-4
    assert abs(chosen.float().mean().item() - 0.5) < 0.05


def test_random_draws_follow_the_generator_passed_in():
    """The independent coupling, the Gumbel noise and the noisy decode draw from the generator
    they are given, not from the global one: same generator seed, same draws, whatever the
    global state."""
    targets = core.permutation_matrices(
        torch.stack([torch.randperm(5), torch.randperm(5)]).expand(64, 2, 5)
    )
    num_valid = torch.full((64,), 2)
    logits = torch.randn(4, 5, 5)
    draws = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        _, chosen = core.independent_coupling(targets, num_valid, torch.Generator().manual_seed(0))
        gumbel = baselines.sample_gumbel((3, 5), torch.Generator().manual_seed(0))
        perms = baselines.decode_noisy(logits, 8, generator=torch.Generator().manual_seed(0))
        draws.append((chosen, gumbel, perms))
    assert torch.equal(draws[0][0], draws[1][0]) and 0 < draws[0][0].float().mean() < 1
    assert torch.equal(draws[0][1], draws[1][1])
    np.testing.assert_array_equal(draws[0][2], draws[1][2])


def test_gumbel_noise_is_finite_at_a_uniform_draw_of_zero(monkeypatch):
    """g = -log(-log(u + eps) + eps): the first eps keeps u = 0 (a possible torch.rand draw)
    finite; u = 0.5 gives -log(log 2)."""
    monkeypatch.setattr(torch, "rand", lambda shape, generator=None: torch.tensor([0.0, 0.5]))
    g = baselines.sample_gumbel((2,))
    assert torch.isfinite(g).all()
    assert g[1].item() == pytest.approx(-np.log(np.log(2.0)), rel=1e-6)


def test_decodes_return_m_samples_of_hungarian_of_the_perturbed_logits():
    """decode_noiseless repeats Hungarian(L) m times; decode_noisy returns Hungarian(L + s g)
    with g drawn from its generator, s = 1 by default."""
    b, m, n = 3, 4, 5
    logits = torch.randn(b, n, n)
    plain = baselines.decode_noiseless(logits, m)
    assert plain.shape == (b, m, n)
    assert (plain == core.hungarian_decode(logits)[:, None, :]).all()
    for scale in (None, 0.5):
        kwargs = {} if scale is None else {"noise_scale": scale}
        perms = baselines.decode_noisy(
            logits, m, generator=torch.Generator().manual_seed(3), **kwargs
        )
        g = baselines.sample_gumbel((b, m, n, n), torch.Generator().manual_seed(3))
        noisy = logits.unsqueeze(1) + (1.0 if scale is None else scale) * g
        expected = core.hungarian_decode(noisy.reshape(b * m, n, n)).reshape(b, m, n)
        np.testing.assert_array_equal(perms, expected)


def test_gumbel_sinkhorn_is_sinkhorn_of_the_perturbed_logits():
    """Eq. (S3), training form: log Sinkhorn((L + s g) / tau) with g from the generator."""
    logits = torch.randn(2, 4, 4)
    out = baselines.gumbel_sinkhorn(logits, 0.7, 15, 0.5, torch.Generator().manual_seed(4))
    g = baselines.sample_gumbel(logits.shape, torch.Generator().manual_seed(4))
    expected = baselines.log_sinkhorn(logits + 0.5 * g, 0.7, 15)
    torch.testing.assert_close(out, expected)
    assert not torch.allclose(out, baselines.log_sinkhorn(logits, 0.7, 15), atol=1e-3)
    default = baselines.gumbel_sinkhorn(logits, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(default, baselines.log_sinkhorn(logits + g, 1.0, 20))


def test_posterior_endpoint_weights_match_a_hand_computation():
    """Eq. (12) at t = 0.4: for each slot k, x0_k = (x_t - t P_k) / (1 - t); slot k counts when it
    is x0_k's nearest valid target, and counted slots are weighted by N(x0_k; J/n, sigma^2). With
    two targets at most one slot is consistent; where none is (x_t between the cells), the
    Gaussian factor alone decides, and there the weights depend on 1 - t."""
    targets, num_valid = two_mode_targets(64)
    sigma, t = 0.45, 0.4
    x_t = core.sample_base(64, 5, 0.8, generator=torch.Generator().manual_seed(5))
    out = core.posterior_endpoint(x_t, torch.full((64,), t), targets, num_valid, sigma)
    neither = 0
    for b in range(64):
        log_w, inside = [], []
        for k in range(2):
            x0 = (x_t[b] - t * targets[b, k]) / (1 - t)
            log_w.append(-((x0 - 0.2) ** 2).sum().item() / (2 * sigma**2))
            _, nearest = core.nearest_target_coupling(x0[None], targets[b : b + 1], num_valid[:1])
            inside.append(nearest.item() == k)
        keep = inside if any(inside) else [True, True]
        neither += not any(inside)
        w = np.exp(np.array(log_w) - max(log_w)) * np.array(keep)
        w = w / w.sum()
        expected = w[0] * targets[b, 0] + w[1] * targets[b, 1]
        torch.testing.assert_close(out[b], expected, atol=1e-5, rtol=1e-5)
    assert neither > 0


def test_slots_past_num_valid_do_not_change_the_posterior():
    """Padding slots (k >= num_valid) take no part in the cell test or the weights, even when
    one of them is the target nearest to x0."""
    targets, num_valid = two_mode_targets(200)
    extra = core.permutation_matrices(torch.tensor([[4, 3, 2, 1, 0]])).expand(200, 1, 5, 5)
    padded = torch.cat([targets, extra], dim=1)  # [B, 3, n, n], the third slot invalid
    x_t = 0.5 * extra[:, 0] + core.sample_base(200, 5, 0.6, torch.Generator().manual_seed(6))
    t = torch.full((200,), 0.3)
    torch.testing.assert_close(
        core.posterior_endpoint(x_t, t, padded, num_valid, 0.45),
        core.posterior_endpoint(x_t, t, targets, num_valid, 0.45),
    )


def test_integrate_checks_its_arguments_and_passes_t_in_the_state_dtype():
    """A bad sampler or step count is a clear error; one step is allowed; t reaches the velocity
    field in the state's dtype (float64 states keep float64 times)."""
    x0 = core.sample_base(3, 4, 0.5).double()
    seen = []

    def velocity(x, t):
        seen.append(t.dtype)
        return torch.zeros_like(x)

    with pytest.raises(ValueError, match="sampler must be 'euler' or 'heun', got 'rk4'"):
        core.integrate(velocity, x0, steps=2, method="rk4", project=True)
    with pytest.raises(ValueError, match="steps must be >= 1, got 0"):
        core.integrate(velocity, x0, steps=0, project=True)
    assert torch.equal(core.integrate(velocity, x0, steps=1, project=True), x0)
    assert seen == [torch.float64]


def test_heun_evaluates_its_corrector_at_t_plus_h():
    """With v = t and 4 steps (h = 1/4), Heun's averaged slopes integrate t exactly on the first
    three steps and its last step is Euler: 0.28125 + 0.25 * 0.75 = 0.46875."""
    x0 = torch.zeros(2, 3, 3)
    x1 = core.integrate(
        lambda x, t: t.view(-1, 1, 1).expand_as(x), x0, steps=4, method="heun", project=False
    )
    torch.testing.assert_close(x1, torch.full_like(x0, 0.46875))


def test_violation_is_per_input_and_the_base_honours_generator_and_dtype():
    exact = torch.eye(4)[None]
    off = exact + 0.1 * torch.eye(4)[None]  # rows and columns sum to 1.1
    torch.testing.assert_close(
        core.constraint_violation(torch.cat([exact, off])), torch.tensor([0.0, 0.1])
    )
    draws = []
    for global_seed in (1, 2):
        torch.manual_seed(global_seed)
        draws.append(
            core.sample_base(3, 4, 0.5, torch.Generator().manual_seed(0), dtype=torch.float64)
        )
    assert torch.equal(draws[0], draws[1]) and draws[0].dtype == torch.float64
