"""GraphCast-style building blocks shared by GraphMet and the baseline (torch + PyG, no I/O).

InteractionNet (Battaglia et al. 2016; GraphCast's processor layer), on a bipartite or a
homogeneous graph with edge latents e_ij, sender latents h_j and receiver latents h_i:

    e_ij' = e_ij + psi([e_ij, h_j, h_i])                                           (IN-e)
    h_i'  = h_i + phi([h_i, sum_j e_ij'])                                          (IN-n)

The encoder applies one InteractionNet on the grid->mesh graph, the decoder one on the
mesh->grid graph (containing-triangle edges) followed by a per-point MLP that predicts the
residual x_{t+1} - x_t. Node tensors are batched [B, N, d]; edge indices [2, E] are shared.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_geometric.nn import MessagePassing


def mlp(d_in: int, d_out: int, hidden: int | None = None, norm: bool = True) -> nn.Sequential:
    """Two-layer SiLU MLP with a closing LayerNorm (GraphCast / neural-lam)."""
    hidden = hidden or d_out
    layers: list[nn.Module] = [nn.Linear(d_in, hidden), nn.SiLU(), nn.Linear(hidden, d_out)]
    if norm:
        layers.append(nn.LayerNorm(d_out))
    return nn.Sequential(*layers)


class InteractionNet(MessagePassing):
    """Eqs. IN-e and IN-n as a PyG MessagePassing layer with sum aggregation.

    The first linear map of psi acts on a concatenation, so it is split into one map per part
    (W [e, h_j, h_i] = W_e e + W_s h_j + W_r h_i): the node parts are computed once per node
    and gathered, not once per edge, which is several times faster on CPUs.
    """

    def __init__(self, dim: int) -> None:
        super().__init__(aggr="sum", node_dim=-2)
        self.edge_in = nn.Linear(dim, dim)
        self.sender_in = nn.Linear(dim, dim, bias=False)
        self.receiver_in = nn.Linear(dim, dim, bias=False)
        self.edge_out = nn.Sequential(nn.SiLU(), nn.Linear(dim, dim), nn.LayerNorm(dim))
        self.node_mlp = mlp(2 * dim, dim)

    def forward(
        self,
        x_src: torch.Tensor,  # [B, Ns, d]
        x_dst: torch.Tensor,  # [B, Nd, d]
        edge_index: torch.Tensor,  # [2, E] (sender, receiver)
        edge_attr: torch.Tensor,  # [B, E, d] or [E, d] (static edges, shared by the batch)
    ) -> tuple[torch.Tensor, torch.Tensor]:
        aggregated, edge_new = self.propagate(
            edge_index,
            x=(self.sender_in(x_src), self.receiver_in(x_dst)),
            edge_attr=edge_attr,
            edge_proj=self.edge_in(edge_attr),
            size=(x_src.shape[-2], x_dst.shape[-2]),
        )
        return x_dst + self.node_mlp(torch.cat([x_dst, aggregated], -1)), edge_new

    def message(self, x_i, x_j, edge_attr, edge_proj):
        # IN-e: e' = e + psi([e, h_j, h_i]); x_j, x_i arrive already projected.
        return edge_attr + self.edge_out(edge_proj + x_j + x_i)  # [B, E, d]

    def aggregate(self, inputs: torch.Tensor, index: torch.Tensor, ptr=None, dim_size=None):
        # Return the updated edges too, so the next layer can use them (as neural-lam does).
        return super().aggregate(inputs, index, ptr=ptr, dim_size=dim_size), inputs


class GridEncoder(nn.Module):
    """Grid -> mesh: embed grid inputs and mesh positions, one InteractionNet on g2m edges."""

    def __init__(
        self, in_features: int, static_features: int, dim: int, mesh_features: int = 4
    ) -> None:
        super().__init__()
        self.grid_embed = mlp(in_features + static_features, dim)
        self.mesh_embed = mlp(mesh_features, dim)
        self.edge_embed = mlp(4, dim)
        self.interaction = InteractionNet(dim)
        self.grid_update = mlp(dim, dim)

    def forward(self, x: torch.Tensor, graph) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, G, F] -> mesh latents [B, M, d], grid latents [B, G, d]."""
        batch = x.shape[0]
        grid_static = graph.grid_static.expand(batch, -1, -1)
        grid = self.grid_embed(torch.cat([x, grid_static], -1))  # [B, G, d]
        mesh = self.mesh_embed(graph.mesh_static).expand(batch, -1, -1)  # [B, M, d]
        edges = self.edge_embed(graph.g2m_edge_attr)  # [Eg, d], shared by the batch
        mesh, _ = self.interaction(grid, mesh, graph.g2m_edges, edges)
        return mesh, grid + self.grid_update(grid)


class GridDecoder(nn.Module):
    """Mesh -> grid over the containing-triangle edges, then the residual head."""

    def __init__(self, dim: int, out_features: int) -> None:
        super().__init__()
        self.edge_embed = mlp(4, dim)
        self.interaction = InteractionNet(dim)
        self.head = mlp(dim, out_features, hidden=dim, norm=False)

    def forward(self, mesh: torch.Tensor, grid: torch.Tensor, graph) -> torch.Tensor:
        """mesh [B, M, d], grid [B, G, d] -> residual [B, G, C]."""
        edges = self.edge_embed(graph.m2g_edge_attr)  # [E, d]
        grid, _ = self.interaction(mesh, grid, graph.m2g_edges, edges)
        return self.head(grid)
