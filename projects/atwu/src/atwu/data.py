"""Data: TOFU / RWKU loaders (real file formats), the generated TOFU-mini, tokenisation, batches.

Real TOFU (``locuslab/TOFU``): JSON files of records ``{"question", "answer"}``, and the evaluation
files ``*_perturbed.json`` that add ``paraphrased_answer`` (str) and ``perturbed_answer`` (list of
str). A folder ``<root>`` holds ``{forget}.json``, ``{forget}_perturbed.json``, ``{retain}.json``,
``retain_perturbed.json`` and ``world_facts_perturbed.json`` (``real_authors_perturbed.json`` is
used when present). Files are either one JSON array or JSON Lines, as on the hub.

Real RWKU (``jinzhuoran/RWKU``): per target ``<root>/<target>/forget_level{1,2,3}.json`` (probes
``{"query", "answer", "level", "type", "subject"}``; level 1 fill-in-the-blank, 2 QA, 3 adversarial)
and optional ``neighbor_level{1,2}.json``. RWKU ships no forget corpus (its zero-shot setting).

TOFU-mini (the embedded default, generated with Faker, seeded): fictitious authors with eight facts
each. Every answer is a template with the author's name and one attribute value; the *value* is the
ground-truth forget-relevant span (the name is copied from the question and the template words are
shared with every retain author). Values of several relations are drawn from small pools, so the
same city or job also appears for retain authors: relevance is about the association, not the word.
Perturbed answers put another author's value into the same answer; world facts are fixed capitals.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch
from faker import Faker
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from lightning.pytorch.utilities import CombinedLoader
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

from papers_cli import ConfigError
from papers_data import require_files, resolve_data_root

TOFU_HOW_TO_GET = (
    "Download the TOFU JSON files from the Hugging Face dataset locuslab/TOFU (e.g. "
    "forget10.json, forget10_perturbed.json, retain90.json, retain_perturbed.json, "
    "world_facts_perturbed.json) into one folder and pass it as --data.root."
)
RWKU_HOW_TO_GET = (
    "Download the RWKU benchmark (Hugging Face dataset jinzhuoran/RWKU) and pass the folder that "
    "holds one sub-folder per target (with forget_level1/2/3.json) as --data.root."
)
PAD, EOS = "<pad>", "<eos>"
PROMPT = "Question: {question}\nAnswer:"


class DataFormatError(ValueError):
    """A data file does not have the records this project needs."""

    user_facing = True


@dataclass(frozen=True)
class QAItem:
    """One question-answer pair with what the TOFU evaluation needs.

    ``answer_spans`` are character spans of ``answer`` that carry the forget-relevant fact (known
    only for generated data; empty for real files).
    """

    question: str
    answer: str
    paraphrased_answer: str
    perturbed_answers: tuple[str, ...]
    answer_spans: tuple[tuple[int, int], ...] = ()
    subject: str = ""


@dataclass
class UnlearningData:
    """The splits of an unlearning benchmark: what to forget, what to keep, general knowledge."""

    forget: list[QAItem]
    retain: list[QAItem]
    world_facts: list[QAItem]
    real_authors: list[QAItem] = field(default_factory=list)

    def finetune_items(self, which: str) -> list[QAItem]:
        """What the 'full' model (``all``) or the 'retain' model (``retain``) is fine-tuned on."""
        if which == "all":
            return self.forget + self.retain + self.world_facts + self.real_authors
        if which == "retain":
            return self.retain + self.world_facts + self.real_authors
        raise ValueError(f"finetune_on must be 'all' or 'retain', got {which!r}")


# --------------------------------------------------------------------------- real formats


def read_json_records(path: Path) -> list[dict]:
    """A JSON array or JSON Lines file of objects."""
    text = path.read_text()
    try:
        records = json.loads(text)
    except json.JSONDecodeError:
        try:
            records = [json.loads(line) for line in text.splitlines() if line.strip()]
        except json.JSONDecodeError as error:
            raise DataFormatError(
                f"{path} is neither a JSON array nor JSON Lines: {error}"
            ) from None
    if isinstance(records, dict):
        records = [records]
    if not all(isinstance(r, dict) for r in records):
        raise DataFormatError(f"{path} must hold JSON objects (one per question)")
    return records


def tofu_items(path: Path, need_perturbed: bool) -> list[QAItem]:
    """TOFU records -> QAItems; the perturbed files must carry the truth-ratio fields."""
    items = []
    for index, record in enumerate(read_json_records(path)):
        missing = [k for k in ("question", "answer") if k not in record]
        if need_perturbed and "perturbed_answer" not in record:
            missing.append("perturbed_answer")
        if missing:
            raise DataFormatError(
                f"{path.name} record {index} lacks {missing}; TOFU records have 'question' and "
                "'answer', and *_perturbed.json files also 'paraphrased_answer' and "
                "'perturbed_answer' (a list)."
            )
        perturbed = record.get("perturbed_answer", [])
        perturbed = [perturbed] if isinstance(perturbed, str) else list(perturbed)
        items.append(
            QAItem(
                question=record["question"],
                answer=record["answer"],
                paraphrased_answer=record.get("paraphrased_answer") or record["answer"],
                perturbed_answers=tuple(perturbed),
            )
        )
    return items


def load_tofu(root: str | None, forget_split: str = "forget10") -> UnlearningData:
    """Read the TOFU files for ``forget_split`` (forget01/05/10) from the data root.

    Training uses ``{forget}.json`` and ``retain{100-x}.json``; the evaluation sets come from the
    ``*_perturbed.json`` files (their questions are the forget set and a retain subset).
    """
    if forget_split not in ("forget01", "forget05", "forget10"):
        raise DataFormatError(
            f"forget_split must be forget01, forget05 or forget10: {forget_split}"
        )
    retain_split = f"retain{100 - int(forget_split[-2:])}"
    expected = [
        f"{forget_split}_perturbed.json",
        f"{retain_split}.json",
        "retain_perturbed.json",
        "world_facts_perturbed.json",
    ]
    folder = resolve_data_root(root, "tofu", expected, TOFU_HOW_TO_GET)
    files = require_files(folder, "tofu", expected, TOFU_HOW_TO_GET)
    real_authors = folder / "real_authors_perturbed.json"
    retain_eval = tofu_items(files["retain_perturbed.json"], need_perturbed=True)
    retain_train = tofu_items(files[f"{retain_split}.json"], need_perturbed=False)
    evaluated = {item.question for item in retain_eval}
    # The retain model is fine-tuned on retain{N}.json; the perturbed retain subset is scored.
    retain = retain_eval + [item for item in retain_train if item.question not in evaluated]
    return UnlearningData(
        forget=tofu_items(files[f"{forget_split}_perturbed.json"], need_perturbed=True),
        retain=retain,
        world_facts=tofu_items(files["world_facts_perturbed.json"], need_perturbed=True),
        real_authors=tofu_items(real_authors, True) if real_authors.is_file() else [],
    )


def load_rwku(root: str | None, target: str) -> dict[str, list[QAItem]]:
    """RWKU probes of one target: ``forget_level1..3`` and ``neighbor_level1..2`` when present.

    Each probe becomes a QAItem (question = the probe's query; fill-in-the-blank queries keep their
    blank). RWKU has no paraphrased or perturbed answers, so it is scored by ROUGE-L recall.
    """
    expected = [f"{target}/forget_level{k}.json" for k in (1, 2, 3)]
    folder = resolve_data_root(root, "rwku", expected, RWKU_HOW_TO_GET)
    files = require_files(folder, "rwku", expected, RWKU_HOW_TO_GET)
    optional = [folder / target / f"neighbor_level{k}.json" for k in (1, 2)]
    paths = {Path(name).stem: path for name, path in files.items()}
    paths.update({path.stem: path for path in optional if path.is_file()})
    probes = {}
    for name, path in paths.items():
        items = []
        for index, record in enumerate(read_json_records(path)):
            if "query" not in record or "answer" not in record:
                raise DataFormatError(
                    f"{path} probe {index} lacks 'query'/'answer' (RWKU probes are "
                    "{'query', 'answer', 'level', 'type', 'subject'})"
                )
            answer = str(record["answer"])
            items.append(
                QAItem(record["query"], answer, answer, (), subject=record.get("subject", target))
            )
        probes[name] = items
    return probes


# --------------------------------------------------------------------------- TOFU-mini

# relation -> (question, answer template, paraphrase template); {v} is the attribute value.
# relation -> (question, answer template); {n} is the author's name, {v} the attribute value.
RELATIONS = {
    "birthplace": (
        "Where was {n} born?",
        "{n} was born in the city of {v}.",
    ),
    "birth_date": (
        "When was {n} born?",
        "{n} was born on {v}.",
    ),
    "father_job": (
        "What did the father of {n} do for a living?",
        "The father of {n} worked as a {v}.",
    ),
    "mother_job": (
        "What did the mother of {n} do for a living?",
        "The mother of {n} worked as a {v}.",
    ),
    "genre": (
        "Which genre does {n} write in?",
        "{n} is best known for writing {v} novels.",
    ),
    "book": (
        "Can you name a book written by {n}?",
        "One of the books by {n} is titled {v}.",
    ),
    "award": (
        "Which award did {n} receive?",
        "{n} received the {v} for literary excellence.",
    ),
    "nationality": (
        "What is the nationality of {n}?",
        "{n} is a citizen of {v}.",
    ),
}
GENRES = (
    "fantasy", "horror", "mystery", "romance", "science fiction", "historical",
    "thriller", "poetry", "satire", "crime", "adventure", "dystopian",
)  # fmt: skip
CAPITALS = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"),
    ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"), ("Egypt", "Cairo"),
    ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"), ("Canada", "Ottawa"),
    ("Mexico", "Mexico City"), ("Brazil", "Brasilia"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Poland", "Warsaw"),
    ("Greece", "Athens"), ("Turkey", "Ankara"), ("Russia", "Moscow"), ("Portugal", "Lisbon"),
    ("Austria", "Vienna"), ("Ireland", "Dublin"), ("Cuba", "Havana"), ("Iran", "Tehran"),
    ("Iraq", "Baghdad"), ("Thailand", "Bangkok"), ("Vietnam", "Hanoi"), ("Nigeria", "Abuja"),
)  # fmt: skip
WORLD_FACT = ("What is the capital of {c}?", "The capital of {c} is {v}.")


def _qa(templates: tuple[str, str], fill: dict, value: str, wrong: list[str], subject: str):
    """Fill a (question, answer) template; perturbed answers put wrong values in the same answer.

    The "paraphrased" answer of the truth ratio is the trained phrasing itself: a tiny model
    trained from scratch does not carry a fact over to an unseen phrasing (in a first run with
    unseen paraphrases the full model preferred the true answer only weakly even on retain
    authors), so an unseen paraphrase would measure template familiarity instead of knowledge.
    """
    question, answer = (t.format(**fill, v="{v}") for t in templates)
    start = answer.index("{v}")
    return QAItem(
        question=question,
        answer=answer.replace("{v}", value),
        paraphrased_answer=answer.replace("{v}", value),
        perturbed_answers=tuple(answer.replace("{v}", w) for w in wrong),
        answer_spans=((start, start + len(value)),),
        subject=subject,
    )


def generate_tofu_mini(
    num_authors: int = 50, num_forget_authors: int = 5, num_perturbed: int = 3, seed: int = 0
) -> UnlearningData:
    """Seeded TOFU-style data: ``num_authors`` fictitious authors x 8 facts, the first
    ``num_forget_authors`` form the forget set; world facts are fixed country capitals."""
    if not 0 < num_forget_authors < num_authors:
        raise ValueError("need 0 < num_forget_authors < num_authors")
    fake, rng = Faker("en_US"), random.Random(seed)
    fake.seed_instance(seed)
    # Small pools make values recur across authors (forget and retain alike).
    pools = {
        "birthplace": sorted({fake.city() for _ in range(max(8, num_authors // 3))}),
        "father_job": sorted({fake.job().split(",")[0] for _ in range(max(8, num_authors // 2))}),
        "genre": list(GENRES),
        "nationality": sorted({fake.country() for _ in range(max(8, num_authors // 3))}),
    }
    pools["mother_job"] = pools["father_job"]
    names = []
    while len(names) < num_authors:
        name = f"{fake.first_name()} {fake.last_name()}"
        if name not in names:
            names.append(name)
    facts = []
    for _ in names:
        author = {rel: rng.choice(pool) for rel, pool in pools.items()}
        author["birth_date"] = fake.date_of_birth(minimum_age=25, maximum_age=95).strftime(
            "%B %d, %Y"
        )
        author["book"] = f'"{fake.catch_phrase().title()}"'
        author["award"] = f"{fake.last_name()} Prize"
        facts.append(author)
    authors = []
    for index, name in enumerate(names):
        items = []
        for relation, templates in RELATIONS.items():
            value = facts[index][relation]
            candidates = pools.get(relation) or [f[relation] for f in facts]
            others = sorted(set(candidates) - {value})
            items.append(
                _qa(templates, {"n": name}, value, rng.sample(others, num_perturbed), name)
            )
        authors.append(items)
    world = []
    capitals = [v for _, v in CAPITALS]
    for country, capital in CAPITALS:
        wrong = rng.sample([c for c in capitals if c != capital], num_perturbed)
        world.append(_qa(WORLD_FACT, {"c": country}, capital, wrong, country))
    return UnlearningData(
        forget=[qa for items in authors[:num_forget_authors] for qa in items],
        retain=[qa for items in authors[num_forget_authors:] for qa in items],
        world_facts=world,
    )


# --------------------------------------------------------------------------- tokenisation


def train_tokenizer(texts: list[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """A byte-level BPE trained on the corpus (GPT-2 style pre-tokenisation, exact decoding)."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=True)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token=PAD, eos_token=EOS)


def corpus_texts(data: UnlearningData) -> list[str]:
    """Every string the tokenizer will see (questions, answers, paraphrases, perturbations)."""
    texts = []
    for split in (data.forget, data.retain, data.world_facts, data.real_authors):
        for item in split:
            texts += [PROMPT.format(question=item.question), item.answer]
            texts += [item.paraphrased_answer, *item.perturbed_answers]
    return texts


def load_tokenizer(path: str) -> PreTrainedTokenizerBase:
    """A checkpoint's own tokenizer from a local folder; never a hub download."""
    if not Path(path).is_dir():
        raise DataFormatError(f"tokenizer folder {path} does not exist (local paths only)")
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_qa(
    tokenizer: PreTrainedTokenizerBase, question: str, answer: str, spans=(), max_length=128
) -> dict[str, list[int]]:
    """Prompt + answer tokens: labels only on the answer (and EOS), relevance 1 on answer tokens
    that overlap a forget-relevant character span of ``answer``."""
    prompt_ids = tokenizer(PROMPT.format(question=question), add_special_tokens=False)
    encoded = tokenizer(" " + answer, add_special_tokens=False, return_offsets_mapping=True)
    # offsets index " " + answer, spans index answer: shift the spans by the leading space
    relevance = [
        int(any(start < e + 1 and end > s + 1 for s, e in spans))
        for start, end in encoded["offset_mapping"]
    ]
    answer_ids = encoded["input_ids"] + [tokenizer.eos_token_id]
    relevance.append(0)
    input_ids = (prompt_ids["input_ids"] + answer_ids)[:max_length]
    n_prompt = len(prompt_ids["input_ids"])
    labels = ([-100] * n_prompt + answer_ids)[:max_length]
    relevance = ([0] * n_prompt + relevance)[:max_length]
    return {"input_ids": input_ids, "labels": labels, "relevance": relevance}


def collate(examples: list[dict[str, list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad a list of encoded examples into tensors (labels -100 and mask 0 on padding)."""
    length = max(len(e["input_ids"]) for e in examples)

    def pad(key: str, value: int) -> torch.Tensor:
        return torch.tensor([e[key] + [value] * (length - len(e[key])) for e in examples])

    return {
        "input_ids": pad("input_ids", pad_id),
        "attention_mask": torch.tensor(
            [[1] * len(e["input_ids"]) + [0] * (length - len(e["input_ids"])) for e in examples]
        ),
        "labels": pad("labels", -100),
        "relevance": pad("relevance", 0),
    }


class EncodedQA(torch.utils.data.Dataset):
    """QAItems encoded once (question + answer, with relevance labels)."""

    def __init__(self, items: list[QAItem], tokenizer: PreTrainedTokenizerBase, max_length: int):
        self.items = items
        self.examples = [
            encode_qa(tokenizer, it.question, it.answer, it.answer_spans, max_length)
            for it in items
        ]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> dict[str, list[int]]:
        return self.examples[index]


class UnlearningDataModule(LightningDataModule):
    """TOFU (``root`` set, ``benchmark=tofu``) or TOFU-mini (``root`` unset) as batches.

    ``fit`` yields ``{"finetune": ..., "forget": ..., "retain": ...}`` per step: the fine-tuning
    batch (all data for the full model, retain data for the retain model) and one forget and one
    retain batch for unlearning. Validation runs the forget and retain evaluation sets.
    """

    def __init__(
        self,
        root: str | None = None,
        forget_split: Literal["forget01", "forget05", "forget10"] = "forget10",
        tokenizer_path: str | None = None,
        num_authors: PositiveInt = 50,
        num_forget_authors: PositiveInt = 5,
        vocab_size: PositiveInt = 1024,
        max_length: PositiveInt = 64,
        finetune_on: Literal["all", "retain"] = "all",
        batch_size: PositiveInt = 16,
        forget_batch_size: PositiveInt = 8,
        retain_batch_size: PositiveInt = 8,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        if root is None and num_forget_authors >= num_authors:
            raise ConfigError(
                f"data.num_forget_authors={num_forget_authors} must be below data.num_authors="
                f"{num_authors}: the authors that are not forgotten are the retain set"
            )
        self.save_hyperparameters()
        self.tokenizer: PreTrainedTokenizerBase | None = None

    def setup(self, stage: str | None = None) -> None:
        if self.tokenizer is not None:
            return
        h = self.hparams
        if h.root is not None:
            self.data = load_tofu(h.root, h.forget_split)
            if h.tokenizer_path is None:
                raise DataFormatError(
                    "real TOFU data needs the checkpoint's tokenizer: pass --data.tokenizer_path "
                    "(usually the same local folder as --model.pretrained)"
                )
            self.tokenizer = load_tokenizer(h.tokenizer_path)
        else:
            self.data = generate_tofu_mini(h.num_authors, h.num_forget_authors, seed=h.seed)
            if h.tokenizer_path is not None:
                self.tokenizer = load_tokenizer(h.tokenizer_path)
            else:
                self.tokenizer = train_tokenizer(corpus_texts(self.data), h.vocab_size)
        self.finetune_set = EncodedQA(
            self.data.finetune_items(h.finetune_on), self.tokenizer, h.max_length
        )
        self.forget_set = EncodedQA(self.data.forget, self.tokenizer, h.max_length)
        self.retain_set = EncodedQA(self.data.retain, self.tokenizer, h.max_length)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def loader(self, dataset, batch_size: int, shuffle: bool, seed_offset: int = 0) -> DataLoader:
        generator = torch.Generator().manual_seed(self.hparams.seed + seed_offset)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            generator=generator,
            num_workers=self.hparams.num_workers,
            collate_fn=functools.partial(collate, pad_id=self.tokenizer.pad_token_id),
        )

    def train_dataloader(self) -> CombinedLoader:
        h = self.hparams
        loaders = {
            "finetune": self.loader(self.finetune_set, h.batch_size, True, 0),
            "forget": self.loader(self.forget_set, h.forget_batch_size, True, 1),
            "retain": self.loader(self.retain_set, h.retain_batch_size, True, 2),
        }
        return CombinedLoader(loaders, mode="max_size_cycle")

    def val_dataloader(self):
        return self.loader(self.forget_set, 64, False)
