r"""The TOFU evaluation chain (teacher-forced probabilities, greedy generations, statistics).

For a question q and answer a, ``P(a|q)^(1/|a|) = exp(mean_t log p_t)`` is the length-normalised
answer probability. Per item (TOFU, open-unlearning ``truth_ratio``)::

    R = mean_k P(a~_k|q)^(1/|a~_k|) / P(a_para|q)^(1/|a_para|)     (perturbed vs paraphrased)

- forget quality: the two-sample KS test p-value between the unlearned model's R on the forget set
  and the retain-only model's R (``scipy.stats.ks_2samp``); high = indistinguishable from a model
  that never saw the forget data;
- forget truth ratio score: mean min(R, 1/R); utility truth ratio score: mean max(0, 1 - R);
- answer probability: retain set P(a|q)^(1/|a|); world facts normalised over the options,
  P(a) / (P(a) + sum_k P(a~_k));
- ROUGE-L recall of the greedy answer against the reference (``rouge-score``);
- model utility: the harmonic mean of {probability, ROUGE-L, truth ratio score} on the retain set
  and on world facts (and on real authors when the data have them);
- span alignment: AUROC and AUPRC of a method's token weights against the ground-truth
  forget-relevant token mask (``sklearn``).
"""

from __future__ import annotations

import numpy as np
import torch
from rouge_score import rouge_scorer
from scipy import stats
from sklearn.metrics import average_precision_score, roc_auc_score

from atwu.core import answer_logprobs
from atwu.data import QAItem, collate, encode_qa, prompt_ids

_ROUGE = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)


@torch.no_grad()
def mean_token_logprob(
    model, tokenizer, questions: list[str], answers: list[str], batch_size: int = 64
) -> np.ndarray:
    """mean_t log p_t of each answer given its question (teacher forcing) -> [N]."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(questions), batch_size):
        examples = [
            encode_qa(tokenizer, q, a)
            for q, a in zip(
                questions[start : start + batch_size],
                answers[start : start + batch_size],
                strict=True,
            )
        ]
        batch = collate(examples, tokenizer.pad_token_id)
        logits = model(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
        ).logits
        logp, mask = answer_logprobs(logits, batch["labels"].to(device))
        out.append(((logp * mask).sum(-1) / mask.sum(-1)).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0)


def truth_ratios(model, tokenizer, items: list[QAItem], kind: str = "geometric") -> np.ndarray:
    """R per item: perturbed over paraphrased length-normalised answer probability.

    ``geometric`` (open-unlearning's ``truth_ratio``): exp of the mean over perturbed answers of
    their mean token log-probability, i.e. the geometric mean of P(a~_k|q)^(1/|a~_k|);
    ``arithmetic`` (the TOFU paper): the arithmetic mean of P(a~_k|q)^(1/|a~_k|).
    """
    if kind not in ("geometric", "arithmetic"):
        raise ValueError(f"truth ratio kind must be 'geometric' or 'arithmetic', got {kind!r}")
    questions = [it.question for it in items]
    para = mean_token_logprob(model, tokenizer, questions, [it.paraphrased_answer for it in items])
    k = min(len(it.perturbed_answers) for it in items)
    pert = np.stack(
        [
            mean_token_logprob(
                model, tokenizer, questions, [it.perturbed_answers[j] for it in items]
            )
            for j in range(k)
        ]
    )
    if kind == "geometric":
        return np.exp(pert.mean(0) - para)
    return np.exp(pert).mean(0) / np.maximum(np.exp(para), 1e-30)


def forget_truth_score(ratios: np.ndarray) -> float:
    """Forget-set truth ratio score: mean min(R, 1/R) (1 = no preference for the truth)."""
    return float(np.mean(np.minimum(ratios, 1.0 / np.maximum(ratios, 1e-30))))


def utility_truth_score(ratios: np.ndarray) -> float:
    """Utility truth ratio score: mean max(0, 1 - R) (1 = the truth is strongly preferred)."""
    return float(np.mean(np.maximum(0.0, 1.0 - ratios)))


def forget_quality(unlearned_ratios: np.ndarray, retain_ratios: np.ndarray) -> float:
    """KS-test p-value between the truth-ratio samples of the unlearned and the retain model."""
    return float(stats.ks_2samp(unlearned_ratios, retain_ratios).pvalue)


def answer_probability(model, tokenizer, items: list[QAItem], over_options: bool) -> float:
    """Mean P(a|q)^(1/|a|); with ``over_options`` normalised against the perturbed answers."""
    questions = [it.question for it in items]
    correct = np.exp(mean_token_logprob(model, tokenizer, questions, [it.answer for it in items]))
    if not over_options:
        return float(correct.mean())
    k = min(len(it.perturbed_answers) for it in items)
    wrong = sum(
        np.exp(
            mean_token_logprob(
                model, tokenizer, questions, [it.perturbed_answers[j] for it in items]
            )
        )
        for j in range(k)
    )
    return float(np.mean(correct / (correct + wrong)))


@torch.no_grad()
def greedy_answers(model, tokenizer, questions: list[str], max_new_tokens: int = 32) -> list[str]:
    """Greedy decoding of each answer (a left-padded batch of prompts through ``generate``)."""
    prompts = [prompt_ids(tokenizer, q) for q in questions]
    return greedy_from_prompts(model, tokenizer, prompts, max_new_tokens)


@torch.no_grad()
def greedy_from_prompts(
    model, tokenizer, prompts: list[list[int]], max_new_tokens: int = 32, batch_size: int = 0
) -> list[str]:
    """Greedy continuation of each prompt (token ids), decoded without special tokens; in
    batches of ``batch_size`` prompts (0: all in one batch, as the TOFU chain has always run)."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id
    answers = []
    batch_size = batch_size or max(len(prompts), 1)
    for start in range(0, len(prompts), batch_size):
        chunk = prompts[start : start + batch_size]
        width = max(len(p) for p in chunk)
        input_ids = torch.tensor([[pad] * (width - len(p)) + p for p in chunk])
        attention = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in chunk])
        generated = model.generate(
            input_ids=input_ids.to(device),
            attention_mask=attention.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=pad,
            eos_token_id=tokenizer.eos_token_id,
        )
        new_tokens = generated[:, width:]
        decoded = tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
        answers += [t.strip() for t in decoded]
    return answers


def rouge_l_recall(predictions: list[str], references: list[str]) -> np.ndarray:
    """ROUGE-L recall of each prediction against its reference."""
    return np.array(
        [
            _ROUGE.score(ref, pred)["rougeL"].recall
            for pred, ref in zip(predictions, references, strict=True)
        ]
    )


def harmonic_mean(values: list[float]) -> float:
    """Model utility aggregate; 0 when any component is 0 (as TOFU's harmonic mean)."""
    values = np.asarray(values, dtype=float)
    return 0.0 if np.any(values <= 0) else float(stats.hmean(values))


def span_alignment(weights: np.ndarray, relevant: np.ndarray) -> dict[str, float]:
    """AUROC and AUPRC of token weights against the ground-truth forget-relevant mask."""
    weights, relevant = np.asarray(weights, float).ravel(), np.asarray(relevant, int).ravel()
    if relevant.min() == relevant.max():
        raise ValueError("span alignment needs both relevant and irrelevant tokens")
    return {
        "auroc": float(roc_auc_score(relevant, weights)),
        "auprc": float(average_precision_score(relevant, weights)),
    }


def utility_components(
    model,
    tokenizer,
    name: str,
    items: list[QAItem],
    over_options: bool,
    max_new_tokens: int = 32,
    truth_ratio: str = "geometric",
) -> dict:
    """Probability, ROUGE-L recall and truth ratio score of one utility set."""
    generated = greedy_answers(model, tokenizer, [it.question for it in items], max_new_tokens)
    return {
        f"{name}_prob": answer_probability(model, tokenizer, items, over_options),
        f"{name}_rouge": float(rouge_l_recall(generated, [it.answer for it in items]).mean()),
        f"{name}_truth": utility_truth_score(truth_ratios(model, tokenizer, items, truth_ratio)),
    }


def evaluate_unlearning(
    model,
    tokenizer,
    forget: list[QAItem],
    utility_sets: dict[str, tuple[list[QAItem], bool]],
    retain_model_ratios: np.ndarray | None = None,
    max_new_tokens: int = 32,
    truth_ratio: str = "geometric",
) -> tuple[dict[str, float], np.ndarray]:
    """The whole chain for one model -> (metrics, its forget-set truth ratios).

    ``utility_sets`` maps a name to (items, normalise probability over options): with TOFU's
    retain, real-author and world-fact sets that is the nine parts of TOFU's model utility.
    """
    was_training = model.training
    model.eval()
    ratios = truth_ratios(model, tokenizer, forget, truth_ratio)
    generated = greedy_answers(model, tokenizer, [it.question for it in forget], max_new_tokens)
    metrics = {
        "forget_rouge": float(rouge_l_recall(generated, [it.answer for it in forget]).mean()),
        "forget_prob": answer_probability(model, tokenizer, forget, over_options=False),
        "forget_truth": forget_truth_score(ratios),
    }
    components = {}
    for name, (items, over_options) in utility_sets.items():
        components.update(
            utility_components(
                model, tokenizer, name, items, over_options, max_new_tokens, truth_ratio
            )
        )
    metrics.update(components)
    metrics["model_utility"] = harmonic_mean(list(components.values()))
    if retain_model_ratios is not None:
        metrics["forget_quality"] = forget_quality(ratios, retain_model_ratios)
    model.train(was_training)
    return metrics, ratios


@torch.no_grad()
def answer_token_logprobs(
    model, tokenizer, items: list[QAItem], batch_size: int = 64
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Teacher-forced log p_t of every answer token and its class (template / value / name /
    EOS, see ``atwu.data.TOKEN_CLASSES``), one (logp [T_i], class [T_i]) pair per item."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        examples = [
            encode_qa(tokenizer, it.question, it.answer, it.answer_spans, 128, it.name_spans)
            for it in chunk
        ]
        batch = collate(examples, tokenizer.pad_token_id)
        logits = model(
            input_ids=batch["input_ids"].to(device),
            attention_mask=batch["attention_mask"].to(device),
        ).logits
        logp, mask = answer_logprobs(logits, batch["labels"].to(device))
        classes = batch["token_class"][:, 1:]
        for row in range(len(chunk)):
            keep = mask[row].bool().cpu()
            out.append((logp[row].cpu()[keep].numpy(), classes[row][keep].numpy()))
    return out


def gap_to_reference(
    unlearned: list[tuple[np.ndarray, np.ndarray]],
    reference: list[tuple[np.ndarray, np.ndarray]],
    token_class: int | None = None,
) -> np.ndarray:
    """Per item: mean over its answer tokens (of one class, or all) of |log p_t - log p_ref_t|.

    Against the retain model this is a token-level forget quality: 0 when the unlearned model
    predicts every answer token as a model that never saw the forget data does. It penalises
    both a fact that is still known (value tokens too likely) and a destroyed answer (template
    tokens pushed far below the retain model's fluent prediction), as well as over-forgetting.
    Items without a token of the class give NaN.
    """
    gaps = []
    for (logp, classes), (ref, _) in zip(unlearned, reference, strict=True):
        keep = np.ones_like(classes, bool) if token_class is None else classes == token_class
        gaps.append(float(np.abs(logp - ref)[keep].mean()) if keep.any() else np.nan)
    return np.asarray(gaps)


def normalised_answer_probability(
    token_logprobs: list[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """Per item P(a|q)^(1/|a|) = exp(mean_t log p_t)."""
    return np.array([float(np.exp(logp.mean())) for logp, _ in token_logprobs])


def forget_gap(
    unlearned: list[tuple[np.ndarray, np.ndarray]],
    reference: list[tuple[np.ndarray, np.ndarray]],
    value_class: int = 1,
) -> np.ndarray:
    """Per forget item, the distance to the retain model (which never saw the item)::

        gap = | mean_{t in value} (log p_t - log p_t^ret) |
              + mean_{t not in value} max(0, log p_t^ret - log p_t)

    The first term is 0 when the fact (the attribute value) is exactly as likely as for a model
    that never learned it, and grows both when it is still known and when it is pushed far below
    (over-forgetting, detectable); the second term is the fluency lost on the rest of the answer
    (template, the name copied from the question, EOS) relative to the retain model. 0 for the
    retain model itself.
    """
    gaps = []
    for (logp, classes), (ref, _) in zip(unlearned, reference, strict=True):
        value = classes == value_class
        knowledge = abs(float((logp - ref)[value].mean())) if value.any() else 0.0
        damage = float(np.maximum(ref - logp, 0.0)[~value].mean()) if (~value).any() else 0.0
        gaps.append(knowledge + damage)
    return np.asarray(gaps)


def rwku_scores(
    model, tokenizer, probes: dict[str, list[QAItem]], max_new_tokens: int = 30
) -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """RWKU's evaluation: ROUGE-L recall of the greedy answer to each probe, averaged per set
    (``forget_level1..3``, ``neighbor_level1..2``) -> ({set: mean}, {set: per-probe recall}).

    As RWKU's ``eval_forget`` / ``eval_neighbor``: the probe's instruction prompt (see
    ``atwu.rwku.answer_prompts``), greedy decoding of ``max_new_tokens`` (RWKU: 30) cut at the
    first line break (RWKU stops on newline tokens), an empty answer scored as "NOANSWER".
    """
    from atwu.rwku import NO_ANSWER, answer_prompts

    was_training = model.training
    model.eval()
    means, per_probe = {}, {}
    for name, items in probes.items():
        if not items:
            continue
        answers = greedy_from_prompts(
            model, tokenizer, answer_prompts(tokenizer, items), max_new_tokens, batch_size=64
        )
        answers = [a.split("\n")[0].strip() or NO_ANSWER for a in answers]
        per_probe[name] = rouge_l_recall(answers, [it.answer for it in items])
        means[name] = float(per_probe[name].mean())
    model.train(was_training)
    return means, per_probe
