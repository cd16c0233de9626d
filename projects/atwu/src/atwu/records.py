"""What the TOFU and RWKU loaders share: the QA record, the prompt format and the JSON reader.

Kept apart from data.py so that ``atwu.rwku`` and ``atwu.data`` both import it and neither
imports the other's module at load time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from transformers import PreTrainedTokenizerBase

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
