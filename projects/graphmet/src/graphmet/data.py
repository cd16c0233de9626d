"""Data: a gridded-reanalysis loader (xarray; netCDF or zarr) and the embedded simulators,
behind one DataModule that also builds the mesh and grid graphs.

Real format: one or more netCDF (``*.nc``) files or zarr stores (``*.zarr``) under the data
root with dimensions (time, [level,] latitude, longitude); ``variables`` names the fields, with
``name@level`` picking a level (e.g. ``z@500``). Longitudes spanning the globe use the
icosahedral multi-mesh (area weight cos latitude); a limited area uses the regional mesh with a
boundary frame forced from the data. Fields are standardised per variable with statistics of
the training period (the first ``1 - val_fraction`` of the time axis).

Miniature: ``source=kolmo`` (forced 2-D turbulence, Eq. S1; ``domain=regional`` is a window of
the native field with a forced boundary frame, ``domain=periodic`` the whole torus coarse-grained)
or ``source=advect`` (the exactly linear control, Eq. S2, periodic).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, OpenUnitInterval, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from graphmet.mesh import WeatherGraph, icosahedral_graph, periodic_graph, regional_graph
from graphmet.simulate import advect_trajectories, coarse_grain, kolmogorov_trajectories
from papers_cli import ConfigError
from papers_data import DatasetNotFoundError, cached_generate, resolve_data_root

HOW_TO_GET = (
    "Put netCDF (*.nc) files or zarr stores (*.zarr) with dimensions (time, [level,] latitude, "
    "longitude) there, e.g. an ERA5 subset exported from WeatherBench2 "
    "(gs://weatherbench2/datasets/era5) with xarray's to_netcdf / to_zarr."
)
LAT_NAMES, LON_NAMES = ("latitude", "lat"), ("longitude", "lon")
LEVEL_NAMES = ("level", "pressure", "plev", "isobaricInhPa", "pressure_level")


class DataFormatError(ValueError):
    """The data do not have the variables, dimensions or values this project needs."""

    user_facing = True


def _find_dim(da, names, what):
    for name in names:
        if name in da.dims:
            return name
    raise DataFormatError(f"variable {da.name!r} has no {what} dimension (looked for {names})")


def select_variable(ds, spec: str):
    """``name`` or ``name@level`` -> DataArray (time, lat, lon)."""
    name, _, level = spec.partition("@")
    if name not in ds.data_vars:
        raise DataFormatError(f"variable {name!r} not in the data; found {sorted(ds.data_vars)}")
    da = ds[name]
    level_dims = [d for d in da.dims if d in LEVEL_NAMES]
    if level_dims:
        dim = level_dims[0]
        if level:
            values = np.asarray(da[dim].values, dtype=float)
            if not np.isclose(values, float(level)).any():
                raise DataFormatError(f"level {level} of {name!r} not in {values.tolist()}")
            da = da.sel({dim: values[np.isclose(values, float(level))][0]})
        elif da.sizes[dim] == 1:
            da = da.isel({dim: 0})
        else:
            raise DataFormatError(f"{name!r} has {da.sizes[dim]} levels: write {name}@<level>")
    elif level:
        raise DataFormatError(f"{name!r} has no level dimension, but {spec!r} asks for one")
    lat, lon = _find_dim(da, LAT_NAMES, "latitude"), _find_dim(da, LON_NAMES, "longitude")
    if "time" not in da.dims:
        raise DataFormatError(f"variable {name!r} has no time dimension")
    return da.transpose("time", lat, lon)


def load_reanalysis(
    root: str | None, variables: list[str], files: str = "*"
) -> dict[str, np.ndarray]:
    """Read the fields [T, C, nlat, nlon] and their lat, lon from the files under the data root
    matching ``files`` (a glob; *.nc and *.zarr only), concatenated along time."""
    import xarray as xr

    folder = resolve_data_root(root, "graphmet", ["*.nc or *.zarr"], HOW_TO_GET)
    paths = [p for p in sorted(Path(folder).glob(files)) if p.suffix in (".nc", ".zarr")]
    if not paths:
        raise DatasetNotFoundError(
            "graphmet", Path(folder), ["*.nc or *.zarr"], HOW_TO_GET, missing=["*.nc or *.zarr"]
        )
    datasets = [
        xr.open_zarr(p) if p.suffix == ".zarr" else xr.open_dataset(p, engine="netcdf4")
        for p in paths
    ]
    try:
        ds = datasets[0]
        if len(datasets) > 1:
            ds = xr.concat(datasets, dim="time", join="exact", data_vars="minimal")
    except ValueError as error:
        raise DataFormatError(f"the files under {folder} do not share one grid: {error}") from None
    arrays = [select_variable(ds, spec) for spec in variables]
    fields = np.stack([np.asarray(a.values, dtype=np.float32) for a in arrays], axis=1)
    if not np.isfinite(fields).all():
        raise DataFormatError("the fields contain NaN or infinite values; fill or mask them first")
    if fields.shape[0] < 3:
        raise DataFormatError(f"need at least 3 time steps, found {fields.shape[0]}")
    lat = np.asarray(arrays[0][arrays[0].dims[1]].values, dtype=np.float64)
    lon = np.asarray(arrays[0][arrays[0].dims[2]].values, dtype=np.float64)
    return {"fields": fields, "lat": lat, "lon": lon}


def is_global(lat: np.ndarray, lon: np.ndarray) -> bool:
    """A grid whose longitudes wrap around and whose latitudes reach both polar caps."""
    step = np.abs(np.diff(lon)).mean() if len(lon) > 1 else 360
    return np.ptp(lon) + step >= 359 and np.ptp(lat) >= 150


def normalisation_stats(train_fields: np.ndarray) -> dict[str, np.ndarray]:
    """Per-variable mean and std over time and space of [T, C, ...] training fields."""
    axes = tuple(i for i in range(train_fields.ndim) if i != 1)
    std = train_fields.std(axis=axes)
    if (std == 0).any():
        raise DataFormatError("a variable is constant over the training period")
    return {"mean": train_fields.mean(axis=axes), "std": std}


class WindowDataset(Dataset):
    """Windows of ``length`` consecutive states from trajectories [N, T, G, C]."""

    def __init__(self, trajectories: torch.Tensor, length: int, stride: int = 1) -> None:
        if trajectories.shape[1] < length:
            raise DataFormatError(
                f"trajectories of {trajectories.shape[1]} steps are shorter than a window of "
                f"{length}; lower the rollout length or use longer trajectories"
            )
        self.data, self.length = trajectories, length
        starts = range(0, trajectories.shape[1] - length + 1, stride)
        self.index = [(n, t) for n in range(trajectories.shape[0]) for t in starts]

    def __len__(self) -> int:
        return len(self.index)

    def __getitem__(self, i: int) -> torch.Tensor:
        n, t = self.index[i]
        return self.data[n, t : t + self.length]  # [length, G, C]


def _mesh(build, *args) -> WeatherGraph:
    """Build a graph; its size checks (cells divisible per level, more nodes than modes, ...)
    all fail on a choice of data.* sizes, so they are reported as such."""
    try:
        return build(*args)
    except ValueError as error:
        raise ConfigError(
            f"{error}. The mesh follows data.grid, data.mesh_stride, data.mesh_levels, "
            "data.icosahedral_refinements and data.modes: change them to fit."
        ) from error


class GraphmetDataModule(LightningDataModule):
    def __init__(
        self,
        source: Literal["kolmo", "advect", "reanalysis"] = "kolmo",
        domain: Literal["regional", "periodic"] = "regional",
        root: str | None = None,
        files: str = "*",
        variables: list[str] | None = None,
        native_resolution: PositiveInt = 48,
        spinup: NonNegativeFloat = 10.0,
        grid: PositiveInt = 24,
        boundary: NonNegativeInt = 3,
        n_train: PositiveInt = 12,
        n_val: PositiveInt = 2,
        n_test: PositiveInt = 6,
        steps: PositiveInt = 100,
        val_fraction: OpenUnitInterval = 0.2,
        rollout_steps: PositiveInt = 2,
        val_steps: PositiveInt = 8,
        mesh_stride: PositiveInt = 2,
        mesh_levels: PositiveInt = 3,
        icosahedral_refinements: NonNegativeInt = 3,
        modes: PositiveInt = 64,
        basis: Literal["laplacian", "fourier"] = "laplacian",
        batch_size: PositiveInt = 8,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        simulated = root is None and source != "reanalysis"
        if source == "advect" and domain != "periodic":
            raise ConfigError(
                "the advection control lives on the torus: set --data.domain=periodic"
            )
        if simulated and basis == "fourier" and domain != "periodic":
            raise ConfigError(
                "the Fourier basis exists only on the periodic lattice mesh: set "
                "--data.domain=periodic or --data.basis=laplacian"
            )
        if simulated and source == "kolmo" and domain == "regional" and grid > native_resolution:
            raise ConfigError(
                f"the regional window data.grid={grid} exceeds data.native_resolution="
                f"{native_resolution}; lower the grid or raise the resolution"
            )
        self.save_hyperparameters()
        self.variables = variables or ["vorticity", "streamfunction"]
        self.graph: WeatherGraph | None = None

    # ------------------------------------------------------------------ sources
    def _simulated(self) -> np.ndarray:
        """[N, T, C, ny, nx] from the cached simulator run."""
        h = self.hparams
        n_traj = h.n_train + h.n_val + h.n_test
        if h.source == "advect":
            config = {"kind": "advect", "n_traj": n_traj, "steps": h.steps, "seed": h.seed}
            config["n"] = h.grid
            make = lambda: {"x": advect_trajectories(n_traj, h.steps, h.seed, n=h.grid)}  # noqa: E731
            return cached_generate("graphmet", config, make)["x"].astype(np.float32)
        config = {"kind": "kolmo", "version": 2, "n_traj": n_traj, "steps": h.steps, "seed": h.seed}
        config.update(n=h.native_resolution, dt=0.05, substeps=8, spinup=h.spinup)

        def make():
            sim = kolmogorov_trajectories(
                n_traj, h.steps, h.seed, n=h.native_resolution, dt=0.05, substeps=8, spinup=h.spinup
            )
            return {"x": sim.astype(np.float16)}

        native = cached_generate("graphmet", config, make)["x"].astype(np.float32)
        if h.domain == "regional":
            return native[..., : h.grid, : h.grid]
        return coarse_grain(native, h.grid)

    def setup(self, stage: str | None = None) -> None:
        if self.graph is not None:
            return
        h = self.hparams
        if h.root is not None or h.source == "reanalysis":
            loaded = load_reanalysis(h.root, self.variables, h.files)
            fields = loaded["fields"]  # [T, C, ny, nx]
            n_train_t = int(round(len(fields) * (1 - h.val_fraction)))
            if min(n_train_t, len(fields) - n_train_t) < h.rollout_steps + 1:
                raise ConfigError(
                    f"{len(fields)} time steps are too few to split at data.val_fraction="
                    f"{h.val_fraction} into windows of data.rollout_steps={h.rollout_steps} + 1; "
                    "give more time steps or lower the rollout"
                )
            split = {"train": fields[None, :n_train_t], "val": fields[None, n_train_t:]}
            split["test"] = split["val"]
            lat, lon = loaded["lat"], loaded["lon"]
            if is_global(lat, lon):
                self.graph = _mesh(icosahedral_graph, lat, lon, h.icosahedral_refinements, h.modes)
            else:
                self.graph = _mesh(
                    regional_graph,
                    lat.shape + lon.shape,
                    h.mesh_stride,
                    h.mesh_levels,
                    h.modes,
                    h.boundary,
                )
        else:
            sim = self._simulated()
            a, b = h.n_train, h.n_train + h.n_val
            split = {"train": sim[:a], "val": sim[a:b], "test": sim[b:]}
            if h.domain == "regional":
                self.graph = _mesh(
                    regional_graph,
                    (h.grid, h.grid),
                    h.mesh_stride,
                    h.mesh_levels,
                    h.modes,
                    h.boundary,
                )
            else:
                cells = h.grid // h.mesh_stride
                self.graph = _mesh(
                    periodic_graph, (h.grid, h.grid), cells, h.mesh_levels, h.modes, h.basis
                )
        self.grid_shape = split["train"].shape[-2:]
        self.stats = normalisation_stats(split["train"].reshape(-1, *split["train"].shape[2:]))
        self.trajectories = {k: self._normalise(v) for k, v in split.items()}
        self.climatology = self.trajectories["train"].mean((0, 1))  # [G, C]
        self.train_set = WindowDataset(self.trajectories["train"], h.rollout_steps + 1)
        val_len = min(h.val_steps + 1, self.trajectories["val"].shape[1])
        self.val_set = WindowDataset(self.trajectories["val"], val_len, stride=max(1, val_len))

    def _normalise(self, fields: np.ndarray) -> torch.Tensor:
        """[N, T, C, ny, nx] -> standardised [N, T, G, C] (row-major grid points)."""
        z = (fields - self.stats["mean"][:, None, None]) / self.stats["std"][:, None, None]
        return torch.from_numpy(np.ascontiguousarray(z.reshape(*z.shape[:3], -1).swapaxes(-1, -2)))

    def test_windows(self, length: int, stride: int) -> torch.Tensor:
        """Evaluation windows [S, length, G, C] from the held-out test trajectories."""
        return torch.stack(list(WindowDataset(self.trajectories["test"], length, stride)))

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            shuffle=True,
            num_workers=self.hparams.num_workers,
            drop_last=len(self.train_set) >= self.hparams.batch_size,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )
