"""The language LightningModule: the designer's direction, the learner's isolation, the arms."""

from __future__ import annotations

import pytest
import torch

from vpretrain import core
from vpretrain.data import VPretrainDataModule
from vpretrain.model import VPretrainModule

SMALL = dict(hidden_size=32, layers=1, heads=2, top_k=4, feedback_batch=16, refresh_every=2)


@pytest.fixture(scope="module")
def data():
    dm = VPretrainDataModule(
        block_size=16,
        batch_size=4,
        n_feedback=32,
        n_val=16,
        n_test=16,
        perplexity_blocks=4,
        arithmetic_share=0.4,
    )
    dm.setup()
    return dm


def module_for(data, arm="vpretrain", **overrides):
    torch.manual_seed(0)
    module = VPretrainModule(arm=arm, vocab_size=data.vocab_size, **{**SMALL, **overrides})
    module.feedback = data.feedback
    optimizer = module.configure_optimizers()
    module.optimizers = lambda: optimizer  # a step outside a Trainer
    module.manual_backward = lambda loss: loss.backward()
    module.log = lambda *args, **kwargs: None
    return module, optimizer


def batch_of(data, index=0):
    return {k: v[index * 4 : (index + 1) * 4] for k, v in data.train_set.blocks.items()}


def designer_value(module, batch):
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    slots, q, d_at, _, _ = module.designed_targets(inputs, observed)
    return core.predicted_decrease(q, d_at, module.hparams.lr).item()


def test_a_designer_step_raises_the_value_of_its_targets(data):
    module, _ = module_for(data, designer_lr=1e-2, kappa=0.0)
    module.refresh_downstream_gradient(0)
    batch = batch_of(data)
    before = designer_value(module, batch)
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    for _ in range(3):
        _, _, _, loss, _ = module.designed_targets(inputs, observed)
        module.designer_optimizer.zero_grad()
        loss.backward()
        module.designer_optimizer.step()
    after = designer_value(module, batch)
    assert after > before + 1e-3 * abs(before)


def test_no_downstream_gradient_reaches_the_learner(data, monkeypatch):
    module, optimizer = module_for(data)
    module.refresh_downstream_gradient(0)
    assert all(p.grad is None for p in module.learner.parameters())
    assert module.downstream_gradient  # the cached g_down

    recorded = {}
    original = core.soft_cross_entropy

    def spy(at, weights, mask=None):
        recorded["weights"] = weights
        return original(at, weights, mask)

    monkeypatch.setattr(core, "soft_cross_entropy", spy)
    learner_before = {n: p.detach().clone() for n, p in module.learner.named_parameters()}
    grads = {}
    step = optimizer.step

    def record_then_step():
        grads.update({n: p.grad.clone() for n, p in module.learner.named_parameters()})
        step()

    optimizer.step = record_then_step
    batch = batch_of(data, 1)
    module.training_step(batch, 0)
    q = recorded["weights"]
    assert not q.requires_grad  # the learner's targets are detached

    # The learner's gradient is exactly that of eq. (1) with these targets at the old weights:
    # nothing from L_down or the designer's loss leaked into it.
    with torch.no_grad():
        for n, p in module.learner.named_parameters():
            p.copy_(learner_before[n])
    module.learner.zero_grad()
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    log_probs = module.learner_log_probs(inputs)
    slots = core.candidates(log_probs, observed, module.hparams.top_k)
    original(log_probs.gather(-1, slots), q).backward()
    for n, p in module.learner.named_parameters():
        assert torch.allclose(grads[n], p.grad, atol=1e-7), n


@pytest.mark.parametrize(
    "arm", ["plain", "fixed_soft", "alignment_reweight", "oracle", "random_gradient", "vpretrain"]
)
def test_every_arm_takes_a_finite_step_that_moves_the_learner(data, arm):
    module, _ = module_for(data, arm=arm)
    before = torch.cat([p.detach().flatten().clone() for p in module.learner.parameters()])
    loss = module.training_step(batch_of(data, 2), 0)
    after = torch.cat([p.detach().flatten() for p in module.learner.parameters()])
    assert torch.isfinite(loss) and not torch.equal(before, after)
    assert (module.designer is not None) == (arm in ("vpretrain", "random_gradient"))


def test_the_random_gradient_control_keeps_the_norm_and_loses_the_direction(data):
    true, _ = module_for(data)
    control, _ = module_for(data, arm="random_gradient")
    true.refresh_downstream_gradient(0)
    control.refresh_downstream_gradient(0)
    a = torch.cat([g.flatten() for g in true.downstream_gradient.values()])
    b = torch.cat([g.flatten() for g in control.downstream_gradient.values()])
    assert a.norm().item() == pytest.approx(b.norm().item(), rel=1e-4)
    assert abs(torch.nn.functional.cosine_similarity(a, b, dim=0).item()) < 0.05


def test_the_oracle_targets_are_the_right_answers(data):
    blocks = data.train_set.blocks
    corrupted = blocks["corrupted"]
    assert corrupted.any() and (blocks["ids"][corrupted] != blocks["clean_ids"][corrupted]).all()
    assert torch.equal(blocks["ids"][~corrupted], blocks["clean_ids"][~corrupted])
    assert (blocks["result"] | ~corrupted).all()  # only answer digits are ever corrupted
