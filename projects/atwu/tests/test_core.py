import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from atwu.core import (
    RelevanceScorer,
    answer_logprobs,
    conflict_scores,
    forget_token_loss,
    masked_mean,
    masked_ranks,
    normalise_budget,
    npo_token_loss,
    relevance_targets,
    retain_nll,
    robust_standardise,
    scorer_loss,
    standardise,
    weighted_forget_loss,
)


def tiny_lm(vocab: int = 12, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
    )  # fmt: skip
    return LlamaForCausalLM._from_config(config, attn_implementation="eager")


def token_losses_of(model, ids, labels, kind, ref_logp=None, beta=1.0):
    def token_losses(params):
        logits = torch.func.functional_call(model, params, (ids,)).logits
        return forget_token_loss(kind, answer_logprobs(logits, labels)[0], ref_logp, beta)

    return token_losses


@pytest.mark.parametrize("kind", ["ga", "npo"])
def test_conflict_scores_equal_autograd_inner_products(kind):
    model = tiny_lm()
    forget = torch.randint(0, 12, (3, 7))
    labels = forget.clone()
    labels[:, :3] = -100  # the question
    retain = torch.randint(0, 12, (4, 7))
    params = dict(model.named_parameters())
    retain_loss = retain_nll(*answer_logprobs(model(retain).logits, retain))
    grads = dict(zip(params, torch.autograd.grad(retain_loss, list(params.values())), strict=True))
    ref_logp = answer_logprobs(tiny_lm(seed=1)(forget).logits, labels)[0].detach()
    scores = conflict_scores(token_losses_of(model, forget, labels, kind, ref_logp), params, grads)

    losses = token_losses_of(model, forget, labels, kind, ref_logp)(params)
    mask = answer_logprobs(model(forget).logits, labels)[1]
    for b, t in mask.nonzero().tolist():
        token_grad = torch.autograd.grad(losses[b, t], list(params.values()), retain_graph=True)
        expected = sum((g * grads[n]).sum() for n, g in zip(params, token_grad, strict=True))
        assert scores[b, t].item() == pytest.approx(expected.item(), rel=1e-4, abs=1e-7)
    assert torch.all(scores[mask == 0] == 0)


def test_a_token_shared_with_the_retain_data_ends_with_a_low_weight():
    """Toy: retain answers are 'S V_i' for subjects P_i; the forget answer is 'S V_0'. Forgetting
    the shared template token S conflicts with the retain data, forgetting V_0 does not."""
    subjects, shared, values = [0, 1, 2, 3], 4, [5, 6, 7, 8]
    rows = torch.tensor([[p, shared, v] for p, v in zip(subjects, values, strict=True)])
    labels = rows.clone()
    labels[:, 0] = -100
    model = tiny_lm(vocab=9)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(40):  # fine-tune on everything (the 'full' model), not to saturation
        optimizer.zero_grad()
        retain_nll(*answer_logprobs(model(rows).logits, labels)).backward()
        optimizer.step()
    forget, forget_labels, retain, retain_labels = rows[:1], labels[:1], rows[1:], labels[1:]
    params = dict(model.named_parameters())
    scorer = RelevanceScorer(16)
    scorer_opt = torch.optim.Adam(scorer.parameters(), lr=0.1)
    for _ in range(30):
        retain_loss = retain_nll(*answer_logprobs(model(retain).logits, retain_labels))
        grads = dict(
            zip(params, torch.autograd.grad(retain_loss, list(params.values())), strict=True)
        )
        scores = conflict_scores(token_losses_of(model, forget, forget_labels, "ga"), params, grads)
        out = model(forget, output_hidden_states=True)
        mask = answer_logprobs(out.logits, forget_labels)[1]
        logits = scorer(out.hidden_states[-1][:, 1:])
        scorer_opt.zero_grad()
        scorer_loss(logits, relevance_targets(scores, mask, 0.5), mask).backward()
        scorer_opt.step()
    weights = normalise_budget(torch.sigmoid(logits.detach()), mask)
    shared_weight, value_weight = weights[0, 0].item(), weights[0, 1].item()  # S, then V_0
    assert scores[0, 0] < scores[0, 1]
    assert shared_weight < 0.5 < 1.5 < value_weight  # the budget keeps the mean at 1


def test_budget_normalisation_fixes_the_mean_weight():
    weights = torch.tensor([[0.2, 0.9, 0.4, 7.0], [0.1, 0.3, 0.0, 5.0]])
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 0, 0]])
    for budget in (1.0, 0.5):
        normalised = normalise_budget(weights, mask, budget)
        assert (normalised * mask).sum() / mask.sum() == pytest.approx(budget)
        assert torch.all(normalised[mask == 0] == 0) and torch.all(normalised >= 0)
    # scale invariance: the budget, not the scorer's overall level, sets the forgetting strength
    torch.testing.assert_close(normalise_budget(weights, mask), normalise_budget(9 * weights, mask))


def test_standardised_targets_are_scale_free_and_ordered():
    scores = torch.tensor([[1.0, -2.0, 3.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    z = standardise(scores, mask)
    assert (z * mask).sum() == pytest.approx(0.0, abs=1e-6)
    assert ((z**2) * mask).sum() / 3 == pytest.approx(1.0, rel=1e-5)
    targets = relevance_targets(scores, mask, 0.5)
    torch.testing.assert_close(targets, relevance_targets(1e-3 * scores, mask, 0.5))
    assert targets[0, 2] > targets[0, 0] > targets[0, 1] and targets[0, 3] == 0


def test_npo_token_loss_matches_its_formula():
    logp, ref = torch.tensor([math.log(0.2)]), torch.tensor([math.log(0.5)])
    beta = 2.0
    expected = (2 / beta) * math.log(1 + (0.2 / 0.5) ** beta)
    assert npo_token_loss(logp, ref, beta).item() == pytest.approx(expected, rel=1e-6)


def test_weighted_forget_loss_treats_weights_as_constants():
    token_loss = torch.tensor([[1.0, 2.0, 3.0]], requires_grad=True)
    weights = torch.tensor([[0.5, 1.5, 9.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss = weighted_forget_loss(token_loss, weights, mask)
    assert loss.item() == pytest.approx((0.5 * 1 + 1.5 * 2) / 2)
    loss.backward()
    assert weights.grad is None
    torch.testing.assert_close(token_loss.grad, torch.tensor([[0.25, 0.75, 0.0]]))


def test_scorer_starts_uniform_and_never_backpropagates_into_the_model():
    scorer = RelevanceScorer(8)
    hidden = torch.randn(2, 5, 8, requires_grad=True)
    logits = scorer(hidden)
    assert torch.all(torch.sigmoid(logits) == 0.5)
    logits.sum().backward()
    assert hidden.grad is None and scorer.linear.weight.grad is not None


def test_answer_logprobs_score_the_next_token_on_answer_positions_only():
    logits = torch.log_softmax(torch.randn(1, 4, 6), -1)
    labels = torch.tensor([[-100, -100, 3, 5]])
    logp, mask = answer_logprobs(logits, labels)
    torch.testing.assert_close(mask, torch.tensor([[0.0, 1.0, 1.0]]))
    torch.testing.assert_close(logp[0, 1:], torch.stack([logits[0, 1, 3], logits[0, 2, 5]]))


# Value tests for the mutation lane's survivors on core.py (see the README's Tests section).


def test_masked_mean_of_one_token_is_that_token_and_of_none_is_zero():
    values = torch.tensor([[4.0, 7.0]])
    assert masked_mean(values, torch.tensor([[0.0, 1.0]])).item() == 7.0
    assert masked_mean(values, torch.zeros(1, 2)).item() == 0.0


def test_the_default_budget_is_a_mean_weight_of_one():
    mask = torch.tensor([[1.0, 1.0, 1.0]])
    normalised = normalise_budget(torch.tensor([[1.0, 2.0, 3.0]]), mask)
    torch.testing.assert_close(normalised, torch.tensor([[0.5, 1.0, 1.5]]))


def test_masked_ranks_by_hand():
    """Ranks among the masked values scaled to [0, 1] by n - 1; masked-out positions 0."""
    values = torch.tensor([[0.3, -1.0, 9.0, 0.1, 5.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0, 1.0, 1.0]])
    expected = torch.tensor([[2 / 3, 0.0, 0.0, 1 / 3, 1.0]])
    torch.testing.assert_close(masked_ranks(values, mask), expected)
    assert masked_ranks(values, mask).dtype == torch.float32
    # one masked token: rank 0 (no division by zero); two: 0 and 1
    assert masked_ranks(values, torch.tensor([[0.0, 0, 1, 0, 0]])).sum().item() == 0.0
    two = masked_ranks(values, torch.tensor([[1.0, 1, 0, 0, 0]]))
    torch.testing.assert_close(two, torch.tensor([[1.0, 0, 0, 0, 0]]))
    # float32 targets whatever the scores' precision (float64 scores in gradchecks)
    assert masked_ranks(values.double(), mask).dtype == torch.float32


def test_robust_standardise_by_hand_ignores_the_outlier():
    """median 3 and IQR 4 - 2 = 2 of [1, 2, 3, 4, 1000]: the outlier sets neither."""
    values = torch.tensor([[1.0, 2.0, 3.0, 4.0, 1000.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    scale = 2.0 / 1.349
    expected = torch.tensor([[-2 / scale, -1 / scale, 0.0, 1 / scale, 997 / scale, 0.0]])
    torch.testing.assert_close(robust_standardise(values, mask), expected)
    # a zero IQR (most scores tied): the score above the median stays above it, far out
    tied = robust_standardise(torch.tensor([[1.0, 1.0, 1.0, 1.0, 5.0]]), torch.ones(1, 5))
    assert tied[0, 4] > 1e6 and torch.all(tied[0, :4] == 0)


@pytest.mark.parametrize("kind", ["z", "robust_z"])
def test_sigmoid_targets_by_hand(kind):
    """Eq. 5 / 5b: sigmoid(standardised score / tau) on answer tokens, 0 elsewhere."""
    scores = torch.tensor([[1.0, 2.0, 3.0, 4.0, 10.0, 7.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    tau = 0.5
    kept = scores[0, :5]
    if kind == "z":
        centre, scale = kept.mean(), kept.var(unbiased=False).sqrt()
    else:
        centre, scale = torch.tensor(3.0), torch.tensor(2.0 / 1.349)  # median, IQR / 1.349
    expected = torch.sigmoid((scores - centre) / scale / tau) * mask
    torch.testing.assert_close(relevance_targets(scores, mask, tau, kind), expected)


def test_unknown_kinds_and_a_missing_reference_are_clear_errors():
    logp = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="NPO token loss needs the reference model's log-prob"):
        forget_token_loss("npo", logp, None, 1.0)
    with pytest.raises(ValueError, match="forget loss must be 'ga' or 'npo', got 'kl'"):
        forget_token_loss("kl", logp, logp, 1.0)
    with pytest.raises(ValueError, match="must be 'rank', 'robust_z' or 'z', got 'softmax'"):
        relevance_targets(logp, torch.ones(1, 2), 1.0, "softmax")


def test_scorer_loss_averages_over_answer_tokens_only():
    logits = torch.tensor([[0.0, 2.0, -1.0]])
    targets = torch.tensor([[1.0, 0.0, 0.5]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    expected = (math.log(2) + math.log(1 + math.exp(2.0))) / 2  # BCE of tokens 0 and 1
    assert scorer_loss(logits, targets, mask).item() == pytest.approx(expected, rel=1e-6)
