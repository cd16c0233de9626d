"""Data: a gridded-reanalysis loader (xarray + dask, lazy; netCDF or zarr) and the embedded
simulators, behind one DataModule that also builds the mesh and grid graphs.

Real format: one or more netCDF (``*.nc``) files or zarr stores (``*.zarr``) under the data
root with dimensions (time, [level,] y, x), where (y, x) is (latitude, longitude) for a
geographic grid or projected (y, x) coordinates for a regional reanalysis (CERRA, MEPS, DANRA
on a Lambert grid). ``variables`` names the predicted fields (``name@level`` picks a level,
e.g. ``z@500``); ``static_variables`` names (y, x) fields appended to the grid's static
features (orography, land-sea mask); ``forcing_variables`` names (time, y, x) fields the model
reads at the target time but does not predict (top-of-atmosphere radiation, ...). Files are
opened lazily with dask chunks of one time step: nothing is read until a training window is,
so a year at 0.25 degrees (~30 GB for five variables) never sits in memory. Longitudes spanning
the globe use the icosahedral multi-mesh (area weight cos latitude); any other grid uses the
regional mesh with a boundary frame forced from the data. The time axis splits into train /
val / test in that order (``val_fraction``, ``test_fraction``); fields are standardised per
variable with statistics of (at most ``stats_samples`` times of) the training period.

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
from papers_data import (
    DatasetNotFoundError,
    EpochShuffle,
    cached_generate,
    drawn_by_trainer,
    resolve_data_root,
)

HOW_TO_GET = (
    "Put netCDF (*.nc) files or zarr stores (*.zarr) with dimensions (time, [level,] latitude, "
    "longitude) or (time, [level,] y, x) there, e.g. an ERA5 subset exported from WeatherBench2 "
    "(gs://weatherbench2/datasets/era5) with xarray's to_netcdf / to_zarr, or a CERRA/MEPS/DANRA "
    "region on its projected grid."
)
LAT_NAMES, LON_NAMES = ("latitude", "lat"), ("longitude", "lon")
Y_NAMES, X_NAMES = (
    ("y", "projection_y_coordinate", "rlat"),
    ("x", "projection_x_coordinate", "rlon"),
)
LEVEL_NAMES = ("level", "pressure", "plev", "isobaricInhPa", "pressure_level")


class DataFormatError(ValueError):
    """The data do not have the variables, dimensions or values this project needs."""

    user_facing = True


def _find_dim(da, names, what):
    for name in names:
        if name in da.dims:
            return name
    raise DataFormatError(f"variable {da.name!r} has no {what} dimension (looked for {names})")


def spatial_dims(da) -> tuple[str, str, bool]:
    """(y dim, x dim, geographic?) of a field: latitude/longitude, else projected y/x."""
    if any(n in da.dims for n in LAT_NAMES) and any(n in da.dims for n in LON_NAMES):
        return _find_dim(da, LAT_NAMES, "latitude"), _find_dim(da, LON_NAMES, "longitude"), True
    if any(n in da.dims for n in Y_NAMES) and any(n in da.dims for n in X_NAMES):
        return _find_dim(da, Y_NAMES, "y"), _find_dim(da, X_NAMES, "x"), False
    raise DataFormatError(
        f"variable {da.name!r} has neither latitude/longitude {LAT_NAMES + LON_NAMES} nor "
        f"projected y/x {Y_NAMES + X_NAMES} dimensions; found {da.dims}"
    )


def select_variable(ds, spec: str, timed: bool = True):
    """``name`` or ``name@level`` -> lazy DataArray (time, y, x), or (y, x) when not ``timed``."""
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
    y, x, _ = spatial_dims(da)
    if not timed:
        if "time" in da.dims:
            if da.sizes["time"] != 1:
                raise DataFormatError(f"static variable {name!r} changes over time")
            da = da.isel(time=0)
        return da.transpose(y, x)
    if "time" not in da.dims:
        raise DataFormatError(f"variable {name!r} has no time dimension")
    return da.transpose("time", y, x)


def open_reanalysis(root: str | None, files: str = "*"):
    """The files under the data root matching ``files`` (a glob; *.nc and *.zarr only), opened
    lazily (dask chunks of one time step) and concatenated along time."""
    import xarray as xr

    folder = resolve_data_root(root, "graphmet", ["*.nc or *.zarr"], HOW_TO_GET)
    paths = [p for p in sorted(Path(folder).glob(files)) if p.suffix in (".nc", ".zarr")]
    if not paths:
        raise DatasetNotFoundError(
            "graphmet", Path(folder), ["*.nc or *.zarr"], HOW_TO_GET, missing=["*.nc or *.zarr"]
        )
    datasets = [
        xr.open_zarr(p, chunks={"time": 1})
        if p.suffix == ".zarr"
        else xr.open_dataset(p, engine="netcdf4", chunks={"time": 1})
        for p in paths
    ]
    try:
        ds = datasets[0]
        if len(datasets) > 1:
            ds = xr.concat(datasets, dim="time", join="exact", data_vars="minimal")
    except ValueError as error:
        raise DataFormatError(f"the files under {folder} do not share one grid: {error}") from None
    return ds


def load_reanalysis(
    root: str | None,
    variables: list[str],
    files: str = "*",
    static_variables: list[str] | None = None,
    forcing_variables: list[str] | None = None,
) -> dict:
    """The predicted fields and forcings as one lazy (dask) DataArray [T, C + F, ny, nx],
    the static fields [S, ny, nx] (read now: they are small), the coordinates and whether the
    grid is geographic."""
    import xarray as xr

    ds = open_reanalysis(root, files)
    timed = [select_variable(ds, spec) for spec in [*variables, *(forcing_variables or [])]]
    y, x, geographic = spatial_dims(timed[0])
    timed = [
        a.rename({a.dims[1]: "y", a.dims[2]: "x"}).drop_vars(
            [c for c in a.coords if c not in ("time",)], errors="ignore"
        )
        for a in timed
    ]
    fields = xr.concat(timed, dim="channel", coords="minimal", compat="override")
    fields = fields.transpose("time", "channel", "y", "x")
    if fields.sizes["time"] < 3:
        raise DataFormatError(f"need at least 3 time steps, found {fields.sizes['time']}")
    static = [
        np.asarray(select_variable(ds, s, timed=False).values, np.float32)
        for s in static_variables or []
    ]
    static = np.stack(static) if static else np.zeros((0, *fields.shape[2:]), np.float32)
    if not np.isfinite(static).all():
        raise DataFormatError("the static fields contain NaN or infinite values")
    return {
        "fields": fields,
        "static": static,
        "y": np.asarray(ds[y].values, dtype=np.float64),
        "x": np.asarray(ds[x].values, dtype=np.float64),
        "geographic": geographic,
    }


def is_global(lat: np.ndarray, lon: np.ndarray) -> bool:
    """A grid whose longitudes wrap around and whose latitudes reach both polar caps."""
    step = np.abs(np.diff(lon)).mean() if len(lon) > 1 else 360
    return np.ptp(lon) + step >= 359 and np.ptp(lat) >= 150


def normalisation_stats(train_fields) -> dict[str, np.ndarray]:
    """Per-variable mean and std over time and space of [T, C, ...] training fields (numpy, or a
    lazy DataArray: then computed with dask)."""
    axes = tuple(i for i in range(train_fields.ndim) if i != 1)
    mean, std = train_fields.mean(axis=axes), train_fields.std(axis=axes)
    mean, std = (np.asarray(getattr(v, "values", v), dtype=np.float32) for v in (mean, std))
    if not (np.isfinite(mean).all() and np.isfinite(std).all()):
        raise DataFormatError("the fields contain NaN or infinite values; fill or mask them first")
    if (std == 0).any():
        raise DataFormatError("a variable is constant over the training period")
    return {"mean": mean, "std": std}


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


class LazyWindowDataset(Dataset):
    """Windows of ``length`` consecutive states of a lazy [T, C, ny, nx] DataArray, read and
    standardised one window at a time -> [length, G, C] (row-major grid points)."""

    def __init__(self, fields, starts: range, length: int, mean, std) -> None:
        self.fields, self.starts, self.length = fields, list(starts), length
        self.mean = np.asarray(mean, np.float32)[:, None, None]
        self.std = np.asarray(std, np.float32)[:, None, None]

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i: int) -> torch.Tensor:
        t = self.starts[i]
        values = np.asarray(self.fields[t : t + self.length].values, dtype=np.float32)
        if not np.isfinite(values).all():
            raise DataFormatError(f"the fields contain NaN or infinite values near time {t}")
        z = (values - self.mean) / self.std  # [L, C, ny, nx]
        return torch.from_numpy(np.ascontiguousarray(z.reshape(*z.shape[:2], -1).swapaxes(-1, -2)))


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
        static_variables: list[str] | None = None,
        forcing_variables: list[str] | None = None,
        native_resolution: PositiveInt = 48,
        spinup: NonNegativeFloat = 10.0,
        substeps: PositiveInt = 4,
        grid: PositiveInt = 16,
        boundary: NonNegativeInt = 2,
        n_train: PositiveInt = 48,
        n_val: PositiveInt = 4,
        n_test: PositiveInt = 8,
        steps: PositiveInt = 64,
        val_fraction: OpenUnitInterval = 0.2,
        test_fraction: OpenUnitInterval = 0.1,
        stats_samples: PositiveInt = 256,
        rollout_steps: PositiveInt = 3,
        val_steps: PositiveInt = 8,
        test_steps: PositiveInt = 8,
        mesh_stride: PositiveInt = 1,
        mesh_levels: PositiveInt = 3,
        icosahedral_refinements: NonNegativeInt = 3,
        modes: PositiveInt = 128,
        basis: Literal["laplacian", "fourier"] = "laplacian",
        batch_size: PositiveInt = 8,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt = 0,
    ) -> None:
        """``rollout_steps``: states per training window minus one (the forecast loss uses
        model.forecast_steps of them, the Koopman loss all); ``val_steps`` / ``test_steps``:
        rollout length of the validation / test metrics; ``static_variables`` and
        ``forcing_variables``: real data only (see the module docstring)."""
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
        if not simulated and basis == "fourier":
            raise ConfigError(
                "the Fourier basis exists only on the miniature's periodic lattice: real data use "
                "--data.basis=laplacian"
            )
        if simulated and (static_variables or forcing_variables):
            raise ConfigError(
                "data.static_variables and data.forcing_variables need real data (data.root)"
            )
        if val_fraction + test_fraction >= 1:
            raise ConfigError(
                f"data.val_fraction={val_fraction} + data.test_fraction={test_fraction} leave no "
                "training period; lower them"
            )
        self.save_hyperparameters()
        self.variables = variables or ["vorticity", "streamfunction"]
        self.graph: WeatherGraph | None = None

    @property
    def real(self) -> bool:
        return self.hparams.root is not None or self.hparams.source == "reanalysis"

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
        config.update(n=h.native_resolution, dt=0.05, substeps=h.substeps, spinup=h.spinup)

        def make():
            sim = kolmogorov_trajectories(
                n_traj,
                h.steps,
                h.seed,
                n=h.native_resolution,
                dt=0.05,
                substeps=h.substeps,
                spinup=h.spinup,
            )
            return {"x": sim.astype(np.float16)}

        native = cached_generate("graphmet", config, make)["x"].astype(np.float32)
        if h.domain == "regional":
            return native[..., : h.grid, : h.grid]
        return coarse_grain(native, h.grid)

    def _build_graph(self, shape: tuple[int, int], static=None, geo=None) -> WeatherGraph:
        """The mesh and grid graphs (the Laplacian basis is cached on disk, so rank 0 computes
        it in ``prepare_data`` and every later call reads it)."""
        h = self.hparams
        if geo is not None and is_global(*geo):
            graph = _mesh(icosahedral_graph, *geo, h.icosahedral_refinements, h.modes)
        elif h.domain == "periodic" and not self.real:
            cells = shape[1] // h.mesh_stride
            graph = _mesh(periodic_graph, shape, cells, h.mesh_levels, h.modes, h.basis)
        else:
            graph = _mesh(regional_graph, shape, h.mesh_stride, h.mesh_levels, h.modes, h.boundary)
        if static is not None and len(static):
            # Static fields, standardised, join the grid's position features.
            flat = static.reshape(len(static), -1).T  # [G, S]
            flat = (flat - flat.mean(0)) / np.where(flat.std(0) > 0, flat.std(0), 1)
            graph.grid_static = np.concatenate([graph.grid_static, flat], 1).astype(np.float32)
        return graph

    def prepare_data(self) -> None:
        """Rank 0 only (Lightning): simulate, or compute the mesh basis, once into the cache."""
        if self.real:
            loaded = load_reanalysis(self.hparams.root, self.variables, self.hparams.files)
            fields = loaded["fields"]
            geo = (loaded["y"], loaded["x"]) if loaded["geographic"] else None
            self._build_graph(tuple(fields.shape[2:]), None, geo)
        else:
            self._simulated()

    def setup(self, stage: str | None = None) -> None:
        if self.graph is not None:
            return
        if self.real:
            self._setup_real()
        else:
            self._setup_simulated()

    def _setup_simulated(self) -> None:
        h = self.hparams
        sim = self._simulated()
        a, b = h.n_train, h.n_train + h.n_val
        split = {"train": sim[:a], "val": sim[a:b], "test": sim[b:]}
        self.graph = self._build_graph(tuple(sim.shape[-2:]))
        self.grid_shape = split["train"].shape[-2:]
        self.stats = normalisation_stats(split["train"].reshape(-1, *split["train"].shape[2:]))
        self.trajectories = {k: self._normalise(v) for k, v in split.items()}
        self.climatology = self.trajectories["train"].mean((0, 1))  # [G, C]
        change = self.trajectories["train"].diff(dim=1)  # [N, T-1, G, C]
        self.increment_scale = change.pow(2).mean((0, 1, 2)).sqrt()  # s of Eq. G1 [C]
        self.train_set = WindowDataset(self.trajectories["train"], h.rollout_steps + 1)
        val_len = min(h.val_steps + 1, self.trajectories["val"].shape[1])
        self.val_set = WindowDataset(self.trajectories["val"], val_len, stride=max(1, val_len))
        test_len = min(h.test_steps + 1, self.trajectories["test"].shape[1])
        self.test_set = WindowDataset(self.trajectories["test"], test_len, stride=test_len)

    def _setup_real(self) -> None:
        """Lazy: only statistics (from at most ``stats_samples`` training times), the
        climatology and the graph are computed now; windows are read when batched."""
        h = self.hparams
        loaded = load_reanalysis(
            h.root, self.variables, h.files, h.static_variables, h.forcing_variables
        )
        fields = loaded["fields"]  # lazy [T, C + F, ny, nx]
        total = fields.shape[0]
        n_test = int(round(total * h.test_fraction))
        n_val = int(round(total * h.val_fraction))
        n_train = total - n_val - n_test
        bounds = {"train": (0, n_train), "val": (n_train, n_train + n_val)}
        bounds["test"] = (n_train + n_val, total)
        lengths = {"train": h.rollout_steps + 1, "val": h.val_steps + 1, "test": h.test_steps + 1}
        for name, (a, b) in bounds.items():
            if b - a < min(lengths[name], 2 if name != "train" else 3):
                raise ConfigError(
                    f"{total} time steps split at data.val_fraction={h.val_fraction} and "
                    f"data.test_fraction={h.test_fraction} leave {b - a} for {name}: too few for "
                    "its windows; give more time steps or change the fractions"
                )
        sample = np.unique(np.linspace(0, n_train - 1, min(n_train, h.stats_samples)).round())
        train_sample = fields.isel(time=sample.astype(int))
        self.stats = normalisation_stats(train_sample)
        geo = (loaded["y"], loaded["x"]) if loaded["geographic"] else None
        self.graph = self._build_graph(tuple(fields.shape[2:]), loaded["static"], geo)
        self.grid_shape = tuple(fields.shape[2:])
        mean, std = self.stats["mean"], self.stats["std"]
        clim = np.asarray(train_sample.mean("time").values, np.float32) - mean[:, None, None]
        clim = clim / std[:, None, None]
        self.climatology = torch.from_numpy(clim.reshape(len(clim), -1).T.copy())  # [G, C + F]
        # s of Eq. G1: the RMS one-step change of each predicted variable (standardised) over
        # the sampled training times that have a successor in the training period.
        channels, starts = len(self.variables), sample[sample < n_train - 1].astype(int)
        now = fields.isel(time=starts).data[:, :channels]
        later = fields.isel(time=starts + 1).data[:, :channels]
        rms = np.sqrt(np.asarray(((later - now) ** 2).mean(axis=(0, 2, 3)), np.float64))
        scale = (rms / std[:channels]).astype(np.float32)
        self.increment_scale = torch.from_numpy(np.where(scale > 0, scale, 1.0))
        self.windows = {}
        for name, (a, b) in bounds.items():
            part = fields.isel(time=slice(a, b))
            length = min(lengths[name], b - a)
            stride = 1 if name == "train" else length
            starts = range(0, b - a - length + 1, stride)
            self.windows[name] = LazyWindowDataset(part, starts, length, mean, std)
        self.train_set, self.val_set = self.windows["train"], self.windows["val"]
        self.test_set = self.windows["test"]
        self.lazy_fields = fields

    def _normalise(self, fields: np.ndarray) -> torch.Tensor:
        """[N, T, C, ny, nx] -> standardised [N, T, G, C] (row-major grid points)."""
        z = (fields - self.stats["mean"][:, None, None]) / self.stats["std"][:, None, None]
        return torch.from_numpy(np.ascontiguousarray(z.reshape(*z.shape[:3], -1).swapaxes(-1, -2)))

    def test_windows(self, length: int, stride: int, split: str = "test") -> torch.Tensor:
        """Evaluation windows [S, length, G, C] from the held-out test (or val) trajectories
        (simulated data)."""
        return torch.stack(list(WindowDataset(self.trajectories[split], length, stride)))

    def train_dataloader(self) -> DataLoader:
        # An order fixed by (seed, optimizer steps): a resumed run reads the same batches.
        n, batch = len(self.train_set), self.hparams.batch_size
        drop_last = n >= batch
        return DataLoader(
            self.train_set,
            batch_size=batch,
            sampler=EpochShuffle(n, self.hparams.seed, drawn_by_trainer(self, n, batch, drop_last)),
            num_workers=self.hparams.num_workers,
            drop_last=drop_last,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(
            self.val_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )

    def test_dataloader(self) -> DataLoader:
        return DataLoader(
            self.test_set, batch_size=self.hparams.batch_size, num_workers=self.hparams.num_workers
        )
