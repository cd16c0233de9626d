"""The LightningModule's training step by value: the loss the default LRRF path returns, term by
term, against hand computations on the module's own network (no Trainer; a stub gives the step
and the batch count)."""

import copy
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from lrrf import core
from lrrf.attacks import Budget, make_attack
from lrrf.model import LrrfModule

BATCHES = 10  # batches per epoch in the stub: task t covers steps [10 t, 10 (t + 1))


def module(**kwargs) -> LrrfModule:
    torch.manual_seed(0)
    m = LrrfModule(epochs_per_task=1, **kwargs)
    m._trainer = SimpleNamespace(num_training_batches=BATCHES, global_step=0)
    m.log = lambda *args, **kw: None
    return m.train()


def at_step(m: LrrfModule, step: int) -> None:
    m._trainer.global_step = step


def digits(n: int = 24, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(n, 1, 8, 8, generator=gen), torch.randint(10, (n,), generator=gen)


def hand_ctir(z: torch.Tensor, z_bar: torch.Tensor, gamma: float) -> torch.Tensor:
    u = z / z.norm(dim=1, keepdim=True)
    v = z_bar / z_bar.norm(dim=1, keepdim=True)
    n = len(u)
    return ((u - v) ** 2).sum(1).mean() + gamma * ((u @ u.T - v @ v.T) ** 2).sum() / n**2


@pytest.mark.parametrize("dynamic", [True, False])
def test_training_step_adds_drm_at_its_dynamic_weight(dynamic, monkeypatch):
    """Task 1 (no accumulated network, no buffer): loss = L_AT + lam1_t L_DRM with
    lam1_t = lam1 * max(acc_clean - acc_adv, 0) on the batch (or lam1 when static)."""
    m = module(lam_drm=3.0, drm_dynamic=dynamic)
    x, _ = digits()
    with torch.no_grad():
        y = m.net.eval()(x).argmax(1)  # every clean item right: the gap is 1 - acc_adv
    m.net.train()
    x_adv = make_attack("linf", Budget(0.5, 10, 0.25))(m.net, x, y, seed=0)
    monkeypatch.setattr(m, "craft", lambda x_, y_, task: x_adv)
    loss = m.training_step((x, y), 0)

    z_all = m.net.features(torch.cat([x, x_adv]))  # train mode, as in the step
    logits, logits_adv = m.net.head(z_all).chunk(2)
    z, z_adv = z_all.chunk(2)
    at = F.cross_entropy(logits_adv, y) + F.cross_entropy(logits, y)
    acc_clean = (logits.argmax(1) == y).float().mean().item()
    acc_adv = (logits_adv.argmax(1) == y).float().mean().item()
    assert acc_clean - acc_adv > 0.2, (acc_clean, acc_adv)  # the dynamic weight is not trivial
    weight = 3.0 * max(acc_clean - acc_adv, 0.0) if dynamic else 3.0
    drm = core.drm_loss(z, z_adv, y)
    assert m._running["drm_weight"] == [pytest.approx(weight, rel=1e-6)]
    assert loss.item() == pytest.approx((at + weight * drm).item(), rel=1e-5)
    assert set(m.loss_terms) == {"at", "drm"}
    assert m.loss_terms["drm"].item() == pytest.approx(weight * drm.item(), rel=1e-5)


def test_training_step_adds_the_full_ctir_loss_against_the_accumulated_network(monkeypatch):
    """Task 2: L_CTIR on the clean AND adversarial features (2B items) against the accumulated
    network in eval mode, with its Gram term at ``ctir_gram``, weighted by ``lam_ctir``."""
    m = module(lam_drm=0.0, lam_ctir=2.5, ctir_gram=0.7, lam_kco=0.0)
    accumulated = copy.deepcopy(m.net)
    with torch.no_grad():
        for p in accumulated.parameters():
            p.add_(0.3 * torch.randn_like(p))
    accumulated.eval().requires_grad_(False)
    m._frozen["accumulated"] = accumulated
    at_step(m, BATCHES)  # task index 1
    x, y = digits()
    x_adv = (x + 0.2 * torch.randn_like(x)).clamp(0, 1)
    monkeypatch.setattr(m, "craft", lambda x_, y_, task: x_adv)
    loss = m.training_step((x, y), 0)

    both = torch.cat([x, x_adv])
    z_all = m.net.features(both)
    logits, logits_adv = m.net.head(z_all).chunk(2)
    at = F.cross_entropy(logits_adv, y) + F.cross_entropy(logits, y)
    with torch.no_grad():
        z_bar = accumulated.features(both)
    ctir = hand_ctir(z_all, z_bar, 0.7)
    assert ctir.item() > 0.01
    assert loss.item() == pytest.approx((at + 2.5 * ctir).item(), rel=1e-5)
    assert m.loss_terms["ctir"].item() == pytest.approx(2.5 * ctir.item(), rel=1e-5)
    assert m._running["ctir_distance"] == [pytest.approx(ctir.item(), rel=1e-5)]
    assert accumulated.training is False  # the target network stays in eval mode


def test_lrrf_without_supcon_drm_and_ctir_is_er_on_a_batch():
    """lam_drm = lam_ctir = 0, kco_supcon = 0, lam_kco = 0.5: LRRF's loss and gradients are ER's
    (its KCO replay term is ER's mean CE over both views of the same replayed items)."""
    x, y = digits(16)
    xb, yb = digits(20, seed=3)
    subjects = {
        "er": module(method="er"),
        "lrrf": module(lam_drm=0.0, lam_ctir=0.0, lam_kco=0.5, kco_supcon=0.0),
    }
    subjects["lrrf"].net.load_state_dict(subjects["er"].net.state_dict())
    losses, grads = {}, {}
    for name, m in subjects.items():
        m.buffer = {"x": xb, "y": yb, "task": torch.zeros(20, dtype=torch.long)}
        m.tasks_done = 1
        m._frozen["accumulated"] = copy.deepcopy(m.net).eval().requires_grad_(False)
        at_step(m, BATCHES + 3)  # task index 1 (FGSM); replayed items re-attacked with PGD-Linf
        torch.manual_seed(11)
        loss = m.training_step((x, y), 0)
        loss.backward()
        losses[name] = loss.item()
        grads[name] = torch.cat([p.grad.flatten() for p in m.net.parameters()])
    assert set(subjects["lrrf"].loss_terms) == {"at", "drm", "kco_replay"}
    assert losses["lrrf"] == pytest.approx(losses["er"], rel=1e-6)
    assert torch.allclose(grads["lrrf"], grads["er"], rtol=1e-5, atol=1e-7)
    # and SupCon does change it: the same step with kco_supcon = 1 is not ER's
    m = module(lam_drm=0.0, lam_ctir=0.0, lam_kco=0.5, kco_supcon=1.0)
    m.net.load_state_dict(subjects["er"].net.state_dict())
    m.buffer, m.tasks_done = subjects["er"].buffer, 1
    at_step(m, BATCHES + 3)
    torch.manual_seed(11)
    assert m.training_step((x, y), 0).item() > losses["er"] + 0.1


def test_grad_shares_are_measured_per_step_and_sum_to_one():
    m = module(lam_drm=1.0, drm_dynamic=False, grad_share_every=1)
    x, y = digits()
    m.training_step((x, y), 0)
    m.on_before_backward(None)
    shares = {k: v[0] for k, v in m._running.items() if k.startswith("share_")}
    assert set(shares) == {"share_at", "share_drm"}
    assert sum(shares.values()) == pytest.approx(1.0)
    assert 0 < shares["share_drm"] < 1
