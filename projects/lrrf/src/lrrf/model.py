"""LightningModule: the continual adversarial-defense loop (wiring; the math is in core.py).

One ``fit`` runs the whole task sequence: task t covers optimizer steps
[t * steps_per_task, (t + 1) * steps_per_task), steps_per_task = epochs_per_task x batches per
epoch. When a task ends (``on_train_batch_end``) the module updates what the next tasks need
(LRRF's accumulated network and buffer, the baselines' old model, Fisher or logits) and fills row
t of R on the validation and test images. All of it is saved in the checkpoint, so a run resumed
mid-sequence continues exactly.
"""

from __future__ import annotations

import copy
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from jsonargparse.typing import (
    NonNegativeFloat,
    NonNegativeInt,
    OpenUnitInterval,
    PositiveFloat,
    PositiveInt,
)
from lightning.pytorch import LightningModule

from lrrf import core
from lrrf.attacks import Budget, check_inputs, make_attack
from lrrf.baselines import (
    air_loss,
    derpp_loss,
    empirical_fisher,
    ewc_loss,
    lwf_loss,
)
from lrrf.data import SHAPES, Dataset
from lrrf.networks import build_network
from papers_cli import ConfigError, init_arguments
from papers_eval.mechanism import gradient_shares
from papers_gpu import derived_seed, run_seed, seed_all_generators

TrainAttack = Literal["linf", "l2", "l1", "fgsm"]
EvalOnlyAttack = Literal["square", "autoattack"]
Method = Literal["lrrf", "seq_at", "joint_at", "er", "lwf", "ewc", "derpp", "air"]
REPLAY = ("lrrf", "er", "derpp")
OLD_MODEL = ("lwf", "air")


class LrrfModule(LightningModule):
    """LRRF and the baselines on one task sequence. ``method`` picks the training rule; for LRRF
    ``lam_drm``, ``lam_ctir``, ``lam_kco`` = 0 switch a mechanism off (the ablations) and
    ``kco_supcon`` = 0 leaves KCO its replay cross-entropy only.

    ``training_step`` sets ``loss_terms`` (the weighted terms whose sum it returns); with
    ``grad_share_every`` = N > 0 every N-th step measures each term's gradient share and cosine
    with the total gradient (papers_eval's ``gradient_shares``), averaged per task into
    ``diagnostics`` as ``share_<term>`` / ``cosine_<term>``."""

    def __init__(
        self,
        dataset: Dataset = "digits",
        arch: Literal["small_cnn", "preact_resnet18"] = "small_cnn",
        width: PositiveInt = 16,
        feature_dim: PositiveInt = 64,
        method: Method = "lrrf",
        tasks: list[TrainAttack] = ["linf", "fgsm", "l2", "l1"],  # noqa: B006 (jsonargparse)
        epochs_per_task: PositiveInt = 3,
        eps_linf: PositiveFloat = 0.2,
        eps_l2: PositiveFloat = 0.8,
        eps_l1: PositiveFloat = 2.5,
        eps_fgsm: PositiveFloat = 0.2,
        l1_sparsity: OpenUnitInterval = 0.1,
        train_steps: PositiveInt = 5,
        train_step_fraction: PositiveFloat = 0.4,
        eval_steps: PositiveInt = 10,
        eval_step_fraction: PositiveFloat = 0.25,
        eval_extra: list[EvalOnlyAttack] = [],  # noqa: B006
        square_queries: PositiveInt = 300,
        lam_drm: NonNegativeFloat = 1.0,
        drm_dynamic: bool = True,
        drm_class_means: bool = True,
        lam_ctir: NonNegativeFloat = 1.0,
        ctir_rule: Literal["mean", "ema"] = "mean",
        ctir_ema: OpenUnitInterval = 0.5,
        ctir_gram: NonNegativeFloat = 1.0,
        lam_kco: NonNegativeFloat = 1.0,
        kco_supcon: NonNegativeFloat = 1.0,
        kco_temperature: PositiveFloat = 0.5,
        replay_attack: Literal["task", "random_previous"] = "task",
        buffer_size: PositiveInt = 50,
        replay_batch: PositiveInt = 16,
        reg_weight: NonNegativeFloat = 1.0,
        derpp_beta: NonNegativeFloat = 0.5,
        fisher_samples: PositiveInt = 256,
        air_noise: PositiveFloat = 0.1,
        lr: PositiveFloat = 0.05,
        weight_decay: NonNegativeFloat = 5e-4,
        evaluate_tasks: bool = True,
        grad_share_every: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        channels, size, classes, mean, std = SHAPES[dataset]
        if buffer_size < classes:
            raise ConfigError(
                f"buffer_size = {buffer_size} is smaller than the {classes} classes: a "
                "class-balanced buffer needs at least one slot per class"
            )
        if len(set(tasks)) != len(tasks) or len(tasks) < 2:
            raise ConfigError(f"tasks must name at least two different attacks, got {tasks}")
        self.num_classes = classes
        self.net = build_network(arch, channels, size, classes, width, feature_dim, mean, std)
        step = {"linf": eps_linf, "l2": eps_l2, "l1": eps_l1, "fgsm": eps_fgsm}
        self.train_attacks = {
            name: make_attack(
                name, Budget(step[name], train_steps, train_step_fraction, l1_sparsity)
            )  # fmt: skip
            for name in tasks
        }
        self.eval_attacks = {
            name: make_attack(
                name, Budget(step[name], eval_steps, eval_step_fraction, l1_sparsity)
            )  # fmt: skip
            for name in tasks
        }
        for name in eval_extra:
            steps = square_queries if name == "square" else eval_steps
            self.eval_attacks[name] = make_attack(name, Budget(eps_linf, steps), classes)
        self._reset_sequence_state()

    # ------------------------------------------------------------------ sequence state
    # The frozen networks are kept out of the module's registry: Lightning's ``model.train()``
    # must not switch their batch norm to training (and they travel in ``lrrf_sequence``).
    @property
    def accumulated(self) -> torch.nn.Module | None:
        """[R4] the accumulated network g_bar (the whole network, frozen, eval mode)."""
        return self._frozen["accumulated"]

    @property
    def old_model(self) -> torch.nn.Module | None:
        """The previous task's end point (the LwF / AIR teacher)."""
        return self._frozen["old_model"]

    def _reset_sequence_state(self) -> None:
        self.tasks_done = 0
        self._frozen: dict[str, torch.nn.Module | None] = {"accumulated": None, "old_model": None}
        self.buffer: dict[str, torch.Tensor] = {}  # [R6] x, y, task (+ x_adv, logits for DER++)
        self.fisher: dict[str, torch.Tensor] = {}
        self.anchors: dict[str, torch.Tensor] = {}
        self.task_end_correct: dict[str, list[np.ndarray]] = {"val": [], "test": []}
        self.diagnostics: list[dict[str, float]] = []
        self._running: dict[str, list[float]] = {}

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        checkpoint["lrrf_sequence"] = {
            "tasks_done": self.tasks_done,
            "accumulated": None if self.accumulated is None else self.accumulated.state_dict(),
            "old_model": None if self.old_model is None else self.old_model.state_dict(),
            "buffer": self.buffer,
            "fisher": self.fisher,
            "anchors": self.anchors,
            "task_end_correct": {
                k: [torch.from_numpy(a) for a in v] for k, v in self.task_end_correct.items()
            },  # fmt: skip
            "diagnostics": self.diagnostics,
            "running": self._running,
        }

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        state = checkpoint.get("lrrf_sequence")
        if state is None:
            return
        self.tasks_done = state["tasks_done"]
        for name in self._frozen:
            self._frozen[name] = self._frozen_copy(state[name])
        self.buffer, self.fisher, self.anchors = state["buffer"], state["fisher"], state["anchors"]
        self.task_end_correct = {k: [a.numpy() for a in v]
                                 for k, v in state["task_end_correct"].items()}  # fmt: skip
        self.diagnostics, self._running = state["diagnostics"], state["running"]

    def on_train_batch_start(self, batch, batch_idx) -> None:
        # Re-seed from the optimizer step, after papers_gpu's SeedEveryStep. Written when that
        # callback keyed on Lightning's (epoch, batch index), which lag one batch after a resume
        # from an epoch-end checkpoint; it no longer does, but the committed claim record drew
        # its attack starts and replay samples from these seeds, so they stay.
        seed_all_generators(derived_seed(run_seed(), self.global_rank, self.global_step, 7))

    def on_train_start(self) -> None:
        for name, net in self._frozen.items():  # restored on the CPU before the module moved
            if net is not None:
                self._frozen[name] = net.to(self.device)

    def _frozen_copy(self, state: dict | None = None) -> torch.nn.Module | None:
        if state is None:
            return None
        frozen = copy.deepcopy(self.net)
        if state is not None:
            frozen.load_state_dict(state)
        frozen.eval().requires_grad_(False)
        return frozen

    # ----------------------------------------------------------------------- schedule
    @property
    def steps_per_task(self) -> int:
        return max(1, self.hparams.epochs_per_task * int(self.trainer.num_training_batches))

    @property
    def current_task(self) -> int:
        return min(self.global_step // self.steps_per_task, len(self.hparams.tasks) - 1)

    def setup(self, stage: str) -> None:
        # The sequence bounds training: T x epochs_per_task epochs unless max_steps is given.
        if stage == "fit" and self.trainer.max_steps == -1:
            self.trainer.fit_loop.max_epochs = (
                len(self.hparams.tasks) * self.hparams.epochs_per_task
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    # -------------------------------------------------------------------- training
    def craft(self, x: torch.Tensor, y: torch.Tensor, task: int) -> torch.Tensor:
        """Adversarial examples of task ``task``'s attack against the current model (eval mode)."""
        return self.train_attacks[self.hparams.tasks[task]](self.net, x, y)

    def craft_mixed(self, x: torch.Tensor, y: torch.Tensor, tasks: torch.Tensor) -> torch.Tensor:
        """Each item attacked by its own task's attack ([B] task ids)."""
        x_adv = x.clone()
        for task in tasks.unique().tolist():
            where = tasks == task
            x_adv[where] = self.craft(x[where], y[where], task)
        return x_adv

    def training_step(self, batch, batch_idx):
        h = self.hparams
        x, y = batch
        check_inputs(x)
        task = self.current_task
        if h.method == "joint_at":  # every item gets one of all T attacks, in equal shares
            ids = torch.arange(len(x), device=x.device) % len(h.tasks)
            x_adv = self.craft_mixed(x, y, ids[torch.randperm(len(x), device=x.device)])
        else:
            x_adv = self.craft(x, y, task)
        z_all = self.net.features(torch.cat([x, x_adv]))  # [2B, D]
        logits_all = self.net.head(z_all)
        z, z_adv = z_all.chunk(2)
        logits, logits_adv = logits_all.chunk(2)
        loss = F.cross_entropy(logits_adv, y) + F.cross_entropy(logits, y)  # L_AT
        terms = {"at": loss}  # the weighted terms whose sum is the loss
        parts: dict[str, torch.Tensor | float] = {"at": loss.detach()}
        clean_correct, adv_correct = logits.argmax(1) == y, logits_adv.argmax(1) == y

        # DRM's discrepancy is measured for every method (a diagnostic); only LRRF trains on it.
        drm = core.drm_loss(z, z_adv, y, h.drm_class_means)
        parts["drm_discrepancy"] = drm.detach()
        if h.method == "lrrf":
            weight = core.drm_weight(h.lam_drm, clean_correct, adv_correct, h.drm_dynamic)
            parts["drm_weight"] = weight
            terms["drm"] = weight * drm
            if self.accumulated is not None and h.lam_ctir > 0:
                with torch.no_grad():
                    z_bar = self.accumulated.features(torch.cat([x, x_adv]))
                ctir = core.ctir_loss(z_all, z_bar, h.ctir_gram)
                parts["ctir_distance"] = ctir.detach()
                terms["ctir"] = h.lam_ctir * ctir
            if self.buffer and h.lam_kco > 0:
                xm, ym, tm = self._replay_batch()
                xm_adv = self.craft_mixed(xm, ym, self._replay_tasks(tm))
                zm_all = self.net.features(torch.cat([xm, xm_adv]))
                zm, zm_adv = zm_all.chunk(2)
                lm, lm_adv = self.net.head(zm_all).chunk(2)
                kco = core.kco_loss(zm, zm_adv, lm, lm_adv, ym, h.kco_temperature, h.kco_supcon)
                replay = core.kco_loss(zm, zm_adv, lm, lm_adv, ym, contrast_weight=0.0)
                parts["kco_gap"] = core.class_mean_gap(zm, zm_adv, ym).detach()
                # KCO split in two, so the gradient shares tell replay from representation
                terms["kco_replay"] = h.lam_kco * replay
                if h.kco_supcon > 0:
                    terms["kco_supcon"] = h.lam_kco * (kco - replay)
        elif h.method == "er" and self.buffer:
            xm, ym, tm = self._replay_batch()
            xm_adv = self.craft_mixed(xm, ym, tm)
            lm_all = self.net(torch.cat([xm, xm_adv]))
            terms["replay"] = F.cross_entropy(lm_all, torch.cat([ym, ym]))
        elif h.method == "derpp" and self.buffer:
            first, second = self._replay_indices(), self._replay_indices()
            b = self.buffer
            terms["replay"] = derpp_loss(
                self.net(b["x_adv"][first]), b["logits"][first],
                self.net(b["x_adv"][second]), b["y"][second], h.reg_weight, h.derpp_beta,
            )  # fmt: skip
        elif h.method == "lwf" and self.old_model is not None:
            both = torch.cat([x, x_adv])
            terms["reg"] = h.reg_weight * lwf_loss(logits_all, self.old_model(both))
        elif h.method == "ewc" and self.fisher:
            terms["reg"] = h.reg_weight * ewc_loss(self.net, self.anchors, self.fisher)
        elif h.method == "air" and self.old_model is not None:
            terms["reg"] = h.reg_weight * air_loss(self.net, self.old_model, x_adv, logits,
                                                   logits_adv, h.air_noise)  # fmt: skip
        self.loss_terms = terms
        loss = sum(terms.values())
        for name, value in parts.items():
            self._running.setdefault(name, []).append(float(value))
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/task", float(task))
        self.log("train/drm_discrepancy", parts["drm_discrepancy"])
        return loss

    def on_before_backward(self, loss: torch.Tensor) -> None:
        every = self.hparams.grad_share_every
        if every and self.global_step % every == 0 and len(self.loss_terms) > 1:
            shares = gradient_shares(self.loss_terms, self.net.parameters())
            for name, values in shares.items():
                self._running.setdefault(f"share_{name}", []).append(values["share"])
                self._running.setdefault(f"cosine_{name}", []).append(values["cosine"])

    def _replay_indices(self) -> torch.Tensor:
        n = len(self.buffer["y"])
        return torch.randint(n, (min(self.hparams.replay_batch, n),), device=self.device)

    def _replay_batch(self):
        idx = self._replay_indices()
        return self.buffer["x"][idx], self.buffer["y"][idx], self.buffer["task"][idx]

    def _replay_tasks(self, stored: torch.Tensor) -> torch.Tensor:
        """[R6] The attack a replayed item is re-crafted with: its own task's, or a random one
        of the finished tasks."""
        if self.hparams.replay_attack == "task":
            return stored
        return torch.randint(self.tasks_done, stored.shape, device=stored.device)

    # ------------------------------------------------------------------ task boundaries
    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        if self.tasks_done >= len(self.hparams.tasks):
            return
        if self.global_step % self.steps_per_task == 0 and self.global_step > 0:
            self.finish_task()

    @torch.no_grad()
    def finish_task(self) -> None:
        """Task ``tasks_done`` ended: update the method's memory, then fill row t of R."""
        h, task = self.hparams, self.tasks_done
        self.tasks_done += 1
        data = self.trainer.datamodule
        if h.method == "lrrf":
            previous = None if self.accumulated is None else self.accumulated.state_dict()
            state = core.accumulate(previous, self.net.state_dict(), self.tasks_done,
                                    h.ctir_rule, h.ctir_ema)  # fmt: skip
            self._frozen["accumulated"] = self._frozen_copy(state)
        if h.method in REPLAY:
            self._update_buffer(data.train_set.tensors, task)
        if h.method in OLD_MODEL:
            self._frozen["old_model"] = self._frozen_copy(self.net.state_dict())
        if h.method == "ewc":
            x, y = data.train_set.tensors
            x, y = x[: h.fisher_samples].to(self.device), y[: h.fisher_samples]
            x_adv = self.craft(x, y.to(self.device), task)
            with torch.enable_grad():
                fisher = empirical_fisher(self.net, x_adv, y.to(self.device), h.replay_batch)
            self.fisher = {k: self.fisher.get(k, 0) + v for k, v in fisher.items()}
            self.anchors = {k: p.detach().clone() for k, p in self.net.named_parameters()}
        summary = {k: float(np.mean(v)) for k, v in self._running.items()}
        summary["task"] = task
        self.diagnostics.append(summary)
        self._running = {}
        if h.evaluate_tasks:
            last = self.tasks_done == len(h.tasks)
            for split, (x, y) in data.eval_sets().items():
                if split == "val" and not last:  # validation needs only the final row
                    continue
                correct = self.evaluate(x, y, list(h.tasks), seed=1000 * task + 7)
                self.task_end_correct[split].append(correct)
                for j, name in enumerate(["clean", *h.tasks]):  # the latest row of R
                    self.log(f"{split}/R_row_{name}", float(correct[j].mean()))

    def _update_buffer(self, tensors: tuple[torch.Tensor, torch.Tensor], task: int) -> None:
        """[R6] Class-balanced slots shared by the tasks seen; DER++ also stores the adversarial
        example and the logits at storage time."""
        x, y = tensors
        per_class = self.hparams.buffer_size // self.num_classes
        rng = np.random.default_rng([run_seed(), self.tasks_done])
        old = self.buffer
        old_tasks = old["task"].cpu().numpy() if old else np.zeros(0, np.int64)
        old_labels = old["y"].cpu().numpy() if old else np.zeros(0, np.int64)
        keep, add = core.merge_buffer(old_tasks, old_labels, y.numpy(), per_class,
                                      self.tasks_done, rng)  # fmt: skip
        keep, add = torch.from_numpy(keep), torch.from_numpy(add)
        new = {"x": x[add].to(self.device), "y": y[add].to(self.device),
               "task": torch.full((len(add),), task, device=self.device)}  # fmt: skip
        if self.hparams.method == "derpp":
            new["x_adv"] = self.craft(new["x"], new["y"], task)
            new["logits"] = self.net.eval()(new["x_adv"])
            self.net.train()
        keep = keep.to(self.device)
        self.buffer = {k: torch.cat([old[k][keep], v]) if old else v for k, v in new.items()}

    # --------------------------------------------------------------------- evaluation
    def evaluate(self, x: torch.Tensor, y: torch.Tensor, attacks: list[str], seed: int,
                 batch: int = 500) -> np.ndarray:  # fmt: skip
        """Per-item correctness [1 + J, N]: clean, then each attack of ``attacks`` (eval-strength
        budgets, seeded starts), with the model in eval mode."""
        was_training = self.net.training
        self.net.eval()
        rows = []
        for start in range(0, len(y), batch):
            xb, yb = (
                x[start : start + batch].to(self.device),
                y[start : start + batch].to(self.device),
            )
            with torch.no_grad():
                row = [self.net(xb).argmax(1) == yb]
            for j, name in enumerate(attacks):
                x_adv = self.eval_attacks[name](self.net, xb, yb, seed=seed + j)
                with torch.no_grad():
                    row.append(self.net(x_adv).argmax(1) == yb)
            rows.append(torch.stack(row).cpu())
        self.net.train(was_training)
        return torch.cat(rows, dim=1).numpy().astype(np.uint8)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        correct = self.evaluate(x, y, [self.hparams.tasks[self.current_task]], seed=batch_idx)
        self.log("val/clean_acc", float(correct[0].mean()), prog_bar=True)
        self.log("val/robust_acc_current", float(correct[1].mean()), prog_bar=True)

    def on_test_epoch_start(self) -> None:
        self._test_rows: list[np.ndarray] = []

    def test_step(self, batch, batch_idx):
        """The final row of R (and the eval-only attacks) on the test split."""
        x, y = batch
        attacks = [*self.hparams.tasks, *self.hparams.eval_extra]
        self._test_rows.append(self.evaluate(x, y, attacks, seed=10_000 + batch_idx))

    def on_test_epoch_end(self) -> None:
        correct = np.concatenate(self._test_rows, axis=1)
        names = ["clean", *self.hparams.tasks, *self.hparams.eval_extra]
        for j, name in enumerate(names):
            self.log(f"test/acc_{name}", float(correct[j].mean()))
        t = len(self.hparams.tasks)
        self.log("test/aa", float(correct[1 : 1 + t].mean()))
        rows = self.task_end_correct["test"]
        if len(rows) == t:  # the R matrix saved with the run: forgetting and BWT
            r = np.stack([row[1 : 1 + t].mean(-1) for row in rows])
            self.r_matrix = r
            self.log("test/forgetting", core.average_forgetting(r))
            self.log("test/bwt", core.backward_transfer(r))
            for i in range(t):
                for j in range(t):
                    self.log(f"test/R_{i}_{j}", float(r[i, j]))

    def configure_optimizers(self):
        h = self.hparams
        return torch.optim.SGD(self.net.parameters(), lr=h.lr, momentum=0.9,
                               weight_decay=h.weight_decay)  # fmt: skip
