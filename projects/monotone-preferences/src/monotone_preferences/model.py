"""LightningModule: wiring only. ``estimator`` picks what `uv run train` fits:

- ``robust`` (default; the reconstructed cross-fitted estimator), ``nnls``, ``isotonic``: closed
  form / QP fits with no optimizer step (manual optimisation; the first training batch triggers
  one fit on the whole training split; FitEndCheckpoint then writes ``last.ckpt``, which holds the
  fitted estimator so that ``train test --ckpt_path`` scores it);
- ``monotone_net``: the positive-weight monotone network, trained by Adam on mini-batches.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from jsonargparse.typing import PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule

from monotone_preferences.core import (
    CrossFitRobust,
    IsotonicRegressor,
    MonotoneNetwork,
    NonNegativeLinear,
    excess_error,
    ordered_pairs,
    top_k_precision,
    violation_rate,
)
from papers_cli.hparams import init_arguments

ESTIMATORS = {"robust": CrossFitRobust, "nnls": NonNegativeLinear, "isotonic": IsotonicRegressor}


def _to_torch(state: Any) -> Any:
    """A fitted state as tensors, numbers, strings and dicts (loadable with weights_only)."""
    if isinstance(state, dict):
        return {k: _to_torch(v) for k, v in state.items()}
    if isinstance(state, np.ndarray):
        return torch.from_numpy(state.copy())
    return state


def _to_numpy(state: Any) -> Any:
    if isinstance(state, dict):
        return {k: _to_numpy(v) for k, v in state.items()}
    if isinstance(state, torch.Tensor):
        return state.numpy()
    return state


class MonotonePreferencesModule(LightningModule):
    """Fits one preference learner; every hyper-parameter is typed (bad values fail parsing)."""

    def __init__(
        self,
        in_features: PositiveInt = 2,
        estimator: Literal["robust", "nnls", "isotonic", "monotone_net"] = "robust",
        folds: PositiveInt = 5,
        rule: Literal["select", "aggregate"] = "select",
        beta: PositiveFloat = 1.0,
        hidden: PositiveInt = 32,
        layers: PositiveInt = 2,
        lr: PositiveFloat = 0.01,
    ) -> None:
        arguments = init_arguments(locals())  # builtins (papers_cli.hparams)
        super().__init__()
        # Given explicitly rather than read from the caller's frame: the mutation lane wraps
        # __init__ in a trampoline, and the frame Lightning would inspect is then the wrapper's.
        self.save_hyperparameters(arguments)
        self.fitted: Any = None
        self.net = MonotoneNetwork(in_features, hidden, layers)
        # target scaling for the network, fixed from the training split at fit start
        self.register_buffer("y_shift", torch.zeros((), dtype=torch.float64))
        self.register_buffer("y_scale", torch.ones((), dtype=torch.float64))
        self.automatic_optimization = estimator == "monotone_net"

    # ------------------------------------------------------------------ prediction
    def make_estimator(self, seed: int) -> Any:
        h = self.hparams
        if h.estimator == "robust":
            return CrossFitRobust(folds=h.folds, rule=h.rule, beta=h.beta, seed=seed)
        return ESTIMATORS[h.estimator]()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Predicted preference f_hat(x) for x [N, d] (float64 out)."""
        if self.hparams.estimator == "monotone_net":
            return self.net(x.float()).double() * self.y_scale + self.y_shift
        if self.fitted is None:
            raise RuntimeError("the estimator has not been fitted (run fit or load a checkpoint)")
        return torch.from_numpy(self.fitted.predict(x.detach().cpu().double().numpy()))

    def predict_numpy(self, x: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            return self(torch.as_tensor(x, dtype=torch.float64)).numpy()

    # -------------------------------------------------------------------- training
    def on_fit_start(self) -> None:
        y = self.trainer.datamodule.train_set.tensors[1]
        if self.global_step == 0 and self.hparams.estimator == "monotone_net":
            self.y_shift.fill_(y.mean())
            self.y_scale.fill_(y.std().clamp_min(1e-8))

    def training_step(self, batch, batch_idx):
        if self.hparams.estimator != "monotone_net":
            if self.fitted is None:  # one fit on the whole training split, no optimizer step
                x, y, _ = self.trainer.datamodule.train_set.tensors
                seed = self.trainer.datamodule.seed
                self.fitted = self.make_estimator(seed).fit(x.numpy(), y.numpy())
                self.log_fit_evidence()
            self.trainer.should_stop = True
            return None
        x, y, _ = batch
        prediction = self.net(x.float())
        loss = torch.mean((prediction - ((y - self.y_shift) / self.y_scale).float()) ** 2)
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def log_fit_evidence(self) -> None:
        """What the robust fit chose: the weight on the linear branch and both CV losses."""
        if isinstance(self.fitted, CrossFitRobust):
            self.log("fit/weight_linear", float(self.fitted.weights_["linear"]))
            for name, loss in self.fitted.cv_losses_.items():
                self.log(f"fit/cv_loss_{name}", float(loss))

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        if self.hparams.estimator != "monotone_net" and self.fitted is None:
            return  # the sanity check runs before the fit
        self.log("val/mse", torch.mean((self(x) - y) ** 2), prog_bar=True, sync_dist=True)

    def test_step(self, batch, batch_idx):
        """The paper's metrics on the test split (`uv run train test --ckpt_path PATH`)."""
        x, y, f = batch
        prediction = self(x)
        self.log("test/mse", torch.mean((prediction - y) ** 2), sync_dist=True)
        reference = f if torch.isfinite(f).all() else y  # the truth when simulated
        scale = float(self.trainer.datamodule.variance_f)
        pred, ref = prediction.numpy(), reference.numpy()
        if torch.isfinite(f).all():
            self.log("test/excess_error", float(excess_error(pred, ref, scale).mean()))
        self.log("test/top10_precision", top_k_precision(pred, ref, 0.1))
        low, high = ordered_pairs(x.numpy(), 2000, np.random.default_rng(0))
        self.log("test/violation_rate", violation_rate(self.predict_numpy, low, high))

    def configure_optimizers(self):
        if self.hparams.estimator != "monotone_net":
            return None
        return torch.optim.Adam(self.net.parameters(), lr=self.hparams.lr)

    # ---------------------------------------------------- the fitted estimator on disk
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.fitted is not None:
            checkpoint["fitted_estimator"] = _to_torch(self.fitted.get_state())

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("fitted_estimator")
        if state is not None:
            self.fitted = self.make_estimator(0).set_state(_to_numpy(state))
