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
    x1 = core.integrate(lambda x, t: core.target_velocity(x0, target), x0, steps=3)
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
