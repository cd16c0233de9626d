"""GraphMet: a graph weather model whose processor is one linear Koopman step (pure torch).

A GraphCast-style model maps the state x_t on the grid (G points, C variables) to x_{t+1}:

    H_t, Z_t = Enc(x_t, f_{t+1})           grid -> mesh; f = boundary forcing (regional runs)
    H_t'     = P(H_t)                       processor on the multi-scale mesh (M nodes, d)
    x_{t+1}  = x_t + s * Dec(H_t', Z_t)     mesh -> grid over containing triangles     (G1)

with s the per-variable RMS of the one-step change x_{t+1} - x_t over the training data
(GraphCast's normalisation of the residual: the decoder predicts a change of unit scale,
however small the change per step), and on a limited area the boundary frame is overwritten
with the forcing:
x_{t+1} = mask * x_{t+1} + (1 - mask) * f_{t+1}                                        (G2)

The message-passing baseline (``baselines.py``) uses P = K InteractionNet layers. GraphMet
replaces that stack with one linear Koopman step in the mesh's spectral basis (``koopman.py``,
Eqs. K1-K5) acting on the anomaly from the encoded climatology Hc = E(clim, clim):
P(H) = H + U (Lambda * C - C) B with C = U^T (H - Hc) A and |Lambda| <= 1 by construction.
The negative control replaces P by the identity (encoder-decoder only).

Training objective, the same forecast term for every processor:

    L = L_fcst + alpha (L_koop + lambda_geo L_geo) + beta L_spec                        (G3)
    L_fcst = 1/R sum_{n=1..R} sum_g w_g ||x_hat_n,g - x_n,g||^2 / sum_g w_g             (G4)
    L_spec = sum ( |F[h x_hat_n]| - |F[h x_n]| )^2 / sum |F[h x_n]|^2                   (G5)

with area weights w_g (cos latitude on the sphere, 1 on the plane) times the interior mask,
an R-step autoregressive rollout (G1 applied R times), L_koop and L_geo from Eqs. K6-K7 over
the encoded true states of the window, and G5 the FFT-amplitude loss of the baseline "message
passing + spectral loss" (F: 2-D FFT of the scored interior, h: a Hann taper when the interior
is not periodic); beta = 0 for every other model.
Long-range propagation: the one-shot latent rollout H_{t+n} = H_t + U(Lambda^n C_t - C_t) B
(Eq. K5) costs one diagonal multiply per step and member instead of K GNN layers. It is trained
by its own decoded multi-lead term (reconstructed; the abstract only says the objective enables
"efficient long-range propagation"), added to G3 with weight gamma for the Koopman processor:

    L_shot = 1/(N-1) sum_{n=2..N} sum_g w_g ||x0 + s Dec(K5_n(H_0), Z_0) - x_n||^2 / sum_g w_g (G6)

over the N leads of the window; lead 1 is left out, being exactly the first step of L_fcst.

Ensembles of M members (reconstructed): the message-passing models perturb the initial state,
x_0^m = x_0 + a s * interior * eps^m (E1, in units of the one-step change s); GraphMet perturbs
its spectral coefficients at the first step, C_0^m = C_0 + a sigma_C * eps^m (E2, sigma_C the
per-(mode, channel) standard deviation of C over analysis states), eps ~ N(0, 1); the amplitude
a is a hyper-parameter chosen on validation.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from graphmet.baselines import MessagePassingProcessor
from graphmet.koopman import (
    KoopmanProcessor,
    dirichlet_energy,
    geometry_loss,
    koopman_loss,
    relative_move,
)
from graphmet.layers import GridDecoder, GridEncoder
from graphmet.mesh import WeatherGraph
from graphmet.metrics import hann_window

STATIC_FEATURES = 4


class GraphBuffers(nn.Module):
    """The graph of a ``WeatherGraph`` as non-persistent tensors (moved with the model)."""

    def __init__(
        self,
        graph: WeatherGraph,
        climatology: torch.Tensor | None = None,
        increment_scale: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.num_mesh = len(graph.mesh_pos)
        self.interior_shape = graph.interior_shape
        self.periodic = graph.kind == "periodic"
        if climatology is None:  # zero anomaly reference: the standardised mean
            climatology = torch.zeros(len(graph.grid_pos), 1)
        self.register_buffer("climatology", climatology.float(), False)  # [G, C] standardised
        if increment_scale is None:  # no normalisation of the decoded change
            increment_scale = torch.ones(1)
        self.register_buffer("increment_scale", increment_scale.float(), False)  # s of G1 [C]
        for name in (
            "grid_static",
            "mesh_static",
            "mesh_edges",
            "mesh_edge_attr",
            "g2m_edges",
            "g2m_edge_attr",
            "m2g_edges",
            "m2g_edge_attr",
            "basis",
            "area_weight",
        ):
            self.register_buffer(name, torch.from_numpy(np.asarray(getattr(graph, name))), False)
        interior = torch.from_numpy(graph.interior.astype(np.float32))
        self.register_buffer("interior", interior[:, None], False)  # [G, 1]
        self.register_buffer("loss_weight", self.area_weight * interior, False)  # [G]
        index = np.flatnonzero(graph.interior)
        self.register_buffer("interior_index", torch.from_numpy(index), False)  # row-major


def model_inputs(state: torch.Tensor, forcing: torch.Tensor, interior: torch.Tensor):
    """Encoder input [B, G, 2C+1+F]: state x_t [B, G, C], the next state's boundary frame, the
    boundary mask, and the forcing fields of the next step (``forcing`` [B, G, C+F] holds the
    next true state, of which only the frame is used, then F forcing fields)."""
    channels = state.shape[-1]
    boundary = 1 - interior.expand(*state.shape[:-1], 1)
    frame, fields = forcing[..., :channels], forcing[..., channels:]
    return torch.cat([state, frame * boundary, boundary, fields], -1)


class GraphWeatherModel(nn.Module):
    """Eq. G1-G2 with a pluggable processor: ``KoopmanProcessor`` (GraphMet) or the
    message-passing stack of ``baselines.MessagePassingProcessor``."""

    def __init__(
        self,
        channels: int,
        dim: int,
        processor: nn.Module,
        static_channels: int = 0,
        forcing_channels: int = 0,
    ) -> None:
        """``channels`` predicted variables C; ``forcing_channels`` F read, not predicted;
        ``static_channels`` static fields appended to the grid's position features."""
        super().__init__()
        self.channels, self.forcing_channels = channels, forcing_channels
        self.encoder = GridEncoder(
            2 * channels + 1 + forcing_channels, STATIC_FEATURES + static_channels, dim
        )
        self.processor = processor
        self.decoder = GridDecoder(dim, channels)
        self.graph: GraphBuffers | None = None

    @property
    def is_koopman(self) -> bool:
        return isinstance(self.processor, KoopmanProcessor)

    def attach_graph(
        self,
        graph: WeatherGraph,
        climatology: torch.Tensor | None = None,
        increment_scale: torch.Tensor | None = None,
    ) -> None:
        """Set the mesh and grid graphs, the (standardised) climatology [G, C] that anchors
        the Koopman anomalies and the scale s [C] of the decoded change (Eq. G1; 1 when not
        given); parameters do not depend on their sizes."""
        device = next(self.parameters()).device
        if climatology is None:
            climatology = torch.zeros(len(graph.grid_pos), self.channels + self.forcing_channels)
        self.graph = GraphBuffers(graph, climatology, increment_scale).to(device)

    def encode(self, state: torch.Tensor, forcing: torch.Tensor):
        """x_t [B, G, C], f_{t+1} [B, G, C] -> mesh latents [B, M, d], grid latents [B, G, d]."""
        return self.encoder(model_inputs(state, forcing, self.graph.interior), self.graph)

    def reference_latent(self) -> torch.Tensor:
        """Hc = E(clim, clim) [1, M, d]: the anomaly origin of the Koopman coordinates. It holds
        the static mesh embedding too, which therefore drops out of C = U^T (H - Hc) A."""
        clim = self.graph.climatology[None]  # [1, G, C + F]
        return self.encode(clim[..., : self.channels], clim)[0]

    def process(
        self,
        mesh: torch.Tensor,
        perturbation: dict | None = None,
        reference: torch.Tensor | None = None,
    ):
        """P(H): returns H' [B, M, d] and the coefficients C_t (Koopman; None otherwise)."""
        if self.is_koopman:
            if reference is None:
                reference = self.reference_latent()
            return self.processor(mesh, self.graph.basis, reference, **(perturbation or {}))
        if isinstance(self.processor, MessagePassingProcessor):
            return self.processor(mesh, self.graph)
        return self.processor(mesh)

    def finish(self, state, mesh, grid, forcing) -> torch.Tensor:
        """Decode the residual, scaled by s, and force the boundary frame (Eqs. G1-G2)."""
        following = state + self.graph.increment_scale * self.decoder(mesh, grid, self.graph)
        inside = self.graph.interior
        return inside * following + (1 - inside) * forcing[..., : self.channels]

    def step(self, state, forcing, perturbation=None, reference=None) -> tuple[torch.Tensor, dict]:
        """One autoregressive step x_t -> x_{t+1}; also returns the latents for diagnostics.
        ``reference``: Hc, computed here when not given (a rollout computes it once)."""
        mesh, grid = self.encode(state, forcing)
        processed, _ = self.process(mesh, perturbation, reference=reference)
        return self.finish(state, processed, grid, forcing), {
            "encoded": mesh,
            "processed": processed,
        }

    def rollout(
        self,
        initial: torch.Tensor,  # [B, G, C]
        forcing: torch.Tensor,  # [B, T, G, C + F] truth (its boundary frame) + forcing fields
        perturbation: dict | None = None,  # Koopman ensembles: noise at the first step
        phase_noise: torch.Tensor | None = None,  # Koopman ensembles: at every step
        diagnostics: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """T autoregressive steps -> forecasts [B, T, G, C] and latent Dirichlet energy [B, T]."""
        state, outputs, energy = initial, [], []
        reference = self.reference_latent() if self.is_koopman else None
        for t in range(forcing.shape[1]):
            noise = dict(perturbation or {}) if t == 0 else {}
            if phase_noise is not None:
                noise["phase_noise"] = phase_noise
            state, latents = self.step(state, forcing[:, t], noise or None, reference)
            outputs.append(state)
            if diagnostics:
                energy.append(
                    dirichlet_energy(
                        latents["processed"], self.graph.mesh_edges, self.graph.num_mesh
                    )
                )
        return torch.stack(outputs, 1), (torch.stack(energy, 1) if diagnostics else None)

    def rollout_latent(
        self, initial: torch.Tensor, forcing: torch.Tensor, reference: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Eq. K5, GraphMet only: encode once, propagate C_{t+n} = Lambda^n C_t, decode each
        lead -> [B, T, G, C]. The boundary frame is still forced from truth at every lead
        (Eq. G2). ``reference``: Hc, computed here when not given."""
        if not self.is_koopman:
            raise TypeError("one-shot latent propagation needs the Koopman processor")
        mesh, grid = self.encode(initial, forcing[:, 0])
        if reference is None:
            reference = self.reference_latent()
        outputs = []
        for n in range(1, forcing.shape[1] + 1):
            processed, _ = self.processor(mesh, self.graph.basis, reference, steps=n)
            outputs.append(self.finish(initial, processed, grid, forcing[:, n - 1]))
        return torch.stack(outputs, 1)


def coefficient_scale(model: GraphWeatherModel, states, forcing) -> torch.Tensor:
    """sigma_C of Eq. E2: the standard deviation of C = U^T (E(x) - Hc) A over the analysis
    states x [S, G, C] (S >= 2) with their next boundary forcing -> [m, r]."""
    mesh, _ = model.encode(states, forcing)
    return model.processor.coefficients(mesh, model.graph.basis, model.reference_latent()).std(0)


def ensemble_rollout(
    model: GraphWeatherModel,
    initial: torch.Tensor,  # [S, G, C]
    forcing: torch.Tensor,  # [S, T, G, C + F]
    members: int,
    amplitude: float,
    generator: torch.Generator,
    mode_scale: torch.Tensor | None = None,  # sigma_C [m, r]: spectral perturbation (E2)
) -> torch.Tensor:
    """Eqs. E1 (``mode_scale`` None: perturbed initial state) and E2 (perturbed spectral
    coefficients of GraphMet's first step): M perturbed rollouts -> [S, M, T, G, C]."""
    samples = initial.shape[0]
    initial = initial.repeat_interleave(members, 0)  # member m of sample i at i * M + m
    forcing = forcing.repeat_interleave(members, 0)
    perturbation = None
    if mode_scale is None:
        noise = torch.randn(initial.shape, generator=generator, dtype=initial.dtype)
        initial = initial + amplitude * model.graph.increment_scale * model.graph.interior * noise
    else:
        noise = torch.randn((len(initial), *mode_scale.shape), generator=generator)
        perturbation = {"coefficient_noise": amplitude * mode_scale * noise.to(mode_scale)}
    forecast, _ = model.rollout(initial, forcing, perturbation)
    return forecast.unflatten(0, (samples, members))


def weighted_mse(prediction: torch.Tensor, target: torch.Tensor, weight: torch.Tensor):
    """Eq. G4's inner term: sum_g w_g (x_hat - x)^2 / sum_g w_g, averaged over the rest.
    prediction, target [..., G, C]; weight [G]."""
    squared = (prediction - target).pow(2).mean(-1)  # [..., G]
    return (squared * weight).sum(-1).mean() / weight.sum()


def interior_images(fields: torch.Tensor, graph: GraphBuffers) -> torch.Tensor:
    """[..., G, C] -> the scored interior as images [..., C, ny, nx] (planar grids only)."""
    if graph.interior_shape is None:
        raise ValueError("the interior of this grid is not a rectangle (planar grids only)")
    inside = fields.index_select(-2, graph.interior_index)  # [..., Gi, C]
    return inside.movedim(-1, -2).unflatten(-1, graph.interior_shape)


def spectral_amplitude_loss(
    prediction: torch.Tensor, target: torch.Tensor, graph: GraphBuffers
) -> torch.Tensor:
    """Eq. G5: relative squared error of the 2-D FFT amplitudes of the interior fields."""
    images_hat, images = interior_images(prediction, graph), interior_images(target, graph)
    if not graph.periodic:
        ny, nx = graph.interior_shape
        taper = hann_window(max(ny, nx), images.dtype, images.device)[:ny, :nx]
        images_hat, images = images_hat * taper, images * taper
    amp_hat = torch.fft.fft2(images_hat, norm="ortho").abs()
    amp = torch.fft.fft2(images, norm="ortho").abs()
    return (amp_hat - amp).pow(2).sum() / amp.pow(2).sum().clamp(min=1e-12)


def training_objective(
    model: GraphWeatherModel,
    window: torch.Tensor,  # [B, L, G, C + F] consecutive states (normalised) + forcing fields
    alpha: float,  # no defaults for the paper's weights: the module passes its hparams
    lambda_geo: float,
    spectral_weight: float = 0.0,
    rollout_steps: int | None = None,
    oneshot_weight: float = 0.0,
) -> dict[str, torch.Tensor]:
    """Eq. G3: L_fcst over the first R steps of the window (R = ``rollout_steps``, default all),
    L_koop and L_geo (Koopman processor, alpha > 0) over every lead of the window, L_spec when
    beta > 0, and for the Koopman processor gamma L_shot (Eq. G6, ``oneshot_weight`` = gamma > 0)
    over leads 2..N.

    The Koopman terms encode the true states x_0..x_N of the window, each with the boundary
    forcing of the next state (the last one with its own)."""
    length = window.shape[1]
    steps = length - 1 if rollout_steps is None else min(rollout_steps, length - 1)
    if steps < 1:  # before the rollout: torch.stack of no steps fails with a vaguer message
        raise ValueError("the window needs at least two states and rollout_steps >= 1")
    forcing, channels = window[:, 1:], model.channels
    state, outputs = window[:, 0, :, :channels], []
    reference = model.reference_latent() if model.is_koopman else None
    for t in range(steps):
        state, latents = model.step(state, forcing[:, t], reference=reference)
        outputs.append(state)
        if t == 0:
            encoded_now = latents["encoded"]  # E(x_0): its input is the true state
            moved = relative_move(encoded_now, latents["processed"]).mean().detach()
    prediction, target = torch.stack(outputs, 1), window[:, 1 : steps + 1, :, :channels]
    fcst = weighted_mse(prediction, target, model.graph.loss_weight)
    terms = {"fcst": fcst, "loss": fcst, "processor_move": moved}
    if spectral_weight > 0:
        terms["spec"] = spectral_amplitude_loss(prediction, target, model.graph)
        terms["loss"] = terms["loss"] + spectral_weight * terms["spec"]
    if model.is_koopman and alpha > 0:  # alpha = 0: K6-K7 add no gradient, skip their cost
        processor, basis = model.processor, model.graph.basis
        encoded = [encoded_now] + [
            model.encode(window[:, n, :, :channels], window[:, min(n + 1, length - 1)])[0]
            for n in range(1, length)
        ]
        coefficients = [processor.coefficients(h, basis, reference) for h in encoded]
        terms["koop"] = koopman_loss(processor.operator, coefficients)
        terms["geo"] = geometry_loss(processor.lift, processor.lower)
        terms["loss"] = terms["loss"] + alpha * (terms["koop"] + lambda_geo * terms["geo"])
    if model.is_koopman and oneshot_weight > 0 and length > 2:
        oneshot = model.rollout_latent(window[:, 0, :, :channels], forcing, reference)
        terms["shot"] = weighted_mse(
            oneshot[:, 1:], window[:, 2:, :, :channels], model.graph.loss_weight
        )
        terms["loss"] = terms["loss"] + oneshot_weight * terms["shot"]
    return terms
