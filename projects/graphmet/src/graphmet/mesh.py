"""Multi-scale meshes and the grid<->mesh graphs of a GraphCast-style model (numpy + scipy).

Three mesh families, one ``WeatherGraph`` record:

- **Icosahedral multi-mesh** (global, GraphCast): the icosahedron M0 refined r times (each
  triangle split into 4, new vertices projected onto the sphere). Level r has ``10*4^r + 2``
  nodes, ``30*4^r`` edges and ``20*4^r`` faces; the multi-mesh keeps the finest node set and the
  union of the edges of every level, so coarse levels act as long-range shortcuts.
- **Periodic lattice multi-mesh** (the doubly periodic "global" miniature): triangulated n x n
  lattices with strides 1, 2, 4, ... merged onto the finest nodes; ``3*(n/s)^2`` edges per level.
- **Regional multi-scale mesh** (limited area, neural-lam style): the same on a bounded rectangle
  with ``(cx/s+1)(cy/s+1)`` nodes per level; a boundary frame of grid cells is forced from truth.

Grid -> mesh (encoder): every grid point sends to every mesh node within ``0.6 x`` the longest
finest-level mesh edge. Mesh -> grid (decoder): every grid point receives from the 3 vertices of
the finest-level triangle that contains it. The spectral basis of GraphMet is the first m
eigenvectors of the multi-mesh's normalised Laplacian ``L = I - D^-1/2 W D^-1/2`` (or, on the
periodic lattice, its Fourier modes, the exact eigenvectors of any translation-invariant operator).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np
from scipy.sparse import coo_matrix
from scipy.sparse.linalg import eigsh
from scipy.spatial import cKDTree

G2M_RADIUS_FACTOR = 0.6  # GraphCast: grid point -> mesh nodes within 0.6 x longest mesh edge


@dataclass
class WeatherGraph:
    """Everything the encoder, processor and decoder need; arrays are numpy, indices int64."""

    kind: str  # "icosahedral" | "periodic" | "regional"
    grid_pos: np.ndarray  # [G, D] grid point positions (D = 2 planar, 3 on the unit sphere)
    mesh_pos: np.ndarray  # [M, D]
    grid_static: np.ndarray  # [G, 4] static grid features (position encoding)
    mesh_static: np.ndarray  # [M, 4]
    mesh_edges: np.ndarray  # [2, Em] directed (both directions), all levels merged
    mesh_edge_attr: np.ndarray  # [Em, 4] displacement (padded to 3) and length, / longest edge
    g2m_edges: np.ndarray  # [2, Eg] (grid index, mesh index)
    g2m_edge_attr: np.ndarray  # [Eg, 4]
    m2g_edges: np.ndarray  # [2, 3G] (mesh index, grid index), the containing triangle's vertices
    m2g_edge_attr: np.ndarray  # [3G, 4]
    m2g_weights: np.ndarray  # [G, 3] barycentric coordinates of each grid point in its triangle
    basis: np.ndarray  # [M, m] orthonormal spectral basis U (Laplacian eigenvectors or Fourier)
    basis_eigenvalues: np.ndarray  # [m] Laplacian eigenvalue (or |k|^2) of each basis vector
    area_weight: np.ndarray  # [G] mean 1 over the interior
    interior: np.ndarray  # [G] bool: predicted points (False = boundary frame forced from truth)
    level_edge_counts: list[int] = field(default_factory=list)  # undirected edges per level
    # (ny, nx) of the scored interior when it is a rectangle of the row-major grid (planar
    # grids), else None: the spectral loss and R_hi need it.
    interior_shape: tuple[int, int] | None = None


# ----------------------------------------------------------------------------- icosahedron


def icosahedron() -> tuple[np.ndarray, np.ndarray]:
    """M0: 12 unit vertices [12, 3] and 20 faces [20, 3] (counter-clockwise seen from outside)."""
    phi = (1 + 5**0.5) / 2
    v = np.array(
        [[-1, phi, 0], [1, phi, 0], [-1, -phi, 0], [1, -phi, 0], [0, -1, phi], [0, 1, phi]]
        + [[0, -1, -phi], [0, 1, -phi], [phi, 0, -1], [phi, 0, 1], [-phi, 0, -1], [-phi, 0, 1]],
        dtype=np.float64,
    )
    faces = np.array(
        [[0, 11, 5], [0, 5, 1], [0, 1, 7], [0, 7, 10], [0, 10, 11], [1, 5, 9], [5, 11, 4]]
        + [[11, 10, 2], [10, 7, 6], [7, 1, 8], [3, 9, 4], [3, 4, 2], [3, 2, 6], [3, 6, 8]]
        + [[3, 8, 9], [4, 9, 5], [2, 4, 11], [6, 2, 10], [8, 6, 7], [9, 8, 1]]
    )
    return v / np.linalg.norm(v, axis=1, keepdims=True), faces


def subdivide(vertices: np.ndarray, faces: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split each triangle into 4; old vertices keep their indices, midpoints are appended."""
    vertices = list(vertices)
    midpoint: dict[tuple[int, int], int] = {}

    def mid(a: int, b: int) -> int:
        key = (min(a, b), max(a, b))
        if key not in midpoint:
            m = vertices[a] + vertices[b]
            vertices.append(m / np.linalg.norm(m))
            midpoint[key] = len(vertices) - 1
        return midpoint[key]

    new_faces = []
    for a, b, c in faces:
        ab, bc, ca = mid(a, b), mid(b, c), mid(c, a)
        new_faces += [[a, ab, ca], [b, bc, ab], [c, ca, bc], [ab, bc, ca]]
    return np.array(vertices), np.array(new_faces)


def faces_to_edges(faces: np.ndarray) -> np.ndarray:
    """Unique undirected edges [E, 2] (sorted pairs) of a triangle list [F, 3]."""
    pairs = np.concatenate([faces[:, [0, 1]], faces[:, [1, 2]], faces[:, [2, 0]]])
    pairs = np.sort(pairs, axis=1)
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return np.unique(pairs, axis=0)


def icosahedral_multimesh(refinements: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Finest vertices [10*4^r+2, 3] and the faces of every level M0..Mr (finest indices)."""
    vertices, faces = icosahedron()
    levels = [faces]
    for _ in range(refinements):
        vertices, faces = subdivide(vertices, faces)
        levels.append(faces)
    return vertices, levels


# ----------------------------------------------------------------------------- lattices


def lattice_multimesh(
    cells: tuple[int, int], levels: int, periodic: bool
) -> tuple[np.ndarray, list[np.ndarray]]:
    """Triangulated lattice, node (i, j) -> index j*nx + i at integer position (i, j).

    Returns positions [N, 2] in cell units and the triangles of each level (strides 1, 2, 4...).
    Periodic: nx = cx nodes per row; bounded: nx = cx + 1. Cells must divide by 2^(levels-1).
    """
    cx, cy = cells
    stride_max = 2 ** (levels - 1)
    if cx % stride_max or cy % stride_max:
        raise ValueError(f"mesh cells {cells} must be divisible by 2^(levels-1) = {stride_max}")
    if periodic and min(cx, cy) // stride_max < 3:
        raise ValueError(
            f"a periodic coarsest level needs >= 3 cells per side; lower levels ({levels})"
        )
    nx, ny = (cx, cy) if periodic else (cx + 1, cy + 1)
    jj, ii = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    pos = np.stack([ii.ravel(), jj.ravel()], axis=1).astype(np.float64)

    def node(i, j):
        return (j % ny) * nx + (i % nx) if periodic else j * nx + i

    triangles = []
    for level in range(levels):
        s = 2**level
        tris = []
        for j in range(0, cy, s):
            for i in range(0, cx, s):
                a, b, c, d = node(i, j), node(i + s, j), node(i + s, j + s), node(i, j + s)
                tris += [[a, b, c], [a, c, d]]  # the diagonal runs from (i, j) to (i+s, j+s)
        triangles.append(np.array(tris))
    return pos, triangles


# ----------------------------------------------------------------------------- connectivity


def _displacement(src: np.ndarray, dst: np.ndarray, boxsize: np.ndarray | None) -> np.ndarray:
    """dst - src, minimal image on a periodic box."""
    d = dst - src
    if boxsize is not None:
        d = d - boxsize * np.round(d / boxsize)
    return d


def _edge_features(d: np.ndarray, scale: float) -> np.ndarray:
    """[E, 4]: displacement padded to 3 components and its length, divided by ``scale``."""
    d3 = np.zeros((len(d), 3))
    d3[:, : d.shape[1]] = d
    return np.concatenate([d3, np.linalg.norm(d3, axis=1, keepdims=True)], axis=1) / scale


def grid_to_mesh_edges(
    grid_pos: np.ndarray, mesh_pos: np.ndarray, radius: float, boxsize=None
) -> np.ndarray:
    """[2, E] (grid, mesh) pairs closer than ``radius`` (scipy cKDTree; pyg-lib not needed)."""
    tree = cKDTree(mesh_pos, boxsize=boxsize)
    hits = tree.query_ball_point(grid_pos, r=radius)
    src = np.concatenate([np.full(len(h), g) for g, h in enumerate(hits)])
    dst = np.concatenate([np.asarray(h, dtype=np.int64) for h in hits])
    return np.stack([src, dst]).astype(np.int64)


def containing_triangles(
    points: np.ndarray,
    vertices: np.ndarray,
    faces: np.ndarray,
    boxsize: np.ndarray | None = None,
    candidates: int = 12,
) -> tuple[np.ndarray, np.ndarray]:
    """For each point [P, D]: the face [P, 3] that contains it and its barycentric weights [P, 3].

    Planar (D = 2, optionally periodic): solve p = v0 + a(v1 - v0) + b(v2 - v0). On the sphere
    (D = 3): the ray through p meets the face where p = sum_i w_i v_i with all w_i >= 0.
    Candidate faces are the nearest centroids; a point outside every candidate is an error.
    """
    v = vertices[faces]  # [F, 3, D]
    rel = v - v[:, :1]
    if boxsize is not None:
        rel = _displacement(0, rel, boxsize)
    centroids = v[:, 0] + rel.mean(1)
    if boxsize is not None:
        centroids = np.mod(centroids, boxsize)
    k = min(candidates, len(faces))
    _, cand = cKDTree(centroids, boxsize=boxsize).query(points, k=k)  # [P, k]
    tri = v[cand]  # [P, k, 3, D]
    if points.shape[1] == 3:
        w = np.linalg.solve(np.swapaxes(tri, -1, -2), np.repeat(points[:, None], k, 1)[..., None])
        w = w[..., 0]  # [P, k, 3]
        w = w / w.sum(-1, keepdims=True)
    else:
        r = _displacement(points[:, None, None, :], tri, boxsize)  # vertex - point, [P, k, 3, 2]
        m = np.stack([r[:, :, 1] - r[:, :, 0], r[:, :, 2] - r[:, :, 0]], axis=-1)  # [P, k, 2, 2]
        ab = np.linalg.solve(m, -r[:, :, 0][..., None])[..., 0]  # [P, k, 2]
        w = np.concatenate([1 - ab.sum(-1, keepdims=True), ab], axis=-1)
    score = w.min(-1)  # [P, k]
    best = score.argmax(1)
    rows = np.arange(len(points))
    if (score[rows, best] < -1e-8).any():
        raise ValueError("some grid points lie outside every mesh triangle; enlarge the mesh")
    return faces[cand[rows, best]], w[rows, best]


def spectral_basis(edges: np.ndarray, n: int, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """``laplacian_basis``, computed once per mesh and cached on disk (papers_data's cache):
    ``eigsh`` with k = 2048 on the 40,962-node M6 takes long, so later runs, and the other DDP
    ranks (which build their graph after rank 0's ``prepare_data``), read it back."""
    from papers_data import cached_generate

    digest = hashlib.sha1(np.ascontiguousarray(edges, dtype=np.int64).tobytes()).hexdigest()
    config = {"kind": "mesh_basis", "version": 1, "edges": digest, "n": n, "modes": modes}
    if modes > n:
        raise ValueError(f"{modes} spectral modes requested but the mesh has {n} nodes")
    out = cached_generate(
        "graphmet",
        config,
        lambda: dict(
            zip(("eigenvalues", "vectors"), laplacian_basis(edges, n, modes), strict=True)
        ),
    )
    return out["eigenvalues"], out["vectors"]


def laplacian_basis(edges: np.ndarray, n: int, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """First ``modes`` eigenpairs of L = I - D^-1/2 W D^-1/2 of an undirected graph [E, 2]."""
    if modes > n:
        raise ValueError(f"{modes} spectral modes requested but the mesh has {n} nodes")
    w = coo_matrix((np.ones(2 * len(edges)), (edges.ravel(), edges[:, ::-1].ravel())), (n, n))
    d = np.asarray(w.sum(1)).ravel() ** -0.5
    norm_w = coo_matrix((d[w.row] * w.data * d[w.col], (w.row, w.col)), (n, n)).tocsr()
    if n <= 4000:  # dense is exact and fast for the miniature meshes
        vals, vecs = np.linalg.eigh(np.eye(n) - norm_w.toarray())
        return vals[:modes], vecs[:, :modes]
    # Paper-scale meshes (M6: 40,962 nodes): the largest eigenpairs of D^-1/2 W D^-1/2.
    vals, vecs = eigsh(norm_w, k=modes, which="LA")
    order = np.argsort(-vals)
    return 1 - vals[order], vecs[:, order]


def fourier_basis(nx: int, ny: int, modes: int) -> tuple[np.ndarray, np.ndarray]:
    """Real Fourier modes of an nx x ny periodic lattice, (cos, sin) pairs ordered by |k|^2.

    The constant and Nyquist modes are left out, so every pair is a complex exponential; the
    mean passes through the Koopman step unchanged (it lies outside span(U)).
    """
    i, j = np.meshgrid(np.arange(nx), np.arange(ny), indexing="xy")
    x, y = i.ravel() / nx, j.ravel() / ny
    waves = [
        (kx, ky)
        for kx in range(0, nx // 2)
        for ky in range(-(ny // 2) + 1, ny // 2)
        if (kx > 0 or ky > 0)
    ]
    waves.sort(key=lambda k: (k[0] ** 2 + k[1] ** 2, k))
    cols, eig = [], []
    for kx, ky in waves[: (modes + 1) // 2]:
        phase = 2 * np.pi * (kx * x + ky * y)
        cols += [np.cos(phase), np.sin(phase)]
        eig += [kx**2 + ky**2] * 2
    u = np.stack(cols[:modes], axis=1)
    return np.asarray(eig[:modes], dtype=np.float64), u / np.linalg.norm(u, axis=0)


# ----------------------------------------------------------------------------- assembly


def _assemble(
    kind,
    grid_pos,
    mesh_pos,
    level_faces,
    boxsize,
    grid_static,
    mesh_static,
    modes,
    basis_kind,
    area_weight,
    interior,
    lattice_shape=None,
    interior_shape=None,
) -> WeatherGraph:
    level_edges = [faces_to_edges(f) for f in level_faces]
    all_edges = np.unique(np.concatenate(level_edges), axis=0)
    finest = level_edges[0]
    longest = np.linalg.norm(
        _displacement(mesh_pos[finest[:, 0]], mesh_pos[finest[:, 1]], boxsize), axis=1
    ).max()
    directed = np.concatenate([all_edges, all_edges[:, ::-1]]).T  # [2, 2E]
    mesh_attr = _edge_features(
        _displacement(mesh_pos[directed[0]], mesh_pos[directed[1]], boxsize), longest
    )
    g2m = grid_to_mesh_edges(grid_pos, mesh_pos, G2M_RADIUS_FACTOR * longest, boxsize)
    g2m_attr = _edge_features(_displacement(grid_pos[g2m[0]], mesh_pos[g2m[1]], boxsize), longest)
    tri, bary = containing_triangles(grid_pos, mesh_pos, level_faces[0], boxsize)
    m2g = np.stack([tri.ravel(), np.repeat(np.arange(len(grid_pos)), 3)]).astype(np.int64)
    m2g_attr = _edge_features(_displacement(mesh_pos[m2g[0]], grid_pos[m2g[1]], boxsize), longest)
    if basis_kind == "fourier":
        if lattice_shape is None:
            raise ValueError("the Fourier basis exists only on the periodic lattice mesh")
        eig, basis = fourier_basis(*lattice_shape, modes)
    elif basis_kind == "laplacian":
        eig, basis = spectral_basis(all_edges, len(mesh_pos), modes)
    else:
        raise ValueError(f"unknown basis {basis_kind!r}: use 'laplacian' or 'fourier'")
    return WeatherGraph(
        kind=kind,
        grid_pos=grid_pos,
        mesh_pos=mesh_pos,
        grid_static=grid_static.astype(np.float32),
        mesh_static=mesh_static.astype(np.float32),
        mesh_edges=directed.astype(np.int64),
        mesh_edge_attr=mesh_attr.astype(np.float32),
        g2m_edges=g2m,
        g2m_edge_attr=g2m_attr.astype(np.float32),
        m2g_edges=m2g,
        m2g_edge_attr=m2g_attr.astype(np.float32),
        m2g_weights=bary.astype(np.float32),
        basis=basis.astype(np.float32),
        basis_eigenvalues=eig.astype(np.float32),
        area_weight=(area_weight / area_weight[interior].mean()).astype(np.float32),
        interior=interior,
        level_edge_counts=[len(e) for e in level_edges],
        interior_shape=interior_shape,
    )


def _torus_features(pos: np.ndarray, box: np.ndarray) -> np.ndarray:
    a = 2 * np.pi * pos / box
    return np.concatenate([np.sin(a), np.cos(a)], axis=1)


def periodic_graph(
    grid: tuple[int, int], mesh_cells: int, levels: int, modes: int, basis: str = "laplacian"
) -> WeatherGraph:
    """Doubly periodic grid [ny, nx] (row-major) on a torus of side = grid points, with a
    periodic lattice multi-mesh of ``mesh_cells`` cells per side."""
    ny, nx = grid
    box = np.array([nx, ny], dtype=np.float64)
    jj, ii = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    grid_pos = np.stack([ii.ravel() + 0.5, jj.ravel() + 0.5], axis=1)
    lattice, level_faces = lattice_multimesh((mesh_cells, mesh_cells), levels, periodic=True)
    mesh_pos = lattice * box / mesh_cells
    interior = np.ones(len(grid_pos), dtype=bool)
    return _assemble(
        "periodic",
        grid_pos,
        mesh_pos,
        level_faces,
        box,
        _torus_features(grid_pos, box),
        _torus_features(mesh_pos, box),
        modes,
        basis,
        np.ones(len(grid_pos)),
        interior,
        lattice_shape=(mesh_cells, mesh_cells),
        interior_shape=(ny, nx),
    )


def regional_graph(
    grid: tuple[int, int], mesh_stride: int, levels: int, modes: int, boundary: int
) -> WeatherGraph:
    """Limited-area grid [ny, nx] with a bounded multi-scale mesh covering it; the outer
    ``boundary`` rows and columns are forced from truth (not predicted, not scored)."""
    ny, nx = grid
    q = 2 ** (levels - 1)
    cells = tuple(int(q * np.ceil(n / mesh_stride / q)) for n in (nx, ny))
    jj, ii = np.meshgrid(np.arange(ny), np.arange(nx), indexing="ij")
    grid_pos = np.stack([ii.ravel() + 0.5, jj.ravel() + 0.5], axis=1)
    lattice, level_faces = lattice_multimesh(cells, levels, periodic=False)
    mesh_pos = lattice * np.array([nx / cells[0], ny / cells[1]])
    interior = (
        (ii >= boundary) & (ii < nx - boundary) & (jj >= boundary) & (jj < ny - boundary)
    ).ravel()
    scale = np.array([nx, ny], dtype=np.float64)

    def feats(p):
        centred = 2 * p / scale - 1
        return np.concatenate([centred, np.zeros_like(centred)], axis=1)

    return _assemble(
        "regional",
        grid_pos,
        mesh_pos,
        level_faces,
        None,
        feats(grid_pos),
        feats(mesh_pos),
        modes,
        "laplacian",
        np.ones(len(grid_pos)),
        interior,
        interior_shape=(ny - 2 * boundary, nx - 2 * boundary),
    )


def latlon_to_xyz(lat: np.ndarray, lon: np.ndarray) -> np.ndarray:
    """Unit vectors [len(lat)*len(lon), 3] of a lat/lon grid (row-major: lat outer)."""
    la, lo = np.meshgrid(np.deg2rad(lat), np.deg2rad(lon), indexing="ij")
    return np.stack([np.cos(la) * np.cos(lo), np.cos(la) * np.sin(lo), np.sin(la)], -1).reshape(
        -1, 3
    )


def icosahedral_graph(lat: np.ndarray, lon: np.ndarray, refinements: int, modes: int):
    """Global lat/lon grid with the icosahedral multi-mesh M0..Mr; area weight cos(lat)."""
    grid_pos = latlon_to_xyz(lat, lon)
    mesh_pos, level_faces = icosahedral_multimesh(refinements)
    area = np.repeat(np.cos(np.deg2rad(lat)), len(lon)).clip(1e-3)
    pad = np.zeros((len(grid_pos), 1))
    return _assemble(
        "icosahedral",
        grid_pos,
        mesh_pos,
        level_faces[::-1],
        None,
        np.concatenate([grid_pos, pad], 1),
        np.concatenate([mesh_pos, np.zeros((len(mesh_pos), 1))], 1),
        modes,
        "laplacian",
        area,
        np.ones(len(grid_pos), dtype=bool),
    )
