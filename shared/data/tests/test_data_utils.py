import numpy as np
import pytest
import torch

from papers_data import (
    DATA_ROOT_ENV,
    DatasetNotFoundError,
    cached_generate,
    config_hash,
    load_mnist_5k,
    load_sklearn_digits,
    read_idx,
    require_files,
    resolve_data_root,
    seeded_split,
    write_idx,
)


def test_data_root_from_argument_then_environment(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    assert resolve_data_root(tmp_path, "mnist") == tmp_path
    (tmp_path / "mnist").mkdir()
    monkeypatch.setenv(DATA_ROOT_ENV, str(tmp_path))
    assert resolve_data_root(None, "mnist") == tmp_path / "mnist"


def test_missing_root_error_says_what_to_do(monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatasetNotFoundError) as info:
        resolve_data_root(None, "mnist", expected=["train-images-idx3-ubyte.gz"], how_to_get="X")
    message = str(info.value)
    assert "--data.root" in message and DATA_ROOT_ENV in message
    assert "train-images-idx3-ubyte.gz" in message and "synthetic" in message
    assert info.value.user_facing


def test_require_files_lists_the_missing_ones(tmp_path):
    (tmp_path / "a.bin").write_bytes(b"x")
    with pytest.raises(DatasetNotFoundError, match="Missing: b.bin"):
        require_files(tmp_path, "demo", ["a.bin", "b.bin"])
    assert require_files(tmp_path, "demo", ["a.bin"]) == {"a.bin": tmp_path / "a.bin"}


@pytest.mark.parametrize("name", ["images-idx3-ubyte", "images-idx3-ubyte.gz"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32])
def test_idx_round_trip(tmp_path, name, dtype):
    array = (np.arange(2 * 3 * 4) * 7 % 251).astype(dtype).reshape(2, 3, 4)
    path = write_idx(tmp_path / name, array)
    back = read_idx(path)
    assert back.shape == (2, 3, 4) and back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back, array)


def test_idx_reader_parses_hand_written_mnist_header(tmp_path):
    # The header as the MNIST page documents it: magic 0x00000803, then 3 big-endian dims.
    payload = bytes(range(2 * 2 * 3))
    raw = bytes([0, 0, 8, 3]) + (2).to_bytes(4, "big") + (2).to_bytes(4, "big")
    raw += (3).to_bytes(4, "big") + payload
    (tmp_path / "f").write_bytes(raw)
    np.testing.assert_array_equal(read_idx(tmp_path / "f").ravel(), np.arange(12))


def test_idx_reader_rejects_bad_files(tmp_path):
    (tmp_path / "bad").write_bytes(b"PK\x03\x04junk")
    with pytest.raises(ValueError, match="not an IDX file"):
        read_idx(tmp_path / "bad")
    write_idx(tmp_path / "short", np.zeros((4, 4), np.uint8))
    (tmp_path / "short").write_bytes((tmp_path / "short").read_bytes()[:-3])
    with pytest.raises(ValueError, match="truncated"):
        read_idx(tmp_path / "short")


def test_seeded_split_is_disjoint_and_deterministic():
    a = seeded_split(100, (0.7, 0.2), seed=3)
    b = seeded_split(100, (0.7, 0.2), seed=3)
    assert [len(p) for p in a] == [70, 20]
    assert not set(a[0]) & set(a[1])
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[0], seeded_split(100, (0.7, 0.2), seed=4)[0])
    with pytest.raises(ValueError):
        seeded_split(10, (0.8, 0.5), seed=0)


def test_cached_generate_calls_the_generator_once_per_config(tmp_path):
    calls = []

    def generate():
        calls.append(1)
        return {"x": np.arange(5) * len(calls)}

    first = cached_generate("toy", {"n": 5, "seed": 0}, generate, tmp_path)
    again = cached_generate("toy", {"seed": 0, "n": 5}, generate, tmp_path)
    other = cached_generate("toy", {"n": 5, "seed": 1}, generate, tmp_path)
    assert len(calls) == 2
    np.testing.assert_array_equal(first["x"], again["x"])
    assert not np.array_equal(first["x"], other["x"])
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})
    assert not list((tmp_path / "toy").glob("*.tmp.npz"))


def test_bundled_mnist_5k_is_real_and_balanced():
    images, labels = load_mnist_5k()
    assert images.shape == (5000, 28, 28) and images.dtype == np.uint8
    assert np.bincount(labels).tolist() == [500] * 10
    assert images.max() == 255 and 0.08 < (images > 127).mean() < 0.2  # strokes, mostly background


def test_bundled_sklearn_digits():
    images, labels = load_sklearn_digits()
    assert images.shape == (1797, 8, 8) and images.min() >= 0.0 and images.max() <= 1.0
    assert set(labels.tolist()) == set(range(10))


def test_epoch_shuffle_is_a_seeded_stream_read_from_the_consumed_position():
    from papers_data import EpochShuffle

    position = {"now": 0}
    order = EpochShuffle(10, seed=3, consumed=lambda: position["now"])
    first = list(order)
    assert sorted(first) == list(range(10)) and len(order) == 10
    torch.manual_seed(123)  # the global generator plays no part
    assert list(order) == first
    position["now"] = 10
    second = list(order)
    assert sorted(second) == list(range(10)) and second != first
    position["now"] = 4  # mid-shuffle (after a resume): the rest of the first shuffle
    assert list(order) == first[4:]
    assert list(EpochShuffle(10, seed=4, consumed=lambda: 0)) != first


def test_a_resumed_fit_reads_the_same_batches_from_an_epoch_shuffle(tmp_path):
    """Straight 12 steps vs 6 steps, checkpoint at the epoch's end, resume: the same batches,
    whether the checkpoint was written at the end of training or after validation, with the
    short last batch kept or dropped; every epoch is a permutation."""
    import lightning as L
    from torch.utils.data import DataLoader, TensorDataset

    from papers_data import EpochShuffle, drawn_by_trainer

    class Record(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[int] = []

        def training_step(self, batch, _):
            self.seen.extend(batch[0].tolist())
            return (self.w - 1).pow(2).sum()

        def validation_step(self, batch, _):
            pass

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    class Data(L.LightningDataModule):
        def __init__(self, n, drop_last):
            super().__init__()
            self.n, self.drop_last = n, drop_last

        def train_dataloader(self):
            order = EpochShuffle(self.n, 5, drawn_by_trainer(self, self.n, 4, self.drop_last))
            data = TensorDataset(torch.arange(self.n))
            return DataLoader(data, batch_size=4, sampler=order, drop_last=self.drop_last)

        def val_dataloader(self):
            return DataLoader(TensorDataset(torch.arange(2)), batch_size=2)

    def fit(steps, root, validate, data, ckpt_path=None):
        trainer = L.Trainer(
            max_steps=steps,
            max_epochs=-1,
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            accelerator="cpu",
            default_root_dir=root,
            limit_val_batches=1 if validate else 0,
            num_sanity_val_steps=0,
        )
        model = Record()
        trainer.fit(model, datamodule=data, ckpt_path=ckpt_path)
        return model.seen, trainer

    for n, drop_last in ((22, False), (26, True)):
        per_epoch = n - n % 4 if drop_last else n
        for validate in (False, True):
            data = Data(n, drop_last)
            name = f"{n}{validate}"
            straight, _ = fit(12, tmp_path / f"s{name}", validate, data)
            first, half = fit(6, tmp_path / f"h{name}", validate, data)
            callback = half.checkpoint_callback
            checkpoint = callback.best_model_path or callback.last_model_path
            rest, _ = fit(12, tmp_path / f"r{name}", validate, data, ckpt_path=checkpoint)
            assert first + rest == straight, (n, validate)
            epochs = straight[:per_epoch], straight[per_epoch : 2 * per_epoch]
            assert epochs[0] != epochs[1], (n, validate)
            if not drop_last:
                assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(n))
            else:
                assert len(set(epochs[0])) == len(set(epochs[1])) == per_epoch


def test_epoch_shuffle_shards_the_padded_shuffle_across_ranks():
    """Ranks read interleaved positions of one shuffle padded to a multiple of the world size:
    equal counts, every item read, and an epoch resumed mid-shuffle continues every rank."""
    from papers_data import EpochShuffle

    position = {"now": 0}

    def ranks(n, world):
        return [
            EpochShuffle(n, 2, lambda: position["now"], replicas=lambda r=r: (r, world))
            for r in range(world)
        ]

    whole = list(EpochShuffle(21, 2, lambda: 0))
    streams = [list(s) for s in ranks(21, 2)]
    assert streams[0] == whole[0::2] and streams[1] == [*whole[1::2], whole[0]]  # padded
    assert [len(s) for s in ranks(21, 2)] == [11, 11]
    assert [len(s) for s in ranks(3, 4)] == [1, 1, 1, 1]  # fewer items than ranks: repeats
    assert {i for s in ranks(3, 4) for i in s} == {0, 1, 2}
    position["now"] = 8  # 2 steps of 2 ranks x batch 2 drawn, then a resume
    assert [list(s) for s in ranks(21, 2)] == [streams[0][4:], streams[1][4:]]
    position["now"] = 21  # the next epoch
    assert list(ranks(21, 2)[0]) != streams[0]


DDP_SCRIPT = """
import json, sys
import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from papers_data import EpochShuffle, drawn_by_trainer

class Record(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []
    def training_step(self, batch, _):
        self.seen.extend(batch[0].tolist())
        return (self.w - 1).pow(2).sum()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

class Data(L.LightningDataModule):
    def train_dataloader(self):
        order = EpochShuffle(21, 5, drawn_by_trainer(self, 21, 4))
        return DataLoader(TensorDataset(torch.arange(21)), batch_size=4, sampler=order)

steps, root, ckpt = int(sys.argv[1]), sys.argv[2], sys.argv[3] or None
trainer = L.Trainer(max_steps=steps, max_epochs=-1, accelerator="cpu", devices=2,
    strategy="ddp", logger=False, enable_progress_bar=False, enable_model_summary=False,
    default_root_dir=root, limit_val_batches=0)
model = Record()
trainer.fit(model, datamodule=Data(), ckpt_path=ckpt)
with open(f"{root}/seen{trainer.global_rank}.json", "w") as f:
    json.dump(model.seen, f)
# Tear the process group down before the interpreter exits: left to exit-time destruction, a
# gloo thread was once killed mid-flight ("terminate called without an active exception",
# SIGABRT) after both ranks had written their files.
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
"""


def test_epoch_shuffle_under_ddp_resumes_mid_epoch_on_every_rank(tmp_path):
    """Two CPU processes, 21 items, batch 4: 3 steps per epoch, each rank 11 items. 4 steps (a
    checkpoint one step into the second epoch) + resume to 6: every rank reads what it reads in
    two uninterrupted epochs (its shard of each epoch's shuffle), and each epoch covers every
    item. (Two launches, not three: the uninterrupted reads are the shards themselves.)"""
    import json
    import os
    import subprocess
    import sys

    from papers_data import EpochShuffle

    script = tmp_path / "ddp_fit.py"
    script.write_text(DDP_SCRIPT)

    def fit(steps, name, ckpt=""):
        root = tmp_path / name
        root.mkdir()
        env = {**os.environ, "PL_DISABLE_FORK": "1", "OMP_NUM_THREADS": "1"}
        result = subprocess.run(
            [sys.executable, str(script), str(steps), str(root), str(ckpt)],
            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        return root, [json.loads((root / f"seen{r}.json").read_text()) for r in range(2)]

    straight = [
        [
            i
            for epoch in (0, 1)
            for i in EpochShuffle(21, 5, lambda e=epoch: 21 * e, lambda r=r: (r, 2))
        ]
        for r in range(2)
    ]
    half_root, half = fit(4, "half")
    checkpoint = max(half_root.rglob("*.ckpt"), key=os.path.getmtime)
    _, rest = fit(6, "resumed", checkpoint)
    assert [h + r for h, r in zip(half, rest, strict=True)] == straight
    for epoch in range(2):
        items = {i for rank in straight for i in rank[11 * epoch : 11 * (epoch + 1)]}
        assert items == set(range(21))
