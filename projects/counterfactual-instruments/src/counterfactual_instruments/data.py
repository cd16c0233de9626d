"""Data: the Multimodal Universe loader (paper scale) and the GalSim miniature behind one
DataModule.

Real format: ``<root>/legacysurvey/**/*.hdf5`` and ``<root>/hsc/**/*.hdf5`` (mmu.py). The
miniature (simulate.py, named as simulated) is rendered once per configuration and cached, so
`uv run train`'s budget includes the first render (about 25 s on one core for 2,500 galaxies).

Every item is a dict: image_X, ivar_X, mask_X, neighbour_X, cond_X for X in A, B (images divided
by ``flux_scale``, inverse variances multiplied by its square, so chi-square is unchanged), and
in the miniature ``params`` (the intrinsic parameters); test items of the miniature also carry
their partner's B observation (partner_image_B, partner_cond_B, partner_ivar_B) and truth_B,
galaxy i noise-free under the partner's B condition. Parameters and conditions are standardised
with the training split's mean and standard deviation.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from counterfactual_instruments.mmu import load_pairs
from counterfactual_instruments.simulate import HSC_LIKE, LEGACY_LIKE, PARAMS, simulate_pairs
from papers_cli import ConfigError
from papers_data import EpochShuffle, cached_generate, drawn_by_trainer, resolve_data_root
from papers_gpu import run_seed

HOW_TO_GET = (
    "put Multimodal Universe cutouts there: Legacy Surveys DR10 south under <root>/legacysurvey/ "
    "and HSC PDR3 under <root>/hsc/ (the healpix=*/ folders of *.hdf5 files as MMU publishes "
    "them; see the project README, 'Paper scale')"
)
Band = Literal["u", "g", "r", "i", "z", "y"]  # matched to a file's DES-G, HSC-G, G, ... by letter
SIM_VERSION = 3  # bump when simulate.py changes what it renders (the cache key)


class PairDataset(Dataset):
    """Row i of every array, as a dict of tensors."""

    def __init__(self, arrays: dict[str, np.ndarray]) -> None:
        self.arrays = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        self.size = len(next(iter(self.arrays.values())))

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.arrays.items()}


def derangement(n: int, rng: np.random.Generator) -> np.ndarray:
    """A permutation with no fixed point (the shuffled-pairs control's pairing)."""
    return (np.arange(n) + rng.integers(1, n)) % n if n > 1 else np.zeros(1, dtype=np.int64)


class CounterfactualInstrumentsDataModule(LightningDataModule):
    """Train / validation / test pairs of the real surveys (``root``) or of the miniature.

    ``seed`` fixes the miniature's galaxies, conditions and noise; by default it is the run's
    ``seed_everything``. ``neighbour``: what the miniature's instrument latent reads, a star
    (default) or another galaxy under the same condition (real data: mmu.py's rule).
    ``shuffle_pairs`` (the negative control) re-pairs the training and
    validation B views with other galaxies' (test pairs stay true).
    """

    def __init__(
        self,
        root: str | None = None,
        n_train: PositiveInt = 1500,
        n_val: PositiveInt = 400,
        n_test: PositiveInt = 600,
        bands_a: list[Band] = ["g", "r", "z"],  # noqa: B006 (jsonargparse reads the default)
        bands_b: list[Band] = ["g", "r", "i", "z", "y"],  # noqa: B006
        size_a: PositiveInt = 16,
        size_b: PositiveInt = 24,
        flux_scale: PositiveFloat = 10.0,
        match_radius_arcsec: PositiveFloat = 1.0,
        neighbour: Literal["star", "galaxy"] = "star",
        shuffle_pairs: bool = False,
        probe_variables: list[str] = [],  # noqa: B006 (jsonargparse reads the default)
        batch_size: PositiveInt = 64,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.n_params = probe_target_count(probe_variables)

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        seed = self.seed = run_seed() if h.seed is None else h.seed
        n = h.n_train + h.n_val + h.n_test
        if h.root is not None:
            folder = resolve_data_root(h.root, "counterfactual-instruments", [], HOW_TO_GET)
            arrays = load_pairs(
                folder,
                h.bands_a,
                h.bands_b,
                h.size_a,
                h.size_b,
                h.match_radius_arcsec,
                h.probe_variables,
            )
            for x in ("A", "B"):
                arrays[f"cond_{x}"] = np.nan_to_num(arrays[f"cond_{x}"])
        else:
            if h.probe_variables:
                raise ConfigError(
                    "--data.probe_variables names catalogue columns of real data (--data.root); "
                    f"the miniature's probe targets are its simulator parameters {list(PARAMS)}"
                )
            self._check_miniature_shape()
            config = {"n": n, "seed": seed, "n_truth": h.n_test, "version": SIM_VERSION}
            config["neighbour"] = h.neighbour
            arrays = cached_generate(
                "counterfactual-instruments",
                config,
                lambda: simulate_pairs(n, seed, h.n_test, h.neighbour),
            )
            arrays = dict(arrays)
            for x in ("A", "B"):
                sigma = arrays[f"cond_{x}"][:, 1]
                arrays[f"ivar_{x}"] = np.broadcast_to(
                    (1.0 / sigma**2)[:, None, None, None], arrays[f"image_{x}"].shape
                ).astype(np.float32)
                arrays[f"mask_{x}"] = np.ones_like(arrays[f"image_{x}"])
        available = len(arrays["image_A"])
        if available < n:
            raise ConfigError(
                f"the data hold {available} pairs, fewer than n_train + n_val + n_test = {n}"
            )
        self.raw = arrays  # unscaled, for the evaluation's shape measurements
        splits = np.split(np.arange(n), [h.n_train, h.n_train + h.n_val])
        self.train_set, self.val_set, self.test_set = (
            PairDataset(self._items(arrays, idx, name, seed))
            for idx, name in zip(splits, ("train", "val", "test"), strict=True)
        )

    def _check_miniature_shape(self) -> None:
        h = self.hparams
        wanted = (LEGACY_LIKE.size, HSC_LIKE.size, list(LEGACY_LIKE.bands), list(HSC_LIKE.bands))
        if (h.size_a, h.size_b, list(h.bands_a), list(h.bands_b)) != wanted:
            raise ConfigError(
                f"the miniature renders A at {LEGACY_LIKE.size} px in {LEGACY_LIKE.bands} and B at "
                f"{HSC_LIKE.size} px in {HSC_LIKE.bands}; size_*/bands_* only apply to real data"
            )

    def _items(self, arrays, idx: np.ndarray, split: str, seed: int) -> dict[str, np.ndarray]:
        h = self.hparams
        n_train = h.n_train
        scale = h.flux_scale
        items: dict[str, np.ndarray] = {}
        b_rows = idx
        if h.shuffle_pairs and split != "test":
            b_rows = idx[derangement(len(idx), np.random.default_rng(seed + 7919))]
        for x, rows in (("A", idx), ("B", b_rows)):
            items[f"image_{x}"] = arrays[f"image_{x}"][rows] / scale
            items[f"ivar_{x}"] = arrays[f"ivar_{x}"][rows] * scale**2
            items[f"mask_{x}"] = arrays[f"mask_{x}"][rows]
            items[f"neighbour_{x}"] = arrays[f"neighbour_{x}"][rows] / scale
            items[f"cond_{x}"] = standardise(arrays[f"cond_{x}"], n_train)[rows]
        if "params" in arrays:
            items["params"] = standardise(arrays["params"], n_train)[idx]
        if split == "test" and "truth_B" in arrays:
            partner = arrays["partner"][idx]
            items["truth_B"] = arrays["truth_B"][idx] / scale
            items["partner_image_B"] = arrays["image_B"][partner] / scale
            items["partner_neighbour_B"] = arrays["neighbour_B"][partner] / scale
            items["partner_ivar_B"] = arrays["ivar_B"][partner] * scale**2
            items["partner_cond_B"] = standardise(arrays["cond_B"], n_train)[partner]
            items["partner"] = partner - idx[0]  # an index into the test split
        return {
            k: np.asarray(v, dtype=np.int64 if k == "partner" else np.float32)
            for k, v in items.items()
        }

    def train_dataloader(self) -> DataLoader:
        # A shuffle keyed on the items drawn so far, so a resumed run reads the uninterrupted
        # run's batches (EpochShuffle's third argument is that position, not the epoch).
        n = len(self.train_set)
        order = EpochShuffle(n, self.seed, drawn_by_trainer(self, n, self.hparams.batch_size))
        return self._loader(self.train_set, sampler=order)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def _loader(self, dataset, sampler=None) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
        )


def probe_target_count(targets: list[str]) -> int:
    """How many quantities the probes (and the oracle's intrinsic latent) hold: the catalogue
    columns named for real data, else the miniature's simulator parameters."""
    return len(targets) if targets else len(PARAMS)


def standardise(values: np.ndarray, n_train: int) -> np.ndarray:
    """Columns centred and scaled with the first ``n_train`` rows' mean and standard deviation."""
    mean, std = values[:n_train].mean(0), values[:n_train].std(0)
    return ((values - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)
