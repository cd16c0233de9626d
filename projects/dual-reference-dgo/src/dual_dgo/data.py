"""DataModule: the offline file (``root``) or the embedded miniature behind one class.

Real data: ``<root>/{train,val,test}.jsonl`` (or ``.parquet``) in the format of formats.py,
written by a generation stage (behaviour policies sampled, scored, saved); this module only
optimises. Miniature: the visual digit-sum task of miniature.py, generated in memory from the
seed (well under a second). Batches hold whole prompts (all their responses), so the per-prompt
normalisations of Eqs. 6-7 are exact inside each batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import ClosedUnitInterval, NonNegativeFloat, NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from dual_dgo.formats import VERIFIERS, extract_answer, read_offline, score_missing
from dual_dgo.miniature import TaskConfig, fast_length, generate_split, reward, slow_length
from dual_dgo.vlm import EncodedPrompt, PromptEncoder, build_mini_processor, load_local
from papers_cli import ConfigError
from papers_data import DatasetNotFoundError, EpochShuffle, drawn_by_trainer, resolve_data_root
from papers_gpu import run_seed

DATASET = "dual-reference-dgo"
HOW_TO_GET = (
    "Write the offline file with your generation stage: one JSON line per prompt with images, "
    "question, answer and responses tagged by mode (fast/slow) and behaviour policy "
    "(README, 'Paper scale'); `dual-reference-dgo-convert` turns DGO's grouped JSON into it."
)
SPLITS = ("train", "val", "test")
_ENCODED: dict[tuple, dict[str, list]] = {}  # the last miniature encoded in this process


def split_seed(seed: int, split: str) -> int:
    """The miniature's generator seed for one split of run seed ``seed``."""
    return seed * 3 + SPLITS.index(split)


def build_processor(checkpoint: str | None):
    """The miniature's LlavaProcessor, or the checkpoint's own processor from its folder."""
    if checkpoint is None:
        return build_mini_processor()
    from transformers import AutoProcessor

    if not (Path(checkpoint).expanduser() / "config.json").is_file():
        load_local(checkpoint)  # raises the error that names the missing files
    return AutoProcessor.from_pretrained(Path(checkpoint).expanduser(), local_files_only=True)


@dataclass
class PromptItem:
    """One prompt and its scored offline responses, encoded."""

    prompt: EncodedPrompt
    responses: list[torch.Tensor]
    rewards: torch.Tensor  # [n] float
    modes: torch.Tensor  # [n] 0 fast / 1 slow
    correct: torch.Tensor  # [n] bool
    answer: str
    difficulty: int  # -1 when the data do not say
    # the scripted policies' outcome table [2 modes, 3] = (accuracy, r if correct, r if wrong);
    # NaN for real data (the exact-partition control needs known policies)
    policy_table: torch.Tensor
    source: int = -1  # the miniature's data source (0 a, 1 b) under counts_by="source", else -1


def collate_prompts(items: list[PromptItem]) -> dict:
    """Whole prompts, flattened per response (``prompts`` indexes each response's prompt); the
    model builds the token sequences of the responses it trains on (all, or a weighted draw)."""
    index = [number for number, item in enumerate(items) for _ in item.responses]
    return {
        "items": items,
        "n_prompts": len(items),
        "prompts": torch.tensor(index, dtype=torch.long),
        "responses": [response for item in items for response in item.responses],
        "rewards": torch.cat([i.rewards for i in items]),
        "modes": torch.cat([i.modes for i in items]),
        "correct": torch.cat([i.correct for i in items]),
        "difficulty": torch.tensor([i.difficulty for i in items]),
        "policy_table": torch.stack([i.policy_table for i in items]),
    }


class DualDgoDataModule(LightningDataModule):
    """Train / validation / test prompts of the offline file or of the miniature.

    ``seed`` fixes the miniature's prompts and draws; by default it is the run's
    ``seed_everything``. ``counts_by="difficulty"``: ``n_fast`` / ``n_slow`` responses per
    prompt from each scripted behaviour policy at difficulty 1, ``n_fast_hard`` /
    ``n_slow_hard`` at ``k_max``, linear in between (equal ends give every prompt the same
    counts). ``counts_by="source"`` (the claim's design): a source tag in the question, drawn
    independently of the difficulty (P(b) = ``source_share``), sets the counts: ``n_fast`` /
    ``n_slow`` for source a, ``n_fast_b`` / ``n_slow_b`` for b (``TaskConfig.counts``). The
    claim's count-swap check exchanges the fast and slow counts.
    """

    def __init__(
        self,
        root: str | None = None,
        checkpoint: str | None = None,
        n_train: PositiveInt = 1500,
        n_val: PositiveInt = 300,
        n_test: PositiveInt = 300,
        k_max: PositiveInt = 8,
        n_fast: NonNegativeInt = 4,
        n_slow: NonNegativeInt = 2,
        n_fast_hard: NonNegativeInt = 1,
        n_slow_hard: NonNegativeInt = 8,
        counts_by: Literal["difficulty", "source"] = "difficulty",
        n_fast_b: NonNegativeInt = 1,
        n_slow_b: NonNegativeInt = 8,
        source_share: ClosedUnitInterval = 0.5,
        length_cost: NonNegativeFloat = 0.2,
        difficulty: Literal["harmonic", "uniform"] = "harmonic",
        max_length: PositiveInt | None = None,
        verifier: Literal["exact", "numeric", "choice"] = "exact",
        batch_prompts: PositiveInt = 32,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder: PromptEncoder | None = None

    @property
    def task(self) -> TaskConfig:
        h = self.hparams
        return TaskConfig(
            k_max=h.k_max,
            n_fast=h.n_fast,
            n_slow=h.n_slow,
            n_fast_hard=h.n_fast_hard,
            n_slow_hard=h.n_slow_hard,
            counts_by=h.counts_by,
            n_fast_b=h.n_fast_b,
            n_slow_b=h.n_slow_b,
            source_share=h.source_share,
            length_cost=h.length_cost,
            difficulty=h.difficulty,
        )

    def setup(self, stage: str | None = None) -> None:
        if self.encoder is not None:
            return
        h = self.hparams
        other = (
            (h.n_fast_b, h.n_slow_b, "data.n_fast_b + data.n_slow_b")
            if h.counts_by == "source"
            else (h.n_fast_hard, h.n_slow_hard, "data.n_fast_hard + data.n_slow_hard")
        )
        if min(h.n_fast + h.n_slow, other[0] + other[1]) == 0:
            raise ConfigError(
                "every prompt needs at least 1 response: data.n_fast + data.n_slow and "
                f"{other[2]} must both be positive"
            )
        self.seed = run_seed() if h.seed is None else h.seed
        self.encoder = PromptEncoder(build_processor(h.checkpoint))
        self.image_token_id = self.encoder.tokenizer.convert_tokens_to_ids(
            getattr(self.encoder.processor, "image_token", "<image>")
        )
        if h.root is None:
            task = self.task
            sizes = {"train": h.n_train, "val": h.n_val, "test": h.n_test}
            key = (repr(task), tuple(sizes.values()), self.seed, h.checkpoint, h.verifier)
            if key not in _ENCODED:  # a claim worker trains many objectives on the same data
                raw = {s: generate_split(sizes[s], split_seed(self.seed, s), task) for s in SPLITS}
                _ENCODED.clear()
                _ENCODED[key] = {
                    name: [self._encode(r) for r in records] for name, records in raw.items()
                }
            self.splits = {name: list(items) for name, items in _ENCODED[key].items()}
            self.max_length = task.max_length
        else:
            raw = self._read_real(h.root)
            self.splits = {
                name: [self._encode(r) for r in records] for name, records in raw.items()
            }

    def _read_real(self, root: str) -> dict[str, list[dict]]:
        folder = resolve_data_root(root, DATASET, [f"{s}.jsonl" for s in SPLITS], HOW_TO_GET)
        out = {}
        for split in SPLITS:
            found = [folder / f"{split}{ext}" for ext in (".jsonl", ".parquet")]
            path = next((p for p in found if p.is_file()), None)
            if path is None:
                raise DatasetNotFoundError(
                    DATASET,
                    folder,
                    [f"{s}.jsonl" for s in SPLITS],
                    HOW_TO_GET,
                    missing=[f"{split}.jsonl or {split}.parquet"],
                )
            out[split] = read_offline(path)
        lengths = [
            self.encoder.count_tokens(r["text"])
            for rs in out.values()
            for x in rs
            for r in x["responses"]
        ]
        self.max_length = self.hparams.max_length or max(lengths)
        for records in out.values():
            score_missing(
                records,
                self.hparams.verifier,
                self.hparams.length_cost,
                self.max_length,
                self.encoder.count_tokens,
            )
        return out

    def _encode(self, record: dict) -> PromptItem:
        encoder, verify = self.encoder, VERIFIERS[self.hparams.verifier]
        responses = record["responses"]
        k = record.get("difficulty")
        if self.hparams.root is None:
            task = self.task
            table = torch.tensor(
                [
                    [task.fast_accuracy(k), *reward([True, False], fast_length(), task)],
                    [task.slow_accuracy(k), *reward([True, False], slow_length(k), task)],
                ],
                dtype=torch.float64,
            )
        else:
            table = torch.full((2, 3), float("nan"), dtype=torch.float64)
        return PromptItem(
            prompt=encoder.encode_prompt(record["image"], record["question"]),
            responses=[encoder.encode_response(r["text"]) for r in responses],
            rewards=torch.tensor([r["reward"] for r in responses], dtype=torch.float32),
            modes=torch.tensor([int(r["mode"] == "slow") for r in responses]),
            correct=torch.tensor(
                [verify(extract_answer(r["text"]), record["answer"]) for r in responses]
            ),
            answer=record["answer"],
            difficulty=-1 if k is None else int(k),
            policy_table=table,
            source=-1 if record.get("source") is None else int(record["source"]),
        )

    def train_dataloader(self) -> DataLoader:
        # A shuffle per epoch keyed on the optimizer steps taken, so a resumed run reads the
        # uninterrupted run's batches.
        n = len(self.splits["train"])
        order = EpochShuffle(n, self.seed, drawn_by_trainer(self, n, self.hparams.batch_prompts))
        return self._loader("train", sampler=order)

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def _loader(self, split: str, sampler: EpochShuffle | None = None) -> DataLoader:
        return DataLoader(
            self.splits[split],
            batch_size=self.hparams.batch_prompts,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
            collate_fn=collate_prompts,
        )
