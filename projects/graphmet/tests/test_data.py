import numpy as np
import pytest
import torch

from graphmet.data import DataFormatError, GraphmetDataModule, load_reanalysis
from graphmet.simulate import (
    KolmogorovFlow,
    advect_trajectories,
    coarse_grain,
    energy_and_enstrophy,
    kolmogorov_trajectories,
)
from papers_cli import ConfigError
from papers_data import DATA_ROOT_ENV, DatasetNotFoundError


def test_reanalysis_loader_reads_variables_and_levels(tmp_path, write_fixture):
    lat, lon = np.linspace(-80, 80, 9), np.arange(0, 360, 30.0)
    ds = write_fixture(tmp_path, lat, lon)
    loaded = load_reanalysis(str(tmp_path), ["z@500", "t@850", "t2m"])
    assert loaded["fields"].shape == (8, 3, 9, 12)
    assert loaded["fields"].chunks is not None  # lazy: dask-backed, nothing read yet
    np.testing.assert_allclose(
        loaded["fields"][:, 1].values, ds["t"].sel(level=850).values, rtol=1e-6
    )
    np.testing.assert_allclose(loaded["x"], lon)
    assert loaded["geographic"]


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (["q"], "not in the data"),
        (["z"], "2 levels"),
        (["z@300"], "level 300"),
        (["t2m@500"], "no level"),
    ],
)
def test_reanalysis_loader_rejects_bad_requests(tmp_path, variables, message, write_fixture):
    write_fixture(tmp_path, np.linspace(-80, 80, 5), np.arange(0, 360, 60.0))
    with pytest.raises(DataFormatError, match=message):
        load_reanalysis(str(tmp_path), variables)


def test_missing_real_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatasetNotFoundError, match="nc"):
        load_reanalysis(str(tmp_path), ["z@500"])
    with pytest.raises(DatasetNotFoundError):
        load_reanalysis(None, ["z@500"])


def test_global_fixture_uses_the_icosahedral_mesh_with_standardised_fields(tmp_path, write_fixture):
    write_fixture(tmp_path, np.linspace(-87.5, 87.5, 8), np.arange(0, 360, 30.0), times=10)
    data = GraphmetDataModule(
        source="reanalysis",
        root=str(tmp_path),
        variables=["z@500", "t2m"],
        icosahedral_refinements=1,
        modes=16,
        rollout_steps=1,
        test_fraction=0.2,
    )
    data.setup()
    assert data.graph.kind == "icosahedral" and len(data.graph.mesh_pos) == 42
    # 10 times: 6 train, 2 val, 2 test, in that order.
    assert len(data.train_set) == 5 and data.train_set[0].shape == (2, 96, 2)
    train = torch.stack([data.train_set[i][0] for i in range(5)] + [data.train_set[4][1]])
    torch.testing.assert_close(train.mean((0, 1)), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(train.std((0, 1), unbiased=False), torch.ones(2), atol=1e-4, rtol=0)
    w = data.graph.area_weight.reshape(8, 12)
    assert w[4, 0] > w[0, 0]  # cos(latitude): the equator weighs more than the pole rows


def test_real_regional_file_from_eofs_uses_the_regional_mesh():
    eofs_examples = pytest.importorskip("eofs.examples")
    from pathlib import Path

    folder = Path(eofs_examples.example_data_path("hgt_djf.nc")).parent
    loaded = load_reanalysis(str(folder), ["z@500"], files="hgt_djf.nc")
    assert loaded["fields"].shape[1:] == (1, 29, 49)
    assert loaded["fields"].shape[0] == 65
    data = GraphmetDataModule(
        source="reanalysis",
        root=str(folder),
        files="hgt_djf.nc",
        variables=["z@500"],
        boundary=2,
        mesh_stride=4,
        mesh_levels=2,
        modes=16,
        val_steps=2,
        test_steps=2,
    )
    data.setup()
    assert data.graph.kind == "regional" and data.graph.interior.sum() == 25 * 45


def test_simulators_are_seeded():
    a = kolmogorov_trajectories(1, 3, seed=1, n=16, dt=0.05, substeps=2, spinup=0.5)
    b = kolmogorov_trajectories(1, 3, seed=1, n=16, dt=0.05, substeps=2, spinup=0.5)
    c = kolmogorov_trajectories(1, 3, seed=2, n=16, dt=0.05, substeps=2, spinup=0.5)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)
    np.testing.assert_array_equal(
        advect_trajectories(1, 3, 4, n=16), advect_trajectories(1, 3, 4, n=16)
    )


def test_kolmogorov_conserves_mean_vorticity_and_inviscid_invariants():
    fields = kolmogorov_trajectories(2, 4, seed=0, n=24, dt=0.05, substeps=4, spinup=1.0)
    assert np.abs(fields[:, :, 0].mean((-2, -1))).max() < 1e-4  # the k = 0 mode stays zero
    flow = KolmogorovFlow(n=24, dt=0.01, nu=0, mu=0, nu8=0, forcing_amplitude=0)
    w = flow.random_state(2, torch.Generator().manual_seed(0)).to(torch.complex128)
    flow.e1, flow.e2 = flow.e1.double(), flow.e2.double()
    e0, z0 = energy_and_enstrophy(w, flow.k2)
    for _ in range(50):
        w = flow.step(w)
    e1, z1 = energy_and_enstrophy(w, flow.k2)
    assert torch.allclose(e1, e0, rtol=1e-4) and torch.allclose(z1, z0, rtol=1e-4)


def test_advection_conserves_every_fourier_amplitude():
    fields = advect_trajectories(2, 6, seed=0, n=16)
    amplitude = np.abs(np.fft.fft2(fields[:, :, 0]))
    np.testing.assert_allclose(amplitude[:, -1], amplitude[:, 0], rtol=1e-4, atol=1e-4)
    assert not np.allclose(fields[:, -1], fields[:, 0])


def test_coarse_graining_keeps_large_scales():
    n = 32
    x = np.arange(n) * 2 * np.pi / n
    field = (np.cos(3 * x)[None, :] + np.sin(14 * x)[:, None]).astype(np.float32)
    coarse = coarse_grain(field[None], 16)[0]
    np.testing.assert_allclose(coarse, np.cos(3 * x[::2])[None, :].repeat(16, 0), atol=1e-5)


def test_regional_datamodule_scores_only_the_interior():
    data = GraphmetDataModule(
        native_resolution=24,
        spinup=0.5,
        grid=16,
        boundary=2,
        n_train=1,
        n_val=1,
        n_test=1,
        steps=5,
        modes=16,
        rollout_steps=1,
        val_steps=2,
        mesh_levels=2,
    )
    data.setup()
    assert data.graph.kind == "regional" and data.graph.interior.sum() == 12 * 12
    assert data.trajectories["train"].shape == (1, 5, 256, 2)
    assert len(data.train_set) == 4 and data.train_set[0].shape == (2, 256, 2)
    # s of Eq. G1: the RMS one-step change per variable, below the fields' unit std.
    train = data.trajectories["train"]
    by_hand = (train[:, 1:] - train[:, :-1]).pow(2).mean((0, 1, 2)).sqrt()
    torch.testing.assert_close(data.increment_scale, by_hand)
    assert (data.increment_scale > 0.01).all() and (data.increment_scale < 1).all()
    with pytest.raises(ConfigError, match="domain=periodic"):
        GraphmetDataModule(source="advect", domain="regional")
    with pytest.raises(ConfigError, match="Fourier basis"):
        GraphmetDataModule(basis="fourier")
    with pytest.raises(ConfigError, match="exceeds data.native_resolution"):
        GraphmetDataModule(grid=64)


def _projected_fixture(times=20, ny=10, nx=12, seed=0):
    """A CERRA/MEPS-like regional dataset on projected (y, x) metres: two predicted fields,
    one forcing field over time and one static field."""
    import xarray as xr

    rng = np.random.default_rng(seed)
    y, x = np.arange(ny) * 5500.0, np.arange(nx) * 5500.0 - 3e5
    return xr.Dataset(
        {
            "t2m": (("time", "y", "x"), rng.normal(280, 5, (times, ny, nx))),
            "msl": (("time", "y", "x"), rng.normal(1e5, 300, (times, ny, nx))),
            "toa": (("time", "y", "x"), rng.uniform(0, 1300, (times, ny, nx))),
            "orography": (("y", "x"), rng.uniform(0, 2000, (ny, nx))),
        },
        coords={"time": np.arange(times) * 3.0, "y": y, "x": x},
    )


def _projected_module(root, **kwargs):
    return GraphmetDataModule(
        source="reanalysis",
        root=str(root),
        variables=["t2m", "msl"],
        static_variables=["orography"],
        forcing_variables=["toa"],
        boundary=1,
        mesh_levels=2,
        modes=16,
        rollout_steps=2,
        val_steps=2,
        test_steps=2,
        **kwargs,
    )


def test_zarr_store_on_a_projected_grid_loads_lazily_with_static_and_forcing_fields(tmp_path):
    ds = _projected_fixture()
    ds.to_zarr(tmp_path / "cerra_like.zarr")
    data = _projected_module(tmp_path)
    data.setup()
    assert data.graph.kind == "regional" and len(data.graph.grid_pos) == 120
    assert data.lazy_fields.chunks is not None  # dask-backed: windows are read when batched
    assert data.graph.grid_static.shape == (120, 4 + 1)  # positions + orography
    window = data.train_set[3]  # [3, G, C + F]
    assert window.shape == (3, 120, 3)
    expected = (ds["toa"].values[4] - data.stats["mean"][2]) / data.stats["std"][2]
    np.testing.assert_allclose(window[1, :, 2].numpy(), expected.ravel(), rtol=1e-5, atol=1e-5)


def test_test_split_is_held_out_apart_from_validation(tmp_path):
    ds = _projected_fixture(times=20)
    noise = np.random.default_rng(1).normal(0, 0.01, ds["t2m"].shape)
    ds["t2m"].values[:] = np.arange(20)[:, None, None] + noise
    ds.to_netcdf(tmp_path / "fixture.nc")
    data = _projected_module(tmp_path)
    data.setup()
    # 20 times: train 0-13, val 14-17, test 18-19; windows never cross a split.
    mean, std = data.stats["mean"][0], data.stats["std"][0]
    splits = {"train": data.train_set, "val": data.val_set, "test": data.test_set}
    first_time = {
        name: round(float(part[0][0, 0, 0]) * std + mean) for name, part in splits.items()
    }
    assert first_time == {"train": 0, "val": 14, "test": 18}
    # s of Eq. G1: t2m moves by 1 (raw units) per step, so its RMS change is 1 / std.
    assert float(data.increment_scale[0]) == pytest.approx(1 / std, rel=1e-3)
    last_train = data.train_set[len(data.train_set) - 1]
    assert round(float(last_train[-1, 0, 0]) * std + mean) == 13


def test_mesh_basis_is_computed_once_and_read_back_from_the_cache(monkeypatch):
    from graphmet import mesh

    edges = mesh.faces_to_edges(mesh.lattice_multimesh((4, 4), 1, periodic=True)[1][0])
    first = mesh.spectral_basis(edges, 16, 6)

    def fail(*args):
        raise AssertionError("the basis was recomputed")

    monkeypatch.setattr(mesh, "laplacian_basis", fail)
    again = mesh.spectral_basis(edges, 16, 6)
    np.testing.assert_array_equal(first[1], again[1])
    with pytest.raises(AssertionError, match="recomputed"):
        mesh.spectral_basis(edges, 16, 8)  # another size is another basis
