"""LightningModule: stage 1 (backbone), then stage 2 (meta-learned alignment), one fit.

Steps [0, stage1_steps) train the backbone (pooled, or with session-specific input layers) on
pooled episodes under drift augmentation; steps [stage1_steps, stage1_steps + meta_steps) freeze
the backbone and meta-learn the alignment start phi_0 and its log inner step sizes. The stage is
a function of ``global_step``, and phi_0 and the step sizes are parameters of the module, so a
checkpoint holds the meta-learned state and a resumed fit continues exactly.
``test`` adapts to each held-out session on its calibration sentences and scores it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from torch import nn

from ibci_fewshot import core
from ibci_fewshot.core import AlignmentForm, GRUDecoder, SessionLayers
from ibci_fewshot.metrics import Lexicon, session_rates
from papers_cli.hparams import init_arguments


def merge_batches(batches: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Padded batches -> one padded batch (pads time and label length to the longest)."""
    t_max = max(b["x"].shape[1] for b in batches)
    l_max = max(b["y"].shape[1] for b in batches)
    return {
        "x": torch.cat([F.pad(b["x"], (0, 0, 0, t_max - b["x"].shape[1])) for b in batches]),
        "y": torch.cat([F.pad(b["y"], (0, l_max - b["y"].shape[1])) for b in batches]),
        **{k: torch.cat([b[k] for b in batches]) for k in ("lengths", "y_lengths", "session")},
    }


class UnknownSessionError(KeyError):
    """A session tag the decoder has neither trained on nor been calibrated for."""

    user_facing = True


class IbciModule(LightningModule):
    """Pooled GRU + CTC backbone with a meta-learned alignment layer (or the session-layer
    contrast). Every hyper-parameter is typed."""

    def __init__(
        self,
        channels: PositiveInt = 192,
        n_sessions: PositiveInt = 8,
        backbone: Literal["pooled", "session_layers"] = "pooled",
        projection: PositiveInt = 64,
        hidden: PositiveInt = 64,
        layers: PositiveInt = 2,
        kernel: PositiveInt = 6,
        stride: PositiveInt = 3,
        smooth_sigma: NonNegativeFloat = 1.5,
        dropout: NonNegativeFloat = 0.1,
        lr: PositiveFloat = 3e-3,
        stage1_steps: NonNegativeInt = 400,
        white_noise: NonNegativeFloat = 0.3,
        offset_sd: NonNegativeFloat = 0.2,
        gain_sd: NonNegativeFloat = 0.1,
        alignment: Literal["affine", "diag_lowrank"] = "affine",
        rank: PositiveInt = 16,
        meta_order: Literal["first", "second"] = "first",
        meta_lr: PositiveFloat = 3e-3,
        inner_steps: PositiveInt = 3,
        inner_lr: PositiveFloat = 0.1,
        step_size_lr: PositiveFloat = 0.03,
        step_size_shape: Literal["tensor", "row", "element"] = "tensor",
        episode_gain_sd: NonNegativeFloat = 0.2,
        episode_offset_sd: NonNegativeFloat = 0.3,
        episode_mix_sd: NonNegativeFloat = 0.5,
        deploy_lr_scale: PositiveFloat = 1.0,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.decoder = GRUDecoder(
            channels, projection, hidden, layers, kernel, stride, dropout=dropout
        )
        self.session_layers = (
            SessionLayers(n_sessions, channels) if backbone == "session_layers" else None
        )
        generator = torch.Generator().manual_seed(0)
        start = core.identity_alignment(channels, self.form, rank, generator)
        self.phi0 = nn.ParameterDict({k: nn.Parameter(v) for k, v in start.items()})
        self.log_step = nn.ParameterDict(
            {
                k: nn.Parameter(
                    torch.full(core.step_size_shape(v, step_size_shape), math.log(inner_lr))
                )
                for k, v in start.items()
            }
        )
        self.calibrated: dict[str, core.Params] = {}
        self.lexicon: Lexicon | None = None  # built from the training transcripts in setup

    def setup(self, stage: str) -> None:
        words = getattr(self.trainer.datamodule, "lexicon_words", None) if self._trainer else None
        if words:
            self.lexicon = Lexicon(words)

    # ------------------------------------------------------------------ pieces
    @property
    def form(self) -> AlignmentForm:
        """Pooled backbone: the chosen alignment form; session-layer backbone: a new session
        layer of its own form (affine + softsign)."""
        return (
            "affine_softsign"
            if self.hparams.backbone == "session_layers"
            else self.hparams.alignment
        )

    def start_params(self) -> core.Params:
        return dict(self.phi0.items())

    def step_sizes(self) -> core.Params:
        return dict(self.log_step.items())

    def smooth(self, x: torch.Tensor) -> torch.Tensor:
        return core.gaussian_smooth(x, self.hparams.smooth_sigma)

    def log_probs(self, batch, phi: core.Params | None = None, decoder: GRUDecoder | None = None):
        """Log-probs [N, T', K] and lengths of a padded batch through alignment phi (None: the
        training-time input path: identity for the pooled backbone, the session's own layer for
        the session-layer backbone)."""
        x = self.smooth(batch["x"])
        if phi is not None:
            x = core.apply_alignment(x, phi, self.form)
        elif self.session_layers is not None:
            x = self.session_layers(x, batch["session"])
        return (decoder or self.decoder)(x, batch["lengths"])

    def loss(self, batch, phi=None, impl="torch", decoder=None) -> torch.Tensor:
        log_probs, lengths = self.log_probs(batch, phi, decoder)
        return core.ctc_loss(log_probs, batch["y"], lengths, batch["y_lengths"], impl=impl)

    def transcribe(self, batch, phi=None, decoder=None, lexicon: bool = False) -> list[str]:
        with torch.no_grad():
            log_probs, lengths = self.log_probs(batch, phi, decoder)
        texts = [core.decode_indices(d) for d in core.greedy_decode(log_probs, lengths)]
        if lexicon and self.lexicon is not None:
            texts = [self.lexicon(t) for t in texts]
        return texts

    def stage(self) -> int:
        return 1 if self.global_step < self.hparams.stage1_steps else 2

    # ------------------------------------------------------------------ training
    def training_step(self, batch, batch_idx):
        if self.stage() == 1:
            return self.stage1_loss(batch["episodes"])
        return self.meta_loss(batch["meta_episodes"])

    def stage1_loss(self, episodes) -> torch.Tensor:
        """Eq. 1 on all sentences of the batch's episodes, pooled, with drift augmentation."""
        h = self.hparams
        batch = merge_batches([e[part] for e in episodes for part in ("support", "query")])
        batch["x"] = core.drift_augment(batch["x"], h.white_noise, h.offset_sd, h.gain_sd)
        loss = self.loss(batch)
        self.log("train/ctc", loss, prog_bar=True)
        return loss

    def meta_loss(self, episodes) -> torch.Tensor:
        """Eq. 3: mean query loss after eq. 2's inner steps on each episode's support, with a
        random synthetic drift per episode (none when the ``episode_*_sd`` are 0: the episodes'
        own sessions then bring the drift, ``IbciDataModule.meta_sessions``); the backbone is
        frozen. Logged beside it: the query loss at phi_0 before the inner steps and at the
        unadapted input path (the identity), so that meta-training shows what each part buys."""
        h = self.hparams
        self.decoder.requires_grad_(False)
        if self.session_layers is not None:
            self.session_layers.requires_grad_(False)
            if self.global_step == h.stage1_steps:  # the new layer starts at the held-in mean
                with torch.no_grad():
                    for k, v in self.session_layers.mean_layer().items():
                        self.phi0[k].copy_(v)
        losses, moved, unadapted, at_identity = [], [], [], []
        identity = {k: v.to(self.device) for k, v in self.zero_shot_params().items()}
        for episode in episodes:
            drift = core.random_drift(
                h.channels, h.episode_gain_sd, h.episode_offset_sd, h.episode_mix_sd
            )
            support, query = (
                {**episode[part], "x": core.apply_drift(self.smooth(episode[part]["x"]), drift)}
                for part in ("support", "query")
            )
            query_loss, adapted = core.episode_loss(
                self.decoder,
                self.form,
                support,
                query,
                self.start_params(),
                self.step_sizes(),
                h.inner_steps,
                first_order=h.meta_order == "first",
            )
            with torch.no_grad():  # the query loss before adaptation, for comparison
                for phi, into in ((self.start_params(), unadapted), (identity, at_identity)):
                    log_probs, lengths = self.decoder(
                        core.apply_alignment(query["x"], phi, self.form), query["lengths"]
                    )
                    into.append(core.ctc_loss(log_probs, query["y"], lengths, query["y_lengths"]))
            losses.append(query_loss)
            moved.append(core.change_norms(adapted, self.start_params()))
        loss = torch.stack(losses).mean()
        self.log("train/meta_query_ctc", loss, prog_bar=True)
        # the same key as stage 1 (a resumed run's logged keys match the uninterrupted run's)
        self.log("train/ctc", torch.stack(unadapted).mean(), prog_bar=True)
        self.log("train/meta_query_ctc_identity", torch.stack(at_identity).mean())
        for k in moved[0]:
            self.log(f"train/inner_change_{k}", float(sum(m[k] for m in moved) / len(moved)))
        self.log(
            "train/inner_lr_mean",
            torch.cat([v.exp().flatten() for v in self.log_step.values()]).mean(),
        )
        return loss

    def on_train_batch_start(self, batch, batch_idx) -> None:
        stage1 = self.stage() == 1
        self.decoder.requires_grad_(stage1)
        if self.session_layers is not None:
            self.session_layers.requires_grad_(stage1)

    def configure_optimizers(self):
        backbone = list(self.decoder.parameters())
        if self.session_layers is not None:
            backbone += list(self.session_layers.parameters())
        h = self.hparams
        return torch.optim.Adam(
            [
                {"params": backbone, "lr": h.lr},
                {"params": list(self.phi0.parameters()), "lr": h.meta_lr},
                {"params": list(self.log_step.parameters()), "lr": h.step_size_lr},
            ]
        )

    # ------------------------------------------------------------------ evaluation
    def validation_step(self, batch, batch_idx):
        """Minival of the held-in sessions, decoded with the training-time input path."""
        texts = self.transcribe(batch)
        references = [
            core.decode_indices(y[:n].tolist())
            for y, n in zip(batch["y"], batch["y_lengths"], strict=True)
        ]
        cer, wer = session_rates(texts, references)
        self.log("val/cer", cer, prog_bar=True, batch_size=len(texts))
        self.log("val/wer", wer, batch_size=len(texts))

    def zero_shot_params(self) -> core.Params:
        """The unadapted input path of a new session: identity (pooled) or the mean held-in
        session layer."""
        if self.session_layers is not None:
            return self.session_layers.mean_layer()
        return core.identity_alignment(self.hparams.channels, self.form, self.hparams.rank)

    def adapt_meta(self, calibration, lr_scale: float | None = None, steps: int | None = None):
        """Deployment (eq. 2 from phi_0 with the learned step sizes) on calibration sentences."""
        scale = self.hparams.deploy_lr_scale if lr_scale is None else lr_scale
        log_step = {k: v.detach() + math.log(scale) for k, v in self.step_sizes().items()}
        start = {k: v.detach() for k, v in self.start_params().items()}
        with torch.enable_grad():
            adapted = core.adapt(
                lambda phi: self.loss(calibration, phi),
                start,
                log_step,
                steps or self.hparams.inner_steps,
                first_order=True,
            )
        return {k: v.detach() for k, v in adapted.items()}

    def calibrate(self, tag: str, calibration) -> core.Params:
        """Adapt to a new session tag from its calibration sentences; later decodes of the tag
        use the result."""
        self.calibrated[tag] = self.adapt_meta(calibration)
        return self.calibrated[tag]

    def params_for(self, tag: str, known_tags: set[str] = frozenset()) -> core.Params:
        """The input path for a session tag: held-in tags decode unadapted; a calibrated tag
        uses its adapted layer; any other tag must be calibrated first."""
        if tag in self.calibrated:
            return self.calibrated[tag]
        if tag in known_tags:
            return self.zero_shot_params()
        raise UnknownSessionError(
            f"session {tag!r} is new to this decoder: calibrate it first "
            "(IbciModule.calibrate(tag, calibration sentences))"
        )

    def test_step(self, item, batch_idx):
        """Adapt on the held-out session's calibration sentences, score its eval sentences."""
        with torch.inference_mode(False):
            calibration = {k: v.clone() for k, v in item["calibration"].items()}
            evaluation = {k: v.clone() for k, v in item["eval"].items()}
            phi = self.calibrate(item["tag"], calibration)
            greedy = self.transcribe(evaluation, phi)
            lexicon = self.transcribe(evaluation, phi, lexicon=True)
        cer, wer = session_rates(greedy, item["cues"])
        _, wer_lexicon = session_rates(lexicon, item["cues"])
        self.log("test/cer", cer, batch_size=1)
        self.log("test/wer", wer, batch_size=1)
        self.log("test/wer_lexicon", wer_lexicon, batch_size=1)
