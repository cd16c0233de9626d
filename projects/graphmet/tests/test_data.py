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
    np.testing.assert_allclose(loaded["fields"][:, 1], ds["t"].sel(level=850).values, rtol=1e-6)
    np.testing.assert_allclose(loaded["lon"], lon)


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
    )
    data.setup()
    assert data.graph.kind == "icosahedral" and len(data.graph.mesh_pos) == 42
    train = data.trajectories["train"]  # [1, 8, G, 2]
    assert train.shape == (1, 8, 96, 2)
    torch.testing.assert_close(train.mean((0, 1, 2)), torch.zeros(2), atol=1e-4, rtol=0)
    torch.testing.assert_close(
        train.std((0, 1, 2), unbiased=False), torch.ones(2), atol=1e-4, rtol=0
    )
    w = data.graph.area_weight.reshape(8, 12)
    assert w[4, 0] > w[0, 0]  # cos(latitude): the equator weighs more than the pole rows


def test_real_regional_file_from_eofs_uses_the_regional_mesh():
    eofs_examples = pytest.importorskip("eofs.examples")
    from pathlib import Path

    folder = Path(eofs_examples.example_data_path("hgt_djf.nc")).parent
    loaded = load_reanalysis(str(folder), ["z@500"], files="hgt_djf.nc")
    assert loaded["fields"].shape[1:] == (1, 29, 49)
    data = GraphmetDataModule(
        source="reanalysis",
        root=str(folder),
        files="hgt_djf.nc",
        variables=["z@500"],
        boundary=2,
        mesh_stride=4,
        mesh_levels=2,
        modes=16,
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
    with pytest.raises(ConfigError, match="domain=periodic"):
        GraphmetDataModule(source="advect", domain="regional")
    with pytest.raises(ConfigError, match="Fourier basis"):
        GraphmetDataModule(basis="fourier")
    with pytest.raises(ConfigError, match="exceeds data.native_resolution"):
        GraphmetDataModule(grid=64)
