import numpy as np
import pytest

from graphmet.mesh import (
    containing_triangles,
    faces_to_edges,
    icosahedral_graph,
    icosahedral_multimesh,
    lattice_multimesh,
    periodic_graph,
    regional_graph,
)


@pytest.mark.parametrize("r", [0, 1, 2, 3])
def test_icosahedral_counts_per_level(r):
    vertices, levels = icosahedral_multimesh(r)
    assert len(vertices) == 10 * 4**r + 2
    for level, faces in enumerate(levels):
        assert len(faces) == 20 * 4**level
        assert len(faces_to_edges(faces)) == 30 * 4**level
    np.testing.assert_allclose(np.linalg.norm(vertices, axis=1), 1.0)


def test_multimesh_merges_every_level_without_duplicates():
    graph = icosahedral_graph(np.linspace(-80, 80, 9), np.arange(0, 360, 30.0), 2, 16)
    assert graph.level_edge_counts == [480, 120, 30]
    assert graph.mesh_edges.shape[1] == 2 * sum(graph.level_edge_counts)


def test_lattice_counts_per_level():
    _, periodic = lattice_multimesh((12, 12), 3, periodic=True)
    assert [len(faces_to_edges(f)) for f in periodic] == [3 * 144, 3 * 36, 3 * 9]
    pos, bounded = lattice_multimesh((8, 4), 2, periodic=False)
    assert len(pos) == 9 * 5
    assert [len(faces_to_edges(f)) for f in bounded] == [
        8 * 5 + 4 * 9 + 32,
        4 * 3 + 2 * 5 + 8,
    ]


@pytest.mark.parametrize(
    "graph",
    [
        periodic_graph((16, 16), 8, 2, 32),
        regional_graph((20, 12), 2, 2, 32, 2),
        icosahedral_graph(np.linspace(-87.5, 87.5, 12), np.arange(0, 360, 15.0), 2, 32),
    ],
    ids=["periodic", "regional", "icosahedral"],
)
def test_every_grid_point_is_connected_both_ways(graph):
    n_grid = len(graph.grid_pos)
    assert set(np.unique(graph.g2m_edges[0])) == set(range(n_grid))
    assert np.array_equal(np.bincount(graph.m2g_edges[1], minlength=n_grid), np.full(n_grid, 3))
    assert (graph.m2g_weights >= -1e-6).all()
    np.testing.assert_allclose(graph.m2g_weights.sum(1), 1, atol=1e-5)
    np.testing.assert_allclose(graph.basis.T @ graph.basis, np.eye(32), atol=1e-4)


def test_mesh_to_grid_uses_the_containing_triangle():
    # Planar: barycentric weights reproduce the point; a point's triangle holds it.
    pos, levels = lattice_multimesh((4, 4), 1, periodic=False)
    points = np.array([[0.25, 0.1], [3.9, 3.2], [1.5, 2.5]])
    faces, w = containing_triangles(points, pos, levels[0])
    np.testing.assert_allclose((w[:, :, None] * pos[faces]).sum(1), points, atol=1e-12)
    assert set(faces[0]) == {0, 1, 6}  # below the diagonal of cell (0, 0)
    # Sphere: the ray through each grid point passes through its triangle.
    graph = icosahedral_graph(np.array([-60.0, 0.0, 45.0]), np.array([10.0, 200.0]), 1, 8)
    tri = graph.m2g_edges[0].reshape(-1, 3)
    rebuilt = (graph.m2g_weights[:, :, None] * graph.mesh_pos[tri]).sum(1)
    rebuilt /= np.linalg.norm(rebuilt, axis=1, keepdims=True)
    np.testing.assert_allclose(rebuilt, graph.grid_pos, atol=1e-5)


def test_laplacian_spectrum_on_the_icosphere_has_harmonic_multiplicities():
    graph = icosahedral_graph(np.array([0.0]), np.array([0.0]), 3, 16)
    groups = np.split(graph.basis_eigenvalues, [1, 4, 9])[:3]
    for group in groups:  # degenerate like l = 0, 1, 2 spherical harmonics (2l + 1)
        assert np.ptp(group) < 1e-4
    assert graph.basis_eigenvalues[0] == pytest.approx(0, abs=1e-5)
    assert (np.diff([g.mean() for g in groups]) > 1e-3).all()


def test_regional_boundary_frame_is_not_scored():
    graph = regional_graph((12, 12), 2, 2, 16, boundary=3)
    assert graph.interior.sum() == 36
    mask = graph.interior.reshape(12, 12)
    assert not mask[:3].any() and not mask[:, -3:].any() and mask[3:9, 3:9].all()


def test_bad_mesh_sizes_are_rejected():
    with pytest.raises(ValueError, match="divisible"):
        lattice_multimesh((6, 6), 3, periodic=True)
    with pytest.raises(ValueError, match=">= 3 cells"):
        lattice_multimesh((8, 8), 3, periodic=True)
