import numpy as np
import pytest
import torch

from graphmet.baselines import MessagePassingProcessor
from graphmet.core import GraphBuffers, GraphWeatherModel, training_objective
from graphmet.koopman import (
    KoopmanOperator,
    KoopmanProcessor,
    dirichlet_energy,
    geometry_loss,
    koopman_loss,
)
from graphmet.mesh import fourier_basis, periodic_graph


@pytest.mark.parametrize("pairing", ["modes", "channels"])
def test_spectral_radius_never_exceeds_one(pairing):
    op = KoopmanOperator(16, 8, pairing)
    for scale in (0.0, 1.0, 10.0, 1e4):
        with torch.no_grad():
            op.log_decay.normal_(0, scale)
            op.frequency.normal_(0, scale)
        assert op.spectral_radius() <= 1.0
        c = torch.randn(3, 16, 8)
        assert op(c, steps=50).norm() <= c.norm() * (1 + 1e-5)  # never amplifies
    with torch.no_grad():
        op.log_decay.zero_()
    assert op.spectral_radius().item() == pytest.approx(1.0)  # the neutral circle is reachable


def _advected_lattice(n=16, steps=30, shift=(0.37, -0.21), modes=40, batch=6, seed=0):
    """Band-limited fields on an n x n lattice advected by a constant sub-cell shift."""
    gen = np.random.default_rng(seed)
    _, u = fourier_basis(n, n, modes)
    kx = np.fft.fftfreq(n, 1 / n)
    fields = []
    for _ in range(batch):
        c0 = gen.normal(size=modes)
        base = (u @ c0).reshape(n, n)  # row = y, column = x
        spec = np.fft.fft2(base)
        phase = np.exp(-2j * np.pi * (kx[None, :] * shift[0] + kx[:, None] * shift[1]) / n)
        fields.append([np.fft.ifft2(spec * phase**t).real.ravel() for t in range(steps)])
    return torch.tensor(np.array(fields), dtype=torch.float32), torch.from_numpy(u).float()


def test_koopman_step_reproduces_the_linear_control():
    """Eq. S2 is exactly a phase rotation of Fourier pairs: fitting Lambda with L_koop alone
    recovers the dynamics, and a 25-step rollout of the Koopman step stays essentially exact."""
    torch.manual_seed(0)
    x, u = _advected_lattice()  # [B, T, N], [N, m]
    coeff = torch.einsum("nm,btn->btm", u, x)[..., None]  # [B, T, m, 1] (d = r = 1)
    op = KoopmanOperator(u.shape[1], 1, "modes", init_scale=0.0)
    opt = torch.optim.Adam(op.parameters(), lr=0.05)
    for _ in range(400):
        loss = koopman_loss(op, coeff[:, :-1].flatten(0, 1), coeff[:, 1:].flatten(0, 1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 1e-6
    with torch.no_grad():
        rolled = op(coeff[:, 0], steps=25)
    relative = (rolled - coeff[:, 25]).norm() / coeff[:, 25].norm()
    assert relative < 1e-2


def test_koopman_processor_maps_coefficients_exactly_and_propagates_in_one_shot():
    """With A orthonormal and B = A^T (L_geo = 0), U^T H' A = Lambda C (Eq. K4), so n single
    steps equal one n-step propagation (Eq. K5)."""
    torch.manual_seed(1)
    basis = torch.linalg.qr(torch.randn(50, 12))[0]
    proc = KoopmanProcessor(dim=10, modes=12, rank=4)
    assert geometry_loss(proc.lift, proc.lower) < 1e-10
    h = torch.randn(2, 50, 10)
    h1, c0 = proc(h, basis)
    torch.testing.assert_close(proc.coefficients(h1, basis), proc.operator(c0), atol=1e-5, rtol=0)
    h3_steps = proc(proc(proc(h, basis)[0], basis)[0], basis)[0]
    torch.testing.assert_close(h3_steps, proc(h, basis, steps=3)[0], atol=1e-5, rtol=0)
    outside = h - torch.einsum("nm,bmd->bnd", basis, torch.einsum("nm,bnd->bmd", basis, h))
    outside1 = h1 - torch.einsum("nm,bmd->bnd", basis, torch.einsum("nm,bnd->bmd", basis, h1))
    # The component outside span(U) x span(A) passes through unchanged.
    p = proc.lift.detach() @ proc.lift.detach().T
    torch.testing.assert_close(outside @ p, outside1 @ p, atol=1e-5, rtol=0)


def test_geometry_loss_is_zero_only_for_an_isometric_lift_with_inverse():
    a = torch.linalg.qr(torch.randn(8, 3))[0]
    assert geometry_loss(a, a.T) < 1e-10
    assert geometry_loss(0.5 * a, a.T) > 0.1  # a shrunk basis is penalised
    gradcheck_a = a.double().requires_grad_()
    assert torch.autograd.gradcheck(lambda x: geometry_loss(x, x.T), (gradcheck_a,))


def _high_frequency_share(h: torch.Tensor, vecs: torch.Tensor) -> float:
    """Share of ||H||^2 on the upper half of the Laplacian spectrum."""
    hi = vecs[:, vecs.shape[1] // 2 :]
    return (torch.einsum("nm,bnd->bmd", hi, h).pow(2).sum() / h.pow(2).sum()).item()


def test_message_passing_stack_smooths_a_high_frequency_field():
    """The mechanism as a unit test: a pure high-frequency latent field loses its share of
    high-frequency energy through a stack of InteractionNets, more with depth, while the
    Koopman step with neutral eigenvalues keeps the norm of every spectral coefficient."""
    graph = periodic_graph((16, 16), 8, 2, 64)
    buffers = GraphBuffers(graph)
    edges = graph.mesh_edges
    n = len(graph.mesh_pos)
    w = np.zeros((n, n))
    w[edges[0], edges[1]] = 1
    d = w.sum(1) ** -0.5
    _, vecs = np.linalg.eigh(np.eye(n) - d[:, None] * w * d[None])
    vecs = torch.from_numpy(vecs).float()
    gen = torch.Generator().manual_seed(0)
    hi = vecs[:, n // 2 :]
    h = torch.einsum("nm,bmd->bnd", hi, torch.randn(4, hi.shape[1], 16, generator=gen))
    h = h / h.pow(2).mean().sqrt()
    assert _high_frequency_share(h, vecs) == pytest.approx(1.0, abs=1e-5)
    shares = {}
    for depth in (1, 8):
        values = []
        for seed in range(3):
            torch.manual_seed(seed)
            with torch.no_grad():
                out, _ = MessagePassingProcessor(16, depth)(h, buffers)
            values.append(_high_frequency_share(out, vecs))
        shares[depth] = float(np.mean(values))
    assert shares[8] < shares[1] < 0.95
    assert shares[8] < 0.6
    energy_in = dirichlet_energy(h, buffers.mesh_edges, n).mean()
    with torch.no_grad():
        out, _ = MessagePassingProcessor(16, 8)(h, buffers)
    assert dirichlet_energy(out, buffers.mesh_edges, n).mean() < 0.8 * energy_in
    proc = KoopmanProcessor(16, 64, 8)
    with torch.no_grad():
        proc.operator.log_decay.zero_()
        out, c0 = proc(h, buffers.basis)
        after = proc.coefficients(out, buffers.basis).norm().item()
    assert after == pytest.approx(c0.norm().item(), rel=1e-4)


def test_dirichlet_energy_orders_smooth_and_rough_fields():
    graph = periodic_graph((8, 8), 4, 1, 4)
    edges = torch.from_numpy(graph.mesh_edges)
    x = torch.from_numpy(graph.mesh_pos[:, 0]).float()
    smooth = torch.cos(2 * torch.pi * x / 8)[None, :, None]
    rough = torch.cos(torch.pi * torch.arange(16.0) % 2 * 1.0)[None, :, None]
    constant = torch.ones(1, 16, 1)
    e = [dirichlet_energy(f, edges, 16).item() for f in (constant, smooth, rough)]
    assert e[0] == pytest.approx(0, abs=1e-6) and e[0] < e[1] < e[2]


@pytest.mark.parametrize("processor", ["graphmet", "gnn"])
def test_objective_backpropagates_to_every_parameter(processor):
    torch.manual_seed(0)
    graph = periodic_graph((8, 8), 4, 1, 8)
    core = KoopmanProcessor(8, 8, 4) if processor == "graphmet" else MessagePassingProcessor(8, 2)
    model = GraphWeatherModel(2, 8, core)
    model.attach_graph(graph)
    terms = training_objective(model, torch.randn(2, 3, 64, 2))
    terms["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert ("koop" in terms) == (processor == "graphmet")


def test_boundary_frame_is_forced_from_truth():
    from graphmet.mesh import regional_graph

    torch.manual_seed(0)
    model = GraphWeatherModel(1, 8, MessagePassingProcessor(8, 1))
    model.attach_graph(regional_graph((8, 8), 2, 1, 8, boundary=2))
    truth = torch.randn(1, 3, 64, 1)
    with torch.no_grad():
        prediction, _ = model.rollout(truth[:, 0], truth[:, 1:])
    frame = ~torch.from_numpy(regional_graph((8, 8), 2, 1, 8, 2).interior)
    torch.testing.assert_close(prediction[:, :, frame], truth[:, 1:, frame])
    assert not torch.allclose(prediction[:, :, ~frame], truth[:, 1:, ~frame])
