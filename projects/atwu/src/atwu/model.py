"""LightningModule: fine-tune a causal LM until it memorises, then unlearn with one method.

One ``fit`` has two phases, switched by the step counter: ``finetune_steps`` steps of NLL on the
fine-tuning data (skipped when ``pretrained`` points at an already fine-tuned checkpoint), then
unlearning with ``method`` until ``trainer.max_steps``. Optimisation is manual because ATWU's step
computes a retain gradient and a forward-mode JVP before the single backward of the step.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Literal

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveFloat, PositiveInt
from lightning.pytorch import LightningModule
from torch.func import functional_call
from transformers import AutoModelForCausalLM, LlamaConfig

from atwu import baselines as B
from atwu.core import (
    RelevanceScorer,
    answer_logprobs,
    atwu_objective,
    conflict_scores,
    forget_token_loss,
    normalise_budget,
    relevance_targets,
    retain_nll,
    scorer_loss,
)
from atwu.evaluate import evaluate_unlearning, rwku_scores, span_alignment, truth_ratios
from papers_cli import ConfigError, UserError, init_arguments

SAMPLE_LEVEL = ("ga", "graddiff", "npo", "simnpo")
PROBABILITY_WEIGHTED = ("wga", "satimp")
SCORER_METHODS = ("atwu", "atwu_random_features")
CONFLICT_METHODS = (*SCORER_METHODS, "atwu_raw_conflict")
# Methods that weight the per-token forget loss of Eq. 2 (ATWU, its ablations, the annotators).
TOKEN_WEIGHTED = (*CONFLICT_METHODS, "atwu_uniform", "annotator_heuristic", "annotator_oracle")
METHODS = (*TOKEN_WEIGHTED, *PROBABILITY_WEIGHTED, *SAMPLE_LEVEL)
Method = Literal[
    "atwu",
    "atwu_random_features",
    "atwu_raw_conflict",
    "atwu_uniform",
    "annotator_heuristic",
    "annotator_oracle",
    "wga",
    "satimp",
    "ga",
    "graddiff",
    "npo",
    "simnpo",
]  # the names of METHODS (test_model keeps them equal)


def build_causal_lm(
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    intermediate_size: int,
    max_positions: int,
    pad_token_id: int,
    eos_token_id: int,
):
    """A tiny Llama from a config (eager attention: forward-mode AD has no CPU SDPA rule)."""
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=eos_token_id,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager")


def load_pretrained(path: str):
    """A causal LM from a local folder only (``local_files_only``: never a hub download)."""
    if not (Path(path) / "config.json").is_file():
        raise UserError(
            f"--model.pretrained={path} is not a local checkpoint folder (no config.json). Pass "
            "the folder written by save_pretrained (e.g. a TOFU fine-tuned model downloaded "
            "beforehand); this project never downloads from a hub."
        )
    return AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, attn_implementation="eager", dtype=torch.float32
    )


class UnlearningModule(LightningModule):
    """Fine-tune (optional) then unlearn with ``method`` (one of ``METHODS``)."""

    def __init__(
        self,
        method: Method = "atwu",
        forget_loss: Literal["ga", "npo"] = "npo",
        pretrained: str | None = None,
        hidden_size: PositiveInt = 128,
        num_layers: PositiveInt = 2,
        num_heads: PositiveInt = 4,
        intermediate_size: PositiveInt = 256,
        max_positions: PositiveInt = 128,
        pretrain_steps: NonNegativeInt = 0,
        finetune_steps: NonNegativeInt = 800,
        finetune_lr: PositiveFloat = 3e-3,
        lr: PositiveFloat = 3e-4,
        retain_weight: NonNegativeFloat = 1.0,
        token_beta: PositiveFloat = 1.0,
        npo_beta: PositiveFloat = 0.1,
        simnpo_beta: PositiveFloat = 2.5,
        simnpo_gamma: NonNegativeFloat = 0.0,
        wga_beta: NonNegativeFloat = 1.0,
        satimp_beta1: NonNegativeFloat = 5.0,
        satimp_beta2: NonNegativeFloat = 1.0,
        budget: PositiveFloat = 1.0,
        scorer_lr: PositiveFloat = 1e-2,
        scorer_temperature: PositiveFloat = 0.5,
        scorer_target: Literal["rank", "robust_z", "z"] = "rank",
        scorer_layer: int = -1,
        burnin_steps: NonNegativeInt = 10,
        rare_max_count: NonNegativeInt = 10,
        eval_items: PositiveInt = 40,
        retain_checkpoint: str | None = None,
        max_new_tokens: PositiveInt = 32,
        truth_ratio: Literal["geometric", "arithmetic"] = "geometric",
    ) -> None:
        super().__init__()
        if pretrained is None and (hidden_size % num_heads or (hidden_size // num_heads) % 2):
            raise ConfigError(
                f"model.hidden_size={hidden_size} must split into model.num_heads={num_heads} "
                "heads of an even size (rotary positions rotate pairs); change one of them"
            )
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.automatic_optimization = False
        self.model = None
        # The retain model's forget-set truth ratios (from ``retain_checkpoint`` or set by the
        # caller); when known, validation logs forget quality.
        self.retain_model_ratios = None

    # ------------------------------------------------------------------ building

    def configure_model(self) -> None:
        if self.model is None:
            self.build(self.trainer.datamodule.tokenizer, self.trainer.datamodule)

    def build(self, tokenizer, datamodule=None) -> None:
        """The language model, the frozen reference / random-feature copies and the scorer."""
        h = self.hparams
        self.tokenizer = tokenizer
        if h.pretrained is not None:
            self.model = load_pretrained(h.pretrained)
        else:
            self.model = build_causal_lm(
                len(tokenizer), h.hidden_size, h.num_layers, h.num_heads, h.intermediate_size,
                h.max_positions, tokenizer.pad_token_id, tokenizer.eos_token_id,
            )  # fmt: skip
        self.check_fits_the_model(datamodule)
        if datamodule is not None and getattr(datamodule, "needs_corpus", False):
            # RWKU's zero-shot setting: the original model writes the forget corpus itself, on
            # the training device (an 8B model sampling on CPU would take hours)
            if self._trainer is not None:
                self.model.to(self.trainer.strategy.root_device)
            datamodule.generate_corpus(self.model)
        hidden = self.model.config.hidden_size
        if self.needs_reference:
            self.reference = self._frozen_copy(self.model)
        if h.method == "atwu_random_features":
            # Random features: the same architecture at a fresh random initialisation.
            self.feature_net = self._frozen_copy(
                AutoModelForCausalLM.from_config(self.model.config, attn_implementation="eager")
            )
        if h.method in SCORER_METHODS:
            self.scorer = RelevanceScorer(hidden)
            # replaced by the trainer's scorer optimizer in training_step (kept in checkpoints)
            self.scorer_optimizer = self._scorer_optimizer()
        if h.method == "annotator_heuristic":
            self.register_buffer("annotator_table", self._heuristic_table(tokenizer, datamodule))

    def check_fits_the_model(self, datamodule=None) -> None:
        """The scorer's layer and the data's length must exist in the (possibly loaded) model."""
        config, layer = self.model.config, self.hparams.scorer_layer
        source = self.hparams.pretrained or "the configured model"
        if not -(config.num_hidden_layers + 1) <= layer <= config.num_hidden_layers:
            raise ConfigError(
                f"model.scorer_layer={layer} but {source} has {config.num_hidden_layers} layers "
                f"(hidden states 0..{config.num_hidden_layers}, or negative from the last)"
            )
        rwku = datamodule is not None and datamodule.hparams.get("benchmark") == "rwku"
        if rwku and (self.hparams.pretrain_steps or self.hparams.finetune_steps):
            raise ConfigError(
                "RWKU unlearns the original model as loaded: set model.pretrain_steps=0 and "
                "model.finetune_steps=0 (configs/rwku.yaml does)"
            )
        max_length = datamodule.hparams.max_length if datamodule is not None else 0
        if max_length > config.max_position_embeddings:
            raise ConfigError(
                f"data.max_length={max_length} exceeds the {config.max_position_embeddings} "
                f"positions of {source}; lower data.max_length or raise model.max_positions"
            )

    @staticmethod
    def _frozen_copy(model):
        frozen = copy.deepcopy(model).eval()
        frozen.requires_grad_(False)
        return frozen

    def _heuristic_table(self, tokenizer, datamodule) -> torch.Tensor:
        counts = torch.zeros(len(tokenizer))
        if datamodule is not None:
            for example in datamodule.finetune_set.examples:
                ids = torch.tensor([t for t in example["labels"] if t != -100])
                counts += torch.bincount(ids, minlength=len(tokenizer)).float()
        strings = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        strings = [tokenizer.convert_tokens_to_string([s]) for s in strings]
        return B.heuristic_vocab_weights(strings, counts, self.hparams.rare_max_count)

    @property
    def needs_reference(self) -> bool:
        token_npo = self.hparams.method in TOKEN_WEIGHTED and self.hparams.forget_loss == "npo"
        return self.hparams.method == "npo" or token_npo

    def _scorer_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(
            self.scorer.parameters(), lr=self.hparams.scorer_lr, weight_decay=0
        )

    def configure_optimizers(self):
        h = self.hparams
        finetune = torch.optim.AdamW(self.model.parameters(), lr=h.finetune_lr, weight_decay=0.0)
        unlearn = torch.optim.AdamW(self.model.parameters(), lr=h.lr, weight_decay=0.0)
        if h.method in SCORER_METHODS:
            return [finetune, unlearn, self._scorer_optimizer()]
        return [finetune, unlearn]

    # ------------------------------------------------------------------ steps

    def forward(self, batch: dict, output_hidden_states: bool = False):
        return self.model(
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            output_hidden_states=output_hidden_states,
        )

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        finetune_opt, unlearn_opt, *scorer_opt = self.optimizers()
        if scorer_opt:
            # the raw optimizer: a LightningOptimizer step would count as a training step, and
            # ATWU would then take fewer model updates than the other methods within max_steps
            self.scorer_optimizer = scorer_opt[0].optimizer
        step, h = self.global_step, self.hparams
        if step < h.pretrain_steps:
            if "pretrain" not in batch:
                raise ConfigError(
                    "model.pretrain_steps > 0 needs generic text (TOFU-mini: data.root unset)"
                )
            loss = self.finetune_loss(batch["pretrain"])
            self.log("train/pretrain_nll", loss, prog_bar=True)
            optimizer = finetune_opt
        elif step < h.pretrain_steps + h.finetune_steps:
            loss = self.finetune_loss(batch["finetune"])
            self.log("train/finetune_nll", loss, prog_bar=True)
            optimizer = finetune_opt
        else:
            unlearn_step = step - h.pretrain_steps - h.finetune_steps
            if unlearn_step == 0 and self.needs_reference:
                # NPO's reference is the model as it is when unlearning starts.
                self.reference.load_state_dict(self.model.state_dict())
            loss = self.unlearning_loss(batch["forget"], batch["retain"], unlearn_step)
            optimizer = unlearn_opt
        optimizer.zero_grad()
        self.manual_backward(loss)
        optimizer.step()
        return loss.detach()

    def finetune_loss(self, batch: dict) -> torch.Tensor:
        logp, mask = answer_logprobs(self(batch).logits, batch["labels"])
        loss = retain_nll(logp, mask)
        if self.hparams.method in SCORER_METHODS:
            # DDP expects a gradient for every trainable parameter in every backward.
            loss = loss + 0.0 * sum(p.sum() for p in self.scorer.parameters())
        return loss

    def reference_logprobs(self, batch: dict) -> torch.Tensor | None:
        if not self.needs_reference:
            return None
        with torch.no_grad():
            return answer_logprobs(self.reference(**_model_inputs(batch)).logits, batch["labels"])[
                0
            ]

    def unlearning_loss(self, forget: dict, retain: dict, unlearn_step: int) -> torch.Tensor:
        """The method's objective (the model step) on one forget and one retain batch.

        For ATWU this first takes the scorer step (Eq. 6 on the conflict scores of the current
        parameters), then returns the model objective (Eq. 8) weighted by the updated scorer:
        strict alternation, scorer step then model step. During the first ``burnin_steps`` the
        model step uses uniform weights (token NPO) while the scorer already learns, so the
        scores are not read at the memorised point only; every method takes the same number of
        model updates.
        """
        h = self.hparams
        out = self(forget, output_hidden_states=h.method == "atwu")
        logp, mask = answer_logprobs(out.logits, forget["labels"])
        retain_logp, retain_mask = answer_logprobs(self(retain).logits, retain["labels"])
        retain_loss = retain_nll(retain_logp, retain_mask)
        ref_logp = self.reference_logprobs(forget)
        self.log("train/retain_nll", retain_loss)
        self.log("train/forget_nll", -(logp * mask).sum() / mask.sum(), prog_bar=True)

        if h.method in SAMPLE_LEVEL or h.method in PROBABILITY_WEIGHTED:
            return self.baseline_loss(logp, mask, ref_logp, retain_loss)

        token_loss = forget_token_loss(h.forget_loss, logp, ref_logp, h.token_beta)
        extra = torch.zeros((), device=logp.device)
        if h.method in CONFLICT_METHODS:
            conflict = self.conflict_scores(forget, retain_loss, ref_logp)
            targets = relevance_targets(conflict, mask, h.scorer_temperature, h.scorer_target)
        if h.method in SCORER_METHODS:
            features = self.scorer_features(forget, out)
            self.scorer_step(features, targets, mask)
            weights = torch.sigmoid(self.scorer(features)).detach()
            # DDP expects a gradient for every trainable parameter in the model step's backward
            extra = 0.0 * sum(p.sum() for p in self.scorer.parameters())
        elif h.method == "atwu_raw_conflict":
            weights = targets
        else:
            weights = self.fixed_token_weights(forget, mask)
        if h.method in CONFLICT_METHODS and unlearn_step < h.burnin_steps:
            weights = mask  # burn-in: uniform token NPO while the scorer learns
        weights = normalise_budget(weights, mask, h.budget)
        return atwu_objective(token_loss, weights, mask, retain_loss, h.retain_weight) + extra

    def scorer_step(self, features: torch.Tensor, targets: torch.Tensor, mask) -> None:
        """One optimizer step of the scorer on Eq. 6 (its gradient averaged over DDP ranks)."""
        loss = scorer_loss(self.scorer(features), targets, mask)
        params = list(self.scorer.parameters())
        grads = torch.autograd.grad(loss, params)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size()
            for grad in grads:
                torch.distributed.all_reduce(grad)
                grad /= world
        for param, grad in zip(params, grads, strict=True):
            param.grad = grad
        self.scorer_optimizer.step()
        self.scorer_optimizer.zero_grad()
        self.log("train/scorer_bce", loss.detach())

    def baseline_loss(self, logp, mask, ref_logp, retain_loss) -> torch.Tensor:
        h = self.hparams
        if h.method == "ga":
            return B.ga_loss(logp, mask)
        if h.method == "graddiff":
            return B.graddiff_loss(logp, mask, retain_loss, h.retain_weight)
        if h.method == "npo":
            forget = B.npo_loss(logp, ref_logp, mask, h.npo_beta)
        elif h.method == "simnpo":
            forget = B.simnpo_loss(logp, mask, h.simnpo_beta, h.simnpo_gamma)
        elif h.method == "wga":
            forget = B.probability_weighted_loss(logp, mask, B.wga_weights(logp, h.wga_beta))
        else:
            weights = B.satimp_weights(logp, h.satimp_beta1, h.satimp_beta2)
            forget = B.probability_weighted_loss(logp, mask, weights)
        return forget + h.retain_weight * retain_loss

    def conflict_scores(self, forget: dict, retain_loss: torch.Tensor, ref_logp) -> torch.Tensor:
        """Eq. 3 on the current parameters: retain gradient by autograd, c_t by one JVP."""
        h = self.hparams
        params = {n: p for n, p in self.model.named_parameters() if p.requires_grad}
        grads = torch.autograd.grad(retain_loss, list(params.values()), retain_graph=True)

        def token_losses(p: dict[str, torch.Tensor]) -> torch.Tensor:
            logits = functional_call(self.model, p, args=(), kwargs=_model_inputs(forget)).logits
            return forget_token_loss(
                h.forget_loss, answer_logprobs(logits, forget["labels"])[0], ref_logp, h.token_beta
            )

        return conflict_scores(token_losses, params, dict(zip(params, grads, strict=True)))

    def scorer_features(self, batch: dict, output=None) -> torch.Tensor:
        """Hidden states h_t [B, T-1, D] of the token each answer position scores (Eq. 4)."""
        if self.hparams.method == "atwu_random_features":
            with torch.no_grad():
                output = self.feature_net(**_model_inputs(batch), output_hidden_states=True)
        elif output is None or output.hidden_states is None:
            with torch.no_grad():
                output = self(batch, output_hidden_states=True)
        return output.hidden_states[self.hparams.scorer_layer][:, 1:]

    def fixed_token_weights(self, batch: dict, mask: torch.Tensor) -> torch.Tensor:
        """Weights that do not learn: uniform, the heuristic annotator or the oracle span mask."""
        method = self.hparams.method
        if method == "atwu_uniform":
            return mask
        if method == "annotator_heuristic":
            return self.annotator_table[batch["input_ids"][:, 1:]] * mask
        return batch["relevance"][:, 1:].float() * mask

    # ------------------------------------------------------------------ inspection

    @torch.no_grad()
    def token_weights(self, forget: dict, retain: dict) -> torch.Tensor | None:
        """The method's (unnormalised) forget-token weights on a batch; None for sample-level."""
        h = self.hparams
        if h.method in SAMPLE_LEVEL:
            return None
        out = self(forget, output_hidden_states=True)
        logp, mask = answer_logprobs(out.logits, forget["labels"])
        if h.method == "wga":
            return B.wga_weights(logp, h.wga_beta) * mask
        if h.method == "satimp":
            return B.satimp_weights(logp, h.satimp_beta1, h.satimp_beta2) * mask
        if h.method in SCORER_METHODS:
            return torch.sigmoid(self.scorer(self.scorer_features(forget, out))) * mask
        if h.method == "atwu_raw_conflict":
            with torch.enable_grad():
                retain_logp, retain_mask = answer_logprobs(self(retain).logits, retain["labels"])
                conflict = self.conflict_scores(
                    forget, retain_nll(retain_logp, retain_mask), self.reference_logprobs(forget)
                )
            return relevance_targets(conflict, mask, h.scorer_temperature, h.scorer_target)
        return self.fixed_token_weights(forget, mask)

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        logp, mask = answer_logprobs(self(batch).logits, batch["labels"])
        self.log("val/forget_nll", -(logp * mask).sum() / mask.sum(), prog_bar=True)

    def test_step(self, batch: dict, batch_idx: int) -> None:
        logp, mask = answer_logprobs(self(batch).logits, batch["labels"])
        self.log("test/forget_nll", -(logp * mask).sum() / mask.sum())

    def on_validation_epoch_end(self) -> None:
        self.log_unlearning_metrics("val")

    def on_test_epoch_end(self) -> None:
        self.log_unlearning_metrics("test")

    def log_unlearning_metrics(self, split: str) -> None:
        """The TOFU chain on the forget and utility sets, and the token weights' span AUROC."""
        datamodule = self.trainer.datamodule
        if datamodule.hparams.get("benchmark") == "rwku":
            # RWKU: ROUGE-L recall on forget levels 1-3 and neighbor levels 1-2
            scores, _ = rwku_scores(
                self.model, self.tokenizer, datamodule.rwku.probes, self.hparams.max_new_tokens
            )
            for name, value in scores.items():
                self.log(f"{split}/{name}_rouge", value)
            return
        data, n = datamodule.data, self.hparams.eval_items
        utility_sets = {"retain": (data.retain[:n], False), "world": (data.world_facts[:n], True)}
        if data.real_authors:
            utility_sets["real_authors"] = (data.real_authors[:n], True)
        h = self.hparams
        if self.retain_model_ratios is None and h.retain_checkpoint is not None:
            # forget quality from the CLI: the retain model's forget-set truth ratios, once
            retain = load_pretrained(h.retain_checkpoint).to(self.device).eval()
            self.retain_model_ratios = truth_ratios(
                retain, self.tokenizer, data.forget[:n], h.truth_ratio
            )
            del retain
        metrics, _ = evaluate_unlearning(
            self.model,
            self.tokenizer,
            data.forget[:n],
            utility_sets,
            self.retain_model_ratios,
            h.max_new_tokens,
            h.truth_ratio,
        )
        for name in ("forget_rouge", "forget_truth", "model_utility", "forget_quality"):
            if name in metrics:
                self.log(f"{split}/{name}", metrics[name])
        forget = next(iter(datamodule.loader(datamodule.forget_set, 64, False)))
        retain = next(iter(datamodule.loader(datamodule.retain_set, 64, False)))
        forget, retain = (
            self.transfer_batch_to_device(b, self.device, 0) for b in (forget, retain)
        )
        weights = self.token_weights(forget, retain)
        relevant = forget["relevance"][:, 1:]
        answer = forget["labels"][:, 1:] != -100
        if weights is not None and 0 < relevant[answer].sum() < answer.sum():
            alignment = span_alignment(
                weights[answer].cpu().numpy(), relevant[answer].cpu().numpy()
            )
            self.log(f"{split}/span_auroc", alignment["auroc"])


def _model_inputs(batch: dict) -> dict[str, torch.Tensor]:
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
