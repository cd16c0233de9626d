"""GraphMet: a graph weather model whose processor is one linear Koopman step (pure torch).

A GraphCast-style model maps the state x_t on the grid (G points, C variables) to x_{t+1}:

    H_t, Z_t = Enc(x_t, f_{t+1})           grid -> mesh; f = boundary forcing (regional runs)
    H_t'     = P(H_t)                       processor on the multi-scale mesh (M nodes, d)
    x_{t+1}  = x_t + Dec(H_t', Z_t)         mesh -> grid over containing triangles     (G1)

and on a limited area the boundary frame is overwritten with the forcing:
x_{t+1} = mask * x_{t+1} + (1 - mask) * f_{t+1}                                        (G2)

The message-passing baseline (``baselines.py``) uses P = K InteractionNet layers. GraphMet
replaces that stack with one linear Koopman step in the mesh's spectral basis (``koopman.py``,
Eqs. K1-K5): P(H) = H + U (Lambda * (U^T H A) - U^T H A) B, with |Lambda| <= 1 by construction.

Training objective, the same forecast term for every processor:

    L = L_fcst + alpha (L_koop + lambda_geo L_geo)                                      (G3)
    L_fcst = 1/R sum_{n=1..R} sum_g w_g ||x_hat_n,g - x_n,g||^2 / sum_g w_g             (G4)

with area weights w_g (cos latitude on the sphere, 1 on the plane) times the interior mask,
an R-step autoregressive rollout (G1 applied R times), and L_koop, L_geo from Eqs. K6-K7.
Long-range propagation: the one-shot latent rollout H_{t+n} = H_t + U(Lambda^n C_t - C_t) B
(Eq. K5) costs one diagonal multiply per step and member instead of K GNN layers.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from graphmet.koopman import KoopmanProcessor, dirichlet_energy, geometry_loss, koopman_loss
from graphmet.layers import GridDecoder, GridEncoder
from graphmet.mesh import WeatherGraph

STATIC_FEATURES = 4


class GraphBuffers(nn.Module):
    """The graph of a ``WeatherGraph`` as non-persistent tensors (moved with the model)."""

    def __init__(self, graph: WeatherGraph) -> None:
        super().__init__()
        self.num_mesh = len(graph.mesh_pos)
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


def model_inputs(state: torch.Tensor, forcing: torch.Tensor, interior: torch.Tensor):
    """Encoder input [B, G, 2C+1]: state, boundary forcing of the next step, boundary mask."""
    boundary = 1 - interior.expand(*state.shape[:-1], 1)
    return torch.cat([state, forcing * boundary, boundary], -1)


class GraphWeatherModel(nn.Module):
    """Eq. G1-G2 with a pluggable processor: ``KoopmanProcessor`` (GraphMet) or the
    message-passing stack of ``baselines.MessagePassingProcessor``."""

    def __init__(self, channels: int, dim: int, processor: nn.Module) -> None:
        super().__init__()
        self.channels = channels
        self.encoder = GridEncoder(2 * channels + 1, STATIC_FEATURES, dim)
        self.processor = processor
        self.decoder = GridDecoder(dim, channels)
        self.graph: GraphBuffers | None = None

    @property
    def is_koopman(self) -> bool:
        return isinstance(self.processor, KoopmanProcessor)

    def attach_graph(self, graph: WeatherGraph) -> None:
        """Set the mesh and grid graphs (parameters do not depend on their sizes)."""
        device = next(self.parameters()).device
        self.graph = GraphBuffers(graph).to(device)

    def encode(self, state: torch.Tensor, forcing: torch.Tensor):
        """x_t [B, G, C], f_{t+1} [B, G, C] -> mesh latents [B, M, d], grid latents [B, G, d]."""
        return self.encoder(model_inputs(state, forcing, self.graph.interior), self.graph)

    def process(self, mesh: torch.Tensor, perturbation: dict | None = None, keep_layers=False):
        """P(H): returns H' [B, M, d] and the per-layer latents (GNN) or coefficients (Koopman)."""
        if self.is_koopman:
            return self.processor(mesh, self.graph.basis, **(perturbation or {}))
        return self.processor(mesh, self.graph, keep_layers=keep_layers)

    def finish(self, state, mesh, grid, forcing) -> torch.Tensor:
        """Decode the residual and force the boundary frame (Eqs. G1-G2)."""
        following = state + self.decoder(mesh, grid, self.graph)
        inside = self.graph.interior
        return inside * following + (1 - inside) * forcing

    def step(self, state, forcing, perturbation=None) -> tuple[torch.Tensor, dict]:
        """One autoregressive step x_t -> x_{t+1}; also returns the latents for diagnostics."""
        mesh, grid = self.encode(state, forcing)
        processed, extra = self.process(mesh, perturbation)
        return self.finish(state, processed, grid, forcing), {
            "encoded": mesh,
            "processed": processed,
            "extra": extra,
        }

    def rollout(
        self,
        initial: torch.Tensor,  # [B, G, C]
        forcing: torch.Tensor,  # [B, T, G, C] truth (only its boundary frame is used)
        perturbation: dict | None = None,  # Koopman ensembles: noise at the first step
        phase_noise: torch.Tensor | None = None,  # Koopman ensembles: at every step
        diagnostics: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """T autoregressive steps -> forecasts [B, T, G, C] and latent Dirichlet energy [B, T]."""
        state, outputs, energy = initial, [], []
        for t in range(forcing.shape[1]):
            noise = dict(perturbation or {}) if t == 0 else {}
            if phase_noise is not None:
                noise["phase_noise"] = phase_noise
            state, latents = self.step(state, forcing[:, t], noise or None)
            outputs.append(state)
            if diagnostics:
                energy.append(
                    dirichlet_energy(
                        latents["processed"], self.graph.mesh_edges, self.graph.num_mesh
                    )
                )
        return torch.stack(outputs, 1), (torch.stack(energy, 1) if diagnostics else None)

    def rollout_latent(self, initial: torch.Tensor, forcing: torch.Tensor) -> torch.Tensor:
        """Eq. K5, GraphMet only: encode once, propagate C_{t+n} = Lambda^n C_t, decode each
        lead. The boundary frame is still forced from truth at every lead (Eq. G2)."""
        if not self.is_koopman:
            raise TypeError("one-shot latent propagation needs the Koopman processor")
        mesh, grid = self.encode(initial, forcing[:, 0])
        outputs = []
        for n in range(1, forcing.shape[1] + 1):
            processed, _ = self.processor(mesh, self.graph.basis, steps=n)
            outputs.append(self.finish(initial, processed, grid, forcing[:, n - 1]))
        return torch.stack(outputs, 1)


def weighted_mse(prediction: torch.Tensor, target: torch.Tensor, weight: torch.Tensor):
    """Eq. G4's inner term: sum_g w_g (x_hat - x)^2 / sum_g w_g, averaged over the rest.
    prediction, target [..., G, C]; weight [G]."""
    squared = (prediction - target).pow(2).mean(-1)  # [..., G]
    return (squared * weight).sum(-1).mean() / weight.sum()


def training_objective(
    model: GraphWeatherModel,
    window: torch.Tensor,  # [B, R+1, G, C] consecutive states (normalised)
    alpha: float = 0.1,
    lambda_geo: float = 1.0,
) -> dict[str, torch.Tensor]:
    """Eq. G3 over an R-step rollout; for the message-passing baseline only L_fcst."""
    steps = window.shape[1] - 1
    forcing = window[:, 1:]
    state, outputs = window[:, 0], []
    for t in range(steps):
        state, latents = model.step(state, forcing[:, t])
        outputs.append(state)
        if t == 0:
            encoded_now = latents["encoded"]  # E(x_0): its input is the true state
    fcst = weighted_mse(torch.stack(outputs, 1), window[:, 1:], model.graph.loss_weight)
    terms = {"fcst": fcst, "loss": fcst}
    if model.is_koopman:
        processor, basis = model.processor, model.graph.basis
        c_now = processor.coefficients(encoded_now, basis)
        follow = forcing[:, 1] if steps > 1 else forcing[:, 0]
        c_next = processor.coefficients(model.encode(window[:, 1], follow)[0], basis)
        terms["koop"] = koopman_loss(processor.operator, c_now, c_next)
        terms["geo"] = geometry_loss(processor.lift, processor.lower)
        terms["loss"] = fcst + alpha * (terms["koop"] + lambda_geo * terms["geo"])
    return terms
