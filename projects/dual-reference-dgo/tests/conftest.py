import pytest
import torch


@pytest.fixture(autouse=True)
def two_threads(tmp_path, monkeypatch):
    """Tests run on 2 cores; generated data are cached in the test's own folder."""
    torch.set_num_threads(2)
    monkeypatch.setenv("PAPERS_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def tiny_args(tmp_path):
    """Flags that shrink configs/default.yaml to seconds: CPU, a tiny VLM, 2 batches an epoch."""
    return [
        "--trainer.accelerator=cpu",
        "--trainer.max_epochs=2",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.check_val_every_n_epoch=1",
        f"--trainer.default_root_dir={tmp_path}",
        "--model.sft_warmup_epochs=0",
        "--model.hidden=32",
        "--model.layers=1",
        "--model.vision_hidden=32",
        "--model.max_new_tokens=14",
        "--data.n_train=32",
        "--data.n_val=16",
        "--data.n_test=16",
        "--data.batch_prompts=16",
    ]


def _png(seed: int, size: int = 28) -> bytes:
    import io

    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 255, size=(size, size), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return buffer.getvalue()


def offline_records(folder):
    """Four prompts in the offline format with its awkward cases: an image as a relative path,
    as base64 in JSON, as a {"bytes": ...} dict; a prompt whose rewards are all zero; responses
    without a reward (scored by the verifier); a difficulty missing."""
    import base64

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "img").mkdir(exist_ok=True)
    (folder / "img" / "a.png").write_bytes(_png(0))
    fast, slow = "<fast> A: 7", "<think> 3 7 </think> A: 7"
    return [
        {
            "id": "a",
            "images": ["img/a.png"],
            "question": "sum ?",
            "answer": "7",
            "difficulty": 2,
            "responses": [
                {"mode": "fast", "behavior": "instruct", "text": fast, "reward": 1.0},
                {"mode": "slow", "behavior": "reasoner", "text": slow, "reward": 0.8},
            ],
        },
        {
            "id": "b",
            "images": [base64.b64encode(_png(1)).decode()],
            "question": "sum ?",
            "answer": "3",
            "difficulty": 1,
            "responses": [
                {"mode": "fast", "text": "<fast> A: 4", "reward": 0.0},
                {"mode": "slow", "text": "<think> 4 </think> A: 4", "reward": 0.0},
            ],
        },
        {
            "id": "c",
            "images": [{"bytes": base64.b64encode(_png(2)).decode(), "path": None}],
            "question": "sum ?",
            "answer": "7",
            "responses": [
                {"mode": "fast", "text": fast},
                {"mode": "slow", "text": "<think> 3 5 </think> A: 5"},
            ],
        },
        {
            "id": "d",
            "image": "img/a.png",
            "question": "sum ?",
            "answer": "7",
            "difficulty": 3,
            "responses": [{"mode": "slow", "text": slow}],
        },
    ]


def write_offline_split(folder, split):
    import json

    records = offline_records(folder)
    (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder / f"{split}.jsonl"


@pytest.fixture
def offline_root(tmp_path):
    for split in ("train", "val", "test"):
        write_offline_split(tmp_path / "offline", split)
    return tmp_path / "offline"


@pytest.fixture
def make_records():
    """The fixture records (a function of the folder their image files go to)."""
    return offline_records
