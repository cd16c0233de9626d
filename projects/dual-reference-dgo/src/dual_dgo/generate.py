"""The generation stage in miniature: behaviour policies sampled, scored and written to the file.

Optimisation (data.py, model.py) only reads the offline file; this module writes one, so the
decoupling of DGO holds in the miniature too::

    dual-reference-dgo-generate OUT [--fast-policy CKPT] [--temperature 1] [--seed 0]

writes ``OUT/{train,val,test}.jsonl`` (formats.py's layout, images as PNG files under
``OUT/images``) with the miniature's prompts and the scripted slow policy's responses. The fast
responses come from the scripted fast policy, or with ``--fast-policy`` from a trained model (a
``uv run train`` checkpoint, e.g. the warm start) forced to begin with ``<fast>`` and sampled at
the temperature: the warm-start model as the fast behaviour policy. Each sampled response is
scored by the verifier minus the length cost, as the scripted ones are. ``uv run train
--data.root OUT --data.max_length 13`` then trains on it (13: the longest slow response).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from dual_dgo.data import SPLITS, DualDgoDataModule, split_seed
from dual_dgo.formats import VERIFIERS, extract_answer
from dual_dgo.miniature import TaskConfig, generate_split, reward
from dual_dgo.model import DualDgoModule
from dual_dgo.vlm import PromptEncoder, to_image


@torch.no_grad()
def sample_fast_responses(
    model: DualDgoModule,
    records: list[dict],
    task: TaskConfig,
    temperature: float,
    seed: int,
) -> list[list[dict]]:
    """``task.counts(k, source)[0]`` responses per record of difficulty k from ``model`` forced
    into the fast mode, each scored.

    The draws depend only on (model, records, n, temperature, seed): sampling runs under a
    forked torch generator seeded with ``seed``."""
    model.eval()
    encoder: PromptEncoder = model.encoder
    counts = [task.counts(r["difficulty"], r.get("source"))[0] for r in records]
    verify = VERIFIERS["exact"]
    prompts = [
        encoder.encode_prompt(r["image"], r["question"])
        for r, n in zip(records, counts, strict=True)
        for _ in range(n)
    ]
    texts = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(prompts), 256):
            texts += model.decode(prompts[start : start + 256], encoder.fast_id, temperature)[1]
    out, starts = [], np.cumsum([0, *counts])
    for index, record in enumerate(records):
        responses = []
        for text in texts[starts[index] : starts[index + 1]]:
            correct = verify(extract_answer(text), record["answer"])
            tokens = encoder.count_tokens(text)
            responses.append(
                {
                    "mode": "fast",
                    "behavior": "warm_start",
                    "text": text,
                    "reward": float(reward(correct, tokens, task)),
                }
            )
        out.append(responses)
    return out


def write_offline_split(records: list[dict], folder: Path, split: str) -> Path:
    """``folder/split.jsonl`` with each image as ``folder/images/<id>.png``."""
    images = folder / "images"
    images.mkdir(parents=True, exist_ok=True)
    lines = []
    for record in records:
        name = f"images/{split}-{record['id']}.png"
        to_image(record["image"]).convert("L").save(folder / name)
        row = {k: v for k, v in record.items() if k not in ("image", "digits")}
        lines.append(json.dumps({**row, "images": [name]}))
    path = folder / f"{split}.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def generate_offline(
    out: str | Path,
    seed: int,
    task: TaskConfig,
    sizes: dict[str, int],
    fast_policy: DualDgoModule | None = None,
    temperature: float = 1.0,
) -> dict[str, dict]:
    """Write the three splits (the prompts of ``DualDgoDataModule(seed=seed)``'s miniature) and
    return, per split, the fast policy's accuracy per digit count (the behaviour it logged)."""
    out = Path(out)
    summary = {}
    for split in SPLITS:
        draws = split_seed(seed, split)  # as DualDgoDataModule.setup draws the miniature
        records = generate_split(sizes[split], draws, task)
        if fast_policy is not None:
            sampled = sample_fast_responses(fast_policy, records, task, temperature, draws)
            for record, fast in zip(records, sampled, strict=True):
                record["responses"] = fast + [r for r in record["responses"] if r["mode"] == "slow"]
        write_offline_split(records, out, split)
        summary[split] = fast_accuracy_by_difficulty(records, task)
    return summary


def fast_accuracy_by_difficulty(records: list[dict], task: TaskConfig) -> list[float]:
    """Share of correct fast responses per digit count 1..k_max (NaN where none)."""
    verify = VERIFIERS["exact"]
    hits: dict[int, list[bool]] = {k: [] for k in range(1, task.k_max + 1)}
    for record in records:
        for response in record["responses"]:
            if response["mode"] == "fast":
                hits[record["difficulty"]].append(
                    verify(extract_answer(response["text"]), record["answer"])
                )
    return [float(np.mean(v)) if v else float("nan") for v in hits.values()]


def load_fast_policy(checkpoint: str | Path) -> DualDgoModule:
    """A ``uv run train`` checkpoint (.ckpt) of the miniature's VLM, on the CPU."""
    path = Path(checkpoint)
    if not path.is_file():
        raise FileNotFoundError(
            f"no fast-policy checkpoint at {path}: pass a .ckpt that `uv run train` wrote "
            "(runs/dual-reference-dgo/lightning_logs/version_*/checkpoints/)"
        )
    model = DualDgoModule.load_from_checkpoint(path, map_location="cpu")
    if model.hparams.checkpoint is not None:
        raise ValueError(
            "the generation stage in miniature samples the miniature's VLM; a model built from a "
            f"local checkpoint ({model.hparams.checkpoint}) belongs to your own generation stage"
        )
    return model


def generate_cli(argv: list[str] | None = None) -> None:
    """``dual-reference-dgo-generate OUT [--fast-policy CKPT] ...``: see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--fast-policy", type=Path, help="a `uv run train` .ckpt (default: scripted)"
    )
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=0)
    defaults = DualDgoDataModule().hparams
    counts = ("n_fast", "n_slow", "n_fast_hard", "n_slow_hard", "n_fast_b", "n_slow_b")
    for name in ("n_train", "n_val", "n_test", *counts):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=defaults[name])
    parser.add_argument(
        "--counts-by", choices=("difficulty", "source"), default=defaults["counts_by"]
    )
    parser.add_argument("--source-share", type=float, default=defaults["source_share"])
    parser.add_argument("--length-cost", type=float, default=defaults["length_cost"])
    args = parser.parse_args(argv)
    if args.temperature <= 0:
        parser.error("--temperature must be > 0 (the behaviour policy samples)")
    try:
        policy = None if args.fast_policy is None else load_fast_policy(args.fast_policy)
    except FileNotFoundError as error:
        parser.error(str(error))
    task = TaskConfig(
        n_fast=args.n_fast,
        n_slow=args.n_slow,
        n_fast_hard=args.n_fast_hard,
        n_slow_hard=args.n_slow_hard,
        counts_by=args.counts_by,
        n_fast_b=args.n_fast_b,
        n_slow_b=args.n_slow_b,
        source_share=args.source_share,
        length_cost=args.length_cost,
    )
    sizes = {"train": args.n_train, "val": args.n_val, "test": args.n_test}
    summary = generate_offline(args.out, args.seed, task, sizes, policy, args.temperature)
    source = "scripted" if policy is None else f"sampled from {args.fast_policy}"
    print(f"wrote {sum(sizes.values())} prompts to {args.out}; fast responses {source}")
    print("fast accuracy by digit count (train):", [round(a, 3) for a in summary["train"]])
