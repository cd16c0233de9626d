import math

import pytest
import torch
from scipy.stats import spearmanr
from torch.utils.flop_counter import FlopCounterMode

from aic.architectures import ARCHITECTURES
from aic.core import (
    AICPolicy,
    adaptive_act,
    check_price,
    count_flops,
    deep_supervision_loss,
    flops_per_decision,
    halting_classifier_loss,
    halting_loss,
    halting_steps,
    policy_losses,
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
        loss = halting_loss(policy(obs)["halt"], voc_targets(returns, "cumulative"))
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
        # Integers from a threshold, computed through other batch shapes: exact, because every
        # halting value sits at least 4e-5 from the price (measured over all 40 x K values and
        # every case), 100x the float32 reordering of values below 1.
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


def test_count_flops_matches_a_hand_count():
    """resmlp on a state vector (F=6 features, D=16, A=3 actions): every matmul by hand,
    2 x rows x cols per linear layer (FlopCounterMode ignores biases)."""
    policy, obs = make("resmlp", "vector")
    f, d, a = 6, 16, 3
    assert count_flops(policy, obs) == {
        "encoder": 2 * f * d + 2 * d * d,  # Linear(F, D), Linear(D, D)
        "core": 2 * (2 * d) * (2 * d) + 2 * (2 * d) * d,  # Linear(2D, 2D), Linear(2D, D)
        "feature": 2 * d * d,  # Linear(D, D)
        "policy": 2 * d * a,
        "halt": 2 * (d + 3) * d
        + 2 * d,  # Linear(D + 3, D) (z, k, confidence, change), Linear(D, 1)
    }


def test_conv_flops_match_a_hand_count():
    """Recurrent conv core on a 5 x 5 grid, D=16: two 3x3 convolutions per step, and the
    focus pooling (an einsum over the 25 cells) in the feature map."""
    policy, obs = make("conv", "grid")
    d, cells = 16, 25
    flops = count_flops(policy, obs)
    assert flops["core"] == 2 * cells * 9 * (2 * d * d + d * d)
    assert flops["feature"] == 2 * cells * d + 2 * (2 * d) * d
    assert flops["encoder"] == 0  # embedding look-ups only


@pytest.mark.parametrize(("arch", "kind"), CASES)
def test_aic_inference_costs_what_flops_per_decision_charges(arch, kind):
    """Counting adaptive_act itself (compacted batches, every sample its own K) gives
    sum_b flops_per_decision(K_b, "readout_halt"): the encoder once and K x (core + feature +
    policy readout + halting head), the head reading the readout at every step."""
    policy, obs = make(arch, kind)
    with torch.no_grad():
        policy.halting_head[-1].bias += 0.1 - policy(obs)["halt"].median()
    flops = count_flops(policy, obs)
    policy.train()  # the eval-mode transformer takes a fused kernel the counter cannot see
    with FlopCounterMode(display=False) as counter:
        _, steps = adaptive_act(policy, obs, 0.1)
    assert 1 < steps.float().mean() < policy.k_max
    charged = flops_per_decision(flops, steps.double(), "readout_halt").sum().item()
    assert counter.get_total_flops() == pytest.approx(charged, rel=1e-9)


def test_fixed_k_is_charged_one_readout_and_no_halting_head():
    flops = {"encoder": 7, "core": 100, "feature": 10, "policy": 3, "halt": 5}
    assert flops_per_decision(flops, 4, "none") == 7 + 4 * 100 + 10 + 3
    assert flops_per_decision(flops, 4, "halt") == 7 + 4 * (100 + 10 + 5) + 3
    assert flops_per_decision(flops, 4, "readout") == 7 + 4 * (100 + 10 + 3)
    assert flops_per_decision(flops, 4, "halt", halt_flops=1) == 7 + 4 * (100 + 10 + 1) + 3
    # AIC's head reads the readout at every step: no separate final readout
    assert flops_per_decision(flops, 4, "readout_halt") == 7 + 4 * (100 + 10 + 3 + 5)
    with pytest.raises(ValueError, match="per-step work"):
        flops_per_decision(flops, 4, "twice")


def test_bad_price_and_architecture_are_user_errors():
    with pytest.raises(UserError, match="negative"):
        check_price(-0.1)
    with pytest.raises(UserError, match="Unknown architecture 'lstm'"):
        AICPolicy("vector", (3,), 2, architecture="lstm")
    with pytest.raises(ConfigError, match="no spatial"):
        AICPolicy("vector", (3,), 2, architecture="conv")
    with pytest.raises(ConfigError, match="multiple of 4"):
        AICPolicy("sequence", (8,), 2, architecture="transformer", dim=6, vocab=5)


# -- value tests written for the mutation lane's survivors (2026-12-01, README) ----------------


def test_a_zero_price_is_allowed_and_a_negative_one_is_explained():
    assert check_price(0.0) == 0.0  # free computation: halt only where the gain is negative
    with pytest.raises(UserError, match=r"^price_per_step=-0.1 is negative .* \(e\.g\. 0\.01\)\.$"):
        check_price(-0.1)


def test_halting_needs_a_value_strictly_below_the_price():
    halt = torch.tensor([[0.5, 0.2, 0.1], [0.1, 0.7, 0.7]])
    # u_1 = 0.5 equals the price: computing on is worth exactly its price, so do not halt there
    assert halting_steps(halt, 0.5).tolist() == [2, 1]


def test_halting_loss_is_a_scaled_huber_with_unit_beta():
    predicted, target = torch.tensor([5.0]), torch.tensor([1.0])
    assert halting_loss(predicted, target).item() == pytest.approx(3.5)  # |d| = 4: 4 - 0.5
    # scale 2: |d| = 2.5 - 0.5 = 2 -> 2 - 0.5
    assert halting_loss(predicted, target, scale=2.0).item() == pytest.approx(1.5)
    # inside the quadratic zone: 0.5 d^2 with beta 1
    assert halting_loss(torch.tensor([1.6]), target).item() == pytest.approx(0.18)


def test_deep_supervision_averages_every_step_by_default():
    per_step = torch.tensor([3.0, 2.0, 1.0])
    assert deep_supervision_loss(per_step).item() == pytest.approx(2.0)
    assert deep_supervision_loss(per_step, deep=False).item() == pytest.approx(1.0)


def test_continuous_policy_loss_and_return_by_hand():
    actions = torch.tensor([[[1.0, 0.0], [0.5, 0.5]], [[0.0, 0.0], [1.0, 1.0]]])  # [B=2, K=2, A]
    target = torch.tensor([[1.0, 1.0], [0.0, 1.0]])
    # step 1: errors (0, 1) and (0, 1) -> mean 0.5; step 2: (0.25, 0.25), (1, 0) -> 0.375
    assert policy_losses("continuous", actions, target).tolist() == pytest.approx([0.5, 0.375])
    returns = step_returns("imitation", actions, target)
    assert torch.allclose(returns, torch.tensor([[-0.5, -0.25], [-0.5, -0.5]]))
    with pytest.raises(ValueError, match="unknown return kind 'bogus'"):
        step_returns("bogus", actions, target)


def test_voc_targets_default_to_the_per_step_gain():
    returns = torch.tensor([[0.0, 0.5, 0.4, 1.0]])
    assert voc_targets(returns).tolist() == voc_targets(returns, "one_step").tolist()
    with pytest.raises(ValueError, match="unknown VoC horizon 'two_step'"):
        voc_targets(returns, "two_step")


def test_policy_defaults_heads_and_readouts():
    torch.manual_seed(0)
    policy = AICPolicy("vector", (6,), 3)
    assert (policy.architecture, policy.k_max, policy.action_kind) == ("iru", 8, "discrete")
    assert policy.policy_head.in_features == 64 and policy.critic_head is None
    assert policy.action_scale == 1.0 and policy.encoder(torch.randn(2, 6))[0].shape[-1] == 64
    # the per-step feature map and the halting head are nonlinear and normalised as specified
    assert [type(m) for m in policy.feature] == [torch.nn.Linear, torch.nn.LayerNorm, torch.nn.GELU]
    assert [type(m) for m in policy.halting_head] == [
        torch.nn.Linear,
        torch.nn.GELU,
        torch.nn.Linear,
    ]
    critic = AICPolicy("vector", (6,), 3, dim=16, k_max=4, critic=True).eval()
    obs = torch.randn(5, 6)
    out = critic(obs)
    assert out["features"].shape == (5, 4, 16)
    assert torch.allclose(out["q"], critic.critic_head(out["features"][:, -1]))
    assert out["q"].shape == (5, 3)


def test_continuous_actions_are_squashed_to_the_action_scale():
    torch.manual_seed(0)
    policy = AICPolicy("vector", (6,), 2, "continuous", dim=16, k_max=2, action_scale=2.0)
    z = torch.randn(7, 16) * 10
    raw = policy.policy_head(z)
    assert torch.allclose(policy.act_head(z), 2.0 * torch.tanh(raw))
    discrete = AICPolicy("vector", (6,), 2, "discrete", dim=16, k_max=2)
    discrete.policy_head.load_state_dict(policy.policy_head.state_dict())
    assert torch.allclose(discrete.act_head(z), raw)


def test_classifier_loss_balances_the_two_classes_by_hand():
    """Eq. 5': gains (0.5, 0, 0, 0) at price 0.1: one paying pair of weight 4/2 = 2, three of
    weight 4/6; at u = 1/2 everywhere the loss is log 2 (each class half the weight)."""
    gain = torch.tensor([[0.5, 0.0, 0.0, 0.0]])
    half = torch.full((1, 4), 0.5)
    assert halting_classifier_loss(half, gain, 0.1).item() == pytest.approx(math.log(2))
    u = torch.tensor([[0.8, 0.4, 0.2, 0.1]])
    expected = -(2 * math.log(0.8) + (2 / 3) * (math.log(0.6) + math.log(0.8) + math.log(0.9))) / 4
    assert halting_classifier_loss(u, gain, 0.1).item() == pytest.approx(expected, rel=1e-5)
    # a gain equal to the price does not pay (strictly greater)
    tie = halting_classifier_loss(u, torch.tensor([[0.1, 0.0, 0.0, 0.0]]), 0.1)
    assert tie.item() == pytest.approx(-sum(math.log(1 - x) for x in (0.8, 0.4, 0.2, 0.1)) / 4)


def test_the_halting_head_sees_the_readouts_confidence_and_change():
    policy, _ = make("gru", "sequence", k_max=3)
    first = torch.tensor([[2.0, 0.0, 0.0]])
    second = torch.tensor([[0.0, 2.0, 0.0]])
    p = torch.softmax(first, -1)
    c, d = policy.readout_signals(second, first)[0].tolist()
    assert c == pytest.approx(p.max().item(), rel=1e-6)
    assert d == pytest.approx(p[0, 0].item() - p[0, 1].item(), rel=1e-6)  # 1/2 ||pi_2 - pi_1||_1
    assert policy.readout_signals(first, None)[0, 1].item() == 0.0
    # the head's value moves with the signals (they enter its input)
    z = torch.zeros(1, 16)
    assert policy.halt_head(z, 1, torch.tensor([[1.0, 0.0]])) != policy.halt_head(
        z, 1, torch.tensor([[0.3, 0.9]])
    )


def test_head_quality_of_a_perfect_and_a_blind_head():
    from aic.evaluate import head_quality

    returns = torch.tensor([[0.0, 0.5, 0.5], [0.2, 0.2, 0.2], [0.1, 0.1, 0.9], [0.3, 0.3, 0.3]])
    gains = voc_targets(returns)  # (0.5, 0), (0, 0), (0, 0.8), (0, 0)
    perfect = head_quality(gains, returns, 0.1)
    assert perfect["auc"] == 1.0 and perfect["paying_fraction"] == 2 / 8
    assert perfect["spearman"] > 0.7
    blind = head_quality(torch.ones(4, 3), returns, 0.1)
    assert blind["auc"] == 0.5
    inverted = head_quality(-gains, returns, 0.1)
    assert inverted["auc"] == 0.0
