"""The language LightningModule: the designer's direction, the learner's isolation, the arms."""

from __future__ import annotations

import pytest
import torch

from vpretrain import core


def designer_value(module, batch):
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    slots, q, d_at, _, _ = module.designed_targets(inputs, observed)
    return core.predicted_decrease(q, d_at, module.hparams.lr).item()


def test_a_designer_step_raises_the_value_of_its_targets(data, tools):
    module, _ = tools.module_for(data, designer_lr=1e-2, kappa=0.0)
    module.refresh_downstream_gradient(0)
    batch = tools.batch_of(data)
    before = designer_value(module, batch)
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    for _ in range(3):
        _, _, _, loss, _ = module.designed_targets(inputs, observed)
        module.designer_optimizer.zero_grad()
        loss.backward()
        module.designer_optimizer.step()
    after = designer_value(module, batch)
    assert after > before + 1e-3 * abs(before)


def test_no_downstream_gradient_reaches_the_learner(data, tools, monkeypatch):
    module, optimizer = tools.module_for(data)
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
    batch = tools.batch_of(data, 1)
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
    "arm",
    [
        "plain",
        "fixed_soft",
        "alignment_reweight",
        "oracle",
        "in_family",
        "random_gradient",
        "vpretrain",
    ],
)
def test_every_arm_takes_a_finite_step_that_moves_the_learner(data, tools, arm):
    module, _ = tools.module_for(data, arm=arm)
    before = torch.cat([p.detach().flatten().clone() for p in module.learner.parameters()])
    loss = module.training_step(tools.batch_of(data, 2), 0)
    after = torch.cat([p.detach().flatten() for p in module.learner.parameters()])
    assert torch.isfinite(loss) and not torch.equal(before, after)
    assert (module.designer is not None) == (arm in ("vpretrain", "random_gradient"))


def test_the_random_gradient_control_keeps_the_norm_and_loses_the_direction(data, tools):
    true, _ = tools.module_for(data)
    control, _ = tools.module_for(data, arm="random_gradient")
    true.refresh_downstream_gradient(0)
    control.refresh_downstream_gradient(0)
    a = torch.cat([g.flatten() for g in true.downstream_gradient.values()])
    b = torch.cat([g.flatten() for g in control.downstream_gradient.values()])
    assert a.norm().item() == pytest.approx(b.norm().item(), rel=1e-4)
    assert abs(torch.nn.functional.cosine_similarity(a, b, dim=0).item()) < 0.05


def test_the_oracle_targets_are_the_right_answers(data, tools):
    blocks = data.train_set.blocks
    corrupted = blocks["corrupted"]
    assert corrupted.any() and (blocks["ids"][corrupted] != blocks["clean_ids"][corrupted]).all()
    assert torch.equal(blocks["ids"][~corrupted], blocks["clean_ids"][~corrupted])
    assert (blocks["result"] | ~corrupted).all()  # only answer digits are ever corrupted


def test_the_in_family_arm_trains_on_lambda_max_at_the_right_digit(data, tools, monkeypatch):
    module, _ = tools.module_for(data, arm="in_family", lambda_max=0.9)
    recorded = {}
    original = core.soft_cross_entropy

    def spy(at, weights, mask=None):
        recorded["at"], recorded["weights"] = at, weights
        return original(at, weights, mask)

    monkeypatch.setattr(core, "soft_cross_entropy", spy)
    batch = tools.corrupted_batch(data)
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    clean, corrupted = batch["clean_ids"][:, 1:], batch["corrupted"][:, 1:]
    # An untrained learner rarely ranks the right digit in its top-K: lift it at the first
    # corrupted position (a constant added to the learner's log-probabilities), so both the
    # reachable and (when the batch has more corruptions) the unreachable case occur.
    b, t = (int(i) for i in torch.nonzero(corrupted)[0])
    lift = torch.zeros(*observed.shape, data.vocab_size)
    lift[b, t, clean[b, t]] = 100.0
    learner_log_probs = module.learner_log_probs
    module.learner_log_probs = lambda ids, mask=None: learner_log_probs(ids, mask) + lift
    with torch.no_grad():
        log_probs = module.learner_log_probs(inputs)
    top = log_probs.topk(module.hparams.top_k, dim=-1).indices
    module.training_step(batch, 0)
    slots = core.candidates(log_probs, observed, module.hparams.top_k)
    dense = core.to_vocabulary(recorded["weights"], slots, data.vocab_size)  # [B, T, V]
    on_clean = dense.gather(-1, clean.unsqueeze(-1)).squeeze(-1)
    on_observed = dense.gather(-1, observed.unsqueeze(-1)).squeeze(-1)
    reachable = corrupted & (top == clean.unsqueeze(-1)).any(-1)
    assert reachable[b, t]
    assert torch.allclose(on_clean[reachable], torch.tensor(0.9))
    assert torch.allclose(on_observed[reachable], torch.tensor(0.1))
    assert torch.allclose(on_observed[~reachable], torch.tensor(1.0))  # one-hot elsewhere
    assert torch.allclose(dense.sum(-1), torch.tensor(1.0))
    # and the learner's loss reads its own log-probabilities at those slots
    assert torch.allclose(recorded["at"].detach(), log_probs.gather(-1, slots), atol=1e-6)


def test_the_sgd_learner_takes_exactly_the_step_the_value_models(data, tools):
    """With optimizer=sgd the learner's step is theta - eta grad L_ssl (eq. 2, P = identity),
    so the realised decrease of the feedback loss matches the value of eq. (3)."""
    module, optimizer = tools.module_for(data, optimizer="sgd", lr=1e-2, refresh_every=1000)
    assert isinstance(optimizer, torch.optim.SGD)
    module.refresh_downstream_gradient(0)
    feedback = module.feedback_minibatch(0)  # the minibatch g_down was taken on
    batch = tools.batch_of(data, 3)
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    _, q, d_at, _, _ = module.designed_targets(inputs, observed)
    predicted = core.predicted_decrease(q.detach(), d_at, module.hparams.lr).item()
    with torch.no_grad():
        before = module.downstream_loss(feedback).item()
    module.training_step(batch, 0)
    with torch.no_grad():
        realised = before - module.downstream_loss(feedback).item()
    assert predicted != 0 and realised == pytest.approx(predicted, rel=0.1)


def test_the_sgd_step_is_minus_lr_times_the_gradient(data, tools):
    module, optimizer = tools.module_for(data, arm="plain", optimizer="sgd", lr=0.5)
    batch = tools.batch_of(data, 4)
    before = {n: p.detach().clone() for n, p in module.learner.named_parameters()}
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    nll = -module.learner_log_probs(inputs).gather(-1, observed.unsqueeze(-1)).mean()
    grads = torch.autograd.grad(nll, list(module.learner.parameters()))
    module.training_step(batch, 0)
    for (n, p), g in zip(module.learner.named_parameters(), grads, strict=True):
        assert torch.allclose(p.detach(), before[n] - 0.5 * g, atol=1e-6), n


def test_answer_positions_restrict_the_value_to_the_stated_results(data, tools, monkeypatch):
    module, _ = tools.module_for(data, value_positions="results")
    recorded = []
    original = core.predicted_decrease

    def spy(weights, directions, lr, mask=None):
        recorded.append(mask)
        return original(weights, directions, lr, mask)

    monkeypatch.setattr(core, "predicted_decrease", spy)
    batch = tools.corrupted_batch(data)
    module.training_step(batch, 0)
    assert torch.equal(recorded[0], batch["result"][:, 1:])
    everywhere, _ = tools.module_for(data)
    recorded.clear()
    everywhere.training_step(batch, 0)
    assert recorded[0] is None
