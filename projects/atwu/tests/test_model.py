import socket
import typing

import pytest
import torch

from atwu.core import answer_logprobs, forget_token_loss, retain_nll
from atwu.data import UnlearningDataModule
from atwu.model import (
    METHODS,
    SAMPLE_LEVEL,
    Method,
    UnlearningModule,
    build_causal_lm,
    load_pretrained,
)
from papers_cli import ConfigError, UserError

TINY = {"hidden_size": 32, "num_layers": 1, "num_heads": 2, "intermediate_size": 64}


@pytest.fixture(scope="module")
def data():
    module = UnlearningDataModule(
        num_authors=6, num_forget_authors=1, num_collateral_authors=1, num_generic=40,
        vocab_size=300,
    )  # fmt: skip
    module.setup()
    return module


@pytest.fixture
def no_network(monkeypatch):
    """Any attempt to open a connection (a hub lookup) fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("a code path tried to reach the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_from_pretrained_reloads_a_saved_local_checkpoint_without_the_hub(
    data, tmp_path, no_network
):
    tokenizer = data.tokenizer
    model = build_causal_lm(
        len(tokenizer), 32, 1, 2, 64, 128, tokenizer.pad_token_id, tokenizer.eos_token_id
    )
    model.save_pretrained(tmp_path / "ckpt")
    tokenizer.save_pretrained(tmp_path / "ckpt")
    reloaded = load_pretrained(str(tmp_path / "ckpt"))
    ids = torch.tensor([[3, 4, 5, 6]])
    torch.testing.assert_close(model(ids).logits, reloaded(ids).logits)
    # the whole unlearning path from the local checkpoint, tokenizer included
    local = UnlearningDataModule(
        num_authors=6, num_forget_authors=1, num_collateral_authors=1, num_generic=40,
        tokenizer_path=str(tmp_path / "ckpt"),
    )  # fmt: skip
    local.setup()
    module = UnlearningModule(method="atwu", pretrained=str(tmp_path / "ckpt"))
    module.build(local.tokenizer, local)
    forget, retain = (
        next(iter(local.loader(s, 4, False))) for s in (local.forget_set, local.retain_set)
    )
    assert torch.isfinite(module.unlearning_loss(forget, retain, unlearn_step=10))


def test_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(UserError, match="not a local checkpoint"):
        load_pretrained(str(tmp_path / "nothing"))


def test_the_method_choices_are_the_methods():
    assert set(typing.get_args(Method)) == set(METHODS) and len(METHODS) == len(set(METHODS))


def test_sizes_that_do_not_fit_the_model_are_config_errors(data):
    with pytest.raises(ConfigError, match="heads of an even size"):
        UnlearningModule(hidden_size=30, num_heads=4)
    module = UnlearningModule(**TINY, scorer_layer=3)  # one layer: hidden states 0..1
    with pytest.raises(ConfigError, match="scorer_layer=3"):
        module.build(data.tokenizer, data)


@pytest.mark.parametrize("method", METHODS)
def test_one_unlearning_step_of_every_method_moves_the_model(method, data):
    torch.manual_seed(0)
    module = UnlearningModule(method=method, **TINY)
    module.build(data.tokenizer, data)
    module.reference.load_state_dict(module.model.state_dict()) if module.needs_reference else None
    forget, retain = (
        next(iter(data.loader(s, 4, False))) for s in (data.forget_set, data.retain_set)
    )
    before = [p.detach().clone() for p in module.model.parameters()]
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    loss = module.unlearning_loss(forget, retain, unlearn_step=10)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    assert any(
        not torch.equal(a, b) for a, b in zip(before, module.model.parameters(), strict=True)
    )
    weights = module.token_weights(forget, retain)
    assert (weights is None) == (method in SAMPLE_LEVEL)


def test_atwu_scorer_learns_during_unlearning_and_weights_keep_the_budget(data):
    torch.manual_seed(0)
    module = UnlearningModule(method="atwu", **TINY)
    module.build(data.tokenizer, data)
    module.reference.load_state_dict(module.model.state_dict())
    forget, retain = (
        next(iter(data.loader(s, 4, False))) for s in (data.forget_set, data.retain_set)
    )
    optimizer = torch.optim.Adam(module.parameters(), lr=1e-2)
    for step in range(3):
        optimizer.zero_grad()
        module.unlearning_loss(forget, retain, unlearn_step=step).backward()
        optimizer.step()
    assert module.scorer.linear.weight.abs().sum() > 0  # it left the uniform start
    weights = module.token_weights(forget, retain)
    answer = forget["labels"][:, 1:] != -100
    assert weights[answer].std() > 0 and torch.all(weights[~answer] == 0)


def batches(data, size=8):
    return (next(iter(data.loader(s, size, False))) for s in (data.forget_set, data.retain_set))


def test_direction_through_the_module_high_weight_where_forgetting_does_not_conflict(
    data, monkeypatch
):
    """Through UnlearningModule (targets, scorer step, weights): when the conflict score says
    value tokens help the retain loss (c > 0) and every other token conflicts (c < 0), the
    scorer learns to weight value tokens above the rest. A sign flip anywhere between the
    conflict scores and the weights (e.g. ``relevance_targets(-conflict)``) fails this."""
    torch.manual_seed(0)
    module = UnlearningModule(method="atwu", burnin_steps=0, scorer_lr=0.05, **TINY)
    module.build(data.tokenizer, data)
    module.reference.load_state_dict(module.model.state_dict())
    forget, retain = batches(data)

    def planted(batch, retain_loss, ref_logp):
        return (batch["relevance"][:, 1:].float() * 2 - 1) * (batch["labels"][:, 1:] != -100)

    monkeypatch.setattr(module, "conflict_scores", planted)
    for step in range(30):
        module.unlearning_loss(forget, retain, unlearn_step=step)
    weights = module.token_weights(forget, retain)
    answer = forget["labels"][:, 1:] != -100
    value = forget["relevance"][:, 1:].bool() & answer
    assert weights[value].mean() > weights[answer & ~value].mean() + 0.05


def test_model_step_uses_the_scorer_after_its_step(data):
    """Strict alternation: at the first step after burn-in the model objective is weighted by
    the scorer after its step (a one-step lag would still use the zero-initialised, uniform
    scorer); during burn-in the weights are uniform."""
    forget, retain = batches(data)

    def loss_and_uniform(burnin: int) -> tuple[float, float]:
        torch.manual_seed(0)
        module = UnlearningModule(method="atwu", burnin_steps=burnin, scorer_lr=0.5, **TINY)
        module.build(data.tokenizer, data)
        with torch.no_grad():
            for p in module.reference.parameters():
                p.add_(0.05 * torch.randn_like(p))  # token NPO losses differ between tokens
        logp, mask = answer_logprobs(module(forget).logits, forget["labels"])
        token_loss = forget_token_loss("npo", logp, module.reference_logprobs(forget), 1.0)
        retain_loss = retain_nll(*answer_logprobs(module(retain).logits, retain["labels"]))
        uniform = ((token_loss * mask).sum() / mask.sum() + retain_loss).item()
        return module.unlearning_loss(forget, retain, unlearn_step=0).item(), uniform

    loss, uniform = loss_and_uniform(burnin=1)
    assert loss == pytest.approx(uniform, rel=1e-5)
    loss, uniform = loss_and_uniform(burnin=0)
    assert loss != pytest.approx(uniform, rel=1e-4)


def test_module_conflict_scores_equal_per_token_autograd(data):
    """UnlearningModule.conflict_scores (the wiring of Eq. 3 to the HF model) against explicit
    per-token gradients: c_t = <grad l_t, grad L_r> with its sign."""
    torch.manual_seed(0)
    module = UnlearningModule(method="atwu", **TINY)
    module.build(data.tokenizer, data)
    forget, retain = batches(data, 2)
    with torch.no_grad():
        for p in module.reference.parameters():
            p.add_(0.05 * torch.randn_like(p))  # a reference different from theta
    logp_r, mask_r = answer_logprobs(module(retain).logits, retain["labels"])
    retain_loss = retain_nll(logp_r, mask_r)
    ref_logp = module.reference_logprobs(forget)
    scores = module.conflict_scores(forget, retain_loss, ref_logp)
    params = [p for p in module.model.parameters() if p.requires_grad]
    retain_grad = torch.autograd.grad(retain_loss, params, retain_graph=True)
    logp, mask = answer_logprobs(module(forget).logits, forget["labels"])
    losses = forget_token_loss("npo", logp, ref_logp, module.hparams.token_beta)
    for b, t in mask.nonzero().tolist()[::5]:
        grad = torch.autograd.grad(losses[b, t], params, retain_graph=True)
        expected = sum((g * r).sum() for g, r in zip(grad, retain_grad, strict=True))
        assert scores[b, t].item() == pytest.approx(expected.item(), rel=1e-3, abs=1e-6)
