"""The validator loop, pinned by value: the acceptance rule and the stop-time update (core.py),
the LightningModule's Eq. 6 weighting and per-trajectory train term (model.py), the same
validators through `uv run train`'s module and the claim's `neural_search`, and completeness
without shift on a world whose training does not cover every test state."""

import numpy as np
import pytest
import torch

from seqrejectron.cli import train
from seqrejectron.core import INF, accepts, advance_stop_times, prefix_lengths
from seqrejectron.experiment import WorldConfig, build_world, episode_metrics, fit, world_summary
from seqrejectron.model import SeqRejectronModule
from seqrejectron.search import neural_search, union_disagreement


def test_acceptance_needs_a_score_above_epsilon_and_train_agreement_within_half_epsilon():
    assert accepts(0.06, 0.025, 0.05)
    assert not accepts(0.05, 0.0, 0.05)  # S(v) = epsilon ends the search
    assert not accepts(0.5, 0.026, 0.05)  # disagrees on more than epsilon/2 of train trajectories
    assert accepts(0.5, 0.0, 0.05)


def test_prefix_lengths_and_stop_time_update_by_hand():
    assert prefix_lengths(np.array([1, INF, 0]), [2, 3, 4]) == [1, 3, 0]
    taus = advance_stop_times(
        np.array([1, INF, INF]), [np.array([0, 1]), np.array([0, 0, 1]), np.array([0, 0])]
    )
    assert taus.tolist() == [1, 2, INF]
    # one stop time per test trajectory: a stop-time array of another length is a bug upstream
    with pytest.raises(ValueError):
        prefix_lengths(np.array([1, INF]), [2, 3, 4])


def constant_policy(module_policy: torch.nn.Module, action: int) -> None:
    """Make a make_policy MLP output ``action`` everywhere (last layer: zero weights, a bias)."""
    with torch.no_grad():
        module_policy[-1].weight.zero_()
        module_policy[-1].bias.copy_(10.0 * torch.nn.functional.one_hot(torch.tensor(action), 3))


def small_module(**kwargs) -> SeqRejectronModule:
    torch.manual_seed(0)
    return SeqRejectronModule(in_features=4, n_test=2, hidden=8, **kwargs)


def test_module_validator_loss_weights_each_test_trajectory_once_by_value():
    """Eq. 6 through the LightningModule: Lambda x train CE plus -log(1 - v(pi-hat(s)|s)) on the
    states before each trajectory's stop time, weighted 1/(m x prefix length)."""
    module = small_module(lam=3.0)
    module.taus.copy_(torch.tensor([1, INF]))  # trajectory 0 stopped after its first state
    gen = torch.Generator().manual_seed(1)
    batch = {
        "train_x": torch.randn(3, 4, generator=gen),
        "train_a": torch.tensor([0, 2, 1]),
        "test_x": torch.randn(5, 4, generator=gen),
        "test_lengths": torch.tensor([2, 3]),
        "train_lengths": torch.tensor([1, 2]),
    }
    with torch.no_grad():
        train_ce = torch.nn.functional.cross_entropy(
            module.candidate(batch["train_x"]), batch["train_a"]
        )
        kept = batch["test_x"][[0, 2, 3, 4]]
        avoid = module.pihat(kept).argmax(-1)
        p_avoid = module.candidate(kept).softmax(-1)[torch.arange(4), avoid]
        weights = torch.tensor([1 / 2, 1 / 6, 1 / 6, 1 / 6])
        expected = 3.0 * train_ce - (weights * torch.log(1 - p_avoid)).sum()
        assert module.validator_loss(batch).item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize(
    ("train_a", "accepted"),
    [
        # the candidate (always action 2) differs from the expert on one state of trajectory 1:
        # 1 of 4 states (0.25, within epsilon/2) but 1 of 2 trajectories (0.5): refused
        ([2, 2, 2, 0], False),
        ([2, 2, 2, 2], True),
    ],
)
def test_module_scores_train_disagreement_per_trajectory(train_a, accepted):
    module = small_module(epsilon=0.5)
    constant_policy(module.pihat, 0)
    constant_policy(module.candidate, 2)  # disagrees with pi-hat on every test state
    batch = {
        "train_x": torch.randn(4, 4),
        "train_a": torch.tensor(train_a),
        "test_x": torch.randn(5, 4),
        "test_lengths": torch.tensor([2, 3]),
        "train_lengths": torch.tensor([2, 2]),
    }
    module.end_round(batch, [2, 3])
    assert int(module.n_validators) == int(accepted)
    assert bool(module.done) is not accepted
    assert module.taus.tolist() == ([0, 0] if accepted else [INF, INF])


def test_train_runs_the_claims_search(search_args):
    """`uv run train`'s module and the claim's neural_search, from the same pi-hat on the same
    data, find the same number of validators and the same test stop times."""
    args = [*search_args, "--model.validator_steps=60", "--trainer.max_steps=480"]
    cli = train(args)
    module, data = cli.model, cli.datamodule
    assert bool(module.done)  # the search ended by its own rule, not by max_steps
    result = neural_search(
        module.pihat,
        data.train,
        data.test,
        epsilon=module.hparams.epsilon,
        lam=module.hparams.lam,
        steps=module.hparams.validator_steps,
        lr=module.hparams.lr,
        seed=0,
    )
    assert len(result.validators) == int(module.n_validators) >= 1
    search_taus = [
        int(
            np.flatnonzero(
                union_disagreement(module.pihat, result.validators, torch.from_numpy(t.feats))
            ).min(initial=INF)
        )
        for t in data.test
    ]
    assert module.taus.tolist() == search_taus


def test_without_shift_the_method_stops_no_test_episode_on_a_partly_covered_world():
    """Q = P (no gust): at seed 102, horizon 80 and 100 demonstrations, training covers 99.7% of
    the test states; the search finds no validator, so it stops no episode in either dynamics."""
    config = WorldConfig(
        horizon=80, strength=0.0, n_train=100, n_test=100, n_calibration=40, n_val=10, n_eval=100
    )
    world = build_world(config, 102)
    assert world_summary(world)["test_state_coverage"] < 1.0
    fitted = fit(world, "seqrejectron", 0.05, {"lam": 20.0}, {"lam": 20.0})
    outcome = episode_metrics(fitted.rule, world.eval_p, world.eval_q)
    assert fitted.diagnostics["n_validators"] == 0
    assert outcome["train_stop"].mean() == 0.0
    assert outcome["test_executed"].mean() == 1.0


def test_module_stop_flags_is_the_union_of_accepted_validators_disagreements():
    """The deployment rule of `train test` (Eq. 1): a state is flagged when SOME accepted
    validator's action differs from pi-hat's; validators past ``n_validators`` are not read."""
    module = small_module()
    constant_policy(module.pihat, 0)
    gate = torch.nn.Linear(4, 3)  # action 1 where x[0] > 0, else 0 (pi-hat's)
    with torch.no_grad():
        gate.weight.zero_()
        gate.bias.zero_()
        gate.weight[1, 0] = 10.0
    module.validators[0] = gate  # disagrees first, so a later agreeing validator must not reset
    constant_policy(module.validators[1], 0)  # agrees everywhere
    constant_policy(module.validators[2], 2)  # disagrees everywhere, but not accepted
    x = torch.tensor([[1.0, 0, 0, 0], [-1.0, 0, 0, 0], [2.0, 1, 0, 0], [0.0, 3, 0, 0]])
    module.n_validators.fill_(2)
    assert module.stop_flags(x).tolist() == [True, False, True, False]
    module.n_validators.fill_(1)
    assert module.stop_flags(x).tolist() == [True, False, True, False]
    module.n_validators.fill_(0)
    assert module.stop_flags(x).tolist() == [False] * 4
    module.n_validators.fill_(3)
    assert module.stop_flags(x).tolist() == [True] * 4


def fit_steps(module, batch, max_steps: int):
    """Run the module's own training loop for ``max_steps`` full-batch steps on ``batch``."""
    from lightning.pytorch import Trainer

    class Repeat(torch.utils.data.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, index):
            return batch

    trainer = Trainer(
        max_steps=max_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, torch.utils.data.DataLoader(Repeat(), batch_size=None))
    return trainer


def loop_batch() -> dict:
    gen = torch.Generator().manual_seed(3)
    return {
        "train_x": torch.randn(6, 4, generator=gen),
        "train_a": torch.tensor([0, 1, 2, 0, 1, 2]),
        "test_x": torch.randn(5, 4, generator=gen),
        "test_lengths": torch.tensor([2, 3]),
        "train_lengths": torch.tensor([3, 3]),
    }


def test_module_logs_bc_loss_during_bc_and_scores_a_round_after_exactly_validator_steps():
    """BC logs pi-hat's cross-entropy under "train/bc_loss" (before its step); the first round
    is scored at its last step, bc_steps + validator_steps - 1, not one step earlier."""
    batch = loop_batch()
    module = small_module(bc_steps=2, validator_steps=3, lr=0.1)
    with torch.no_grad():
        first = torch.nn.functional.cross_entropy(module.pihat(batch["train_x"]), batch["train_a"])
    trainer = fit_steps(module, batch, 1)
    torch.testing.assert_close(trainer.callback_metrics["train/bc_loss"], first)
    for steps, scored in ((4, False), (5, True)):  # round 1: steps 2, 3, 4
        trainer = fit_steps(small_module(bc_steps=2, validator_steps=3, lr=0.1), batch, steps)
        assert ("round/score" in trainer.callback_metrics) == scored, steps


def test_module_trains_pihat_for_exactly_bc_steps_then_starts_a_round_from_it():
    """Steps 0 .. bc_steps - 1 are full-batch BC (Adam on pi-hat's cross-entropy, replayed by
    hand); at step bc_steps pi-hat freezes and the first round's candidate starts from it."""
    import copy

    module = small_module(bc_steps=2, validator_steps=3, lr=0.1)
    batch = loop_batch()
    replay = copy.deepcopy(module.pihat)
    optimizer = torch.optim.Adam(replay.parameters(), lr=0.1, foreach=True)
    for _ in range(2):
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(replay(batch["train_x"]), batch["train_a"]).backward()
        optimizer.step()

    trainer = fit_steps(module, batch, 3)  # two BC steps and the first step of round 1
    for got, want in zip(module.pihat.parameters(), replay.parameters(), strict=True):
        torch.testing.assert_close(got, want)
    with torch.no_grad():  # step 2 logs the frozen pi-hat's BC loss and the round's loss
        frozen = torch.nn.functional.cross_entropy(replay(batch["train_x"]), batch["train_a"])
    torch.testing.assert_close(trainer.callback_metrics["train/bc_loss"], frozen)
    assert "train/validator_loss" in trainer.callback_metrics
    moved = [
        (c - p).abs().max()
        for c, p in zip(module.candidate.parameters(), replay.parameters(), strict=True)
    ]
    # one step of a FRESH Adam (lr 0.1) from pi-hat: each weight moves by about lr; Adam state
    # kept from the BC phase (zero gradients, two steps) would move it by about 0.064
    torch.testing.assert_close(max(moved), torch.tensor(0.1), atol=1e-3, rtol=0)
