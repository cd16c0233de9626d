import math

import numpy as np
import pytest
import torch

from seqrejectron.core import (
    INF,
    all_tables,
    calibrate_threshold,
    check_epsilon,
    cumulative_stop_time,
    disagreement_loss,
    exact_search,
    hellinger_sq_categorical,
    hellinger_sq_gaussian,
    make_policy,
    pair_masks,
    prefix_cut,
    prefix_weights,
    relaxed_loss,
    stop_times,
    table_agreement_masks,
    validator_score,
)
from seqrejectron.search import SearchResult, neural_search


def test_stop_time_is_the_first_disagreement():
    flags = [np.array([0, 0, 1, 1], bool), np.zeros(3, bool), np.array([1, 0], bool)]
    assert stop_times(flags).tolist() == [2, INF, 0]


def test_validator_score_matches_a_hand_count():
    # three test trajectories, prefixes cut at tau = (2, INF, 0)
    test = [np.array([0, 1, 1], bool), np.array([0, 0, 1], bool), np.array([1, 1], bool)]
    taus = np.array([2, INF, 0])
    # traj 0: disagreement at t=1 < 2 -> cut; traj 1: t=2 < inf -> cut; traj 2: prefix empty
    train = [np.zeros(4, bool), np.array([0, 1], bool), np.zeros(2, bool), np.zeros(1, bool)]
    score, cut, train_rate = validator_score(test, taus, train, lam=2.0)
    assert cut == pytest.approx(2 / 3) and train_rate == pytest.approx(1 / 4)
    assert score == pytest.approx(2 / 3 - 2.0 / 4)
    assert prefix_cut(test, taus).tolist() == [True, True, False]


def test_epsilon_outside_the_unit_interval_is_an_error():
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="epsilon"):
            check_epsilon(bad)


def random_problem(rng, n_z=4, n_traj=60, length=6):
    """Trajectories over n_z abstract states with a fixed expert table and pi-hat = expert except
    on z = n_z - 1, which training never visits."""
    expert = rng.integers(3, size=n_z)
    pihat = expert.copy()
    pihat[-1] = (expert[-1] + 1) % 3
    train_z = [rng.integers(n_z - 1, size=length) for _ in range(n_traj)]
    test_z = [rng.integers(n_z, size=length) for _ in range(n_traj)]
    return expert, pihat, train_z, test_z


@pytest.mark.parametrize("epsilon", [0.05, 0.1, 0.3])
def test_exact_loop_adds_at_most_one_over_epsilon_validators_each_cutting_epsilon(epsilon):
    rng = np.random.default_rng(0)
    n_z = 4
    tables = all_tables(n_z, 3)
    expert, pihat, train_z, test_z = random_problem(rng, n_z)
    test_pihat = [pihat[z] for z in test_z]
    chosen, rounds = exact_search(
        tables, 3, test_z, test_pihat, train_z, [expert[z] for z in train_z], epsilon, lam=2.0
    )
    assert 1 <= len(chosen) <= math.ceil(1 / epsilon)
    for accepted in rounds[: len(chosen)]:
        assert accepted["cut"] > epsilon and accepted["train"] == 0
    assert rounds[-1]["score"] <= epsilon or len(chosen) == math.ceil(1 / epsilon)
    # the chosen validators stop every test trajectory on which pi-hat errs (z = n_z - 1)
    errs = np.array([bool(np.any(z == n_z - 1)) for z in test_z])
    cut = np.zeros(len(test_z), bool)
    for k in chosen:
        cut |= np.array([bool(np.any(tables[k][z] != pihat[z])) for z in test_z])
    assert cut[errs].all()


def test_the_expert_is_a_feasible_validator():
    rng = np.random.default_rng(1)
    tables = all_tables(4, 3)
    expert, pihat, train_z, test_z = random_problem(rng)
    index = int(np.flatnonzero((tables == expert).all(axis=1))[0])
    masks = pair_masks(train_z, [expert[z] for z in train_z], 3)
    agree = np.bitwise_or.reduce(1 << (np.arange(4) * 3 + expert))
    assert not np.any(masks & ~agree)  # no train disagreement
    test_dis = [expert[z] != pihat[z] for z in test_z]
    score, cut, train = validator_score(
        test_dis, np.full(len(test_z), INF), [expert[z] != expert[z] for z in train_z], 2.0
    )
    assert train == 0 and cut > 0.5 and index >= 0


def test_neural_search_reaches_the_exact_maximum_on_a_toy():
    """One-hot z inputs: the network class contains every table, so the relaxation's first
    validator should cut as many test prefixes as the best table."""
    rng = np.random.default_rng(2)
    n_z = 5
    expert, pihat_table, train_z, test_z = random_problem(rng, n_z, n_traj=40)

    class T:
        def __init__(self, z, table):
            self.feats = np.eye(n_z, dtype=np.float32)[z]
            self.expert = table[z]
            self.z = z

        def __len__(self):
            return len(self.z)

    train = [T(z, expert) for z in train_z]
    test = [T(z, expert) for z in test_z]
    torch.manual_seed(0)
    pihat = torch.nn.Sequential(torch.nn.Linear(n_z, 3))
    with torch.no_grad():
        pihat[0].weight.copy_(5 * torch.eye(3)[pihat_table].T)
        pihat[0].bias.zero_()
    result: SearchResult = neural_search(
        pihat, train, test, epsilon=0.05, lam=20.0, steps=300, lr=0.05, seed=0
    )
    _, rounds = exact_search(
        all_tables(n_z, 3),
        3,
        test_z,
        [pihat_table[z] for z in test_z],
        train_z,
        [expert[z] for z in train_z],
        0.05,
        lam=2.0,
    )
    assert result.rounds[0]["cut"] == pytest.approx(rounds[0]["cut"])
    assert result.rounds[0]["train"] == 0


def test_categorical_hellinger_is_a_bounded_divergence():
    torch.manual_seed(0)
    p = torch.softmax(torch.randn(200, 4), -1)
    q = torch.softmax(torch.randn(200, 4), -1)
    h = hellinger_sq_categorical(p, q)
    assert ((h >= 0) & (h <= 1)).all() and (h > 0).all()
    assert hellinger_sq_categorical(p, p).abs().max() < 1e-6
    disjoint = hellinger_sq_categorical(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert disjoint.item() == pytest.approx(1.0)
    # by hand: p = (0.5, 0.5), q = (1, 0): 1 - sqrt(0.5)
    assert hellinger_sq_categorical(
        torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0])
    ).item() == pytest.approx(1 - math.sqrt(0.5))


@pytest.mark.parametrize(
    ("m1", "s1", "m2", "s2"), [(0.0, 1.0, 0.0, 1.0), (0.0, 1.0, 1.5, 0.5), (-1.0, 0.3, 2.0, 2.0)]
)
def test_gaussian_hellinger_matches_quadrature(m1, s1, m2, s2):
    x = np.linspace(-30, 30, 200_001)
    p = np.exp(-((x - m1) ** 2) / (2 * s1**2)) / (s1 * math.sqrt(2 * math.pi))
    q = np.exp(-((x - m2) ** 2) / (2 * s2**2)) / (s2 * math.sqrt(2 * math.pi))
    quadrature = 1 - np.trapezoid(np.sqrt(p * q), x)
    closed = hellinger_sq_gaussian(
        *(torch.tensor([v], dtype=torch.float64) for v in (m1, s1, m2, s2))
    )
    assert closed.item() == pytest.approx(quadrature, abs=1e-6)
    assert (closed.item() == pytest.approx(0.0, abs=1e-12)) == (m1 == m2 and s1 == s2)


def test_diagonal_gaussian_hellinger_multiplies_the_coefficients():
    m1, s1 = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 2.0])
    m2, s2 = torch.tensor([1.0, 1.0]), torch.tensor([1.0, 1.0])
    one = [
        1 - hellinger_sq_gaussian(m1[i : i + 1], s1[i : i + 1], m2[i : i + 1], s2[i : i + 1])
        for i in range(2)
    ]
    both = hellinger_sq_gaussian(m1, s1, m2, s2)
    assert both.item() == pytest.approx(1 - (one[0] * one[1]).item())


def test_cumulative_stop_is_the_first_crossing():
    d = np.array([0.1, 0.2, 0.05, 0.3, 0.4])
    assert cumulative_stop_time(d, 0.35) == 2  # 0.1 + 0.2 + 0.05 = 0.35 reaches eta at t = 2
    assert cumulative_stop_time(d, 0.3500001) == 3
    assert cumulative_stop_time(d, 10.0) == INF


def test_calibrated_threshold_stops_at_most_the_rate():
    rng = np.random.default_rng(0)
    scores = rng.random(200)
    for rate in (0.0, 0.05, 0.2):
        kappa = calibrate_threshold(scores, rate)
        assert (scores > kappa).mean() <= rate
        assert (scores >= kappa).mean() > rate  # the smallest such threshold


def test_disagreement_loss_pushes_away_from_the_avoided_action():
    logits = torch.zeros(4, 3, requires_grad=True)
    avoid = torch.tensor([0, 1, 2, 0])
    loss = disagreement_loss(logits, avoid, torch.full((4,), 0.25))
    assert loss.item() == pytest.approx(-math.log(2 / 3))
    loss.backward()
    assert (logits.grad[torch.arange(4), avoid] > 0).all()  # descent lowers the avoided logit


def test_prefix_weights_count_each_trajectory_once():
    w = prefix_weights([2, 0, 4], per_trajectory=True)
    assert w.tolist() == pytest.approx([0.25, 0.25, 0.125, 0.125, 0.125, 0.125])
    assert prefix_weights([3, 1], per_trajectory=False).tolist() == pytest.approx([0.25] * 4)


# Value tests added for the mutation lane's survivors (README, "Mutation lane").


def test_hellinger_never_goes_negative_by_rounding():
    """float32 rounding puts the Bhattacharyya coefficient above 1 for some rows; the clamp at 0
    keeps H^2 non-negative there, for both closed forms."""
    generator = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(2000, 7, generator=generator), -1)
    assert (1 - torch.sqrt(p * p).sum(-1) < 0).any()  # the unclamped value would go negative
    h = hellinger_sq_categorical(p, p)
    assert (h >= 0).all() and (h < 1e-6).all()
    # Gaussians one float apart in their standard deviations: 2 s1 s2 / (s1^2 + s2^2) rounds
    # above 1 for some rows
    mean = torch.randn(2000, 3, generator=generator)
    s1 = torch.rand(2000, 3, generator=generator) + 0.05
    s2 = torch.nextafter(s1, torch.full_like(s1, 10.0))
    raw = 1 - torch.exp((0.5 * torch.log(2 * s1 * s2 / (s1.pow(2) + s2.pow(2)))).sum(-1))
    assert (raw < 0).any()
    h = hellinger_sq_gaussian(mean, s1, mean, s2)
    assert (h >= 0).all() and (h < 1e-6).all()


def test_gaussian_hellinger_is_per_row_in_a_batch():
    m1, s1 = torch.tensor([[0.0, 1.0], [2.0, 0.0]]), torch.tensor([[1.0, 2.0], [0.5, 1.0]])
    m2, s2 = torch.tensor([[1.0, 1.0], [2.0, 0.0]]), torch.tensor([[1.0, 1.0], [0.5, 1.0]])
    batch = hellinger_sq_gaussian(m1, s1, m2, s2)
    assert batch.shape == (2,)
    for i in range(2):
        assert batch[i].item() == pytest.approx(
            hellinger_sq_gaussian(m1[i], s1[i], m2[i], s2[i]).item()
        )
    assert batch[1].item() == 0.0 and batch[0].item() > 0.1


def test_cumulative_stop_fires_when_the_sum_equals_eta():
    assert cumulative_stop_time(np.array([0.25, 0.25, 0.5]), 0.5) == 1  # exact binary fractions


def test_calibrated_threshold_by_hand():
    scores = np.arange(10)  # integers: the threshold is returned as a float
    assert calibrate_threshold(scores, 0.3) == 6.0  # 7, 8, 9 exceed it: 3 of 10
    assert calibrate_threshold(scores, 0.0) == 9.0
    assert calibrate_threshold(scores, 1.0) == -math.inf  # every trajectory may stop


def test_relaxed_loss_by_hand():
    validator = torch.nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        validator.weight.zero_()  # uniform: CE = log 3, -log(1 - 1/3) = log 1.5
    train_x, train_a = torch.ones(4, 2), torch.tensor([0, 1, 2, 0])
    lam = 2.0
    empty = relaxed_loss(
        validator,
        train_x,
        train_a,
        torch.zeros(0, 2),
        torch.zeros(0, dtype=torch.long),
        torch.zeros(0),
        lam,
    )
    assert empty.item() == pytest.approx(lam * math.log(3))
    one = relaxed_loss(
        validator, train_x, train_a, torch.ones(1, 2), torch.tensor([1]), torch.tensor([0.5]), lam
    )
    assert one.item() == pytest.approx(lam * math.log(3) + 0.5 * math.log(1.5))


def test_validator_score_without_train_trajectories_counts_no_train_disagreement():
    test = [np.array([False, True]), np.array([False, False])]
    taus = np.array([INF, INF])
    assert validator_score(test, taus, [], lam=3.0) == (0.5, 0.5, 0.0)


def test_prefix_weights_of_only_empty_prefixes_are_empty():
    for per_trajectory in (True, False):
        assert prefix_weights([0, 0], per_trajectory=per_trajectory).shape == (0,)


def test_pair_and_agreement_masks_by_hand():
    # bit z * n_actions + a; two actions: (0, 1) -> bit 1, (1, 0) -> bit 2
    zs = [np.array([0, 1, 1]), np.array([], dtype=np.int64), np.array([])]
    actions = [np.array([1, 0, 0]), np.array([], dtype=np.int64), np.array([])]
    assert pair_masks(zs, actions, 2).tolist() == [2 | 4, 0, 0]  # an empty trajectory holds no pair
    assert pair_masks([], [], 2).dtype == np.int64  # no trajectories: still bit-operable
    with pytest.raises(ValueError):
        pair_masks(zs, actions[:2], 2)  # one action sequence per trajectory
    # table (0, 1) agrees with (z=0, a=0) and (z=1, a=1): bits 0 and 3; table (1, 0): bits 1, 2
    assert table_agreement_masks(np.array([[0, 1], [1, 0]]), 2).tolist() == [1 | 8, 2 | 4]
    assert all_tables(2, 2).tolist() == [[0, 0], [0, 1], [1, 0], [1, 1]]
    none = all_tables(0, 3)  # no abstract states: the one empty table, still integer
    assert none.shape == (1, 0) and none.dtype == np.int64


def test_stop_times_and_prefix_cut_of_no_trajectories_and_mismatched_lengths():
    empty = stop_times([])
    assert empty.shape == (0,) and empty.dtype == np.int64
    with pytest.raises(ValueError):
        prefix_cut([np.array([True]), np.array([False])], np.array([INF]))


def hand_problem():
    """Two abstract states, two actions; tables (0,0) (0,1) (1,0) (1,1) are indices 0-3. The
    expert is (0, 1), pi-hat is (0, 0) (wrong on z = 1), training visits only z = 0."""
    test_z = [np.array([0, 1, 1]), np.array([0, 0]), np.array([1, 0])]
    test_pihat = [np.zeros(3, np.int64), np.zeros(2, np.int64), np.zeros(2, np.int64)]
    return all_tables(2, 2), test_z, test_pihat, [np.array([0, 0])], [np.array([0, 0])]


def test_exact_search_rounds_by_hand():
    tables, test_z, test_pihat, train_z, train_a = hand_problem()
    # Round 1, prefixes whole: (0,0) = pi-hat cuts nothing; (0,1) cuts trajectories 0 and 2
    # (pair z=1, a=0) with no train disagreement; (1,x) cut all three but disagree with the one
    # train trajectory (z=0, a=0): S = 1 - 2 * 1. The expert (0, 1) wins with S = 2/3, and its
    # first disagreements give tau = (1, INF, 0). Round 2: prefixes [z=0], [0, 0], []: only
    # (1,x) cut (2/3 - 2 < 0), so the best S is 0 (table 0) <= eps and the loop stops.
    chosen, rounds = exact_search(tables, 2, test_z, test_pihat, train_z, train_a, 0.3, lam=2.0)
    assert chosen == [1]
    assert rounds[0] == {
        "score": pytest.approx(2 / 3),
        "cut": pytest.approx(2 / 3),
        "train": 0.0,
        "size": 1,
    }
    assert rounds[1] == {"score": 0.0, "cut": 0.0, "train": 0.0}  # the rejecting round: no size
    # with lam = 0 the train disagreement is still reported: (1, 0) disagrees on the one train
    # trajectory, and it is first among the tables that cut every whole prefix
    chosen, rounds = exact_search(tables, 2, test_z, test_pihat, train_z, train_a, 0.3, lam=0.0)
    assert chosen[0] == 2 and rounds[0]["cut"] == 1.0 and rounds[0]["train"] == 1.0


def test_exact_search_accepts_only_scores_above_epsilon():
    tables = all_tables(2, 2)
    test_z, test_pihat = [np.array([1]), np.array([0])], [np.array([0]), np.array([0])]
    train_z, train_a = [np.array([0])], [np.array([0])]
    # the best table, (0, 1), cuts one of the two test trajectories: S = 1/2 = eps exactly
    chosen, rounds = exact_search(tables, 2, test_z, test_pihat, train_z, train_a, 0.5, lam=1.0)
    assert chosen == [] and rounds == [{"score": 0.5, "cut": 0.5, "train": 0.0}]
    chosen, _ = exact_search(tables, 2, test_z, test_pihat, train_z, train_a, 0.49, lam=1.0)
    assert chosen == [1]


def test_exact_search_round_cap_binds_when_tables_recut_one_prefix():
    # One test trajectory z = (0, 1, 2), pi-hat actions (0, 0, 1); lam = 0, so the first table
    # (in product order) that disagrees inside the current prefix wins every round: (0,0,0) cuts
    # at t = 2, then (0,1,0) at t = 1, then (1,0,0) at t = 0, each with S = 1 > eps. Each
    # re-cuts the same prefix, so only the cap ceil(1 / eps) = 2 stops the loop.
    tables = all_tables(3, 2)
    args = ([np.array([0, 1, 2])], [np.array([0, 0, 1])], [np.array([0])], [np.array([0])])
    chosen, rounds = exact_search(tables, 2, *args, epsilon=0.5, lam=0.0)
    assert chosen == [0, 2] and len(rounds) == 2 and rounds[-1]["size"] == 2
    chosen, _ = exact_search(tables, 2, *args, epsilon=0.5, lam=0.0, max_rounds=5)
    assert chosen == [0, 2, 4]  # without the cap: a third table, then an empty prefix


def test_exact_search_refuses_test_trajectories_without_pihat_actions():
    # the loop stops in round 1 (table (1,x) disagrees on train, (0,x) cut nothing), so only the
    # first length check can see the missing pi-hat sequence
    tables = all_tables(2, 2)
    with pytest.raises(ValueError):
        exact_search(
            tables,
            2,
            [np.array([0]), np.array([0])],
            [np.array([0])],
            [np.array([0])],
            [np.array([0])],
            0.5,
            lam=2.0,
        )


def test_make_policy_is_a_two_hidden_layer_relu_mlp():
    torch.manual_seed(0)
    policy = make_policy(3, 5, 2)
    layers = list(policy)
    assert [type(m) for m in layers] == [
        torch.nn.Linear,
        torch.nn.ReLU,
        torch.nn.Linear,
        torch.nn.ReLU,
        torch.nn.Linear,
    ]
    sizes = [(m.in_features, m.out_features) for m in layers if isinstance(m, torch.nn.Linear)]
    assert sizes == [(3, 5), (5, 5), (5, 2)] and all(m.bias is not None for m in layers[::2])
    x = torch.tensor([[1.0, -2.0, 0.5]])
    with torch.no_grad():
        w1, w2, w3 = layers[0], layers[2], layers[4]
        by_hand = w3(torch.relu(w2(torch.relu(w1(x)))))
        # the same layers called in the same order on the same shapes: bit for bit
        assert torch.equal(policy(x), by_hand) and policy(x).shape == (1, 2)
