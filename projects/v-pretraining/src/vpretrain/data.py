"""Data: the unlabeled CPT stream, the feedback problems and the evaluation sets, one DataModule.

Paper scale (``--data.corpus`` and ``--data.gsm8k``): a text corpus (JSONL or parquet with a
``text`` field, packed across documents with EOS) tokenised by the checkpoint's tokenizer, and
GSM8K's ``train.jsonl`` (``n_feedback`` problems drawn as feedback, ``n_val`` others for
validation) and ``test.jsonl`` (evaluation). Default: the miniature of ``miniature.py``.

Every training batch is a dict of [B, block_size + 1] tensors: ``ids`` (what the learner reads),
``clean_ids`` (the stream with every stated result right; equal to ``ids`` on real data),
``corrupted`` and ``result`` (token annotations, all False on real data).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from papers_cli import ConfigError
from papers_data import EpochShuffle, drawn_by_trainer
from vpretrain import formats, miniature
from vpretrain.formats import Problem

Stream = Literal["noisy", "clean", "base"]


@dataclass
class ProblemSet:
    """Problems encoded for scoring and greedy decoding.

    ``input_ids`` / ``attention_mask`` / ``answer_mask`` [N, L]: prompt + answer, right-padded;
    ``prompt_ids`` / ``prompt_mask`` [N, P]: the prompts alone, LEFT-padded for generation."""

    problems: list[Problem]
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    answer_mask: torch.Tensor
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor

    def __len__(self) -> int:
        return len(self.problems)

    def subset(self, index: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.input_ids[index],
            "attention_mask": self.attention_mask[index],
            "answer_mask": self.answer_mask[index],
        }


def encode_problems(tokenizer, problems: list[Problem], chat: bool = False) -> ProblemSet:
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pairs = [formats.encode_problem(tokenizer, p, chat=chat) for p in problems]
    length = max(len(a) + len(b) for a, b in pairs)
    width = max(len(a) for a, _ in pairs)
    ids = torch.full((len(pairs), length), pad, dtype=torch.long)
    attention = torch.zeros(len(pairs), length, dtype=torch.long)
    answer = torch.zeros(len(pairs), length, dtype=torch.bool)
    prompts = torch.full((len(pairs), width), pad, dtype=torch.long)
    prompt_mask = torch.zeros(len(pairs), width, dtype=torch.long)
    for i, (prompt, reply) in enumerate(pairs):
        n = len(prompt) + len(reply)
        ids[i, :n] = torch.tensor(prompt + reply)
        attention[i, :n] = 1
        answer[i, len(prompt) : n] = True
        prompts[i, width - len(prompt) :] = torch.tensor(prompt)
        prompt_mask[i, width - len(prompt) :] = 1
    return ProblemSet(problems, ids, attention, answer, prompts, prompt_mask)


class BlockDataset(Dataset):
    def __init__(self, blocks: dict[str, np.ndarray]):
        self.blocks = {name: torch.from_numpy(array) for name, array in blocks.items()}

    def __len__(self) -> int:
        return len(self.blocks["ids"])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {name: array[i] for name, array in self.blocks.items()}


class ProblemDataset(Dataset):
    def __init__(self, problems: ProblemSet):
        self.problems = problems

    def __len__(self) -> int:
        return len(self.problems)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        p = self.problems
        return {
            "input_ids": p.input_ids[i],
            "attention_mask": p.attention_mask[i],
            "answer_mask": p.answer_mask[i],
            "prompt_ids": p.prompt_ids[i],
            "prompt_mask": p.prompt_mask[i],
            "index": torch.tensor(i),
        }


@lru_cache(maxsize=4)
def miniature_stream(
    kind: Stream, arithmetic_share: float, corruption_rate: float, seed: int, mixed_feedback: int
) -> miniature.Stream:
    """The miniature's stream (memoised: a claim worker fits many arms on the same stream)."""
    tokenizer = miniature.train_tokenizer()
    extra = (
        [
            f"{p.question}\n{p.solution}"
            for p in miniature.problems("feedback", mixed_feedback, seed)
        ]
        if mixed_feedback
        else []
    )
    if kind == "base":
        return miniature.build_stream(
            tokenizer, miniature.prose_split("base"), arithmetic_share, 0.0, seed, extra
        )
    stream = miniature.build_stream(
        tokenizer, miniature.prose_split("cpt"), arithmetic_share, corruption_rate, seed, extra
    )
    if kind == "clean":  # the same text with every stated answer right
        none = np.zeros_like(stream.corrupted)
        stream = miniature.Stream(stream.clean_ids, stream.clean_ids, none, stream.result)
    return stream


class VPretrainDataModule(LightningDataModule):
    """The CPT stream, the feedback set and the evaluation sets.

    ``stream``: ``noisy`` (CPT prose + worked problems, ``corruption_rate`` of them with a wrong
    answer), ``clean`` (the same text with every answer right; the precondition's reference) or
    ``base`` (base-pretraining text: news, other articles, correct worked problems).
    ``mix_feedback`` adds the feedback problems to the stream as ordinary documents: the
    reference arm that breaks the rule (labels as learner supervision)."""

    def __init__(
        self,
        corpus: Path | None = None,
        gsm8k: Path | None = None,
        tokenizer: Path | None = None,
        chat: bool = False,
        stream: Stream = "noisy",
        arithmetic_share: NonNegativeFloat = 0.2,
        corruption_rate: NonNegativeFloat = 0.3,
        mix_feedback: bool = False,
        n_feedback: PositiveInt = 1024,
        n_val: PositiveInt = 200,
        n_test: PositiveInt = 300,
        perplexity_blocks: PositiveInt = 64,
        block_size: PositiveInt = 64,
        batch_size: PositiveInt = 16,
        seed: NonNegativeInt = 0,
        num_workers: NonNegativeInt = 0,
    ):
        super().__init__()
        self.save_hyperparameters()
        if (corpus is None) != (gsm8k is None):
            raise ConfigError(
                "--data.corpus and --data.gsm8k go together: the real-data path needs both a "
                "text corpus and GSM8K (leave both unset for the miniature)."
            )
        if not 0 <= arithmetic_share < 1 or not 0 <= corruption_rate <= 1:
            raise ConfigError(
                "--data.arithmetic_share must be in [0, 1) and --data.corruption_rate in [0, 1]"
            )
        self.tokenizer = (
            formats.load_tokenizer(None if tokenizer is None else str(tokenizer))
            if tokenizer is not None or corpus is not None
            else miniature.train_tokenizer()
        )
        self._ready = False

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    @property
    def real(self) -> bool:
        return self.hparams.corpus is not None

    def setup(self, stage: str | None = None) -> None:
        if self._ready:
            return
        h = self.hparams
        if self.real:
            self._setup_real()
        else:
            self._setup_miniature()
        formats.refuse_overlap(self.feedback.problems, self.test_problems.problems)
        formats.refuse_overlap(self.feedback.problems, self.val_problems.problems)
        self.train_set = BlockDataset(self.stream.blocks(h.block_size + 1))
        self._ready = True

    def _setup_miniature(self) -> None:
        h = self.hparams
        feedback = miniature.problems("feedback", h.n_feedback, h.seed)
        self.stream = miniature_stream(
            h.stream,
            h.arithmetic_share,
            h.corruption_rate,
            h.seed,
            h.n_feedback if h.mix_feedback else 0,
        )
        self.feedback = encode_problems(self.tokenizer, feedback)
        # Validation and test problems do not depend on the seed: every seed is judged on the
        # same items, so comparisons pair over problems.
        self.val_problems = encode_problems(self.tokenizer, miniature.problems("val", h.n_val, 0))
        self.test_problems = encode_problems(
            self.tokenizer, miniature.problems("test", h.n_test, 0)
        )
        self.perplexity = {
            split: self._prose_blocks(miniature.prose_split(split)) for split in ("val", "test")
        }

    def _prose_blocks(self, texts: list[str]) -> torch.Tensor:
        eos = self.tokenizer.eos_token_id
        docs = [self.tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
        blocks = formats.pack_documents(docs, self.hparams.block_size + 1, eos)
        return blocks[: self.hparams.perplexity_blocks]

    def _setup_real(self) -> None:
        h = self.hparams
        texts = formats.read_text_corpus(h.corpus)
        held_out = max(1, len(texts) // 50)
        tok = self.tokenizer
        docs = [tok(t, add_special_tokens=False)["input_ids"] for t in texts[held_out:]]
        blocks = formats.pack_documents(docs, h.block_size + 1, tok.eos_token_id, tok.bos_token_id)
        ids = blocks.flatten().numpy()
        zeros = np.zeros_like(ids, dtype=bool)
        self.stream = miniature.Stream(ids, ids.copy(), zeros, zeros.copy())
        root = Path(h.gsm8k)
        train = formats.read_gsm8k(root / "train.jsonl")
        test = formats.read_gsm8k(root / "test.jsonl")[: h.n_test]
        feedback = formats.split_feedback(train, h.n_feedback, h.seed)
        chosen = {p.question for p in feedback}
        val = [p for p in train if p.question not in chosen][: h.n_val]
        formats.refuse_overlap(feedback, test)
        if not val:
            raise ConfigError(
                f"--data.n_feedback {h.n_feedback} takes every GSM8K train problem; leave some "
                "for validation (lower n_feedback)."
            )
        if h.mix_feedback:
            raise ConfigError("--data.mix_feedback is a miniature reference arm only")
        self.feedback = encode_problems(tok, feedback, chat=h.chat)
        self.val_problems = encode_problems(tok, val, chat=h.chat)
        self.test_problems = encode_problems(tok, test, chat=h.chat)
        eval_texts = texts[:held_out]
        half = max(1, len(eval_texts) // 2)
        self.perplexity = {
            "val": self._prose_blocks(eval_texts[:half]),
            "test": self._prose_blocks(eval_texts[half:] or eval_texts),
        }

    def train_dataloader(self) -> DataLoader:
        n = len(self.train_set)
        order = EpochShuffle(
            n, self.hparams.seed, drawn_by_trainer(self, n, self.hparams.batch_size, drop_last=True)
        )
        return DataLoader(
            self.train_set,
            batch_size=self.hparams.batch_size,
            sampler=order,
            num_workers=self.hparams.num_workers,
            drop_last=True,
        )

    def _eval_loaders(self, problems: ProblemSet, split: str) -> list[DataLoader]:
        return [
            DataLoader(ProblemDataset(problems), batch_size=64),
            DataLoader(BlockDataset({"ids": self.perplexity[split].numpy()}), batch_size=16),
        ]

    def val_dataloader(self) -> list[DataLoader]:
        return self._eval_loaders(self.val_problems, "val")

    def test_dataloader(self) -> list[DataLoader]:
        return self._eval_loaders(self.test_problems, "test")
