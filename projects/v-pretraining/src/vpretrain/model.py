"""The LightningModule: a causal-LM learner, the target designer and every language arm.

``arm`` picks what the learner is trained on (all from the same checkpoint, same optimizer):

- ``vpretrain``: the method. Targets from ``TargetDesigner`` (eq. 6), which steps on the value
  of eq. (3) from one JVP (eq. 4) along u = P g_down; the learner steps on eq. (1), q detached.
- ``random_gradient`` (negative control): the same machinery with g_down replaced by a random
  direction of the same norm, redrawn at every refresh.
- ``plain``: one-hot next-token prediction (plain continued pretraining).
- ``fixed_soft``: fixed top-K soft targets (self-distillation at a fixed mixing weight).
- ``alignment_reweight``: one-hot targets, tokens weighted by relu(-D_t(y_t)) (LESS-style).
- ``oracle`` (positive control): one-hot targets with every corrupted number replaced by the
  right one (needs the miniature's annotations).
- ``in_family`` (positive control): the member of the designer's family (eq. 6) that puts
  lambda_max on the right digit at corrupted positions when it is in the top-K (eq. 8), 0
  elsewhere (needs the annotations).

``optimizer``: the learner's AdamW (the paper's setting) or plain SGD, for which the value's
first-order step (eq. 2 with P = identity) is exactly the step the learner takes.
``value_positions``: ``all`` (every position counts in the value and the designer's loss) or
``results`` (only the stream's stated-result digits, the answer-bearing positions; needs the
miniature's annotations).

The designer's optimizer is a plain torch optimizer owned by the module (its state goes into the
checkpoint): Lightning's ``global_step`` then counts learner steps only. The designer exists in
the two arms that use it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import NonNegativeFloat, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from papers_cli import ConfigError, init_arguments
from vpretrain import baselines, core, formats

Arm = Literal[
    "vpretrain",
    "random_gradient",
    "plain",
    "fixed_soft",
    "alignment_reweight",
    "oracle",
    "in_family",
]
VALUED_ARMS = ("vpretrain", "random_gradient", "alignment_reweight")
DESIGNER_ARMS = ("vpretrain", "random_gradient")
Attention = Literal["eager", "sdpa", "flash_attention_2"]


def build_learner(
    pretrained: str | None,
    vocab_size: int,
    hidden_size: int,
    layers: int,
    heads: int,
    max_positions: int,
    attn_implementation: Attention = "eager",
) -> torch.nn.Module:
    """A Qwen2-family causal LM: the local checkpoint at ``pretrained``, or a tiny one built
    from a ``Qwen2Config``."""
    if pretrained is not None:
        try:
            model = AutoModelForCausalLM.from_pretrained(
                pretrained, local_files_only=True, attn_implementation=attn_implementation
            )
        except OSError as error:
            raise ConfigError(
                f"--model.pretrained {pretrained}: no local checkpoint there ({error}). Put a "
                "Hugging Face folder (config.json, model.safetensors, tokenizer files) there, "
                "e.g. Qwen2.5-0.5B downloaded on a machine with internet."
            ) from error
    else:
        config = Qwen2Config(
            vocab_size=vocab_size,
            hidden_size=hidden_size,
            intermediate_size=4 * hidden_size,
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=max(1, heads // 2),
            max_position_embeddings=max_positions,
            tie_word_embeddings=True,
            attn_implementation=attn_implementation,
        )
        model = Qwen2ForCausalLM(config)
    return model


class VPretrainModule(LightningModule):
    def __init__(
        self,
        arm: Arm = "vpretrain",
        pretrained: str | None = None,
        init_from: Path | None = None,
        vocab_size: PositiveInt = 2048,
        hidden_size: PositiveInt = 96,
        layers: PositiveInt = 3,
        heads: PositiveInt = 4,
        max_positions: PositiveInt = 256,
        lr: PositiveFloat = 1e-3,
        weight_decay: NonNegativeFloat = 0.0,
        top_k: PositiveInt = 16,
        lambda_max: PositiveFloat = 0.9,
        designer_lr: PositiveFloat = 3e-3,
        designer_width: PositiveInt = 64,
        kappa: NonNegativeFloat = 0.05,
        mu: NonNegativeFloat = 0.0,
        smoothing: PositiveFloat = 0.1,
        temperature: PositiveFloat = 1.0,
        fixed_mixing: NonNegativeFloat = 0.5,
        refresh_every: PositiveInt = 10,
        feedback_batch: PositiveInt = 128,
        gradient_ema: NonNegativeFloat = 0.5,
        preconditioner: Literal["adam", "identity"] = "identity",
        optimizer: Literal["adamw", "sgd"] = "adamw",
        value_positions: Literal["all", "results"] = "all",
        max_new_tokens: PositiveInt = 6,
        attn_implementation: Attention = "eager",
    ):
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.automatic_optimization = False
        formats.check_top_k(top_k, vocab_size)
        if arm == "fixed_soft" and not 0 <= fixed_mixing <= 1:
            raise ConfigError("--model.fixed_mixing is a probability: choose it in [0, 1]")
        self.learner = build_learner(
            pretrained, vocab_size, hidden_size, layers, heads, max_positions, attn_implementation
        )
        if arm in VALUED_ARMS:  # the value's JVP needs forward-mode AD through attention
            formats.check_attention_supports_jvp(self.learner)
        if init_from is not None:
            self.learner.load_state_dict(torch.load(init_from, weights_only=True))
        self.designer, self.designer_optimizer = None, None
        if arm in DESIGNER_ARMS:
            size = self.learner.config.hidden_size
            self.designer = core.TargetDesigner(size, top_k, designer_width, lambda_max)
            self.designer_optimizer = torch.optim.Adam(self.designer.parameters(), lr=designer_lr)
        # g_down, cached between refreshes (an EMA over feedback minibatches); saved.
        self.downstream_gradient: dict[str, torch.Tensor] = {}
        self.feedback = None  # a data.ProblemSet, taken from the DataModule at fit start

    # -- optimizers and state ---------------------------------------------------------------
    def configure_optimizers(self):
        if self.hparams.optimizer == "sgd":
            return torch.optim.SGD(self.learner.parameters(), lr=self.hparams.lr)
        return torch.optim.AdamW(
            self.learner.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )

    def on_fit_start(self) -> None:
        datamodule = getattr(self.trainer, "datamodule", None)
        if self.feedback is None and datamodule is not None:
            self.feedback = datamodule.feedback
        if getattr(datamodule, "real", False):
            if self.hparams.arm in ("oracle", "in_family"):
                raise ConfigError(
                    f"--model.arm {self.hparams.arm} needs the miniature's annotations of "
                    "corrupted numbers; real corpora have none."
                )
            if self.hparams.value_positions == "results":
                raise ConfigError(
                    "--model.value_positions results needs the miniature's annotations of "
                    "stated results; real corpora have none: use all."
                )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if self.designer_optimizer is not None:
            checkpoint["designer_optimizer"] = self.designer_optimizer.state_dict()
        checkpoint["downstream_gradient"] = dict(self.downstream_gradient)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        if "designer_optimizer" in checkpoint and self.designer_optimizer is not None:
            self.designer_optimizer.load_state_dict(checkpoint["designer_optimizer"])
        self.downstream_gradient = dict(checkpoint.get("downstream_gradient", {}))

    # -- the downstream direction -----------------------------------------------------------
    def learner_log_probs(self, input_ids, attention_mask=None) -> torch.Tensor:
        logits = self.learner(input_ids=input_ids, attention_mask=attention_mask).logits
        return core.log_softmax_at_least_fp32(logits)

    def feedback_minibatch(self, step: int) -> dict[str, torch.Tensor]:
        n = len(self.feedback)
        generator = torch.Generator().manual_seed(1_000_003 * step + 17)
        index = torch.randperm(n, generator=generator)[: self.hparams.feedback_batch]
        return {k: v.to(self.device) for k, v in self.feedback.subset(index).items()}

    def downstream_loss(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """L_down: mean answer NLL of feedback problems (core.answer_nll)."""
        nll = core.answer_nll(
            self.learner_log_probs,
            batch["input_ids"],
            batch["attention_mask"],
            batch["answer_mask"],
        )
        return nll.mean()

    def refresh_downstream_gradient(self, step: int) -> None:
        """g_down <- EMA of grad L_down on a feedback minibatch, by ``torch.autograd.grad`` so
        that no downstream gradient is ever accumulated into the learner's ``.grad``. The
        negative control replaces it by a seeded random direction of the same norm."""
        named = dict(self.learner.named_parameters())
        loss = self.downstream_loss(self.feedback_minibatch(step))
        grads = torch.autograd.grad(loss, list(named.values()), allow_unused=True)
        fresh = {
            name: (g if g is not None else torch.zeros_like(p)).detach()
            for (name, p), g in zip(named.items(), grads, strict=True)
        }
        if self.hparams.arm == "random_gradient":
            generator = torch.Generator().manual_seed(7_919 * step + 3)
            norm = torch.sqrt(sum((g**2).sum() for g in fresh.values()))
            noise = {n: torch.randn(g.shape, generator=generator) for n, g in fresh.items()}
            noise_norm = torch.sqrt(sum((g**2).sum() for g in noise.values()))
            fresh = {n: (g * norm / noise_norm).to(self.device) for n, g in noise.items()}
        beta = self.hparams.gradient_ema if self.downstream_gradient else 0.0
        self.downstream_gradient = {
            name: beta * self.downstream_gradient.get(name, 0.0) + (1 - beta) * g
            for name, g in fresh.items()
        }

    def tangent(self) -> dict[str, torch.Tensor]:
        """u = P g_down with P from the learner optimizer's current state (or identity)."""
        if self.hparams.preconditioner == "identity":
            return self.downstream_gradient
        named = dict(self.learner.named_parameters())
        optimizer = self.optimizers()
        optimizer = getattr(optimizer, "optimizer", optimizer)  # unwrap a LightningOptimizer
        scales = core.adam_preconditioner(optimizer, named)
        return {name: scales[name] * g for name, g in self.downstream_gradient.items()}

    # -- one training step ------------------------------------------------------------------
    def designed_targets(self, inputs, observed, positions=None):
        """Eq. (4)-(7): (slots, q, D at the slots, the designer's loss, logs); q still carries
        the designer's graph (the caller detaches it for the learner). ``positions`` [B, T]:
        the positions the value and the regularisers count (None: all)."""
        h = self.hparams
        named = dict(self.learner.named_parameters())
        log_probs, directions, hidden = core.log_probs_and_directions(
            self.learner, named, self.tangent(), inputs
        )
        slots = core.candidates(log_probs, observed, h.top_k)
        at = log_probs.gather(-1, slots)  # [B, T, K+1]
        d_at = directions.gather(-1, slots)  # [B, T, K+1]
        if h.arm == "alignment_reweight":
            return slots, at, d_at, None, {}
        mixing, scores = self.designer(hidden.detach().float(), at.detach())
        q = core.soft_targets(mixing, scores, h.temperature)
        value = core.predicted_decrease(q, d_at, h.lr, positions)
        # Eq. (7): the value in units of the batch's spread of D, so kappa and mu are scale-free.
        scale = d_at.std().clamp_min(1e-12).detach()
        kl, entropy = core.designer_regularisers(q, h.smoothing, positions)
        objective = value / (h.lr * scale)
        designer_loss = -objective + h.kappa * kl - h.mu * entropy
        logs = {
            "value": value.detach(),
            "mixing": mixing.detach().mean(),
            "designer_kl": kl.detach(),
            "d_scale": scale,
            "score_scale": self.designer.score_scale.detach(),
            "score_entropy": core.score_entropy(scores.detach(), h.temperature),
        }
        return slots, q, d_at, designer_loss, logs

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        h = self.hparams
        step = self.global_step
        inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
        logs: dict[str, torch.Tensor] = {}
        designer_loss = None
        if h.arm in VALUED_ARMS and (step % h.refresh_every == 0 or not self.downstream_gradient):
            self.refresh_downstream_gradient(step)
        if h.arm in ("vpretrain", "random_gradient"):
            positions = batch["result"][:, 1:] if h.value_positions == "results" else None
            slots, q, _, designer_loss, logs = self.designed_targets(inputs, observed, positions)
            log_probs = self.learner_log_probs(inputs)
            loss = core.soft_cross_entropy(log_probs.gather(-1, slots), q.detach())
        elif h.arm == "alignment_reweight":
            slots, _, d_at, _, _ = self.designed_targets(inputs, observed)
            mask = torch.ones_like(observed, dtype=torch.float32)
            weights = baselines.alignment_token_weights(d_at[..., core.OBSERVED], mask)
            log_probs = self.learner_log_probs(inputs)
            nll = -log_probs.gather(-1, observed.unsqueeze(-1)).squeeze(-1)
            loss = (weights * nll).mean()
            logs["weight_max"] = weights.max()
        elif h.arm == "fixed_soft":
            log_probs = self.learner_log_probs(inputs)
            slots = core.candidates(log_probs, observed, h.top_k)
            at = log_probs.gather(-1, slots)
            loss = core.soft_cross_entropy(at, baselines.fixed_soft_targets(at, h.fixed_mixing))
        elif h.arm == "in_family":
            log_probs = self.learner_log_probs(inputs)
            slots = core.candidates(log_probs, observed, h.top_k)
            q = core.in_family_targets(
                slots, batch["clean_ids"][:, 1:], batch["corrupted"][:, 1:], h.lambda_max
            )
            loss = core.soft_cross_entropy(log_probs.gather(-1, slots), q)
        else:  # plain, oracle
            targets = batch["clean_ids"][:, 1:] if h.arm == "oracle" else observed
            log_probs = self.learner_log_probs(inputs)
            loss = -log_probs.gather(-1, targets.unsqueeze(-1)).mean()
        # One backward for both parts (what DDP expects): the learner's loss sees q detached and
        # the designer's loss sees the learner's features detached, so the gradients are
        # exactly those of the two separate steps.
        optimizer = self.optimizers()
        optimizer.zero_grad(set_to_none=True)
        if designer_loss is None:
            self.manual_backward(loss)
        else:
            self.designer_optimizer.zero_grad(set_to_none=True)
            self.manual_backward(loss + designer_loss)
            self.designer_optimizer.step()
        optimizer.step()
        self.log("train/loss", loss.detach(), prog_bar=True)
        self.log(
            "train/observed_nll", -log_probs.detach().gather(-1, observed.unsqueeze(-1)).mean()
        )
        for name, value in logs.items():
            self.log(f"train/{name}", value)
        return loss.detach()

    # -- evaluation -------------------------------------------------------------------------
    def _eval_step(self, batch, dataloader_idx: int, split: str) -> None:
        if dataloader_idx == 0:
            nll = core.answer_nll(
                self.learner_log_probs,
                batch["input_ids"],
                batch["attention_mask"],
                batch["answer_mask"],
            )
            self.log(
                f"{split}/answer_nll", nll.mean(), add_dataloader_idx=False, batch_size=len(nll)
            )
            if split == "test":
                correct = self.pass_at_1(batch)
                self.log(
                    "test/pass_at_1",
                    correct.mean(),
                    add_dataloader_idx=False,
                    batch_size=len(correct),
                )
        else:
            nll = self.token_nll(batch["ids"])
            self.log(f"{split}/prose_nll", nll, add_dataloader_idx=False)
            self._prose.append(nll.detach())

    def on_validation_epoch_start(self) -> None:
        self._prose = []

    on_test_epoch_start = on_validation_epoch_start

    def _log_perplexity(self, split: str) -> None:
        if self._prose:
            self.log(f"{split}/perplexity", torch.stack(self._prose).mean().exp())

    def on_validation_epoch_end(self) -> None:
        self._log_perplexity("val")

    def on_test_epoch_end(self) -> None:
        self._log_perplexity("test")

    def validation_step(self, batch, batch_idx, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx, "val")

    def test_step(self, batch, batch_idx, dataloader_idx: int = 0) -> None:
        self._eval_step(batch, dataloader_idx, "test")

    @torch.no_grad()
    def token_nll(self, ids: torch.Tensor) -> torch.Tensor:
        """Mean next-token NLL of held-out prose blocks [B, T+1] (exp of it: perplexity)."""
        log_probs = self.learner_log_probs(ids[:, :-1])
        return -log_probs.gather(-1, ids[:, 1:].unsqueeze(-1)).mean()

    @torch.no_grad()
    def greedy_answers(self, batch) -> list[str]:
        """Greedy decodes of the (left-padded) prompts, as text."""
        tokenizer = self.trainer.datamodule.tokenizer
        out = self.learner.generate(
            input_ids=batch["prompt_ids"],
            attention_mask=batch["prompt_mask"],
            max_new_tokens=self.hparams.max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id,
        )
        return tokenizer.batch_decode(
            out[:, batch["prompt_ids"].shape[1] :], skip_special_tokens=True
        )

    def pass_at_1(self, batch) -> torch.Tensor:
        problems = self.trainer.datamodule.test_problems.problems
        chosen = [problems[int(i)] for i in batch["index"]]
        return torch.as_tensor(
            formats.pass_at_1(self.greedy_answers(batch), chosen), dtype=torch.float32
        )
