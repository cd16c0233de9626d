import pytest
import torch
from scipy.stats import spearmanr

from aic.architectures import ARCHITECTURES
from aic.core import (
    AICPolicy,
    adaptive_act,
    check_price,
    count_flops,
    halting_loss,
    halting_steps,
    select_steps,
    step_returns,
    voc_targets,
)
from papers_cli import ConfigError, UserError

OBS = {"grid": (5, 5, 3), "vector": (6,), "sequence": (7,)}


def make(arch: str, kind: str, k_max: int = 5, seed: int = 0) -> tuple[AICPolicy, torch.Tensor]:
    torch.manual_seed(seed)
    action_kind = "continuous" if kind == "vector" else "discrete"
    policy = AICPolicy(kind, OBS[kind], 3, action_kind, arch, dim=16, k_max=k_max, vocab=20).eval()
    if kind == "vector":
        obs = torch.randn(40, *OBS[kind])
    else:
        obs = torch.randint(0, 6 if kind == "grid" else 20, (40, *OBS[kind]))
        if kind == "grid":
            obs[..., 2] %= 4  # MiniGrid has four cell states
            obs[:, 2, 2, 0] = 10  # one agent cell
    return policy, obs


CASES = [(a, k) for a in ARCHITECTURES for k in OBS if not (a == "conv" and k == "vector")]


def test_voc_targets_are_detached_and_signed():
    returns = torch.tensor([[0.0, 0.5, 0.5, 1.0], [1.0, 0.2, 0.4, 0.3]], requires_grad=True)
    one = voc_targets(returns, "one_step")
    cumulative = voc_targets(returns, "cumulative")
    assert not one.requires_grad and not cumulative.requires_grad
    torch.testing.assert_close(one, torch.tensor([[0.5, 0.0, 0.5, 0.0], [-0.8, 0.2, -0.1, 0.0]]))
    # best later return minus the current one: positive while more steps still pay
    torch.testing.assert_close(
        cumulative, torch.tensor([[1.0, 0.5, 0.5, 0.0], [-0.6, 0.2, -0.1, 0.0]])
    )
    predicted = torch.zeros(2, 4, requires_grad=True)
    halting_loss(predicted, returns * 2).backward()
    assert returns.grad is None  # the target never sends gradients back


def test_step_returns_closed_forms():
    logits = torch.tensor([[[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]]])  # [1, K=2, A=3]
    q = torch.tensor([[0.1, 0.9, 0.5]])
    assert step_returns("q", logits, None, q).tolist() == [[pytest.approx(0.1), pytest.approx(0.9)]]
    loglik = step_returns("likelihood", logits, torch.tensor([1]))
    torch.testing.assert_close(loglik, logits.log_softmax(-1)[..., 1])
    mse = step_returns(
        "imitation", torch.tensor([[[1.0, 1.0], [0.0, 0.0]]]), torch.tensor([[0.0, 0.0]])
    )
    torch.testing.assert_close(mse, torch.tensor([[-1.0, 0.0]]))


def test_halting_head_learns_known_difficulty_without_collapse():
    """Toy: state s carries its difficulty d(s) in 1..4; the readout is right from step d on.
    Regressing the VoC target must give K(s) that tracks d(s) and takes several values."""
    torch.manual_seed(0)
    policy = AICPolicy("vector", (4,), 2, "discrete", "iru", dim=16, k_max=5)
    difficulty = torch.randint(1, 5, (256,))
    obs = torch.nn.functional.one_hot(difficulty - 1, 4).float() + 0.05 * torch.randn(256, 4)
    k = torch.arange(1, 6)
    returns = (k[None] >= difficulty[:, None]).float()  # R_k(s) known exactly
    optimizer = torch.optim.Adam(policy.parameters(), lr=1e-2)
    for _ in range(100):
        loss = halting_loss(policy(obs)["halt"], voc_targets(returns))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    steps = halting_steps(policy(obs)["halt"].detach(), price=0.5)
    assert len(steps.unique()) >= 3
    assert spearmanr(steps, difficulty).statistic > 0.9
    assert (steps == difficulty).float().mean() > 0.9


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_compacted_batch_equals_per_sample_and_table(arch, kind):
    policy, obs = make(arch, kind)
    # Shift the head so that the price 0.1 sits just below its median (K varies), not on it: a
    # halting value equal to the price is a tie that batch and single-sample rounding break
    # differently from one CPU to another.
    with torch.no_grad():
        policy.halting_head[-1].bias += 0.1 - policy(obs)["halt"].median() + 1e-3
        table = policy(obs)
    price = 0.1
    actions, steps = adaptive_act(policy, obs, price)
    assert len(steps.unique()) > 1
    torch.testing.assert_close(steps, halting_steps(table["halt"], price))
    torch.testing.assert_close(actions, select_steps(table["actions"], steps), atol=1e-5, rtol=1e-4)
    for i in range(0, 40, 7):
        single_action, single_steps = adaptive_act(policy, obs[i : i + 1], price)
        assert single_steps.item() == steps[i].item()
        torch.testing.assert_close(single_action[0], actions[i], atol=1e-5, rtol=1e-4)


def test_compaction_really_skips_work():
    policy, obs = make("gru", "vector")
    rows = []
    policy.refiner.register_forward_hook(lambda m, i, o: rows.append(i[0].shape[0]))
    with torch.no_grad():
        policy.halting_head[-1].bias += 0.1 - policy(obs)["halt"].median()
    price = 0.1
    rows.clear()
    _, steps = adaptive_act(policy, obs, price)
    assert sum(rows) == int(steps.sum()) < obs.shape[0] * policy.k_max


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_flops_are_counted_for_every_architecture(arch, kind):
    policy, obs = make(arch, kind)
    flops = count_flops(policy, obs)
    assert flops["per_step"] > 0 and flops["encoder"] >= 0


def test_bad_price_and_architecture_are_user_errors():
    with pytest.raises(UserError, match="negative"):
        check_price(-0.1)
    with pytest.raises(UserError, match="Unknown architecture 'lstm'"):
        AICPolicy("vector", (3,), 2, architecture="lstm")
    with pytest.raises(ConfigError, match="no spatial"):
        AICPolicy("vector", (3,), 2, architecture="conv")
    with pytest.raises(ConfigError, match="multiple of 4"):
        AICPolicy("sequence", (8,), 2, architecture="transformer", dim=6, vocab=5)
