import numpy as np
import pytest

from tcwm.data import DataFormatError, TcwmDataModule, generate_miniature, load_real
from papers_cli import ConfigError
from papers_data import DATA_ROOT_ENV, DatasetNotFoundError


def test_real_format_loader_parses_a_fixture(tmp_path):
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.savez(tmp_path / "data.npz", x=x, y=np.ones(4, np.float32))
    loaded_x, loaded_y = load_real(str(tmp_path), in_features=3)
    np.testing.assert_array_equal(loaded_x, x)
    assert loaded_y.shape == (4,)


def test_missing_real_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatasetNotFoundError, match="data.npz"):
        load_real(str(tmp_path), in_features=3)


@pytest.mark.parametrize(
    ("x", "y", "message"),
    [
        (np.zeros((4, 2)), np.zeros(4), "in_features"),
        (np.zeros((4, 3)), np.zeros(5), "expected x"),
        (np.full((4, 3), np.nan), np.zeros(4), "NaN"),
    ],
)
def test_bad_data_is_rejected(tmp_path, x, y, message):
    np.savez(tmp_path / "data.npz", x=x, y=y)
    with pytest.raises(DataFormatError, match=message):
        load_real(str(tmp_path), in_features=3)


def test_generator_is_seeded():
    a, b = generate_miniature(8, 3, 0.1, seed=1), generate_miniature(8, 3, 0.1, seed=1)
    np.testing.assert_array_equal(a["x"], b["x"])  # same call, same seed: bit for bit
    np.testing.assert_allclose(a["y"], a["x"] @ a["w"], atol=0.5)  # y = w.x + small noise
    assert not np.array_equal(a["x"], generate_miniature(8, 3, 0.1, seed=2)["x"])


def test_datamodule_splits_are_disjoint_and_sized():
    data = TcwmDataModule(n_train=40, n_val=10, n_test=20, in_features=3, seed=0)
    data.setup()
    assert [len(s) for s in (data.train_set, data.val_set, data.test_set)] == [40, 10, 20]
    splits = (data.train_set, data.val_set, data.test_set)
    assert len({tuple(x.tolist()) for s in splits for x in s.tensors[0]}) == 70


def test_too_few_rows_for_the_splits_is_a_clear_error(tmp_path):
    np.savez(tmp_path / "data.npz", x=np.zeros((10, 3), np.float32), y=np.zeros(10, np.float32))
    data = TcwmDataModule(root=str(tmp_path), n_train=8, n_val=4, n_test=4, in_features=3)
    with pytest.raises(ConfigError, match="fewer than"):
        data.setup()
