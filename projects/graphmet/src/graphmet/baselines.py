"""Baselines with the same encoder, decoder and mesh as GraphMet (``core.GraphWeatherModel``).

- ``MessagePassingProcessor``: the GraphCast / neural-lam processor, K unshared InteractionNet
  layers (Eqs. IN-e, IN-n in ``layers.py``) on the multi-mesh. K is the depth swept in the
  claim experiment; the latents after every layer feed the smoothing diagnostic.
- ``persistence`` and ``climatology``: the references of the activity metric (persistence keeps
  all activity and no skill gain; climatology has zero activity).
- ``initial_condition_ensemble``: perturbed initial states, the ensemble scheme any processor
  can use (GraphMet's cheaper spectral scheme lives in ``cli.forecast_ensemble``).
"""

from __future__ import annotations

import torch
from torch import nn

from graphmet.layers import InteractionNet, mlp


class MessagePassingProcessor(nn.Module):
    """K unshared InteractionNets on the multi-mesh, residual on nodes and edges."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        if depth < 1:
            raise ValueError(f"the message-passing processor needs depth >= 1, got {depth}")
        self.edge_embed = mlp(4, dim)
        self.layers = nn.ModuleList(InteractionNet(dim) for _ in range(depth))

    def forward(self, mesh: torch.Tensor, graph):
        """mesh [B, M, d] -> ([B, M, d], None): the second slot is the Koopman processor's C_t."""
        edges = self.edge_embed(graph.mesh_edge_attr)  # [E, d]; [B, E, d] after layer 1
        for layer in self.layers:
            mesh, edges = layer(mesh, mesh, graph.mesh_edges, edges)
        return mesh, None


def persistence(initial: torch.Tensor, steps: int) -> torch.Tensor:
    """x_hat_{t+n} = x_t: [B, G, C] -> [B, T, G, C]."""
    return initial[:, None].expand(-1, steps, -1, -1)


def climatology(climate_mean: torch.Tensor, batch: int, steps: int) -> torch.Tensor:
    """x_hat = the training-period mean state [G, C] at every lead -> [B, T, G, C]."""
    return climate_mean.expand(batch, steps, -1, -1)


def initial_condition_ensemble(
    initial: torch.Tensor, members: int, amplitude: float, generator: torch.Generator
) -> torch.Tensor:
    """Members [B*M, G, C] (member-major within each sample): x_0 + amplitude * white noise
    in normalised units (the fields are standardised per variable)."""
    repeated = initial.repeat_interleave(members, 0)
    noise = torch.randn(repeated.shape, generator=generator).to(initial)
    return repeated + amplitude * noise
