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
from papers_data import EpochShuffle, drawn_by_trainer, require_files, resolve_data_root

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
# How a question becomes the prompt: "plain" (PROMPT, no special token: TOFU-mini), "plain_bos"
# (the tokenizer's BOS token, then PROMPT) or "chat" (the tokenizer's own chat template with the
# question as the user turn and the generation prompt, as open-unlearning's TOFU checkpoints were
# fine-tuned; the template writes BOS itself). Set on the tokenizer by the data module, so that
# training, evaluation and generation all build the same prompt.
PROMPT_FORMAT_ATTR = "atwu_prompt_format"
PromptFormat = Literal["plain", "plain_bos", "chat"]


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
    name_spans: tuple[tuple[int, int], ...] = ()


@dataclass
class UnlearningData:
    """The splits of an unlearning benchmark: what to forget, what to keep, general knowledge."""

    forget: list[QAItem]
    retain: list[QAItem]
    world_facts: list[QAItem]
    real_authors: list[QAItem] = field(default_factory=list)
    # TOFU-mini only: retain authors kept out of the retain loss (they share values with forget
    # authors), and the generic corpus about one-off people (training / held-out evaluation).
    collateral: list[QAItem] = field(default_factory=list)
    generic: list[QAItem] = field(default_factory=list)
    generic_eval: list[QAItem] = field(default_factory=list)

    def finetune_items(self, which: str, author_repeats: int = 1) -> list[QAItem]:
        """What the 'full' model (``all``), the 'retain' model (``retain``) or the pretraining
        (``generic``: no author fact) is trained on. Fine-tuning sees the author facts and world
        facts ``author_repeats`` times, mixed with as many generic QA as author QA (so the
        generic ability is kept while the facts are memorised)."""
        if which == "generic":
            if not self.generic:
                raise ConfigError("pretraining on generic text needs TOFU-mini (no data.root)")
            return self.generic + self.world_facts + self.real_authors
        if which == "all":
            authors = self.forget + self.retain + self.collateral
        elif which == "retain":
            authors = self.retain + self.collateral
        else:
            raise ValueError(f"finetune_on must be 'all', 'retain' or 'generic', got {which!r}")
        facts = (authors + self.world_facts + self.real_authors) * author_repeats
        return facts + self.generic[: len(authors) * author_repeats]


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

# relation -> (question forms, answer forms); {n} is the person's name, {v} the attribute value.
# Form 0 is the phrasing of the author facts; every form appears in the generic corpus, so the
# model learns the language (templates, copying the name, a value of the right type) from text
# that carries no author fact, before it memorises the authors.
RELATIONS = {
    "birthplace": (
        ("Where was {n} born?", "In which city was {n} born?", "What is the birthplace of {n}?"),
        ("{n} was born in the city of {v}.", "The birthplace of {n} is {v}.",
         "{n} came into the world in {v}."),
    ),
    "birth_date": (
        ("When was {n} born?", "What is the date of birth of {n}?", "On which day was {n} born?"),
        ("{n} was born on {v}.", "The date of birth of {n} is {v}.",
         "{n} was born on the day {v}."),
    ),
    "father_job": (
        ("What did the father of {n} do for a living?", "What was the job of the father of {n}?",
         "How did the father of {n} earn a living?"),
        ("The father of {n} worked as a {v}.", "The job of the father of {n} was {v}.",
         "{n} grew up with a father who was a {v}."),
    ),
    "mother_job": (
        ("What did the mother of {n} do for a living?", "What was the job of the mother of {n}?",
         "How did the mother of {n} earn a living?"),
        ("The mother of {n} worked as a {v}.", "The job of the mother of {n} was {v}.",
         "{n} grew up with a mother who was a {v}."),
    ),
    "genre": (
        ("Which genre does {n} write in?", "What kind of books does {n} write?",
         "In what genre is {n} known?"),
        ("{n} is best known for writing {v} novels.", "The books of {n} are {v} novels.",
         "Readers know {n} for {v} novels."),
    ),
    "book": (
        ("Can you name a book written by {n}?", "What is one book by {n}?",
         "Name a novel that {n} wrote."),
        ("One of the books by {n} is titled {v}.", "{n} wrote a book called {v}.",
         "A novel by {n} is {v}."),
    ),
    "award": (
        ("Which award did {n} receive?", "What prize was given to {n}?",
         "Which honour has {n} won?"),
        ("{n} received the {v} for literary excellence.", "{n} was given the {v}.",
         "The {v} went to {n}."),
    ),
    "nationality": (
        ("What is the nationality of {n}?", "Which country is {n} a citizen of?",
         "Where does {n} hold citizenship?"),
        ("{n} is a citizen of {v}.", "The nationality of {n} is {v}.",
         "{n} holds a passport of {v}."),
    ),
}  # fmt: skip
# Relations whose values come from small pools: forget and collateral authors can share them.
POOLED = ("birthplace", "father_job", "mother_job", "genre", "nationality")
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


def _qa(question: str, answer: str, fill: str, value: str, wrong: list[str], subject: str):
    """Fill a (question, answer) form; perturbed answers put wrong values in the same answer.

    The "paraphrased" answer of the truth ratio is the trained phrasing itself (form 0), as the
    author facts were only ever seen in that phrasing.
    """
    question, answer = question.format(n=fill, c=fill), answer.format(n=fill, c=fill, v="{v}")
    start = answer.index("{v}")
    filled = answer.replace("{v}", value)
    names = ()
    if fill and fill in answer:  # the name (or country) copied from the question
        at = answer.index(fill)
        at = at if at < start else at + len(value) - len("{v}")
        names = ((at, at + len(fill)),)
    return QAItem(
        question=question,
        answer=filled,
        paraphrased_answer=filled,
        perturbed_answers=tuple(answer.replace("{v}", w) for w in wrong),
        answer_spans=((start, start + len(value)),),
        subject=subject,
        name_spans=tuple(names),
    )


def _value_sampler(fake: Faker, pools: dict[str, list[str]]):
    def draw(relation: str, rng: random.Random) -> str:
        if relation in pools:
            return rng.choice(pools[relation])
        if relation == "birth_date":
            return fake.date_of_birth(minimum_age=25, maximum_age=95).strftime("%B %d, %Y")
        if relation == "book":
            return f'"{fake.catch_phrase().title()}"'
        return f"{fake.last_name()} Prize"

    return draw


def _fresh_name(fake: Faker, taken: set[str]) -> str:
    while True:
        name = f"{fake.first_name()} {fake.last_name()}"
        if name not in taken:
            taken.add(name)
            return name


def generate_tofu_mini(
    num_authors: int = 30,
    num_forget_authors: int = 10,
    num_collateral_authors: int = 5,
    num_generic: int = 3000,
    num_generic_eval: int = 48,
    num_perturbed: int = 3,
    seed: int = 0,
) -> UnlearningData:
    """Seeded TOFU-style data (Faker).

    - ``num_authors`` fictitious authors x 8 facts (form 0 of each relation); the first
      ``num_forget_authors`` are forgotten. The next ``num_collateral_authors`` share three
      pooled values (birthplace, a parent's job, genre...) with a forget author: they are learned
      by both models but kept out of the retain loss, to measure collateral damage.
    - a generic corpus of ``num_generic`` QA about one-off people (fresh name, random values, any
      of the three phrasings): language without author facts, for pretraining and mixed into
      fine-tuning; ``generic_eval`` holds unseen one-off people for the utility.
    - world facts: fixed country capitals.
    """
    if not 0 < num_forget_authors < num_authors:
        raise ValueError("need 0 < num_forget_authors < num_authors")
    if num_forget_authors + num_collateral_authors >= num_authors:
        raise ValueError("forget + collateral authors must leave some retain authors")
    fake, rng = Faker("en_US"), random.Random(seed)
    fake.seed_instance(seed)
    pools = {
        "birthplace": sorted({fake.city() for _ in range(max(8, num_authors // 3))}),
        "father_job": sorted({fake.job().split(",")[0] for _ in range(max(8, num_authors // 2))}),
        "genre": list(GENRES),
        "nationality": sorted({fake.country() for _ in range(max(8, num_authors // 3))}),
    }
    pools["mother_job"] = pools["father_job"]
    draw = _value_sampler(fake, pools)
    taken: set[str] = set()
    names = [_fresh_name(fake, taken) for _ in range(num_authors)]
    facts = [{rel: draw(rel, rng) for rel in RELATIONS} for _ in names]
    for k in range(num_collateral_authors):
        # a collateral author shares three pooled values with one forget author
        source = facts[k % num_forget_authors]
        for relation in rng.sample(POOLED, 3):
            facts[num_forget_authors + k][relation] = source[relation]
    authors = []
    for index, name in enumerate(names):
        items = []
        for relation, (questions, answers) in RELATIONS.items():
            value = facts[index][relation]
            candidates = pools.get(relation) or [f[relation] for f in facts]
            others = sorted(set(candidates) - {value})
            wrong = rng.sample(others, num_perturbed)
            items.append(_qa(questions[0], answers[0], name, value, wrong, name))
        authors.append(items)

    def generic_item() -> QAItem:
        relation = rng.choice(list(RELATIONS))
        questions, answers = RELATIONS[relation]
        name = _fresh_name(fake, taken)
        value = draw(relation, rng)
        wrong = [draw(relation, rng) for _ in range(num_perturbed)]
        form = rng.randrange(len(questions)), rng.randrange(len(answers))
        return _qa(questions[form[0]], answers[form[1]], name, value, wrong, "")

    generic = [generic_item() for _ in range(num_generic)]
    generic_eval = [generic_item() for _ in range(num_generic_eval)]
    world = []
    capitals = [v for _, v in CAPITALS]
    for country, capital in CAPITALS:
        wrong = rng.sample([c for c in capitals if c != capital], num_perturbed)
        world.append(_qa(*WORLD_FACT, country, capital, wrong, country))
    first_retain = num_forget_authors + num_collateral_authors
    return UnlearningData(
        forget=[qa for items in authors[:num_forget_authors] for qa in items],
        retain=[qa for items in authors[first_retain:] for qa in items],
        world_facts=world,
        collateral=[qa for items in authors[num_forget_authors:first_retain] for qa in items],
        generic=generic,
        generic_eval=generic_eval,
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
    for split in (
        data.forget, data.retain, data.collateral, data.world_facts, data.real_authors,
        data.generic, data.generic_eval,
    ):  # fmt: skip
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


TEMPLATE, VALUE, NAME, END = 0, 1, 2, 3  # token classes of an answer (-1 on the prompt)
TOKEN_CLASSES = {"template": TEMPLATE, "value": VALUE, "name": NAME, "eos": END}


def set_prompt_format(tokenizer: PreTrainedTokenizerBase, prompt_format: str) -> None:
    """Record how prompts are built for this tokenizer (see ``PROMPT_FORMAT_ATTR``)."""
    if prompt_format == "chat" and not getattr(tokenizer, "chat_template", None):
        raise DataFormatError(
            "data.prompt_format=chat needs a tokenizer with a chat template (the checkpoint's "
            "tokenizer_config.json); use plain or plain_bos for a tokenizer without one"
        )
    if prompt_format == "plain_bos" and tokenizer.bos_token_id is None:
        raise DataFormatError("data.prompt_format=plain_bos needs a tokenizer with a BOS token")
    setattr(tokenizer, PROMPT_FORMAT_ATTR, prompt_format)


def prompt_ids(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    """The token ids of the prompt for ``question`` in the tokenizer's prompt format."""
    prompt_format = getattr(tokenizer, PROMPT_FORMAT_ATTR, "plain")
    if prompt_format == "chat":
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return list(ids)
    ids = tokenizer(PROMPT.format(question=question), add_special_tokens=False)["input_ids"]
    return [tokenizer.bos_token_id, *ids] if prompt_format == "plain_bos" else ids


def encode_qa(
    tokenizer: PreTrainedTokenizerBase,
    question: str,
    answer: str,
    spans=(),
    max_length=128,
    name_spans=(),
) -> dict[str, list[int]]:
    """Prompt + answer tokens: labels only on the answer (and EOS), relevance 1 on answer tokens
    that overlap a forget-relevant character span of ``answer``; ``token_class`` marks template,
    value, name (copied from the question) and EOS tokens."""
    prompt = prompt_ids(tokenizer, question)
    encoded = tokenizer(" " + answer, add_special_tokens=False, return_offsets_mapping=True)

    def overlaps(start: int, end: int, char_spans) -> bool:
        # offsets index " " + answer, spans index answer: shift the spans by the leading space
        return any(start < e + 1 and end > s + 1 for s, e in char_spans)

    relevance = [int(overlaps(a, b, spans)) for a, b in encoded["offset_mapping"]]
    classes = [
        VALUE if value else NAME if overlaps(a, b, name_spans) else TEMPLATE
        for value, (a, b) in zip(relevance, encoded["offset_mapping"], strict=True)
    ]
    answer_ids = encoded["input_ids"] + [tokenizer.eos_token_id]
    relevance.append(0)
    classes.append(END)
    input_ids = (prompt + answer_ids)[:max_length]
    n_prompt = len(prompt)
    labels = ([-100] * n_prompt + answer_ids)[:max_length]
    relevance = ([0] * n_prompt + relevance)[:max_length]
    classes = ([-1] * n_prompt + classes)[:max_length]
    return {
        "input_ids": input_ids,
        "labels": labels,
        "relevance": relevance,
        "token_class": classes,
    }


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
        "token_class": pad("token_class", -1),
    }


class EncodedQA(torch.utils.data.Dataset):
    """QAItems encoded once (question + answer, with relevance labels)."""

    def __init__(self, items: list[QAItem], tokenizer: PreTrainedTokenizerBase, max_length: int):
        self.items = items
        self.examples = [
            encode_qa(tokenizer, it.question, it.answer, it.answer_spans, max_length, it.name_spans)
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
        prompt_format: PromptFormat = "plain",
        num_authors: PositiveInt = 30,
        num_forget_authors: PositiveInt = 10,
        num_collateral_authors: NonNegativeInt = 5,
        num_generic: NonNegativeInt = 3000,
        vocab_size: PositiveInt = 1024,
        max_length: PositiveInt = 64,
        finetune_on: Literal["all", "retain", "generic"] = "all",
        author_repeats: PositiveInt = 3,
        batch_size: PositiveInt = 16,
        forget_batch_size: PositiveInt = 8,
        retain_batch_size: PositiveInt = 8,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        if root is None and num_forget_authors + num_collateral_authors >= num_authors:
            raise ConfigError(
                f"data.num_forget_authors={num_forget_authors} plus data.num_collateral_authors="
                f"{num_collateral_authors} must be below data.num_authors={num_authors}: the "
                "remaining authors are the retain set"
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
            self.data = generate_tofu_mini(
                h.num_authors,
                h.num_forget_authors,
                h.num_collateral_authors,
                h.num_generic,
                seed=h.seed,
            )
            if h.tokenizer_path is not None:
                self.tokenizer = load_tokenizer(h.tokenizer_path)
            else:
                self.tokenizer = train_tokenizer(corpus_texts(self.data), h.vocab_size)
        set_prompt_format(self.tokenizer, h.prompt_format)
        self.finetune_set = EncodedQA(
            self.data.finetune_items(h.finetune_on, h.author_repeats), self.tokenizer, h.max_length
        )
        self.pretrain_set = (
            EncodedQA(self.data.finetune_items("generic"), self.tokenizer, h.max_length)
            if self.data.generic
            else None
        )
        self.forget_set = EncodedQA(self.data.forget, self.tokenizer, h.max_length)
        self.retain_set = EncodedQA(self.data.retain, self.tokenizer, h.max_length)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def loader(self, dataset, batch_size: int, shuffle: bool, seed_offset: int = 0) -> DataLoader:
        """Batches of ``dataset``; shuffled ones read a seeded stream of shuffles from the
        position the trainer's optimizer steps give, so a resumed run sees the same batches
        (every training step draws one batch from each of the combined loaders)."""
        sampler = None
        if shuffle:
            stream_seed = self.hparams.seed * 16 + seed_offset
            drawn = drawn_by_trainer(self, len(dataset), batch_size)
            sampler = EpochShuffle(len(dataset), stream_seed, drawn)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
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
        if self.pretrain_set is not None:
            loaders["pretrain"] = self.loader(self.pretrain_set, h.batch_size, True, 3)
        return CombinedLoader(loaders, mode="max_size_cycle")

    def val_dataloader(self):
        return self.loader(self.forget_set, 64, False)

    def test_dataloader(self):
        """TOFU evaluates an unlearned model on the forget set (and the utility sets, which the
        module reads from ``data``): the same batches as validation."""
        return self.loader(self.forget_set, 64, False)
