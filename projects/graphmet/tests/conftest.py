import numpy as np
import pytest
import torch


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on a shared 2-core machine (one thread: see cli.CPU_THREADS); generated data
    are cached in the test's own folder."""
    torch.set_num_threads(1)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, tiny simulator, few steps."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=6",
        "--trainer.val_check_interval=6",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
        "--data.source=advect",
        "--data.domain=periodic",
        "--data.basis=fourier",
        "--data.grid=16",
        "--data.boundary=0",
        "--data.n_train=2",
        "--data.n_val=1",
        "--data.n_test=1",
        "--data.steps=12",
        "--data.val_steps=3",
        "--data.test_steps=3",
        "--data.rollout_steps=2",
        "--data.modes=32",
        "--data.mesh_levels=2",
        "--data.batch_size=4",
        "--model.dim=16",
        "--model.rank=8",
    ]


def _write_fixture(folder, lat, lon, times=8, seed=0):
    """A reanalysis-like netCDF file: z and t on two pressure levels, t2m at the surface."""
    import xarray as xr

    rng = np.random.default_rng(seed)
    shape = (times, 2, len(lat), len(lon))
    dims = ("time", "level", "latitude", "longitude")
    ds = xr.Dataset(
        {
            "z": (dims, rng.normal(5e4, 100, shape)),
            "t": (dims, rng.normal(250, 5, shape)),
            "t2m": (("time", "latitude", "longitude"), rng.normal(280, 8, shape[:1] + shape[2:])),
        },
        coords={
            "time": np.arange(times) * 6.0,
            "level": [500, 850],
            "latitude": lat,
            "longitude": lon,
        },
    )
    folder.mkdir(parents=True, exist_ok=True)
    ds.to_netcdf(folder / "fixture.nc")
    return ds


@pytest.fixture
def write_fixture():
    """Writes a small netCDF reanalysis fixture into a folder; returns the xarray Dataset."""
    return _write_fixture
