"""The offline file: its reader (JSONL or parquet), the verifier, and DGO's grouped JSON.

One record per prompt (the abstract names no dataset, so none is hard-coded)::

    {"id": "q17", "images": ["img/q17.png" | {"bytes": <base64 or raw>} | {"path": ...}],
     "question": "...", "answer": "42", "difficulty": 3,            # difficulty optional
     "responses": [{"mode": "fast" | "slow", "behavior": "instruct-7b",
                    "text": "<fast> A: 42", "reward": 0.98}, ...]}   # reward optional

Relative image paths resolve against the file's folder. Responses without a reward are scored
by ``score_missing``: a pluggable verifier on the text after the last answer tag, minus the
length cost. ``convert_grouped_dgo`` turns DGO's grouped JSON
(``[{prompt, completions | generated_texts, weights?, ground_truth, images?}]``) into this format.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image

from dual_dgo.miniature import ANSWER_TAG, MODE_TOKENS

MODES = ("fast", "slow")


class OfflineFormatError(ValueError):
    """The offline file does not follow the format above; the message names the record."""

    user_facing = True


def _image(value: Any, folder: Path, where: str) -> Image.Image:
    if isinstance(value, dict):
        if value.get("bytes") is not None:
            value = value["bytes"]
        elif value.get("path"):
            value = value["path"]
        else:
            raise OfflineFormatError(f"{where}: an image dict needs 'bytes' or 'path'")
    if isinstance(value, (bytes, bytearray)):
        return Image.open(io.BytesIO(value)).convert("RGB")
    if isinstance(value, str):
        if len(value) < 1024:  # a path; longer strings can only be base64
            path = Path(value) if Path(value).is_absolute() else folder / value
            if path.is_file():
                return Image.open(path).convert("RGB")
        try:  # base64 bytes in JSON
            return Image.open(io.BytesIO(base64.b64decode(value, validate=True))).convert("RGB")
        except ValueError:
            raise OfflineFormatError(
                f"{where}: image {value[:60]!r} is neither a file nor base64"
            ) from None
    raise OfflineFormatError(f"{where}: unsupported image value of type {type(value).__name__}")


def _record(raw: dict, folder: Path, where: str) -> dict:
    for key in ("question", "answer", "responses"):
        if key not in raw:
            raise OfflineFormatError(f"{where}: missing '{key}'")
    images = raw.get("images")
    if images is None and raw.get("image") is not None:
        images = [raw["image"]]
    if not images:
        raise OfflineFormatError(f"{where}: a VLM prompt needs at least one image ('images')")
    if len(images) > 1:
        raise OfflineFormatError(f"{where}: {len(images)} images; this loader takes one per prompt")
    responses = []
    for index, response in enumerate(raw["responses"]):
        mode = response.get("mode")
        if mode not in MODES:
            raise OfflineFormatError(
                f"{where}, response {index}: mode must be fast or slow, got {mode!r}"
            )
        if not str(response.get("text", "")).startswith(MODE_TOKENS[mode]):
            raise OfflineFormatError(
                f"{where}, response {index}: a {mode} response must start with {MODE_TOKENS[mode]}"
            )
        reward = response.get("reward")
        responses.append(
            {
                "mode": mode,
                "behavior": str(response.get("behavior", mode)),
                "text": str(response["text"]),
                "reward": None if reward is None else float(reward),
            }
        )
    if not responses:
        raise OfflineFormatError(f"{where}: no responses")
    difficulty = raw.get("difficulty")
    return {
        "id": str(raw.get("id", where)),
        "image": _image(images[0], folder, where),
        "question": str(raw["question"]),
        "answer": str(raw["answer"]),
        "difficulty": None if difficulty is None else int(difficulty),
        "responses": responses,
    }


def read_offline(path: str | Path) -> list[dict]:
    """Records of a JSONL (one prompt per line) or parquet offline file."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
    elif path.suffix in (".jsonl", ".json"):
        rows = []
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as error:
                    raise OfflineFormatError(f"{path}:{number}: not JSON ({error})") from None
    else:
        raise OfflineFormatError(f"{path}: expected a .jsonl or .parquet file")
    return [_record(row, path.parent, f"{path.name} record {i}") for i, row in enumerate(rows)]


def extract_answer(text: str) -> str | None:
    """The text after the last answer tag (``A:``), or the last \\boxed{...}, stripped."""
    boxed = re.findall(r"\\boxed\{([^{}]*)\}", text)
    if boxed:
        return boxed[-1].strip()
    if ANSWER_TAG not in text:
        return None
    return text.rsplit(ANSWER_TAG, 1)[1].strip().split("\n")[0].strip() or None


def exact_match(prediction: str | None, answer: str) -> bool:
    return prediction is not None and prediction.strip().lower() == answer.strip().lower()


def numeric_match(prediction: str | None, answer: str) -> bool:
    """Equal as numbers (thousands separators and a trailing period ignored)."""

    def number(text: str) -> float | None:
        try:
            return float(text.replace(",", "").rstrip("."))
        except ValueError:
            return None

    if prediction is None:
        return False
    left, right = number(prediction), number(answer)
    return left is not None and right is not None and abs(left - right) < 1e-6


def choice_match(prediction: str | None, answer: str) -> bool:
    """Multiple choice: the first letter A-E of the prediction equals the answer's."""
    if prediction is None:
        return False
    found = re.search(r"\b([A-E])\b", prediction.upper())
    return found is not None and found.group(1) == answer.strip().upper()[:1]


VERIFIERS: dict[str, Callable[[str | None, str], bool]] = {
    "exact": exact_match,
    "numeric": numeric_match,
    "choice": choice_match,
}


def score_missing(
    records: list[dict],
    verifier: str,
    length_cost: float,
    max_length: int,
    count_tokens: Callable[[str], int],
) -> list[dict]:
    """Fill each missing reward with verifier(answer) - length_cost * tokens / max_length."""
    check = VERIFIERS[verifier]
    for record in records:
        for response in record["responses"]:
            if response["reward"] is None:
                correct = check(extract_answer(response["text"]), record["answer"])
                tokens = count_tokens(response["text"])
                response["reward"] = float(correct) - length_cost * tokens / max_length
    return records


def convert_grouped_dgo(groups: list[dict], default_mode: str = "fast") -> list[dict]:
    """DGO's grouped JSON -> this format. A completion that starts with ``<think>`` is slow;
    any other gets ``default_mode`` and that mode's token prepended. DGO's ``weights`` are
    dropped: they belong to the single-reference objective (rewards are re-scored)."""
    out = []
    for index, group in enumerate(groups):
        texts = group.get("completions", group.get("generated_texts"))
        if texts is None or "prompt" not in group or "ground_truth" not in group:
            raise OfflineFormatError(
                f"group {index}: needs 'prompt', 'ground_truth' and "
                "'completions' or 'generated_texts'"
            )
        responses = []
        for text in texts:
            text = str(text).lstrip()
            mode = "slow" if text.startswith(MODE_TOKENS["slow"]) else default_mode
            if not text.startswith(MODE_TOKENS[mode]):
                text = f"{MODE_TOKENS[mode]} {text}"
            responses.append({"mode": mode, "behavior": group.get("behavior", "dgo"), "text": text})
        record = {
            "id": str(group.get("id", index)),
            "question": group["prompt"],
            "answer": str(group["ground_truth"]),
            "responses": responses,
        }
        for key in ("images", "image", "difficulty"):
            if key in group:
                record[key] = group[key]
        out.append(record)
    return out


def convert_cli(argv: list[str] | None = None) -> None:
    """``dual-reference-dgo-convert grouped.json out.jsonl [--default-mode fast]``."""
    parser = argparse.ArgumentParser(description=convert_grouped_dgo.__doc__.splitlines()[0])
    parser.add_argument("grouped", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--default-mode", choices=MODES, default="fast")
    args = parser.parse_args(argv)
    records = convert_grouped_dgo(json.loads(args.grouped.read_text()), args.default_mode)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in records))
    print(f"wrote {len(records)} prompts to {args.out}")
