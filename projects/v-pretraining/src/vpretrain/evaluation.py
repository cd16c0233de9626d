"""Scores of a trained learner on a DataModule's evaluation sets, per item (for paired CIs)."""

from __future__ import annotations

import numpy as np
import torch

from vpretrain import core, formats
from vpretrain.data import ProblemSet, VPretrainDataModule


@torch.no_grad()
def answer_nll(module, problems: ProblemSet, batch_size: int = 100) -> np.ndarray:
    """Mean answer-token NLL per problem [N]."""
    out = []
    for start in range(0, len(problems), batch_size):
        batch = problems.subset(torch.arange(start, min(start + batch_size, len(problems))))
        out.append(
            core.answer_nll(
                module.learner_log_probs,
                batch["input_ids"],
                batch["attention_mask"],
                batch["answer_mask"],
            )
        )
    return torch.cat(out).numpy()


@torch.no_grad()
def pass_at_1(module, data: VPretrainDataModule, problems: ProblemSet, batch_size: int = 100):
    """0/1 per problem: the greedy decode's final number equals the answer."""
    tokenizer = data.tokenizer
    texts = []
    for start in range(0, len(problems), batch_size):
        stop = min(start + batch_size, len(problems))
        prompt = problems.prompt_ids[start:stop]
        generated = module.learner.generate(
            input_ids=prompt,
            attention_mask=problems.prompt_mask[start:stop],
            max_new_tokens=module.hparams.max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts += tokenizer.batch_decode(generated[:, prompt.shape[1] :], skip_special_tokens=True)
    return formats.pass_at_1(texts, problems.problems)


@torch.no_grad()
def prose_nll(module, blocks: torch.Tensor, batch_size: int = 16) -> np.ndarray:
    """Mean next-token NLL per held-out prose block [N] (perplexity = exp of the mean)."""
    out = []
    for start in range(0, len(blocks), batch_size):
        ids = blocks[start : start + batch_size]
        log_probs = module.learner_log_probs(ids[:, :-1])
        nll = -log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        out.append(nll.mean(-1))
    return torch.cat(out).numpy()
