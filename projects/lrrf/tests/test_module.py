"""The LightningModule's training step by value: the loss the default LRRF path returns, term by
term, against hand computations on the module's own network (no Trainer; a stub gives the step
and the batch count)."""

import copy
from types import SimpleNamespace

import numpy as np
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


# ---- the other training paths (issue 57's mutation lane): joint AT's mixed attacks, the terms'
# switches at their thresholds, the gradient-share schedule, the replay draws, the buffer update


def marked_craft(calls: list):
    """A stand-in attack: item + 0.01 (task + 1), so the attack an item got can be read off."""

    def craft(x, y, task):
        calls.append((task, x.clone(), y.clone()))
        return x + 0.01 * (task + 1)

    return craft


def l_at(m: LrrfModule, x: torch.Tensor, x_adv: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    logits_all = m.net.head(m.net.features(torch.cat([x, x_adv])))
    logits, logits_adv = logits_all.chunk(2)
    return F.cross_entropy(logits_adv, y) + F.cross_entropy(logits, y)


@pytest.mark.parametrize("step", [0, 2 * BATCHES + 1])  # the first task and the third
def test_joint_at_gives_every_item_one_attack_in_equal_shares_whatever_the_task(step):
    m = module(method="joint_at", lam_drm=0.0)
    calls = []
    m.craft = marked_craft(calls)
    at_step(m, step)
    x, y = digits(8)
    loss = m.training_step((x, y), 0)
    assert sorted(task for task, _, _ in calls) == [0, 1, 2, 3]  # each attack crafted once
    assert all(len(items) == 2 for _, items, _ in calls)  # on 8 / 4 items each
    x_adv = torch.empty_like(x)
    for task, items, labels in calls:
        for item, label in zip(items, labels, strict=True):
            (row,) = [i for i in range(len(x)) if torch.equal(x[i], item)]
            assert y[row] == label
            x_adv[row] = item + 0.01 * (task + 1)
    assert loss.item() == pytest.approx(l_at(m, x, x_adv, y).item(), rel=1e-6)


def test_sequential_methods_attack_the_whole_batch_with_the_current_task():
    m = module(method="seq_at", lam_drm=0.0)
    calls = []
    m.craft = marked_craft(calls)
    at_step(m, 2 * BATCHES + 1)
    x, y = digits(8)
    m.training_step((x, y), 0)
    assert [(task, len(items)) for task, items, _ in calls] == [(2, 8)]


def test_the_at_part_is_recorded_and_equal_predictions_give_drm_no_dynamic_weight():
    """The step records L_AT; with x~ = x the clean and adversarial accuracies are equal, so the
    dynamic weight max(acc_clean - acc_adv, 0) is 0 although every item is right."""
    m = module(lam_drm=4.0, drm_dynamic=True, lam_ctir=0.0, lam_kco=0.0)
    x, _ = digits()
    with torch.no_grad():
        y = m.net.eval()(x).argmax(1)
    m.net.train()
    m.craft = lambda x_, y_, task: x_.clone()
    loss = m.training_step((x, y), 0)
    at = l_at(m, x, x, y)
    assert m._running["at"] == [pytest.approx(at.item(), rel=1e-6)]
    assert m._running["drm_weight"] == [0.0]
    assert loss.item() == pytest.approx(at.item(), rel=1e-6)


@pytest.mark.parametrize("class_means", [True, False])
def test_drm_follows_the_class_mean_switch(class_means):
    m = module(lam_drm=2.0, drm_dynamic=False, drm_class_means=class_means, lam_kco=0.0)
    x, y = digits()
    x_adv = (x + 0.3 * torch.randn(x.shape, generator=torch.Generator().manual_seed(5))).clamp(0, 1)
    m.craft = lambda x_, y_, task: x_adv
    loss = m.training_step((x, y), 0)
    z_all = m.net.features(torch.cat([x, x_adv]))
    z, z_adv = z_all.chunk(2)
    drm = {cm: core.drm_loss(z, z_adv, y, class_means=cm).item() for cm in (True, False)}
    assert abs(drm[True] - drm[False]) > 1e-4  # the switch changes the value here
    expected = l_at(m, x, x_adv, y).item() + 2.0 * drm[class_means]
    assert loss.item() == pytest.approx(expected, rel=1e-5)


def test_ctir_acts_at_a_weight_below_one_and_kco_stays_off_at_zero():
    """lam_ctir = 0.5 still adds CTIR; lam_kco = 0 adds no KCO term and replays nothing, even
    with a full buffer."""
    m = module(lam_drm=0.0, lam_ctir=0.5, lam_kco=0.0)
    m._frozen["accumulated"] = LrrfModule(epochs_per_task=1).net.eval().requires_grad_(False)
    xb, yb = digits(20, seed=3)
    m.buffer, m.tasks_done = {"x": xb, "y": yb, "task": torch.zeros(20, dtype=torch.long)}, 1
    at_step(m, BATCHES)
    m.craft = lambda x_, y_, task: x_.flip(-1)

    def no_replay(*args):
        raise AssertionError("replayed although lam_kco = 0")

    m.craft_mixed = no_replay
    x, y = digits()
    m.training_step((x, y), 0)
    assert set(m.loss_terms) == {"at", "drm", "ctir"}
    assert m.loss_terms["ctir"].item() == pytest.approx(0.5 * m._running["ctir_distance"][0])
    assert m._running["ctir_distance"][0] > 0.01


def test_gradient_shares_every_nth_step_and_only_with_several_terms():
    m = module(lam_drm=1.0, drm_dynamic=False, grad_share_every=3, lam_kco=0.0)
    single = module(method="seq_at", grad_share_every=1)
    x, y = digits()
    for step in range(7):
        for subject in (m, single):
            at_step(subject, step)
            subject.training_step((x, y), 0)
            subject.on_before_backward(None)
    assert len(m._running["share_at"]) == len(m._running["share_drm"]) == 3  # steps 0, 3, 6
    cosines = m._running["cosine_at"] + m._running["cosine_drm"]
    assert len(cosines) == 6 and all(isinstance(c, float) and -1 <= c <= 1 for c in cosines)
    assert not any(k.startswith(("share_", "cosine_")) for k in single._running)  # L_AT alone


def test_replay_draws_indices_in_the_buffer_and_attacks_by_the_configured_rule():
    m = module(replay_batch=16, replay_attack="random_previous")
    for n, drawn in ((40, 16), (5, 5)):
        m.buffer = {"y": torch.zeros(n, dtype=torch.long)}
        idx = m._replay_indices()
        assert idx.shape == (drawn,) and idx.dtype == torch.long
        assert int(idx.min()) >= 0 and int(idx.max()) < n
    m.tasks_done = 3
    stored = torch.zeros(600, dtype=torch.long)
    tasks = m._replay_tasks(stored)
    assert tasks.shape == stored.shape and set(tasks.tolist()) == {0, 1, 2}
    own = module(replay_attack="task")
    assert torch.equal(own._replay_tasks(stored + 2), stored + 2)  # each item's own task


def train_set(seed: int, per_class: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    y = torch.arange(10).repeat_interleave(per_class)
    return torch.rand(len(y), 1, 8, 8, generator=gen), y


def rows_of(x: torch.Tensor, stored: torch.Tensor) -> list[int]:
    """The index in ``x`` of every stored image (each must be found exactly once)."""
    found = []
    for image in stored:
        (row,) = [i for i in range(len(x)) if torch.equal(x[i], image)]
        found.append(row)
    return found


def test_the_buffer_keeps_class_balanced_slots_shared_by_the_tasks_seen():
    """buffer_size 20 over 10 classes: 2 slots a class. After task 0 they hold task 0's images
    (with their labels); after task 1 each class keeps floor(2 / 2) = 1 of task 0's, an image
    the buffer already held, and adds 1 of task 1's."""
    m = module(method="er", buffer_size=20)
    x0, y0 = train_set(0)
    m.tasks_done = 1
    m._update_buffer((x0, y0), 0)
    first = {k: v.clone() for k, v in m.buffer.items()}
    assert set(first) == {"x", "y", "task"} and len(first["y"]) == 20
    assert torch.equal(torch.bincount(first["y"], minlength=10), torch.full((10,), 2))
    assert torch.equal(first["task"], torch.zeros(20, dtype=torch.long))
    rows = rows_of(x0, first["x"])
    assert len(set(rows)) == 20 and torch.equal(y0[rows], first["y"])

    x1, y1 = train_set(1)
    m.tasks_done = 2
    m._update_buffer((x1, y1), 1)
    b = m.buffer
    assert len(b["y"]) == 20
    for task, (x, y) in enumerate(((x0, y0), (x1, y1))):
        mine = b["task"] == task
        assert torch.equal(torch.bincount(b["y"][mine], minlength=10), torch.ones(10).long())
        assert torch.equal(y[rows_of(x, b["x"][mine])], b["y"][mine])
    kept = rows_of(first["x"], b["x"][b["task"] == 0])  # old entries come from the old buffer
    assert torch.equal(first["y"][kept], b["y"][b["task"] == 0])


def test_der_plus_plus_stores_the_adversarial_example_and_its_logits_in_eval_mode():
    m = module(method="derpp", buffer_size=20)
    calls = []
    m.craft = marked_craft(calls)
    x0, y0 = train_set(0)
    m.tasks_done = 1
    m._update_buffer((x0, y0), 0)
    b = m.buffer
    assert [(task, len(items)) for task, items, _ in calls] == [(0, 20)]
    assert torch.equal(b["x_adv"], b["x"] + 0.01)
    with torch.no_grad():
        expected = m.net.eval()(b["x_adv"])
    m.net.train()
    assert torch.allclose(b["logits"], expected)
    assert m.net.training  # the module is back in train mode
    np.testing.assert_array_equal(b["task"].numpy(), np.zeros(20))


# ---- every baseline's term through the step, by value (issue 57's mutation lane)
class FixedDraws:
    """Stands in for ``_replay_indices``: the given index tensors, in turn."""

    def __init__(self, *draws: list[int]):
        self.draws = [torch.tensor(d) for d in draws]

    def __call__(self) -> torch.Tensor:
        return self.draws.pop(0)


def baseline_step(method: str, **kwargs):
    """A step of task 2 (FGSM) with a deterministic attack; returns the module, the batch, x~,
    the loss and the logged values."""
    m = module(method=method, **kwargs)
    m.craft = marked_craft([])
    at_step(m, BATCHES + 2)
    logged = {}

    def log(name, value, **kw):
        logged[name] = (float(torch.as_tensor(value).detach()), kw)

    m.log = log
    x, y = digits(12)
    return m, x, y, x + 0.02, logged


def test_er_replays_the_buffer_items_with_their_own_attacks():
    m, x, y, x_adv, logged = baseline_step("er")
    xb, yb = digits(10, seed=4)
    m.buffer = {"x": xb, "y": yb, "task": torch.tensor([0, 1] * 5)}
    m._replay_indices = FixedDraws([1, 4, 6, 9])
    loss = m.training_step((x, y), 0)
    idx = [1, 4, 6, 9]
    xm, ym, tm = xb[idx], yb[idx], m.buffer["task"][idx]
    xm_adv = xm + 0.01 * (tm + 1).view(-1, 1, 1, 1)  # each item's own task's attack
    replay = F.cross_entropy(m.net(torch.cat([xm, xm_adv])), torch.cat([ym, ym]))
    assert set(m.loss_terms) == {"at", "replay"}
    assert m.loss_terms["replay"].item() == pytest.approx(replay.item(), rel=1e-6)
    assert loss.item() == pytest.approx((l_at(m, x, x_adv, y) + replay).item(), rel=1e-6)
    assert logged["train/loss"] == (pytest.approx(loss.item(), rel=1e-6), {"prog_bar": True})
    assert logged["train/task"] == (1.0, {})
    assert logged["train/drm_discrepancy"][0] == pytest.approx(m._running["drm_discrepancy"][0])


def test_der_plus_plus_matches_stored_logits_and_labels_of_two_draws():
    m, x, y, x_adv, _ = baseline_step("derpp", reg_weight=0.7, derpp_beta=0.3)
    xb, yb = digits(10, seed=4)
    m.buffer = {"x": xb, "y": yb, "task": torch.zeros(10, dtype=torch.long),
                "x_adv": xb + 0.05, "logits": torch.randn(10, 10)}  # fmt: skip
    m._replay_indices = FixedDraws([0, 2, 4], [7, 8, 9])
    loss = m.training_step((x, y), 0)
    b, first, second = m.buffer, [0, 2, 4], [7, 8, 9]
    replay = 0.7 * F.mse_loss(m.net(b["x_adv"][first]), b["logits"][first]) + 0.3 * (
        F.cross_entropy(m.net(b["x_adv"][second]), b["y"][second])
    )
    assert set(m.loss_terms) == {"at", "replay"}
    assert m.loss_terms["replay"].item() == pytest.approx(replay.item(), rel=1e-6)
    assert loss.item() == pytest.approx((l_at(m, x, x_adv, y) + replay).item(), rel=1e-6)


def test_lwf_distils_the_old_model_on_both_views():
    m, x, y, x_adv, _ = baseline_step("lwf", reg_weight=1.5)
    old = LrrfModule(epochs_per_task=1).net.eval().requires_grad_(False)
    m._frozen["old_model"] = old
    loss = m.training_step((x, y), 0)
    both = torch.cat([x, x_adv])
    reg = 1.5 * core.distillation_kl(m.net(both), old(both), temperature=2.0)
    assert set(m.loss_terms) == {"at", "reg"}
    assert m.loss_terms["reg"].item() == pytest.approx(reg.item(), rel=1e-5)
    assert loss.item() == pytest.approx((l_at(m, x, x_adv, y) + reg).item(), rel=1e-5)


def test_ewc_penalises_the_fisher_weighted_distance_to_the_anchors():
    m, x, y, x_adv, _ = baseline_step("ewc", reg_weight=3.0)
    gen = torch.Generator().manual_seed(2)
    m.anchors = {n: p.detach() + 0.1 * torch.randn(p.shape, generator=gen)
                 for n, p in m.net.named_parameters()}  # fmt: skip
    m.fisher = {n: torch.rand(p.shape, generator=gen) for n, p in m.net.named_parameters()}
    loss = m.training_step((x, y), 0)
    reg = (
        3.0
        / 2
        * sum((m.fisher[n] * (p - m.anchors[n]) ** 2).sum() for n, p in m.net.named_parameters())
    )  # fmt: skip (EWC's lambda / 2)
    assert set(m.loss_terms) == {"at", "reg"}
    assert m.loss_terms["reg"].item() == pytest.approx(reg.item(), rel=1e-5)
    assert loss.item() == pytest.approx((l_at(m, x, x_adv, y) + reg).item(), rel=1e-5)


def test_air_adds_its_pseudo_replay_and_alignment_on_this_batch():
    from lrrf.baselines import air_loss

    m, x, y, x_adv, _ = baseline_step("air", reg_weight=0.4, air_noise=0.1)
    old = LrrfModule(epochs_per_task=1).net.eval().requires_grad_(False)
    m._frozen["old_model"] = old
    torch.manual_seed(9)
    loss = m.training_step((x, y), 0)
    logits, logits_adv = m.net(torch.cat([x, x_adv])).chunk(2)
    torch.manual_seed(9)
    reg = 0.4 * air_loss(m.net, old, x_adv, logits, logits_adv, 0.1)
    assert set(m.loss_terms) == {"at", "reg"}
    assert m.loss_terms["reg"].item() == pytest.approx(reg.item(), rel=1e-5)
    assert loss.item() == pytest.approx((l_at(m, x, x_adv, y) + reg).item(), rel=1e-5)


@pytest.mark.parametrize("method", ["seq_at", "joint_at"])
def test_methods_without_memory_add_no_term_even_with_state_present(method):
    """A buffer, an old model and a Fisher left in place change nothing for seq AT / joint AT."""
    m, x, y, x_adv, _ = baseline_step(method)
    m.buffer = {"x": x, "y": y, "task": torch.zeros(12, dtype=torch.long)}
    m._frozen["old_model"] = LrrfModule(epochs_per_task=1).net.eval()
    m.fisher = {n: torch.ones_like(p) for n, p in m.net.named_parameters()}
    m.anchors = {n: torch.zeros_like(p) for n, p in m.net.named_parameters()}
    m.training_step((x, y), 0)
    assert set(m.loss_terms) == {"at"}


def test_lrrf_kco_splits_replay_and_supcon_at_its_temperature():
    """KCO at lam_kco 0.5, temperature 0.3 and SupCon weight 2: kco_replay = lam x the replay
    CE, kco_supcon = lam x (KCO - replay CE), and the class-mean gap is recorded."""
    m = module(lam_drm=0.0, lam_ctir=0.0, lam_kco=0.5, kco_temperature=0.3, kco_supcon=2.0)
    m.craft = marked_craft([])
    at_step(m, BATCHES + 1)
    xb, yb = digits(10, seed=4)
    m.buffer = {"x": xb, "y": yb % 3, "task": torch.zeros(10, dtype=torch.long)}
    m.tasks_done = 1
    m._replay_indices = FixedDraws(list(range(10)))
    x, y = digits(12)
    m.training_step((x, y), 0)
    xm, ym = xb, yb % 3
    xm_adv = xm + 0.01
    zm_all = m.net.features(torch.cat([xm, xm_adv]))
    zm, zm_adv = zm_all.chunk(2)
    lm, lm_adv = m.net.head(zm_all).chunk(2)
    kco = core.kco_loss(zm, zm_adv, lm, lm_adv, ym, 0.3, 2.0)
    replay = core.kco_loss(zm, zm_adv, lm, lm_adv, ym, contrast_weight=0.0)
    assert abs(kco.item() - core.kco_loss(zm, zm_adv, lm, lm_adv, ym, 0.5, 2.0).item()) > 1e-4
    assert m.loss_terms["kco_replay"].item() == pytest.approx(0.5 * replay.item(), rel=1e-6)
    assert m.loss_terms["kco_supcon"].item() == pytest.approx(0.5 * (kco - replay).item(), rel=1e-5)
    gap = core.class_mean_gap(zm, zm_adv, ym).item()
    assert m._running["kco_gap"] == [pytest.approx(gap, rel=1e-6)]


def test_the_buffer_draw_is_fixed_by_the_run_seed_and_the_task(monkeypatch):
    """Two runs with the same seed store the same images; another run seed or another task
    count draws others (the draw's generator is seeded by both)."""

    def stored(seed: int, tasks_done: int = 1) -> list[int]:
        monkeypatch.setenv("PL_GLOBAL_SEED", str(seed))
        m = module(method="er", buffer_size=20)
        x, y = train_set(0)
        m.tasks_done = tasks_done
        m._update_buffer((x, y), 0)
        return rows_of(x, m.buffer["x"])

    assert stored(3) == stored(3)
    assert stored(3) != stored(4)
    assert stored(3) != stored(3, tasks_done=2)
