import dataclasses

import numpy as np
import pytest
import torch

# Everything at module level: mutmut forks each mutant from a server that has imported the
# tests, so an import inside a test (graphmet.model pulls in Lightning, ~15 s) is paid per mutant.
from graphmet.baselines import MessagePassingProcessor
from graphmet.core import (
    GraphBuffers,
    GraphWeatherModel,
    coefficient_scale,
    ensemble_rollout,
    interior_images,
    model_inputs,
    spectral_amplitude_loss,
    training_objective,
    weighted_mse,
)
from graphmet.koopman import (
    KoopmanOperator,
    KoopmanProcessor,
    changing_share,
    dirichlet_energy,
    geometry_loss,
    koopman_loss,
    relative_move,
)
from graphmet.mesh import fourier_basis, periodic_graph, regional_graph
from graphmet.model import build_model, resolve_pairing
from papers_cli import ConfigError


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
        loss = koopman_loss(op, [coeff[:, :-1].flatten(0, 1), coeff[:, 1:].flatten(0, 1)])
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 1e-5
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
    z = 0.3 * torch.randn(c0.shape)  # E2: the noise is added to C_t before the step
    noisy, _ = proc(h, basis, coefficient_noise=z)
    torch.testing.assert_close(
        proc.coefficients(noisy, basis), proc.operator(c0 + z), atol=1e-5, rtol=0
    )
    eta = 0.3 * torch.randn(2, 6, 4)  # phase noise [B, pairs, r] reaches Lambda
    turned, _ = proc(h, basis, phase_noise=eta)
    expected = proc.operator(c0, phase_noise=eta)
    torch.testing.assert_close(proc.coefficients(turned, basis), expected, atol=1e-5, rtol=0)
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
    # By hand, r = 3: B A = I / 2 gives 3 * (1/2)^2; 2A with B = A^T: 3 * 3^2 + 3 * 1^2.
    torch.testing.assert_close(geometry_loss(a, 0.5 * a.T), torch.tensor(0.75))
    torch.testing.assert_close(geometry_loss(2.0 * a, a.T), torch.tensor(30.0))


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
    terms = training_objective(model, torch.randn(2, 3, 64, 2), 0.1, 1.0)
    terms["loss"].backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    assert ("koop" in terms) == (processor == "graphmet")


def test_boundary_frame_is_forced_from_truth():
    torch.manual_seed(0)
    model = GraphWeatherModel(1, 8, MessagePassingProcessor(8, 1))
    model.attach_graph(regional_graph((8, 8), 2, 1, 8, boundary=2))
    truth = torch.randn(1, 3, 64, 1)
    with torch.no_grad():
        prediction, _ = model.rollout(truth[:, 0], truth[:, 1:])
    frame = ~torch.from_numpy(regional_graph((8, 8), 2, 1, 8, 2).interior)
    torch.testing.assert_close(prediction[:, :, frame], truth[:, 1:, frame])
    assert not torch.allclose(prediction[:, :, ~frame], truth[:, 1:, ~frame])


def test_koopman_loss_is_one_for_the_identity_step_and_zero_for_the_true_operator():
    """Eq. K6 is normalised by the change of the coefficients over every lead."""
    torch.manual_seed(0)
    truth = KoopmanOperator(8, 4, "modes")
    c0 = torch.randn(5, 8, 4)
    leads = [c0] + [truth(c0, n).detach() for n in (1, 2, 3)]
    assert koopman_loss(truth, leads).item() < 1e-10
    identity = KoopmanOperator(8, 4, "modes", init_scale=0.0)  # rho = 1, omega = 0
    assert koopman_loss(identity, leads).item() == pytest.approx(1.0, rel=1e-5)
    # Only later leads count: a wrong 3-step propagation is penalised by itself.
    wrong = leads[:3] + [leads[3] + 0.3 * torch.randn_like(c0)]
    assert koopman_loss(truth, wrong).item() > 0.01


def test_koopman_loss_gives_the_encoder_no_reason_to_shrink_the_anomaly():
    """Eq. K6 is a ratio in the coefficients' scale: scaling every C by s leaves it unchanged and
    its gradient along the scale is zero (a detached denominator pushes every C towards 0)."""
    torch.manual_seed(1)
    operator = KoopmanOperator(8, 4, "modes", init_scale=0.3)
    leads = [torch.randn(5, 8, 4) for _ in range(4)]
    scale = torch.tensor(1.0, requires_grad=True)
    loss = koopman_loss(operator, [scale * c for c in leads])
    (grad,) = torch.autograd.grad(loss, scale)
    assert abs(grad.item()) < 1e-5 * loss.item()
    small = koopman_loss(operator, [1e-3 * c for c in leads])
    assert small.item() == pytest.approx(loss.item(), rel=1e-4)


def _tiny_model(processor: str, climatology=None, seed=0):
    torch.manual_seed(seed)
    graph = regional_graph((8, 8), 1, 2, 16, boundary=1)
    model = build_model(processor, 2, 8, 1, 16, 4, "auto")
    model.attach_graph(graph, climatology)
    return model


def test_objective_is_the_sum_of_its_terms_with_the_koopman_terms_from_true_states():
    """Eq. G3 with every term: dropping alpha (L_koop + lambda L_geo) or beta L_spec, or
    computing L_koop from anything but the encoded true states, changes the numbers."""
    clim = 0.3 * torch.randn(64, 2)
    model = _tiny_model("graphmet", clim)
    window = torch.randn(2, 4, 64, 2)
    terms = training_objective(model, window, 0.3, 2.0, 0.5, rollout_steps=2)
    expected = terms["fcst"] + 0.3 * (terms["koop"] + 2.0 * terms["geo"]) + 0.5 * terms["spec"]
    torch.testing.assert_close(terms["loss"], expected)
    assert terms["koop"] > 1e-3 and terms["spec"] > 1e-3
    with torch.no_grad():
        model.processor.lower.add_(0.1)  # make L_geo non-zero
        terms = training_objective(model, window, 0.3, 2.0, 0.0, rollout_steps=2)
        assert terms["geo"] > 1e-3
        reference = model.reference_latent()
        coefficients = [
            model.processor.coefficients(
                model.encode(window[:, n], window[:, min(n + 1, 3)])[0],
                model.graph.basis,
                reference,
            )
            for n in range(4)
        ]
        by_hand = koopman_loss(model.processor.operator, coefficients)
    torch.testing.assert_close(terms["koop"], by_hand)
    torch.testing.assert_close(
        terms["loss"], terms["fcst"] + 0.3 * (terms["koop"] + 2.0 * terms["geo"])
    )
    plain = training_objective(model, window, 0.0, 2.0, 0.0, rollout_steps=2)
    assert plain["loss"] < terms["loss"] - 1e-3


def test_forecast_loss_covers_exactly_the_requested_steps():
    """R = rollout_steps steps of a window of 4 states, at most its 3 transitions (None: all);
    a window of one state is refused by name."""
    model = _tiny_model("message_passing")
    window = torch.randn(2, 4, 64, 2)
    with torch.no_grad():
        for steps, covered in ((1, 1), (2, 2), (3, 3), (10, 3), (None, 3)):
            fcst = training_objective(model, window, 0.0, 1.0, rollout_steps=steps)["fcst"]
            prediction, _ = model.rollout(window[:, 0], window[:, 1 : covered + 1])
            by_hand = weighted_mse(prediction, window[:, 1 : covered + 1], model.graph.loss_weight)
            torch.testing.assert_close(fcst, by_hand)
        with pytest.raises(ValueError, match="at least two states"):
            training_objective(model, window[:, :1], 0.0, 1.0)


def test_objective_logs_the_processor_move_and_skips_the_terms_it_does_not_weigh():
    """processor_move = ||P(E(x_0)) - E(x_0)|| / ||E(x_0)|| of the first step (0 for the
    identity processor); at alpha = beta = 0 neither the Koopman nor the spectral terms are
    computed; G6 needs a lead 2, so a window of 2 states has no one-shot term and one of 3
    states has it."""
    clim = 0.3 * torch.randn(64, 2)
    model = _tiny_model("graphmet", clim)
    window = torch.randn(2, 4, 64, 2)
    with torch.no_grad():
        model.processor.operator.log_decay.fill_(0.5)
        terms = training_objective(model, window, 0.0, 1.0, rollout_steps=1)
        _, latents = model.step(window[:, 0], window[:, 1])
        moved = relative_move(latents["encoded"], latents["processed"]).mean()
        torch.testing.assert_close(terms["processor_move"], moved)
        assert moved > 1e-3 and not {"koop", "geo", "spec"} & set(terms)
        identity = training_objective(_tiny_model("identity"), window, 0.0, 1.0)
        assert identity["processor_move"].item() == 0.0
        two = training_objective(model, window[:, :2], 0.0, 1.0, oneshot_weight=1.0)
        assert "shot" not in two and torch.isfinite(two["loss"])
        three = training_objective(model, window[:, :3], 0.0, 1.0, oneshot_weight=1.0)
        oneshot = model.rollout_latent(window[:, 0], window[:, 1:3])
        by_hand = weighted_mse(oneshot[:, 1:], window[:, 2:3], model.graph.loss_weight)
        torch.testing.assert_close(three["shot"], by_hand)


def test_decoder_output_is_added_to_the_state_as_a_residual(monkeypatch):
    """Eq. G1: x_{t+1} = x_t + s * Dec(...): with a decoder that outputs zeros the interior stays
    x_t, with one that outputs ones it moves by exactly s (per variable)."""
    model = _tiny_model("message_passing")
    model.graph.increment_scale = torch.tensor([0.5, 2.0])
    state, forcing = torch.randn(2, 64, 2), torch.randn(2, 64, 2)
    inside = model.graph.interior.bool()[:, 0]
    for value in (0.0, 1.0):
        monkeypatch.setattr(
            model.decoder, "forward", lambda mesh, grid, graph, v=value: torch.full_like(state, v)
        )
        with torch.no_grad():
            nxt, _ = model.step(state, forcing)
        moved = value * torch.tensor([0.5, 2.0])
        torch.testing.assert_close(nxt[:, inside], state[:, inside] + moved)
        torch.testing.assert_close(nxt[:, ~inside], forcing[:, ~inside])


def test_the_koopman_step_acts_on_the_anomaly_from_the_encoded_climatology():
    """C = U^T (H - E(clim)) A: the climatology is a fixed point of the step (the static mesh
    embedding, part of every latent, is not in the Koopman coordinates), and a state away from
    it is moved."""
    clim = torch.randn(64, 2)
    model = _tiny_model("graphmet", clim)
    with torch.no_grad():
        model.processor.operator.log_decay.fill_(0.5)  # |lambda| = 0.78: a visible step
        reference = model.reference_latent()
        h_clim = model.encode(clim[None], clim[None])[0]
        after, coefficients = model.process(h_clim, reference=reference)
        assert coefficients.abs().max() < 1e-5
        torch.testing.assert_close(after, h_clim)
        other = model.encode(clim[None] + torch.randn(1, 64, 2), clim[None])[0]
        moved, _ = model.process(other, reference=reference)
    assert (moved - other).norm() > 1e-3 * (other - reference).norm()


def test_identity_processor_is_the_encoder_decoder_alone():
    model = _tiny_model("identity")
    h = torch.randn(2, model.graph.num_mesh, 8)
    out, _ = model.process(h)
    assert out is h
    assert not any("processor" in name for name, _ in model.named_parameters())


def test_spectral_amplitude_loss_sees_lost_small_scales_and_ignores_a_phase_shift():
    buffers = GraphBuffers(periodic_graph((8, 8), 8, 1, 8))
    y = torch.arange(8.0)
    field = torch.cos(2 * torch.pi * 3 * y / 8)[None, :] + torch.cos(2 * torch.pi * y / 8)[:, None]
    truth = field.reshape(1, 64, 1)
    shifted = torch.roll(field, 2, dims=1).reshape(1, 64, 1)  # same amplitudes
    smooth = torch.cos(2 * torch.pi * y / 8)[:, None].expand(8, 8).reshape(1, 64, 1)
    assert spectral_amplitude_loss(shifted, truth, buffers) < 1e-6
    assert spectral_amplitude_loss(smooth, truth, buffers) > 0.3


def test_spectral_amplitude_loss_is_relative_to_the_truths_spectrum():
    """Eq. G5 divides by the truth's spectral energy: a zero forecast scores exactly 1 on either
    grid (Parseval), and scaling forecast and truth together leaves the loss unchanged."""
    torch.manual_seed(0)
    for graph in (periodic_graph((8, 8), 8, 1, 8), regional_graph((8, 8), 1, 2, 16, boundary=1)):
        buffers = GraphBuffers(graph)
        truth, forecast = torch.randn(3, 64, 2), torch.randn(3, 64, 2)
        for scale in (5.0, 1e-3):  # a ratio at any scale above the clamp's 1e-12
            zero = spectral_amplitude_loss(torch.zeros_like(truth), scale * truth, buffers)
            torch.testing.assert_close(zero, torch.tensor(1.0))
        torch.testing.assert_close(
            spectral_amplitude_loss(4.0 * forecast, 4.0 * truth, buffers),
            spectral_amplitude_loss(forecast, truth, buffers),
        )


def test_interior_images_lay_out_the_interior_row_major_and_refuse_a_non_planar_grid():
    """[S, T, G, C] -> [S, T, C, ny, nx]: pixel (i, j) of variable c is grid node (i + 1) * 8 +
    (j + 1) of the 8 x 8 regional grid with a one-cell frame; a grid whose interior is not a
    rectangle is refused by name."""
    graph = regional_graph((8, 8), 1, 2, 16, boundary=1)
    fields = torch.arange(2 * 3 * 64 * 2, dtype=torch.float32).reshape(2, 3, 64, 2)
    images = interior_images(fields, GraphBuffers(graph))
    assert images.shape == (2, 3, 2, 6, 6)
    rows = torch.arange(6)[:, None] + 1
    nodes = (rows * 8 + rows.T).reshape(-1)  # (i + 1) * 8 + (j + 1), row-major
    expected = fields[:, :, nodes, :].movedim(-1, 2).reshape(2, 3, 2, 6, 6)
    torch.testing.assert_close(images, expected)
    assert images[1, 2, 1, 0, 5].item() == fields[1, 2, 1 * 8 + 6, 1].item()
    flat = GraphBuffers(dataclasses.replace(graph, interior_shape=None))
    with pytest.raises(ValueError, match="not a rectangle"):
        interior_images(fields, flat)


def test_pairing_basis_vectors_is_refused_on_a_laplacian_basis():
    assert resolve_pairing("auto", "fourier") == "modes"
    assert resolve_pairing("auto", "laplacian") == "channels"
    with pytest.raises(ConfigError, match="Fourier basis"):
        build_model("graphmet", 2, 8, 1, 16, 4, "modes", "laplacian")


def test_oneshot_term_is_the_decoded_k5_forecast_from_lead_two_on():
    """Eq. G6: L_shot is the weighted MSE of the one-shot forecast K5 at leads 2..N (lead 1 is
    the first step of L_fcst, which K5 equals there); gamma adds it to the loss, even with
    alpha = 0, and it is absent for a message-passing model."""
    clim = 0.3 * torch.randn(64, 2)
    model = _tiny_model("graphmet", clim)
    window = torch.randn(2, 4, 64, 2)
    with torch.no_grad():
        model.processor.operator.log_decay.fill_(0.5)  # a visible step, different per lead
        terms = training_objective(model, window, 0.0, 1.0, rollout_steps=2, oneshot_weight=0.7)
        oneshot = model.rollout_latent(window[:, 0], window[:, 1:])
        first, _ = model.step(window[:, 0], window[:, 1])
        plain = training_objective(model, window, 0.0, 1.0, rollout_steps=2)
    torch.testing.assert_close(oneshot[:, 0], first)
    by_hand = weighted_mse(oneshot[:, 1:], window[:, 2:], model.graph.loss_weight)
    torch.testing.assert_close(terms["shot"], by_hand)
    torch.testing.assert_close(terms["loss"], terms["fcst"] + 0.7 * terms["shot"])
    assert "shot" not in plain and plain["loss"] < terms["loss"] - 1e-3
    gnn = _tiny_model("message_passing")
    assert "shot" not in training_objective(gnn, window, 0.0, 1.0, oneshot_weight=1.0)


def test_a_short_run_with_the_oneshot_term_trains_the_long_range_step():
    """With alpha = 0 only the one-shot term G6 gives K5's multi-lead forecast a gradient: the
    same 40 Adam steps from the same start leave K5's leads 2..3 worse without it."""
    gen = torch.Generator().manual_seed(0)
    start = torch.randn(4, 1, 64, 2, generator=gen)
    window = torch.cat([start * 0.8**t for t in range(4)], 1)  # decaying anomalies
    errors = {}
    for gamma in (0.0, 1.0):
        model = _tiny_model("graphmet", seed=1)
        opt = torch.optim.Adam(model.parameters(), lr=1e-2)
        for _ in range(40):
            loss = training_objective(
                model, window, 0.0, 1.0, rollout_steps=1, oneshot_weight=gamma
            )
            opt.zero_grad()
            loss["loss"].backward()
            opt.step()
        with torch.no_grad():
            oneshot = model.rollout_latent(window[:, 0], window[:, 1:])
            errors[gamma] = weighted_mse(oneshot[:, 1:], window[:, 2:], model.graph.loss_weight)
    assert errors[1.0] < 0.8 * errors[0.0]


def test_oneshot_rollout_is_lambda_to_the_n_with_the_frame_forced_at_every_lead():
    """Eq. K5: with Lambda^3 = 1 (rho = 1, omega = 2 pi / 3) the lead-3 one-shot latent is the
    initial one, so K5 decodes like the encoder-decoder at lead 3 but not at lead 2; the
    boundary frame is the truth's at every lead; a non-Koopman model is refused."""
    model = _tiny_model("graphmet", 0.3 * torch.randn(64, 2))
    initial, forcing = torch.randn(2, 64, 2), torch.randn(2, 3, 64, 2)
    with torch.no_grad():
        model.processor.operator.log_decay.zero_()
        model.processor.operator.frequency.fill_(2 * np.pi / 3)
        oneshot = model.rollout_latent(initial, forcing)
        mesh, grid = model.encode(initial, forcing[:, 0])
        unchanged = [model.finish(initial, mesh, grid, forcing[:, n]) for n in range(3)]
    assert oneshot.shape == (2, 3, 64, 2)
    torch.testing.assert_close(oneshot[:, 2], unchanged[2], atol=1e-5, rtol=1e-4)
    assert (oneshot[:, 1] - unchanged[1]).abs().max() > 1e-3
    inside = model.graph.interior.bool()[:, 0]
    torch.testing.assert_close(oneshot[:, :, ~inside], forcing[:, :, ~inside])
    with pytest.raises(TypeError, match="needs the Koopman processor"):
        _tiny_model("message_passing").rollout_latent(initial, forcing)


def test_changing_share_by_hand():
    """sum_t ||C_t - mean_t C||^2 / sum_t ||C_t||^2 per trajectory: 0 for a constant sequence,
    1 for one that alternates around zero, 0.2 for the values 1 and 3."""

    constant = torch.ones(1, 5, 2, 3)
    alternating = torch.tensor([1.0, -1.0, 1.0, -1.0]).reshape(1, 4, 1, 1).expand(1, 4, 2, 3)
    hand = torch.tensor([1.0, 3.0]).reshape(1, 2, 1, 1)
    assert changing_share(constant).tolist() == [0.0]
    torch.testing.assert_close(changing_share(alternating), torch.ones(1))
    torch.testing.assert_close(changing_share(hand), torch.tensor([0.2]))
    both = torch.cat([hand, 2 * hand])  # per trajectory, invariant to scale
    torch.testing.assert_close(changing_share(both), torch.tensor([0.2, 0.2]))


def test_ensemble_members_are_perturbed_as_in_e1_and_e2(monkeypatch):
    """Amplitude 0 gives M copies of the deterministic rollout. E1 (message passing): the
    initial state moves by a s eps on the interior only (std a s per variable). E2 (GraphMet):
    the first step's coefficients get a sigma_C eps (std a sigma_C), the state is not touched."""

    initial, forcing = torch.randn(2, 64, 2), torch.randn(2, 3, 64, 2)
    gnn = _tiny_model("message_passing")
    gnn.graph.increment_scale = torch.tensor([0.5, 2.0])
    with torch.no_grad():
        members = ensemble_rollout(gnn, initial, forcing, 3, 0.0, torch.Generator())
        single, _ = gnn.rollout(initial, forcing)
    assert members.shape == (2, 3, 3, 64, 2)
    torch.testing.assert_close(members, single[:, None].expand_as(members))

    seen = {}

    def capture(initial, forcing, perturbation=None):
        seen.update(initial=initial, perturbation=perturbation)
        return initial[:, None].expand(-1, forcing.shape[1], -1, -1), None

    monkeypatch.setattr(gnn, "rollout", capture)
    ensemble_rollout(gnn, initial, forcing, 400, 0.1, torch.Generator().manual_seed(0))
    moved = (seen["initial"] - initial.repeat_interleave(400, 0)).unflatten(0, (2, 400))
    inside = gnn.graph.interior.bool()[:, 0]
    assert moved[:, :, ~inside].abs().max() == 0 and seen["perturbation"] is None
    spread = moved[:, :, inside].flatten(0, 2).std(0)  # [C]
    torch.testing.assert_close(spread, torch.tensor([0.05, 0.2]), rtol=0.05, atol=0)

    koopman = _tiny_model("graphmet", 0.3 * torch.randn(64, 2))
    states = torch.randn(5, 64, 2)
    with torch.no_grad():
        scale = coefficient_scale(koopman, states, states)
        mesh, _ = koopman.encode(states, states)
        coeffs = koopman.processor.coefficients(
            mesh, koopman.graph.basis, koopman.reference_latent()
        )
    torch.testing.assert_close(scale, coeffs.std(0))
    monkeypatch.setattr(koopman, "rollout", capture)
    ensemble_rollout(koopman, initial, forcing, 400, 2.0, torch.Generator().manual_seed(0), scale)
    torch.testing.assert_close(seen["initial"], initial.repeat_interleave(400, 0))
    noise = seen["perturbation"]["coefficient_noise"]  # [S * M, m, r]
    assert noise.shape == (800, *scale.shape)
    torch.testing.assert_close(
        noise.std(0) / (2.0 * scale), torch.ones_like(scale), rtol=0.15, atol=0
    )


def test_weighted_mse_relative_move_and_geometry_loss_by_hand():
    """Eq. G4's inner term, ||H' - H|| / ||H|| and K7 on numbers small enough to do by hand."""
    prediction = torch.tensor([[[1.0, 3.0], [0.0, 0.0]]])  # [1, G=2, C=2]
    target = torch.zeros(1, 2, 2)
    weight = torch.tensor([3.0, 1.0])
    # squared error per point: mean_c = (1 + 9) / 2 = 5 at g = 0, 0 at g = 1 -> 3 * 5 / 4
    torch.testing.assert_close(weighted_mse(prediction, target, weight), torch.tensor(3.75))
    # [B, T, G, C] with a non-zero target, against explicit loops over every index.
    gen = torch.Generator().manual_seed(0)
    forecast, truth = torch.randn(2, 3, 4, 2, generator=gen), torch.randn(2, 3, 4, 2, generator=gen)
    per_point = torch.tensor([0.5, 1.0, 2.0, 0.0])
    loops = [
        sum(per_point[g] * ((forecast[b, t, g] - truth[b, t, g]) ** 2).mean() for g in range(4))
        / per_point.sum()
        for b in range(2)
        for t in range(3)
    ]
    torch.testing.assert_close(weighted_mse(forecast, truth, per_point), torch.stack(loops).mean())
    before = torch.tensor([[[3.0, 4.0]], [[1.0, 0.0]]])  # norms 5 and 1
    after = before + torch.tensor([[[0.0, 1.0]], [[0.0, 2.0]]])
    torch.testing.assert_close(relative_move(before, after), torch.tensor([0.2, 2.0]))
    small = relative_move(1e-3 * before, 1e-3 * after)  # a ratio at any scale above 1e-12
    torch.testing.assert_close(small, torch.tensor([0.2, 2.0]))
    lift = torch.tensor([[2.0, 0.0], [0.0, 1.0], [0.0, 0.0]])  # A^T A = diag(4, 1)
    lower = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])  # B A = diag(2, 1)
    torch.testing.assert_close(geometry_loss(lift, lower), torch.tensor(9.0 + 1.0))


def test_dirichlet_energy_of_a_path_graph_by_hand():
    """tr(H^T L H) / tr(H^T H), L = I - D^-1/2 A D^-1/2 on the path 0-1-2 (degrees 1, 2, 1):
    0 for H = D^1/2 1, 2 (the maximum) for the alternating field on one edge, and
    2 (1 - 1/sqrt 2)^2 / 3 for the constant field (not 0: the degrees differ)."""
    path = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    fields = torch.tensor([[1.0, 2**0.5, 1.0], [1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])[..., None]
    expected = torch.tensor([0.0, 2 * (1 - 2**-0.5) ** 2 / 3, 1.0])
    torch.testing.assert_close(dirichlet_energy(fields, path, 3), expected)
    edge = torch.tensor([[0, 1], [1, 0]])
    alternating = torch.tensor([[[1.0], [-1.0]]])
    torch.testing.assert_close(dirichlet_energy(alternating, edge, 2), torch.tensor([2.0]))
    # A Rayleigh quotient: the scale of the latent drops out (no clamp effect above 1e-12).
    torch.testing.assert_close(dirichlet_energy(1e-3 * fields, path, 3), expected)


def test_rollout_perturbs_the_first_step_only_and_rotates_phases_at_every_step():
    """GraphMet's rollout: coefficient noise (E2) enters the first step only, phase noise every
    step; with diagnostics it returns each step's latent Dirichlet energy [B, T]."""
    model = _tiny_model("graphmet", 0.3 * torch.randn(64, 2))
    initial, forcing = torch.randn(2, 64, 2), torch.randn(2, 3, 64, 2)
    modes, rank = model.graph.basis.shape[1], model.processor.lift.shape[1]
    noise = {"coefficient_noise": torch.randn(2, modes, rank)}
    phase = 0.5 * torch.randn(2, modes, rank // 2)
    with torch.no_grad():
        model.processor.operator.log_decay.fill_(0.3)
        reference = model.reference_latent()
        out, energy = model.rollout(initial, forcing, noise, phase, diagnostics=True)
        state, by_hand, energies = initial, [], []
        for t in range(3):
            extra = {"phase_noise": phase, **(noise if t == 0 else {})}
            state, latents = model.step(state, forcing[:, t], extra, reference)
            by_hand.append(state)
            energies.append(
                dirichlet_energy(latents["processed"], model.graph.mesh_edges, model.graph.num_mesh)
            )
        plain, none = model.rollout(initial, forcing)
    torch.testing.assert_close(out, torch.stack(by_hand, 1))
    torch.testing.assert_close(energy, torch.stack(energies, 1))
    assert energy.shape == (2, 3) and none is None
    assert (out - plain)[:, 0].abs().max() > 1e-4  # the noise acts


def test_graph_buffers_defaults_and_the_scored_weights():
    """No climatology: a zero anomaly origin; no scale: s = 1; the loss weight is the area
    weight on the interior and 0 on the forced frame; interior_index lists the interior."""

    graph = regional_graph((8, 8), 1, 2, 16, boundary=1)
    buffers = GraphBuffers(graph)
    assert buffers.climatology.shape == (64, 1) and buffers.climatology.abs().max() == 0
    torch.testing.assert_close(buffers.increment_scale, torch.ones(1))
    inside = torch.from_numpy(graph.interior)
    area = torch.from_numpy(graph.area_weight).float()
    torch.testing.assert_close(buffers.loss_weight.float(), area * inside)
    assert buffers.interior[:, 0].bool().tolist() == inside.tolist()
    assert buffers.interior_index.tolist() == np.flatnonzero(graph.interior).tolist()
    assert buffers.num_mesh == len(graph.mesh_pos) and not buffers.periodic
    assert buffers.interior_shape == (6, 6)


def test_an_ensemble_is_reproducible_from_its_seeded_generator_and_small_shares_are_exact():
    """E1 draws its noise from the given generator: the same seed gives the same members, another
    seed others. changing_share is a ratio at any scale (no clamp effect above 1e-12)."""

    gnn = _tiny_model("message_passing")
    initial, forcing = torch.randn(1, 64, 2), torch.randn(1, 2, 64, 2)
    with torch.no_grad():
        runs = [
            ensemble_rollout(gnn, initial, forcing, 2, 0.5, torch.Generator().manual_seed(s))
            for s in (3, 3, 4)
        ]
    torch.testing.assert_close(runs[0], runs[1])
    assert (runs[0] - runs[2]).abs().max() > 1e-4
    tiny = 1e-3 * torch.tensor([1.0, 3.0]).reshape(1, 2, 1, 1)
    torch.testing.assert_close(changing_share(tiny), torch.tensor([0.2]))


def test_ensemble_members_are_the_rollouts_of_the_drawn_perturbations():
    """E1: member m of sample i starts from x_i + a * s * interior * z with z drawn from the
    generator; E2: GraphMet's first step gets a * sigma_C * z on its coefficients. Each member
    is exactly the deterministic rollout of that perturbation, and E2 is reproducible from its
    seeded generator (the same seed: the same members; another seed: others)."""
    initial, forcing = torch.randn(2, 64, 2), torch.randn(2, 2, 64, 2)
    start, frame = initial.repeat_interleave(3, 0), forcing.repeat_interleave(3, 0)
    gnn = _tiny_model("message_passing")
    gnn.graph.increment_scale = torch.tensor([0.5, 2.0])
    with torch.no_grad():
        members = ensemble_rollout(gnn, initial, forcing, 3, 0.7, torch.Generator().manual_seed(5))
        z = torch.randn(start.shape, generator=torch.Generator().manual_seed(5))
        moved = start + 0.7 * gnn.graph.increment_scale * gnn.graph.interior * z
        by_hand, _ = gnn.rollout(moved, frame)
    torch.testing.assert_close(members, by_hand.unflatten(0, (2, 3)))

    koopman = _tiny_model("graphmet", 0.3 * torch.randn(64, 2))
    with torch.no_grad():
        scale = coefficient_scale(koopman, initial, forcing[:, 0])
        runs = [
            ensemble_rollout(
                koopman, initial, forcing, 3, 0.7, torch.Generator().manual_seed(g), scale
            )
            for g in (5, 5, 6)
        ]
        z = torch.randn((6, *scale.shape), generator=torch.Generator().manual_seed(5))
        by_hand, _ = koopman.rollout(start, frame, {"coefficient_noise": 0.7 * scale * z})
    torch.testing.assert_close(runs[0], by_hand.unflatten(0, (2, 3)))
    torch.testing.assert_close(runs[0], runs[1])
    assert (runs[0] - runs[2]).abs().max() > 1e-4


def test_encoder_input_holds_the_frame_not_the_next_interior_and_reads_forcing_fields():
    """Eq. G2's input [x_t, frame of x_{t+1}, boundary mask, forcing fields] by hand, with one
    forcing field (F = 1); the next true state's interior never reaches the forecast."""
    graph = regional_graph((8, 8), 1, 2, 16, boundary=1)
    torch.manual_seed(0)
    model = GraphWeatherModel(2, 8, MessagePassingProcessor(8, 1), forcing_channels=1)
    model.attach_graph(graph)
    state, forcing = torch.randn(2, 64, 2), torch.randn(2, 64, 3)
    inside = torch.from_numpy(graph.interior).float()[:, None]  # [G, 1]
    frame = 1 - inside
    expected = torch.cat(
        [state, forcing[..., :2] * frame, frame.expand(2, 64, 1), forcing[..., 2:]], -1
    )
    torch.testing.assert_close(model_inputs(state, forcing, model.graph.interior), expected)
    leaked = forcing.clone()
    leaked[:, inside[:, 0].bool(), :2] += 10.0  # another next-state interior, same frame
    with torch.no_grad():
        forecast, _ = model.step(state, forcing)
        unchanged, _ = model.step(state, leaked)
        other_field = forcing.clone()
        other_field[..., 2] += 1.0
        moved, _ = model.step(state, other_field)
    torch.testing.assert_close(forecast, unchanged)
    assert (moved - forecast).abs().max() > 1e-4  # the forcing field is read


def test_a_model_with_static_and_forcing_fields_steps_and_attach_graph_keeps_its_scale():
    """Static fields widen the grid's features (STATIC_FEATURES + S), forcing fields the encoder
    input (2C + 1 + F); the default climatology covers C + F channels, so the Koopman anomaly
    origin encodes; attach_graph stores s; a model is built without a graph."""
    graph = regional_graph((8, 8), 1, 2, 16, boundary=1)
    graph.grid_static = np.concatenate([graph.grid_static, np.ones((64, 2), np.float32)], 1)
    torch.manual_seed(0)
    model = build_model("graphmet", 2, 8, 1, 16, 4, "auto", static_channels=2, forcing_channels=1)
    assert model.graph is None
    model.attach_graph(graph, increment_scale=torch.tensor([0.5, 2.0]))
    torch.testing.assert_close(model.graph.increment_scale, torch.tensor([0.5, 2.0]))
    assert model.graph.climatology.shape == (64, 3)
    # The graph (climatology and s included) is attached from the data, never checkpointed, so a
    # checkpoint loads onto another grid: no graph buffer in the state dict.
    assert not [key for key in model.state_dict() if key.startswith("graph.")]
    with torch.no_grad():
        forecast, _ = model.step(torch.randn(2, 64, 2), torch.randn(2, 64, 3))
    assert forecast.shape == (2, 64, 2) and torch.isfinite(forecast).all()


def test_phase_noise_turns_each_eigenvalue_by_exactly_its_noise():
    """Eq. K3 with phase noise: Lambda = rho exp(i (omega + eta)): the same modulus, the angle
    turned by eta, per member."""
    torch.manual_seed(0)
    op = KoopmanOperator(8, 4, "modes")
    eta = 0.2 * torch.randn(3, 4, 4)  # [B, pairs, r]
    plain, noisy = op.eigenvalues(), op.eigenvalues(eta)
    assert noisy.shape == (3, 4, 4)
    torch.testing.assert_close(noisy.abs(), plain.abs().expand_as(noisy))
    torch.testing.assert_close(noisy, plain * torch.polar(torch.ones_like(eta), eta))
    c = torch.randn(3, 8, 4)
    torch.testing.assert_close(op(c, phase_noise=eta), op.to_real(noisy * op.to_complex(c)))


def test_operator_starts_near_the_identity_step_and_checks_its_pairing():
    """init_scale 0.1: |lambda| near 1 and small angles (the step starts near the identity);
    mode pairs by default; the paired axis must be even, the other need not be; coefficients
    of any batch shape go to complex pairs (2k, 2k + 1) -> c_2k + i c_2k+1 and back."""
    torch.manual_seed(0)
    op = KoopmanOperator(8, 4)
    assert op.pairing == "modes" and op.log_decay.shape == (4, 4)
    lam = op.eigenvalues()
    assert lam.abs().min() > 0.9 and lam.angle().abs().max() < 0.5
    with pytest.raises(ValueError, match="must be 'modes' or 'channels'"):
        KoopmanOperator(8, 4, "pairs")
    with pytest.raises(ValueError, match="needs an even number of modes"):
        KoopmanOperator(7, 4, "modes")
    with pytest.raises(ValueError, match="needs an even number of channels"):
        KoopmanOperator(8, 3, "channels")
    for pairing, (m, r) in (("modes", (8, 3)), ("channels", (7, 4))):
        op = KoopmanOperator(m, r, pairing)
        c = torch.randn(2, 3, m, r)
        z = op.to_complex(c)
        if pairing == "modes":
            torch.testing.assert_close(z[1, 2, 3, 1], torch.complex(c[1, 2, 6, 1], c[1, 2, 7, 1]))
        else:
            torch.testing.assert_close(z[1, 2, 6, 1], torch.complex(c[1, 2, 6, 2], c[1, 2, 6, 3]))
        torch.testing.assert_close(op.to_real(z), c)
