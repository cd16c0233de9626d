"""The positive control on a tiny fixture: through the project's own module and metric, weighting
only the ground-truth span (the value tokens) must bring the model closer to the retain model
(``forget_gap``) than uniform weights at the same budget, learning rate and update count; the
same check fails when the oracle's weights are swapped (everything but the span) or uniform."""

import numpy as np
import pytest
import torch

from atwu.claim import quiet_trainer
from atwu.core import answer_logprobs, retain_nll
from atwu.data import UnlearningDataModule, collate
from atwu.evaluate import answer_token_logprobs, forget_gap
from atwu.model import UnlearningModule, build_causal_lm, load_pretrained

# 4 authors (1 to forget, 3 to keep) x 8 facts, the world facts, no generic corpus
SIZES = {
    "num_authors": 4,
    "num_forget_authors": 1,
    "num_collateral_authors": 0,
    "num_generic": 0,
    "vocab_size": 300,
    "author_repeats": 1,
    "forget_batch_size": 8,
    "retain_batch_size": 8,
}
MARGIN = 0.5  # nats of forget_gap the oracle must gain over uniform weights


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A retain model (trained on the retain authors and world facts) and a full model (the
    retain model trained further on every author): full-batch AdamW, one thread."""
    torch.set_num_threads(1)
    work = tmp_path_factory.mktemp("oracle")
    data = UnlearningDataModule(**SIZES)
    data.setup()
    tokenizer = data.tokenizer
    tokenizer.save_pretrained(work / "tok")
    torch.manual_seed(0)
    model = build_causal_lm(
        len(tokenizer), 32, 1, 2, 64, 128, tokenizer.pad_token_id, tokenizer.eos_token_id
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for which, steps in (("retain", 100), ("all", 40)):
        split = UnlearningDataModule(finetune_on=which, tokenizer_path=str(work / "tok"), **SIZES)
        split.setup()
        batch = collate(split.finetune_set.examples, tokenizer.pad_token_id)
        for _ in range(steps):
            logits = model(batch["input_ids"], batch["attention_mask"]).logits
            loss = retain_nll(*answer_logprobs(logits, batch["labels"]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.save_pretrained(work / which)
    retain = load_pretrained(str(work / "retain")).eval()
    return {
        "work": work,
        "tokenizer": tokenizer,
        "forget": data.data.forget,
        "retain_logprobs": answer_token_logprobs(retain, tokenizer, data.data.forget),
    }


def unlearned_gap(world, method: str, lr: float = 3e-3, steps: int = 15) -> np.ndarray:
    """forget_gap per forget item after ``steps`` unlearning updates of ``method``."""
    torch.manual_seed(0)
    data = UnlearningDataModule(tokenizer_path=str(world["work"] / "tok"), **SIZES)
    module = UnlearningModule(
        method=method, pretrained=str(world["work"] / "all"), finetune_steps=0, lr=lr,
        burnin_steps=0,
    )  # fmt: skip
    quiet_trainer(steps).fit(module, data)
    logprobs = answer_token_logprobs(module.model.eval(), world["tokenizer"], world["forget"])
    return forget_gap(logprobs, world["retain_logprobs"])


def oracle_wins(oracle: np.ndarray, uniform: np.ndarray) -> bool:
    """The check: lower mean forget_gap than uniform weights by MARGIN, on most items."""
    return (uniform.mean() - oracle.mean() > MARGIN) and np.mean(oracle < uniform) > 0.5


def test_the_span_oracle_beats_uniform_weights_and_the_check_can_fail(world, monkeypatch):
    uniform = unlearned_gap(world, "atwu_uniform")
    oracle = unlearned_gap(world, "annotator_oracle")
    full = load_pretrained(str(world["work"] / "all")).eval()
    before = forget_gap(
        answer_token_logprobs(full, world["tokenizer"], world["forget"]), world["retain_logprobs"]
    )
    assert oracle.mean() < before.mean()  # unlearning moved toward the retain model
    assert oracle_wins(oracle, uniform), (oracle.mean(), uniform.mean())
    # the same check on uniform weights themselves, and on the oracle's weights swapped
    # (every answer token but the span) inside the module: both fail
    assert not oracle_wins(uniform, uniform)
    monkeypatch.setattr(
        UnlearningModule,
        "fixed_token_weights",
        lambda self, batch, mask: (1 - batch["relevance"][:, 1:].float()) * mask,
    )
    swapped = unlearned_gap(world, "annotator_oracle")
    assert not oracle_wins(swapped, uniform), (swapped.mean(), uniform.mean())
    assert swapped.mean() > oracle.mean() + MARGIN
