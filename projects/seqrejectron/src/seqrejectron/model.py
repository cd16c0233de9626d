"""LightningModule: behaviour cloning, then SeqRejectron's neural validator rounds (wiring only;
the losses and the score come from core.py).

Steps 0 .. bc_steps-1 fit pi-hat by log-loss BC. Then each round of ``validator_steps`` steps
trains a candidate validator from pi-hat's weights on Eq. 6; at the round's last step the
candidate is scored (Eq. 2): accepted (it joins the validators and the test prefixes it cuts
are stopped) or, if it scores at most epsilon or disagrees with the expert on more than
epsilon/2 of the train trajectories, the search ends. The validators, their count, the test stop
times and the done flag are buffers and parameters, so a checkpoint resumes mid-loop.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, OpenUnitInterval, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from torch import nn

from papers_cli.hparams import init_arguments
from seqrejectron.core import (
    INF,
    accepts,
    advance_stop_times,
    check_epsilon,
    first_true,
    make_policy,
    prefix_lengths,
    prefix_weights,
    relaxed_loss,
    validator_score,
)


class SeqRejectronModule(LightningModule):
    def __init__(
        self,
        in_features: PositiveInt = 42,  # envs.N_FEATURES (A); the data module checks the match
        n_test: PositiveInt = 200,
        n_actions: PositiveInt = 3,
        hidden: PositiveInt = 64,
        lr: PositiveFloat = 0.01,
        bc_steps: PositiveInt = 300,
        validator_steps: PositiveInt = 150,
        epsilon: OpenUnitInterval = 0.05,
        lam: PositiveFloat = 20.0,
        score_lambda: NonNegativeFloat = 1.0,
    ) -> None:
        super().__init__()
        check_epsilon(epsilon)
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.pihat = make_policy(in_features, hidden, n_actions)
        self.candidate = make_policy(in_features, hidden, n_actions)
        self.max_validators = math.ceil(1 / epsilon)
        self.validators = nn.ModuleList(
            make_policy(in_features, hidden, n_actions) for _ in range(self.max_validators)
        )
        self.register_buffer("n_validators", torch.tensor(0))
        self.register_buffer("done", torch.tensor(False))
        self.register_buffer("taus", torch.full((n_test,), INF, dtype=torch.long))

    # -- policies --------------------------------------------------------------------------
    def act(self, x: torch.Tensor) -> torch.Tensor:
        return self.pihat(x).argmax(-1)

    def stop_flags(self, x: torch.Tensor) -> torch.Tensor:
        """Per state: does some accepted validator's action differ from pi-hat's? [N] bool."""
        base = self.act(x)
        flags = torch.zeros(len(x), dtype=torch.bool, device=x.device)
        for v in self.validators[: int(self.n_validators)]:
            flags |= v(x).argmax(-1) != base
        return flags

    # -- training --------------------------------------------------------------------------
    def on_train_batch_start(self, batch, batch_idx):
        """Once the search has ended, stop before the next step: no step runs and none is
        counted, so a run resumed from a checkpoint written after the end stops at the same
        global step as the run that went straight through (-1 skips the epoch's batches)."""
        if bool(self.done):
            self.trainer.should_stop = True
            return -1
        return None

    def training_step(self, batch, batch_idx):
        step, h = self.global_step, self.hparams
        if step < h.bc_steps:
            loss = nn.functional.cross_entropy(self.pihat(batch["train_x"]), batch["train_a"])
            self.log("train/bc_loss", loss, prog_bar=True, batch_size=1)
            return self.touch_every_parameter(loss)
        # (once the search has ended, on_train_batch_start stops before any step runs)
        with torch.no_grad():  # pi-hat is fixed now; logged so every step reports the same keys
            bc_loss = nn.functional.cross_entropy(self.pihat(batch["train_x"]), batch["train_a"])
        self.log("train/bc_loss", bc_loss, prog_bar=True, batch_size=1)
        round_step = (step - h.bc_steps) % h.validator_steps
        if round_step == 0:
            self.start_round()
        loss = self.validator_loss(batch)
        self.log("train/validator_loss", loss, prog_bar=True, batch_size=1)
        if round_step == h.validator_steps - 1:
            self.end_round(batch, [int(n) for n in batch["test_lengths"]])
        return self.touch_every_parameter(loss)

    def validator_loss(self, batch) -> torch.Tensor:
        """Eq. 6 on the candidate: Lambda x CE to the expert on the train states plus the
        disagreement with pi-hat on the test states before each trajectory's stop time, each
        trajectory weighted once (1 / (m x prefix length), as search.neural_search)."""
        lengths = [int(n) for n in batch["test_lengths"]]
        cut = prefix_lengths(self.taus.tolist(), lengths)
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        index = torch.from_numpy(
            np.concatenate([np.arange(s, s + c) for s, c in zip(starts, cut, strict=True)]).astype(
                np.int64
            )
        ).to(batch["test_x"].device)
        with torch.no_grad():
            avoid = self.act(batch["test_x"][index])
        weights = prefix_weights(cut, per_trajectory=True).to(batch["test_x"])
        return relaxed_loss(
            self.candidate,
            batch["train_x"],
            batch["train_a"],
            batch["test_x"][index],
            avoid,
            weights,
            self.hparams.lam,
        )

    def touch_every_parameter(self, loss: torch.Tensor) -> torch.Tensor:
        """Add 0 x every parameter, so DDP sees a gradient (zero) for the networks a phase does
        not train; with their Adam state cleared (``start_round``), a zero gradient moves
        nothing."""
        return loss + 0.0 * sum(p.sum() for p in self.parameters())

    def start_round(self) -> None:
        self.candidate.load_state_dict(self.pihat.state_dict())
        optimizer = self.optimizers().optimizer
        # a fresh Adam state for each candidate; pi-hat's is dropped so it stays where BC left it
        for p in [*self.candidate.parameters(), *self.pihat.parameters()]:
            optimizer.state.pop(p, None)

    @torch.no_grad()
    def candidate_disagreements(self, batch, lengths):
        """Per trajectory: the candidate's disagreement with pi-hat on each test state and with
        the expert on each train state."""
        test_dis = (
            (self.candidate(batch["test_x"]).argmax(-1) != self.act(batch["test_x"])).cpu().numpy()
        )
        train_dis = (self.candidate(batch["train_x"]).argmax(-1) != batch["train_a"]).cpu().numpy()
        train_lengths = [int(n) for n in batch["train_lengths"]]
        return (
            np.split(test_dis, np.cumsum(lengths)[:-1]),
            np.split(train_dis, np.cumsum(train_lengths)[:-1]),
        )

    @torch.no_grad()
    def end_round(self, batch, lengths) -> None:
        """Score the candidate (Eq. 2, train term per trajectory, as search.neural_search) and
        accept it or end the search (core.accepts)."""
        test_dis, train_dis = self.candidate_disagreements(batch, lengths)
        score, cut, train_rate = validator_score(
            test_dis, self.taus.cpu().numpy(), train_dis, self.hparams.score_lambda
        )
        self.log_dict(
            {"round/score": score, "round/cut": cut, "round/train_disagreement": train_rate},
            batch_size=1,
        )
        if not accepts(score, train_rate, self.hparams.epsilon):
            self.done.fill_(True)
            return
        self.validators[int(self.n_validators)].load_state_dict(self.candidate.state_dict())
        self.n_validators += 1
        taus = advance_stop_times(self.taus.cpu().numpy(), test_dis)
        self.taus.copy_(torch.from_numpy(taus))
        if int(self.n_validators) >= self.max_validators:
            self.done.fill_(True)

    def validation_step(self, batch, batch_idx):
        with torch.no_grad():
            accuracy = (self.act(batch["train_x"]) == batch["train_a"]).float().mean()
            test_stop = self.stop_flags(batch["test_x"]).float().mean()
        self.log_dict(
            {
                "val/bc_train_accuracy": accuracy,
                "val/test_state_stop": test_stop,
                "val/n_validators": self.n_validators.float(),
            },
            sync_dist=True,
            batch_size=1,
        )

    # -- testing: roll the selective policy out -------------------------------------------
    def test_step(self, episode_seed, batch_idx):
        data = self.trainer.datamodule
        policy = self.rollout_policy()
        seed = int(episode_seed[0])
        p_traj, q_traj = data.train_env.rollout(policy, seed), data.test_env.rollout(policy, seed)
        tau_p = first_true(
            self.stop_flags(torch.from_numpy(p_traj.feats).to(self.device)).cpu().numpy()
        )
        tau_q = first_true(
            self.stop_flags(torch.from_numpy(q_traj.feats).to(self.device)).cpu().numpy()
        )
        stopped_q = tau_q < len(q_traj)
        self.log_dict(
            {
                "test/train_stop": float(tau_p < len(p_traj)),
                "test/test_cost": float(q_traj.cost * (not stopped_q)),
                "test/test_executed": float(not stopped_q),
                "test/bc_test_cost": float(q_traj.cost),
            },
            batch_size=1,
            sync_dist=True,
        )

    def rollout_policy(self):
        @torch.no_grad()
        def act(feats, z):
            return int(self.act(torch.from_numpy(feats)[None].to(self.device))[0])

        return act

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr, foreach=True)
