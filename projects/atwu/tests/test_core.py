import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from atwu.core import (
    RelevanceScorer,
    answer_logprobs,
    conflict_scores,
    forget_token_loss,
    normalise_budget,
    npo_token_loss,
    relevance_targets,
    retain_nll,
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
