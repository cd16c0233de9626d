import math

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from atwu.data import QAItem, corpus_texts, encode_qa, generate_tofu_mini, train_tokenizer
from atwu.evaluate import (
    answer_probability,
    forget_gap,
    forget_quality,
    forget_truth_score,
    harmonic_mean,
    rouge_l_recall,
    span_alignment,
    truth_ratios,
    utility_truth_score,
)


@pytest.fixture(scope="module")
def lm_and_tokenizer():
    data = generate_tofu_mini(4, 1, 1, num_generic=20)
    tokenizer = train_tokenizer(corpus_texts(data), 300)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
    )  # fmt: skip
    model = LlamaForCausalLM._from_config(config, attn_implementation="eager").eval()
    return model, tokenizer, data


def normalised_probability_by_hand(model, tokenizer, question, answer):
    """P(a|q)^(1/|a|), one sequence at a time, token by token."""
    encoded = encode_qa(tokenizer, question, answer)
    ids = torch.tensor([encoded["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits[0]
    logps = [
        torch.log_softmax(logits[t - 1], -1)[label].item()
        for t, label in enumerate(encoded["labels"])
        if label != -100
    ]
    return math.exp(sum(logps) / len(logps))


def test_truth_ratio_matches_a_hand_computation(lm_and_tokenizer):
    model, tokenizer, data = lm_and_tokenizer
    items = data.forget[:3]
    ratios = truth_ratios(model, tokenizer, items)
    for item, ratio in zip(items, ratios, strict=True):
        para = normalised_probability_by_hand(
            model, tokenizer, item.question, item.paraphrased_answer
        )
        pert = [
            normalised_probability_by_hand(model, tokenizer, item.question, a)
            for a in item.perturbed_answers
        ]
        assert ratio == pytest.approx(np.mean(pert) / para, rel=1e-4)


def test_answer_probability_over_options(lm_and_tokenizer):
    model, tokenizer, data = lm_and_tokenizer
    item = data.world_facts[0]
    correct = normalised_probability_by_hand(model, tokenizer, item.question, item.answer)
    wrong = [
        normalised_probability_by_hand(model, tokenizer, item.question, a)
        for a in item.perturbed_answers
    ]
    value = answer_probability(model, tokenizer, [item], over_options=True)
    assert value == pytest.approx(correct / (correct + sum(wrong)), rel=1e-4)


def test_forget_quality_is_the_two_sample_ks_p_value():
    # Disjoint samples of 3: D = 1, exact p = 2 / C(6, 3) = 0.1
    assert forget_quality(np.array([1.0, 2, 3]), np.array([4.0, 5, 6])) == pytest.approx(0.1)
    # Identical samples: D = 0, p = 1
    assert forget_quality(np.array([1.0, 2, 3]), np.array([1.0, 2, 3])) == pytest.approx(1.0)
    # n = m = 2, D = 1/2 (ECDFs by hand): the exact p-value is 1 (every split of 4 has D >= 1/2)
    a, b = np.array([1.0, 3.0]), np.array([2.0, 4.0])
    d = max(abs(np.mean(a <= x) - np.mean(b <= x)) for x in np.concatenate([a, b]))
    assert d == pytest.approx(0.5)
    assert forget_quality(a, b) == pytest.approx(1.0)


def test_truth_scores_and_harmonic_mean():
    ratios = np.array([0.5, 2.0, 1.0])
    assert forget_truth_score(ratios) == pytest.approx((0.5 + 0.5 + 1.0) / 3)
    assert utility_truth_score(ratios) == pytest.approx((0.5 + 0 + 0) / 3)
    assert harmonic_mean([0.5, 0.25]) == pytest.approx(2 / (1 / 0.5 + 1 / 0.25))
    assert harmonic_mean([0.5, 0.0]) == 0.0


def test_rouge_l_recall():
    recall = rouge_l_recall(["the cat", "a dog sat"], ["the cat sat", "the dog sat down"])
    np.testing.assert_allclose(recall, [2 / 3, 2 / 4])


def test_span_alignment():
    relevant = np.array([0, 0, 1, 1])
    assert span_alignment(np.array([0.1, 0.2, 0.8, 0.9]), relevant) == {"auroc": 1.0, "auprc": 1.0}
    assert span_alignment(np.ones(4), relevant)["auroc"] == 0.5
    with pytest.raises(ValueError, match="both"):
        span_alignment(np.ones(3), np.ones(3))


def test_qa_items_with_perturbations_are_what_the_chain_reads():
    item = QAItem("q?", "a.", "a!", ("b.", "c."))
    assert len(item.perturbed_answers) == 2


def test_forget_gap_by_hand():
    """value term |mean (logp - ref)| over value tokens + mean (ref - logp)_+ over the rest."""
    classes = np.array([0, 2, 1, 1, 0, 3])
    reference = [(np.array([-0.1, -2.0, -3.0, -1.0, -0.2, -0.1]), classes)]
    same = forget_gap(reference, reference)
    assert same.tolist() == [0.0]
    unlearned = [(np.array([-0.6, -0.5, -5.0, 0.0, -0.2, -1.1]), classes)]
    # value: mean(-2, +1) = -0.5 -> 0.5; rest: (0.5, 0, 0, 1.0) / 4 = 0.375 (name above ref: 0)
    assert forget_gap(unlearned, reference)[0] == pytest.approx(0.5 + 0.375)
