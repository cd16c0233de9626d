"""The language math of core.py, checked against autograd, finite differences and closed forms."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from vpretrain import baselines, core


def tiny_lm(vocab: int = 50, dtype=torch.float64) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    return Qwen2ForCausalLM(config).to(dtype)


def log_probs_of(model, ids):
    return torch.log_softmax(model(input_ids=ids).logits, -1)


def random_tangent(model, seed=1):
    g = torch.Generator().manual_seed(seed)
    return {
        n: torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in model.named_parameters()
    }


def test_directions_equal_autograd_inner_products_and_finite_differences():
    model = tiny_lm()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    tangent = random_tangent(model)
    named = dict(model.named_parameters())
    log_probs, directions, hidden = core.log_probs_and_directions(model, named, tangent, ids)
    assert torch.allclose(log_probs, log_probs_of(model, ids))
    assert hidden.shape == (2, 7, 16)
    for b, t, v in [(0, 3, 5), (1, 6, 49), (1, 0, 0)]:
        model.zero_grad()
        log_probs_of(model, ids)[b, t, v].backward()
        by_autograd = sum((p.grad * tangent[n]).sum() for n, p in named.items())
        assert directions[b, t, v].item() == pytest.approx(
            by_autograd.item(), rel=1e-5
        )  # RMSNorm: fp32
    eps = 1e-4  # Qwen2's RMSNorm computes in fp32: a smaller step drowns in its round-off
    with torch.no_grad():
        plus = torch.func.functional_call(
            model, {n: p + eps * tangent[n] for n, p in named.items()}, (ids,)
        ).logits.log_softmax(-1)
        minus = torch.func.functional_call(
            model, {n: p - eps * tangent[n] for n, p in named.items()}, (ids,)
        ).logits.log_softmax(-1)
    finite = (plus - minus) / (2 * eps)
    assert (directions - finite).abs().max() < 1e-3 * directions.abs().max()


def test_predicted_decrease_matches_the_realised_one_for_a_small_step():
    """Eq. (3): for a small SGD step on L_ssl(q), V(q) equals L_down(theta) - L_down(theta')."""
    model = tiny_lm()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (3, 9), generator=g)
    feedback = torch.randint(0, 50, (4, 6), generator=g)
    answer = torch.zeros(4, 6, dtype=torch.bool)
    answer[:, 3:] = True
    named = dict(model.named_parameters())

    def downstream():
        fn = lambda i, a: log_probs_of(model, i)  # noqa: E731
        return core.answer_nll(fn, feedback, torch.ones_like(feedback), answer).mean()

    g_down = torch.autograd.grad(downstream(), list(named.values()))
    tangent = dict(zip(named, g_down, strict=True))
    log_probs, directions, _ = core.log_probs_and_directions(model, named, tangent, ids[:, :-1])
    slots = core.candidates(log_probs, ids[:, 1:], k=4)
    mixing = torch.rand(3, 8, generator=g, dtype=torch.float64)
    q = core.soft_targets(mixing, torch.randn(3, 8, 4, generator=g, dtype=torch.float64))
    lr = 1e-3
    predicted = core.predicted_decrease(q, directions.gather(-1, slots), lr)

    before = downstream().item()
    ssl = core.soft_cross_entropy(log_probs_of(model, ids[:, :-1]).gather(-1, slots), q)
    grads = torch.autograd.grad(ssl, list(named.values()))
    with torch.no_grad():
        for p, grad in zip(named.values(), grads, strict=True):
            p -= lr * grad
    realised = before - downstream().item()
    assert predicted.item() == pytest.approx(realised, rel=0.02)
    assert abs(predicted.item()) > 1e-6  # not trivially zero


def test_soft_targets_are_distributions_on_the_top_k_plus_the_observed_token():
    g = torch.Generator().manual_seed(0)
    log_probs = torch.randn(2, 5, 30, generator=g).log_softmax(-1)
    observed = torch.randint(0, 30, (2, 5), generator=g)
    slots = core.candidates(log_probs, observed, k=4)
    assert torch.equal(slots[..., 0], observed)
    assert torch.equal(slots[..., 1:], log_probs.topk(4, -1).indices)
    q = core.soft_targets(torch.rand(2, 5, generator=g), torch.randn(2, 5, 4, generator=g), 0.5)
    dense = core.to_vocabulary(q, slots, 30)
    assert torch.allclose(dense.sum(-1), torch.ones(2, 5))
    assert (dense >= 0).all()
    allowed = torch.zeros(2, 5, 30, dtype=torch.bool).scatter_(-1, slots, True)
    assert (dense[~allowed] == 0).all()
    one_hot = core.soft_targets(torch.zeros(2, 5), torch.randn(2, 5, 4, generator=g))
    assert torch.equal(core.to_vocabulary(one_hot, slots, 30).argmax(-1), observed)
    assert torch.allclose(one_hot[..., 0], torch.ones(2, 5))
    scores = torch.randn(2, 5, 4, generator=g)
    spread = core.soft_targets(torch.ones(2, 5), scores, temperature=2.0)
    assert torch.allclose(spread[..., 1:], torch.softmax(scores / 2.0, -1))


def test_soft_cross_entropy_is_linear_in_the_targets_and_one_hot_is_plain_nll():
    g = torch.Generator().manual_seed(1)
    at = torch.randn(2, 3, 5, generator=g).log_softmax(-1)
    q1 = torch.rand(2, 3, 5, generator=g).softmax(-1)
    q2 = torch.rand(2, 3, 5, generator=g).softmax(-1)
    mixed = core.soft_cross_entropy(at, 0.3 * q1 + 0.7 * q2)
    assert mixed == pytest.approx(
        (0.3 * core.soft_cross_entropy(at, q1) + 0.7 * core.soft_cross_entropy(at, q2)).item()
    )
    one_hot = torch.zeros(2, 3, 5)
    one_hot[..., 0] = 1
    assert core.soft_cross_entropy(at, one_hot) == pytest.approx(-at[..., 0].mean().item())
    mask = torch.tensor([[1.0, 0, 0], [0, 0, 1]])
    expected = -(at[0, 0, 0] + at[1, 2, 0]) / 2
    assert core.soft_cross_entropy(at, one_hot, mask) == pytest.approx(expected.item())


def test_predicted_decrease_closed_form_and_mask():
    q = torch.tensor([[[0.5, 0.5], [1.0, 0.0]]])  # [1, 2, 2]
    d = torch.tensor([[[2.0, -4.0], [3.0, 7.0]]])
    # -(eta/N) sum q D = -(0.1/2) * ((1 - 2) + 3) = -0.1
    assert core.predicted_decrease(q, d, 0.1).item() == pytest.approx(-0.1)
    mask = torch.tensor([[1.0, 0.0]])
    assert core.predicted_decrease(q, d, 0.1, mask).item() == pytest.approx(0.1)


def test_designer_regularisers_closed_form():
    k = 4
    reference = torch.full((1, 1, k + 1), 0.1 / k)
    reference[..., 0] = 0.9
    kl, entropy = core.designer_regularisers(reference, smoothing=0.1)
    assert kl.item() == pytest.approx(0.0, abs=1e-7)
    uniform = torch.full((1, 1, k + 1), 1 / (k + 1))
    kl, entropy = core.designer_regularisers(uniform, smoothing=0.1)
    assert entropy.item() == pytest.approx(math.log(k + 1))
    expected = sum(0.2 * math.log(0.2 / r) for r in [0.9] + [0.1 / k] * k)
    assert kl.item() == pytest.approx(expected)


def test_adam_preconditioner_is_the_bias_corrected_second_moment():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
    optimizer = torch.optim.AdamW([p], lr=0.1, betas=(0.9, 0.99), eps=1e-8)
    scales = core.adam_preconditioner(optimizer, {"p": p})
    assert torch.equal(scales["p"], torch.ones(3))  # no state yet: identity
    for grad in ([0.5, 1.0, -2.0], [1.5, -1.0, 0.0]):
        p.grad = torch.tensor(grad)
        optimizer.step()
    v = 0.99 * (1 - 0.99) * torch.tensor([0.25, 1.0, 4.0]) + (1 - 0.99) * torch.tensor(
        [2.25, 1.0, 0.0]
    )
    v_hat = v / (1 - 0.99**2)
    expected = 1 / (v_hat.sqrt() + 1e-8)
    scales = core.adam_preconditioner(optimizer, {"p": p})
    assert torch.allclose(scales["p"], expected, rtol=1e-5)


def test_alignment_weights_keep_helpful_tokens_only():
    d = torch.tensor([[-2.0, 1.0, -1.0, 0.0]])
    mask = torch.ones(1, 4)
    weights = baselines.alignment_token_weights(d, mask)
    assert torch.allclose(weights, torch.tensor([[8 / 3, 0.0, 4 / 3, 0.0]]))
    assert torch.equal(baselines.alignment_token_weights(torch.ones(1, 4), mask), mask)


def test_fixed_soft_targets_mix_the_renormalised_top_k():
    log_probs = torch.log(torch.tensor([[[0.5, 0.3, 0.1, 0.1]]]))
    slots = core.candidates(log_probs, torch.tensor([[3]]), k=2)  # observed 3, top-2 = 0, 1
    at = log_probs.gather(-1, slots)
    q = baselines.fixed_soft_targets(at, 0.4)
    assert torch.allclose(q, torch.tensor([[[0.6, 0.4 * 0.5 / 0.8, 0.4 * 0.3 / 0.8]]]))
    assert torch.allclose(baselines.fixed_soft_targets(at, 0.0), torch.tensor([[[1.0, 0, 0]]]))


def test_answer_nll_reads_only_the_answer_tokens():
    table = torch.log(torch.tensor([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]))

    def fn(ids, mask):  # the next token's log-probabilities depend on the current token only
        return table[ids]

    ids = torch.tensor([[0, 2, 1, 0]])
    answer = torch.tensor([[False, False, True, True]])
    # tokens 1 (after 2) and 0 (after 1): -(log 0.2 + log 0.6) / 2
    expected = -(math.log(0.2) + math.log(0.6)) / 2
    assert core.answer_nll(fn, ids, torch.ones_like(ids), answer).item() == pytest.approx(expected)


def test_designer_starts_near_the_one_hot_target_and_stays_bounded():
    designer = core.TargetDesigner(hidden_size=8, k=3, width=8, lambda_max=0.9)
    hidden = torch.randn(2, 4, 8) * 100
    at = torch.randn(2, 4, 4).log_softmax(-1)
    mixing, scores = designer(hidden, at)
    assert mixing.shape == (2, 4) and scores.shape == (2, 4, 3)
    assert torch.allclose(mixing, torch.full((2, 4), 0.9 * torch.sigmoid(torch.tensor(-3.0))))
    torch.nn.init.constant_(designer.mixing[-1].bias, 50.0)
    assert designer(hidden, at)[0].max() <= 0.9


def test_frozen_parameters_get_a_zero_tangent():
    model = tiny_lm()
    ids = torch.randint(0, 50, (1, 5), generator=torch.Generator().manual_seed(4))
    named = dict(model.named_parameters())
    tangent = random_tangent(model)
    head = "model.embed_tokens.weight"
    partial = {head: tangent[head]}
    _, directions, _ = core.log_probs_and_directions(model, named, partial, ids)
    zeroed = {n: (t if n == head else torch.zeros_like(t)) for n, t in tangent.items()}
    _, expected, _ = core.log_probs_and_directions(model, named, zeroed, ids)
    assert torch.allclose(directions, expected) and directions.abs().max() > 0


def test_adam_preconditioner_reads_every_parameter_with_state():
    fresh = torch.nn.Parameter(torch.ones(2))  # never stepped: identity
    a = torch.nn.Parameter(torch.ones(2))
    b = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([fresh, a, b], lr=0.1, betas=(0.9, 0.99), eps=1e-8)
    a.grad, b.grad = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
    optimizer.step()
    scales = core.adam_preconditioner(optimizer, {"fresh": fresh, "a": a, "b": b})
    assert torch.equal(scales["fresh"], torch.ones(2))
    assert torch.allclose(scales["b"], 1 / (torch.tensor([3.0, 4.0]) + 1e-8), rtol=1e-5)
    assert torch.allclose(scales["a"], 1 / (torch.tensor([1.0, 2.0]) + 1e-8), rtol=1e-5)


def test_masked_means_count_only_unmasked_positions():
    q = torch.full((1, 2, 3), 1 / 3)
    q[0, 1] = torch.tensor([0.8, 0.1, 0.1])
    mask = torch.tensor([[0.0, 1.0]])
    kl, entropy = core.designer_regularisers(q, smoothing=0.2, mask=mask)
    alone_kl, alone_entropy = core.designer_regularisers(q[:, 1:], smoothing=0.2)
    assert kl.item() == pytest.approx(alone_kl.item())
    assert entropy.item() == pytest.approx(alone_entropy.item())
    at = torch.log(torch.tensor([[[0.5, 0.5], [0.25, 0.75]]]))
    one_hot = torch.tensor([[[1.0, 0.0], [1.0, 0.0]]])
    assert core.soft_cross_entropy(at, one_hot, mask).item() == pytest.approx(-math.log(0.25))


def test_alignment_weights_ignore_masked_positions_and_small_totals():
    d = torch.tensor([[-0.2, -0.1, 5.0, -0.3]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    weights = baselines.alignment_token_weights(d, mask)
    # total relu(-D) over unmasked = 0.3 (below 1), scaled to mean 1 over the 3 positions
    assert torch.allclose(weights, torch.tensor([[2.0, 1.0, 0.0, 0.0]]))


def test_answer_nll_is_per_problem():
    table = torch.log(torch.tensor([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1], [0.2, 0.2, 0.6]]))
    ids = torch.tensor([[0, 2, 1, 0], [1, 0, 2, 2]])
    answer = torch.tensor([[False, False, True, True], [False, True, True, False]])
    nll = core.answer_nll(lambda i, m: table[i], ids, torch.ones_like(ids), answer)
    expected = [-(math.log(0.2) + math.log(0.6)) / 2, -(math.log(0.6) + math.log(0.7)) / 2]
    assert torch.allclose(nll, torch.tensor(expected))


def test_in_family_targets_put_lambda_max_on_the_right_digit_where_it_is_reachable():
    # [1, 4] positions, K = 3: slots = [observed, top1, top2, top3]
    slots = torch.tensor([[[5, 7, 9, 4], [5, 7, 9, 4], [6, 6, 2, 3], [8, 1, 2, 3]]])
    clean = torch.tensor([[9, 5, 2, 0]])
    corrupted = torch.tensor([[True, False, True, True]])
    q = core.in_family_targets(slots, clean, corrupted, 0.9)
    expected = torch.tensor(
        [
            [
                [0.1, 0.0, 0.9, 0.0],  # corrupted, clean 9 at top-2
                [1.0, 0.0, 0.0, 0.0],  # not corrupted: one-hot observed
                [0.1, 0.0, 0.9, 0.0],  # corrupted, clean 2 at top-2
                [1.0, 0.0, 0.0, 0.0],  # corrupted but clean 0 not in the top-K
            ]
        ]
    )
    assert torch.allclose(q, expected)


def test_in_family_targets_use_one_slot_when_the_clean_token_repeats():
    slots = torch.tensor([[[5, 2, 2, 4]]])  # a duplicate in the top-K
    q = core.in_family_targets(slots, torch.tensor([[2]]), torch.tensor([[True]]), 0.5)
    assert torch.allclose(q, torch.tensor([[[0.5, 0.5, 0.0, 0.0]]]))


def test_in_family_targets_are_a_member_of_the_designer_family():
    # eq. (6) with lambda = lambda_max and scores that put all top-K mass on one slot
    slots = torch.tensor([[[5, 7, 9, 4]]])
    q = core.in_family_targets(slots, torch.tensor([[9]]), torch.tensor([[True]]), 0.9)
    scores = torch.tensor([[[-1e4, 0.0, -1e4]]])
    assert torch.allclose(q, core.soft_targets(torch.tensor([[0.9]]), scores), atol=1e-6)


def test_mass_by_rank_sums_to_the_mean_mixing_weight():
    weights = torch.tensor([[[0.5, 0.3, 0.2], [1.0, 0.0, 0.0], [0.2, 0.0, 0.8]]])
    assert torch.allclose(core.mass_by_rank(weights), torch.tensor([0.3, 1.0]) / 3)
    mask = torch.tensor([[True, False, True]])
    assert torch.allclose(core.mass_by_rank(weights, mask), torch.tensor([0.15, 0.5]))


def test_score_entropy_is_log_k_when_flat_and_zero_when_peaked():
    flat = torch.zeros(2, 3, 4)
    assert core.score_entropy(flat).item() == pytest.approx(math.log(4))
    peaked = torch.tensor([[[50.0, 0.0, 0.0, 0.0]]])
    assert core.score_entropy(peaked).item() == pytest.approx(0.0, abs=1e-6)
    two = torch.tensor([[[0.0, 0.0, -1e4, -1e4]]])
    assert core.score_entropy(two, temperature=2.0).item() == pytest.approx(math.log(2))


def test_score_entropy_by_value_at_the_default_and_another_temperature():
    scores = torch.tensor([[[math.log(3.0), 0.0]]])  # softmax: 3/4, 1/4
    expected = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert core.score_entropy(scores).item() == pytest.approx(expected, rel=1e-6)
    halved = torch.tensor([math.sqrt(3.0), 1.0]) / (1 + math.sqrt(3.0))  # softmax of scores / 2
    expected = -(halved * halved.log()).sum().item()
    assert core.score_entropy(scores, temperature=2.0).item() == pytest.approx(expected, rel=1e-6)


def test_mass_by_rank_over_a_single_kept_position_is_that_position():
    weights = torch.tensor([[[0.5, 0.3, 0.2], [0.4, 0.1, 0.5]]])
    mask = torch.tensor([[False, True]])
    assert torch.allclose(core.mass_by_rank(weights, mask), torch.tensor([0.1, 0.5]))


def test_masked_regularisers_average_over_the_kept_positions_only():
    # K = 2, smoothing 0.2: r = [0.8, 0.1, 0.1]; three positions, the middle one masked out
    weights = torch.tensor([[[0.8, 0.1, 0.1], [0.2, 0.4, 0.4], [1.0, 0.0, 0.0]]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    kl, entropy = core.designer_regularisers(weights, 0.2, mask)
    # position 0 equals r (KL 0, entropy H(r)); position 2 is one-hot (KL -log 0.8, entropy 0)
    h_r = -(0.8 * math.log(0.8) + 2 * 0.1 * math.log(0.1))
    assert kl.item() == pytest.approx(-math.log(0.8) / 2, rel=1e-5)
    assert entropy.item() == pytest.approx(h_r / 2, rel=1e-5)
