"""The real-format loaders parse fixtures written here; the miniature's split is seeded."""

import gzip
import pickle
import struct

import numpy as np
import pytest

from lrrf.data import LrrfDataModule, check_images, load_cifar, load_mnist


def write_cifar(root, which: str, n: int = 20) -> np.ndarray:
    """Pickles in the published structure (bytes keys, uint8 [N, 3072] row-major RGB planes)."""
    rng = np.random.default_rng(0)
    folder = root / ("cifar-10-batches-py" if which == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    if which == "cifar100":
        names = ["train", "test"]
    label_key = b"labels" if which == "cifar10" else b"fine_labels"
    first = None
    for name in names:
        data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10 if which == "cifar10" else 100, size=n).tolist()
        record = {b"data": data, label_key: labels, b"batch_label": b"x"}
        if which == "cifar100":
            record[b"coarse_labels"] = [0] * n
        with open(folder / name, "wb") as f:
            pickle.dump(record, f, protocol=2)
        first = (data, labels) if first is None else first
    return first


def test_cifar10_pickle_with_bytes_keys_and_rgb_planes(tmp_path):
    data, labels = write_cifar(tmp_path, "cifar10")
    (train_x, train_y), (test_x, test_y) = load_cifar(str(tmp_path), "cifar10")
    assert train_x.shape == (100, 3, 32, 32) and test_x.shape == (20, 3, 32, 32)
    # row-major planes: the first 1024 bytes are the red plane of image 0, row by row
    assert train_x[0, 0, 0, 1] == pytest.approx(data[0, 1] / 255)
    assert train_x[0, 0, 1, 0] == pytest.approx(data[0, 32] / 255)
    assert train_x[0, 1, 0, 0] == pytest.approx(data[0, 1024] / 255)
    assert train_x[0, 2, 31, 31] == pytest.approx(data[0, 3071] / 255)
    assert train_y[:20].tolist() == labels and train_x.min() >= 0 and train_x.max() <= 1


def test_cifar100_reads_fine_labels(tmp_path):
    _, labels = write_cifar(tmp_path, "cifar100")
    (train_x, train_y), _ = load_cifar(str(tmp_path), "cifar100")
    assert train_y.tolist() == labels and train_x.shape == (20, 3, 32, 32)
    assert max(labels) > 10  # the fine labels, not the coarse zeros


def write_idx(path, array: np.ndarray, gz: bool) -> None:
    code = 0x08
    header = struct.pack(">BBBB", 0, 0, code, array.ndim) + struct.pack(
        f">{array.ndim}I", *array.shape
    )
    payload = header + array.astype(">u1").tobytes()
    opener = gzip.open if gz else open
    with opener(str(path) + (".gz" if gz else ""), "wb") as f:
        f.write(payload)


@pytest.mark.parametrize("gz", [True, False], ids=["gzipped", "plain"])
def test_mnist_idx_big_endian_headers(tmp_path, gz):
    rng = np.random.default_rng(1)
    # 300 = 0x012C: a header read little-endian would give 0x2C010000
    images = rng.integers(0, 256, size=(300, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=300, dtype=np.uint8)
    write_idx(tmp_path / "train-images-idx3-ubyte", images, gz)
    write_idx(tmp_path / "train-labels-idx1-ubyte", labels, gz)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", images[:50], gz)
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels[:50], gz)
    (train_x, train_y), (test_x, test_y) = load_mnist(str(tmp_path))
    assert train_x.shape == (300, 1, 28, 28) and test_x.shape == (50, 1, 28, 28)
    assert np.array_equal(train_y, labels) and train_x[5, 0, 3, 4] == pytest.approx(
        images[5, 3, 4] / 255
    )


def test_the_data_module_reads_real_cifar(tmp_path):
    write_cifar(tmp_path, "cifar10")
    data = LrrfDataModule(dataset="cifar10", root=str(tmp_path), n_val=10, seed=0)
    data.setup("fit")
    assert len(data.train_set) == 90 and len(data.val_set) == 10 and len(data.test_set) == 20


def test_the_miniature_split_is_seeded_and_disjoint():
    a = LrrfDataModule(seed=0)
    a.setup("fit")
    b = LrrfDataModule(seed=0)
    b.setup("fit")
    c = LrrfDataModule(seed=1)
    c.setup("fit")
    assert np.array_equal(a.test_set.tensors[0].numpy(), b.test_set.tensors[0].numpy())
    assert not np.array_equal(a.test_set.tensors[0].numpy(), c.test_set.tensors[0].numpy())
    assert len(a.train_set) + len(a.val_set) + len(a.test_set) == 1797
    assert len(a.val_set) == 200 and len(a.test_set) == 497
    x = a.train_set.tensors[0]
    assert x.shape[1:] == (1, 8, 8) and x.min() >= 0 and x.max() <= 1


def test_images_outside_the_unit_interval_are_refused():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        check_images(np.full((2, 1, 8, 8), 2.0, np.float32), np.zeros(2), "x")
