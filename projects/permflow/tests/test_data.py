"""Data generators (ambiguity, SLAP), the MNIST IDX path and input validation."""

import gzip
import itertools
import struct

import numpy as np
import pytest
from scipy.optimize import linear_sum_assignment

from papers_cli import ConfigError
from papers_data import DatasetNotFoundError
from permflow.data import (
    MNIST_FILES,
    PermutationDataModule,
    generate_slap,
    load_image_pools,
    load_slap,
    make_sorting_sequences,
    permutation_cycles,
    save_slap,
    validate_costs,
)

LABELS = np.repeat(np.arange(10), 5)  # a toy pool: 5 images per class


def valid_orders_by_brute_force(value_a: np.ndarray, value_b: np.ndarray) -> set[tuple]:
    """Every rank assignment that sorts the items under some reading of the blended item."""
    n, found = len(value_a), set()
    readings = {tuple(value_a), tuple(value_b)}
    for ranks in itertools.permutations(range(n)):
        order = np.argsort(ranks)  # items listed from rank 0 upwards
        for values in readings:
            if all(values[order[r]] < values[order[r + 1]] for r in range(n - 1)):
                found.add(ranks)
    return found


@pytest.mark.parametrize("n", [3, 5, 7])
def test_ambiguous_sequences_have_exactly_two_valid_orders(n):
    seqs = make_sorting_sequences(LABELS, n, 200, ambiguous_fraction=0.5, seed=n)
    assert 60 < (seqs["num_valid"] == 2).sum() < 140
    for s in range(200):
        a, b = seqs["value_a"][s], seqs["value_b"][s]
        orders = valid_orders_by_brute_force(a, b)
        k = seqs["num_valid"][s]
        assert len(orders) == k
        assert orders == {tuple(p) for p in seqs["optima"][s][:k]}
        assert len(set(a.tolist())) == n  # no ties among clean values
        if k == 2:  # the two orders are adjacent-rank transposes
            first, second = seqs["optima"][s]
            assert (first != second).sum() == 2
            assert abs(first - second).max() == 1
            blended = np.flatnonzero(seqs["idx_a"][s] != seqs["idx_b"][s])
            assert len(blended) == 1
            assert LABELS[seqs["idx_a"][s][blended[0]]] < LABELS[seqs["idx_b"][s][blended[0]]]


def test_sequences_are_seeded():
    one = make_sorting_sequences(LABELS, 5, 50, 0.5, seed=3)
    two = make_sorting_sequences(LABELS, 5, 50, 0.5, seed=3)
    other = make_sorting_sequences(LABELS, 5, 50, 0.5, seed=4)
    assert all(np.array_equal(one[k], two[k]) for k in one)
    assert not np.array_equal(one["idx_a"], other["idx_a"])


def test_sorting_rejects_bad_lengths_and_incomplete_pools():
    with pytest.raises(ValueError, match="sequence length"):
        make_sorting_sequences(LABELS, 11, 5, 0.5, seed=0)
    with pytest.raises(ValueError, match="every digit class"):
        make_sorting_sequences(LABELS[LABELS != 3], 5, 5, 0.5, seed=0)


def brute_force_optima(cost: np.ndarray) -> set[tuple]:
    costs = {p: cost[np.arange(len(p)), p].sum() for p in itertools.permutations(range(len(cost)))}
    best = min(costs.values())
    return {p for p, c in costs.items() if c <= best + 1e-6}


@pytest.mark.parametrize("n", [4, 6])
def test_slap_instances_have_exactly_the_two_optima_pi_and_its_inverse(n):
    data = generate_slap(30, n, seed=0)
    assert data["C"].dtype == np.float32 and data["optima"].dtype == np.int16
    for cost, (pi, pi_inv) in zip(data["C"], data["optima"], strict=True):
        assert np.allclose(cost, cost.T)
        assert brute_force_optima(cost.astype(np.float64)) == {tuple(pi), tuple(pi_inv)}
        assert np.array_equal(pi[pi_inv], np.arange(n))
        assert sum(len(c) >= 3 for c in permutation_cycles(pi)) == 1


def test_slap_is_seeded_and_round_trips_through_npz(tmp_path):
    data = generate_slap(20, 8, seed=5)
    assert all(np.array_equal(data[k], generate_slap(20, 8, seed=5)[k]) for k in data)
    path = tmp_path / "slap.npz"
    save_slap(path, data)
    loaded = load_slap(path, n=8)
    assert all(np.array_equal(data[k], loaded[k]) for k in data)
    for cost, (pi, _) in zip(loaded["C"], loaded["optima"], strict=True):
        _, cols = linear_sum_assignment(cost.astype(np.float64))
        assert cost[np.arange(8), cols].sum() == pytest.approx(cost[np.arange(8), pi].sum())


def test_bad_cost_matrices_give_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="square"):
        validate_costs(np.zeros((3, 4, 5)))
    nan_costs = np.zeros((2, 4, 4))
    nan_costs[1, 0, 0] = np.nan
    with pytest.raises(ConfigError, match="NaN"):
        validate_costs(nan_costs)
    path = tmp_path / "slap6.npz"
    save_slap(path, generate_slap(4, 6, seed=0))
    with pytest.raises(ConfigError, match="model expects n=8"):
        load_slap(path, n=8)


def write_idx(path, array: np.ndarray) -> None:
    """Real IDX bytes: 0x00 0x00 dtype(0x08=ubyte) ndim, big-endian int32 dims, data; gzipped."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def test_idx_files_under_the_data_root_are_parsed(tmp_path):
    rng = np.random.default_rng(0)
    images = {split: rng.integers(0, 256, (30, 28, 28)) for split in ("train", "test")}
    labels = {split: np.tile(np.arange(10), 3) for split in ("train", "test")}
    write_idx(tmp_path / MNIST_FILES["train_images"], images["train"])
    write_idx(tmp_path / MNIST_FILES["train_labels"], labels["train"])
    write_idx(tmp_path / MNIST_FILES["test_images"], images["test"])
    write_idx(tmp_path / MNIST_FILES["test_labels"], labels["test"])
    train_x, train_y, test_x, test_y = load_image_pools("idx", str(tmp_path), 28, seed=0)
    assert train_x.shape == (30, 1, 28, 28) and test_x.shape == (30, 1, 28, 28)
    assert np.allclose(train_x[:, 0].numpy() * 255, images["train"], atol=1e-3)
    assert np.array_equal(test_y, labels["test"])
    small = load_image_pools("idx", str(tmp_path), 14, seed=0)[0]
    assert small.shape == (30, 1, 14, 14)


def test_missing_data_root_raises_dataset_not_found(tmp_path, monkeypatch):
    monkeypatch.delenv("PAPERS_DATA_ROOT", raising=False)
    with pytest.raises(DatasetNotFoundError):
        load_image_pools("idx", None, 14, seed=0)
    with pytest.raises(DatasetNotFoundError, match="train-images-idx3-ubyte"):
        load_image_pools("idx", str(tmp_path), 14, seed=0)


def test_bundled_mnist_pools_are_disjoint_and_sequences_well_formed():
    dm = PermutationDataModule(n=5, num_train=64, num_val=16, num_test=32, batch_size=16)
    dm.setup()
    train, test = dm.splits["train"], dm.splits["test"]
    flat = train.images.flatten(1)
    assert train.images.shape[1:] == (1, 14, 14) and flat.min() >= 0 and flat.max() <= 1
    train_rows = {row.numpy().tobytes() for row in flat}
    assert not any(row.numpy().tobytes() in train_rows for row in test.images.flatten(1))
    batch = next(iter(dm.train_dataloader()))
    assert batch["condition"].shape == (16, 5, 1, 14, 14)
    assert batch["optima"].shape == (16, 2, 5)


def test_datamodule_rejects_sequences_longer_than_the_digits_allow():
    """n = 10 holds every digit once: possible without blends, impossible with them (the old
    sampler looped forever there)."""
    PermutationDataModule(n=10, ambiguous_fraction=0.0)
    PermutationDataModule(task="slap", n=12)
    with pytest.raises(ConfigError, match="use n <= 9"):
        PermutationDataModule(n=10, ambiguous_fraction=0.5)
    with pytest.raises(ValueError, match="sequence length"):
        make_sorting_sequences(LABELS, 10, 5, 1.0, seed=0)


@pytest.mark.parametrize(("n", "digits"), [(5, 2), (6, 3)])
def test_multi_digit_sequences_have_exactly_two_valid_orders(n, digits):
    labels = np.repeat(np.arange(10), 3)
    seqs = make_sorting_sequences(labels, n, 60, ambiguous_fraction=0.5, seed=1, digits=digits)
    assert seqs["idx_a"].shape == (60, n, digits)
    assert seqs["value_a"].max() < 10**digits and seqs["value_a"].max() >= 10 ** (digits - 1)
    for s in range(60):
        a, b = seqs["value_a"][s], seqs["value_b"][s]
        orders = valid_orders_by_brute_force(a, b)
        k = seqs["num_valid"][s]
        assert len(orders) == k == len(set(orders))
        assert orders == {tuple(p) for p in seqs["optima"][s][:k]}
        for item in range(n):  # each digit image shows its digit; a blend differs in one digit
            shown_a = [labels[i] for i in seqs["idx_a"][s, item]]
            shown_b = [labels[i] for i in seqs["idx_b"][s, item]]
            assert shown_a == [int(d) for d in str(a[item]).zfill(digits)]
            assert shown_b == [int(d) for d in str(b[item]).zfill(digits)]
            assert sum(x != y for x, y in zip(shown_a, shown_b, strict=True)) <= 1


def test_multi_digit_numbers_allow_ambiguity_beyond_nine_items():
    dm = PermutationDataModule(n=12, digits=2, num_train=32, num_val=8, num_test=8, batch_size=8)
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["condition"].shape == (8, 12, 1, 14, 28)  # two digits side by side
    from permflow.model import PermutationModel

    model = PermutationModel(n=12, digits=2, width=16, image_dim=16, channels=(4, 8))
    assert model.training_loss(batch).isfinite()
    with pytest.raises(ConfigError, match="use n <= 99"):
        PermutationDataModule(n=100, digits=2)
