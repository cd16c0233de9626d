"""The embedded default: real prose, templated arithmetic and GSM-style problems, a small BPE.

- Prose: the 105 Wikipedia articles and 300 news paragraphs shipped as test data in the
  ``gensim`` wheel (no download). Articles split into base pretraining, continued pretraining
  (CPT) and held-out perplexity sets; news goes to base pretraining.
- GSM-mini: one-step word problems ("Ann has 7 pens. She buys 5 more. How many pens does she
  have now?" -> "#### 12") over a small fact space (a in 2..9, b in 1..4, + or -: 58 facts).
  Feedback, validation and test problems use disjoint name sets, so no evaluated question is
  ever seen.
- Worked problems in the unlabeled streams ("web math"): documents of GSM-mini problems with
  their answers, names disjoint from validation and test. Base pretraining sees few and all
  correct. In the CPT stream a share ``corruption_rate`` state a wrong answer with the same digit
  count: a DESIGNED STRESS TEST of this miniature (not the paper's data) that gives soft targets
  something to fix; the clean stream is the same text with every answer right.
- Tokenizer: a 2,048-token byte-level BPE trained on this text with digits split one per token
  (as Qwen2.5 does). The real Qwen2.5 BPE (151k tokens, ``formats.load_tokenizer``) works too,
  but its vocabulary makes the tiny model's embedding, head and the full-vocabulary JVP cost
  about 70x more per token on CPU, so the default keeps the small BPE.
"""

from __future__ import annotations

import bz2
import hashlib
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from papers_data import cache_dir, config_hash
from vpretrain.formats import Problem

WIKI_FILE = "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
NEWS_FILE = "lee_background.cor"
EOS = "<|endoftext|>"

NAMES = {
    "base": ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gail", "Hugo"],
    "feedback": ["Ivy", "Jack", "Kim", "Leo", "Mia", "Ned", "Ola", "Pat"],
    "val": ["Quinn", "Rosa", "Sam", "Tess"],
    "test": ["Uma", "Vic", "Wes", "Xena", "Yara", "Zoe"],
    "narrative": ["Ann", "Ben", "Cara", "Dan", "Eva", "Finn", "Gail", "Hugo"],
}
FEMALE = {
    "Ann",
    "Cara",
    "Eva",
    "Gail",
    "Ivy",
    "Kim",
    "Mia",
    "Ola",
    "Rosa",
    "Tess",
    "Uma",
    "Xena",
    "Yara",
    "Zoe",
}
OBJECTS = ["pens", "apples", "books", "coins", "cards", "shells", "cups", "stamps"]
GAINS = ["buys {b} more", "finds {b} more", "gets {b} more"]
LOSSES = ["gives away {b}", "loses {b}", "sells {b}"]


@dataclass(frozen=True)
class Situation:
    """One arithmetic fact in words: who, what, the two numbers and the operation."""

    name: str
    obj: str
    a: int
    b: int
    add: bool
    verb: str

    @property
    def result(self) -> int:
        return self.a + self.b if self.add else self.a - self.b

    def setup(self) -> str:
        pronoun = "She" if self.name in FEMALE else "He"
        return f"{self.name} has {self.a} {self.obj}. {pronoun} {self.verb.format(b=self.b)}."

    def question(self) -> str:
        pronoun = "she" if self.name in FEMALE else "he"
        return f"{self.setup()} How many {self.obj} does {pronoun} have now?"


def draw_situation(rng: random.Random, names: list[str]) -> Situation:
    add = rng.random() < 0.5
    a = rng.randint(2, 9)
    b = rng.randint(1, 4) if add else rng.randint(1, min(4, a))
    verb = rng.choice(GAINS if add else LOSSES)
    return Situation(rng.choice(names), rng.choice(OBJECTS), a, b, add, verb)


def wrong_result(result: int, rng: random.Random) -> int:
    """A wrong result near the right one with the same number of digits (so the corrupted
    digits align one to one with the right ones, which the oracle control needs)."""
    while True:
        wrong = result + rng.choice([-3, -2, -1, 1, 2, 3])
        if wrong >= 0 and len(str(wrong)) == len(str(result)):
            return wrong


def problems(split: str, n: int, seed: int) -> list[Problem]:
    """``n`` distinct GSM-mini problems whose names belong to ``split``."""
    rng = random.Random(f"problems-{split}-{seed}")
    seen: dict[str, Problem] = {}
    while len(seen) < n:
        s = draw_situation(rng, NAMES[split])
        question = s.question()
        seen.setdefault(question, Problem(question, f"#### {s.result}", str(s.result)))
    return list(seen.values())


@dataclass
class Narrative:
    """A document of worked problems with the stated answers' character spans."""

    text: str
    clean_text: str
    spans: list[tuple[int, int]]  # character spans of the stated results (same in both texts)
    corrupted: list[bool]


def narrative(rng: random.Random, problems_per_document: int, corruption_rate: float) -> Narrative:
    """Worked problems in the GSM-mini format as found in a web corpus; a share
    ``corruption_rate`` of them state a wrong answer (same digit count as the right one)."""
    parts, clean_parts, spans, corrupted, offset = [], [], [], [], 0
    for _ in range(problems_per_document):
        s = draw_situation(rng, NAMES["narrative"])
        wrong = rng.random() < corruption_rate
        stated = wrong_result(s.result, rng) if wrong else s.result
        head = f"{s.question()}\n#### "
        spans.append((offset + len(head), offset + len(head) + len(str(stated))))
        corrupted.append(wrong)
        parts.append(f"{head}{stated}")
        clean_parts.append(f"{head}{s.result}")
        offset += len(parts[-1]) + 2
    return Narrative("\n\n".join(parts), "\n\n".join(clean_parts), spans, corrupted)


def _gensim_file(name: str) -> Path:
    from gensim.test.utils import datapath

    return Path(datapath(name))


@lru_cache(maxsize=1)
def wiki_articles() -> tuple[str, ...]:
    """The gensim wheel's 105 Wikipedia articles as plain text (markup filtered)."""
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    articles = []
    with bz2.BZ2File(_gensim_file(WIKI_FILE)) as stream:
        for _title, text, _pageid in extract_pages(stream):
            plain = filter_wiki(text).replace("'''", "").replace("''", "")
            plain = re.sub(r"\n\s*\n+", "\n\n", plain).strip()
            if len(plain) > 500:
                articles.append(plain)
    return tuple(articles)


def paragraphs(articles: tuple[str, ...] | list[str], min_chars: int = 80) -> list[str]:
    out = []
    for article in articles:
        out += [p.strip() for p in article.split("\n\n") if len(p.strip()) >= min_chars]
    return out


def news_paragraphs() -> list[str]:
    return [line.strip() for line in _gensim_file(NEWS_FILE).read_text().splitlines() if line]


def prose_split(part: str) -> list[str]:
    """Prose paragraphs of one part: ``base`` (news + 60 articles), ``cpt`` (36 articles),
    ``val`` / ``test`` (held-out articles for perplexity, disjoint from both)."""
    articles = wiki_articles()
    if part == "base":
        return news_paragraphs() + paragraphs(articles[:60])
    if part == "cpt":
        return paragraphs(articles[60:96])
    if part == "val":
        return paragraphs(articles[96:100])
    if part == "test":
        return paragraphs(articles[100:])
    raise ValueError(f"unknown prose part {part!r}")


def tokenizer_corpus() -> list[str]:
    rng = random.Random("tokenizer")
    text = prose_split("base") + prose_split("cpt")
    text += [narrative(rng, 5, 0.0).text for _ in range(300)]
    text += [f"{p.question}\n{p.solution}" for p in problems("base", 300, 0)]
    return text


@lru_cache(maxsize=2)
def train_tokenizer(vocab_size: int = 2048):
    """The miniature's byte-level BPE (digits split one per token), cached on disk."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = tokenizer_corpus()
    # Keyed by the training text itself: a changed miniature never reuses a stale tokenizer.
    digest = hashlib.sha256("\x00".join(corpus).encode()).hexdigest()
    path = (
        cache_dir()
        / "v-pretraining"
        / f"bpe-{config_hash({'vocab': vocab_size, 'text': digest})}.json"
    )
    if not path.is_file():
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Digits(individual_digits=True),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tokenizer.train_from_iterator(corpus, trainer)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{random.getrandbits(32)}.tmp")
        tmp.write_text(tokenizer.to_str())
        tmp.replace(path)
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(path.read_text()), eos_token=EOS, pad_token=EOS
    )


@dataclass
class Stream:
    """A packed token stream with per-token annotations, all [N] int64/bool.

    ``ids``: what the learner reads; ``clean_ids``: the same text with every stated result
    right (equal to ``ids`` off the corrupted digits); ``corrupted``: the digit differs from
    the right one; ``result``: the token is a digit of a stated result."""

    ids: np.ndarray
    clean_ids: np.ndarray
    corrupted: np.ndarray
    result: np.ndarray

    def blocks(self, block_size: int) -> dict[str, np.ndarray]:
        """Cut into full blocks of ``block_size`` tokens [N // block_size, block_size]."""
        n = len(self.ids) // block_size * block_size
        return {
            name: getattr(self, name)[:n].reshape(-1, block_size)
            for name in ("ids", "clean_ids", "corrupted", "result")
        }


def build_stream(
    tokenizer,
    prose: list[str],
    arithmetic_share: float,
    corruption_rate: float,
    seed: int,
    extra_documents: list[str] = (),
) -> Stream:
    """Pack prose paragraphs, worked-problem documents (about ``arithmetic_share`` of the
    text by characters) and ``extra_documents`` in a seeded order, EOS after each."""
    rng = random.Random(f"stream-{seed}")
    documents: list[tuple[str, Narrative | None]] = [(p, None) for p in prose]
    documents += [(d, None) for d in extra_documents]
    prose_chars = sum(len(d) for d, _ in documents)
    target = arithmetic_share / max(1e-9, 1 - arithmetic_share) * prose_chars
    chars = 0
    while chars < target:
        # One problem per document, ended by EOS as the evaluated answers are.
        story = narrative(rng, 1, corruption_rate)
        documents.append((story.text, story))
        chars += len(story.text)
    rng.shuffle(documents)
    eos = tokenizer.convert_tokens_to_ids(EOS)
    ids, clean, corrupted, result = [], [], [], []
    for text, story in documents:
        encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
        doc_ids = list(encoded["input_ids"])
        doc_clean = list(doc_ids)
        doc_corrupted = [False] * len(doc_ids)
        doc_result = [False] * len(doc_ids)
        if story is not None:
            for i, (start, end) in enumerate(encoded["offset_mapping"]):
                for (lo, hi), _ in zip(story.spans, story.corrupted, strict=True):
                    if lo <= start and end <= hi and end > start:
                        doc_result[i] = True
                        right = story.clean_text[start:end]
                        if right != text[start:end]:
                            doc_corrupted[i] = True
                            doc_clean[i] = tokenizer.convert_tokens_to_ids(right)
        ids += doc_ids + [eos]
        clean += doc_clean + [eos]
        corrupted += doc_corrupted + [False]
        result += doc_result + [False]
    return Stream(
        np.asarray(ids, dtype=np.int64),
        np.asarray(clean, dtype=np.int64),
        np.asarray(corrupted, dtype=bool),
        np.asarray(result, dtype=bool),
    )


def describe() -> str:
    """A one-line summary of the bundled sources (for the README and logs)."""
    return json.dumps({"wiki_articles": len(wiki_articles()), "news": len(news_paragraphs())})
