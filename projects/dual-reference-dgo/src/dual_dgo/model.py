"""LightningModule: one VLM, one weighted sequence loss, the objective chosen by name.

Every objective (the method, the baselines, the controls) is a set of per-response weights for
``core.sequence_loss``; the model, data, optimizer and epochs are shared. Evaluation (validation
and ``train test --ckpt_path``) measures per prompt: the exact fast probability from the first
response token, and greedy decodes forced into each mode (correctness by the verifier, tokens
generated); the model's own choice is the more probable mode token.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from jsonargparse.typing import (
    ClosedUnitInterval,
    NonNegativeFloat,
    NonNegativeInt,
    OpenUnitInterval,
    PositiveFloat,
    PositiveInt,
)
from lightning.pytorch import LightningModule
from scipy.stats import spearmanr

from dual_dgo import baselines
from dual_dgo.core import (
    FAST,
    SLOW,
    dual_reference_weights,
    exact_log_partitions,
    fast_probability,
    fixed_prior_weights,
    response_log_probs,
    sequence_loss,
)
from dual_dgo.data import PromptItem, build_processor
from dual_dgo.formats import VERIFIERS, extract_answer
from dual_dgo.vlm import (
    PromptEncoder,
    _vision_batch,
    batch_sequences,
    build_tiny_vlm,
    decode_responses,
    load_local,
)
from papers_cli import ConfigError, init_arguments
from papers_gpu import derived_seed, run_seed

Objective = Literal[
    "dual",
    "single_reference",
    "sft",
    "rft",
    "always_fast",
    "always_slow",
    "fixed_prior",
    "exact_partition",
]
VISION_KEYS = ("pixel_values", "image_grid_thw", "mm_token_type_ids", "image_sizes")


class DualDgoModule(LightningModule):
    """A VLM trained offline by Dual-Reference DGO (``objective="dual"``) or a baseline.

    ``checkpoint``: a local VLM folder (paper scale); None builds the miniature's tiny LLaVA
    (``hidden``, ``layers``, ``heads``, ``vision_hidden``). ``init_checkpoint``: a Lightning
    checkpoint to warm-start from (the claim trains every objective from one warm start).
    ``responses_per_prompt``: None trains on every response with its weight (Eq. 5 exactly);
    r draws r responses per prompt with probability proportional to their weights, each
    carrying the prompt's total weight / r: an unbiased estimate of the same loss at a fraction
    of the compute (the default, 1, is what lets the tiny VLM learn to read in minutes: many
    distinct images per step). ``sft_warmup_epochs``: the first epochs train SFT on the mixture
    (the warm start the claim shares between objectives), then the objective takes over.
    ``sft_fast_share``: None trains SFT on every response as sampled (its first token imitates
    the sample counts); a share s in (0, 1) gives each prompt's fast responses s of its weight
    and the slow ones 1 - s (``baselines.mode_share_sft_weights``; the claim's warm start).
    """

    def __init__(
        self,
        objective: Objective = "dual",
        beta: PositiveFloat = 0.2,
        prior_fast: ClosedUnitInterval = 0.5,
        reduction: Literal["sum", "token_mean"] = "sum",
        lr: PositiveFloat = 2e-3,
        weight_decay: NonNegativeFloat = 0.0,
        checkpoint: str | None = None,
        init_checkpoint: str | None = None,
        hidden: PositiveInt = 96,
        layers: PositiveInt = 3,
        heads: PositiveInt = 4,
        vision_hidden: PositiveInt = 64,
        responses_per_prompt: PositiveInt | None = 1,
        sft_warmup_epochs: NonNegativeInt = 0,
        sft_fast_share: OpenUnitInterval | None = None,
        verifier: Literal["exact", "numeric", "choice"] = "exact",
        max_new_tokens: PositiveInt = 24,
        length_cost: NonNegativeFloat = 0.2,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.encoder = PromptEncoder(build_processor(checkpoint))
        tokenizer = self.encoder.tokenizer
        if checkpoint is None:
            self.vlm = build_tiny_vlm(tokenizer, hidden, layers, heads, vision_hidden)
        else:
            self.vlm, _ = load_local(checkpoint)
            if self.encoder.added_tokens:
                self.vlm.resize_token_embeddings(len(tokenizer))
        self.image_token_id = (
            self.vlm.config.image_token_index
            if hasattr(self.vlm.config, "image_token_index")
            else self.vlm.config.image_token_id
        )
        if init_checkpoint is not None:
            state = torch.load(Path(init_checkpoint), map_location="cpu", weights_only=True)[
                "state_dict"
            ]
            self.load_state_dict(state)
        self._outputs: list[dict[str, np.ndarray]] = []
        self.evaluation: dict[str, dict[str, np.ndarray]] = {}

    # ----- training -----------------------------------------------------------------------
    def response_weights(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-response weights of the configured objective and the target mode masses rho."""
        h = self.hparams
        if h.objective == "sft" or self.current_epoch < h.sft_warmup_epochs:
            if h.sft_fast_share is not None:
                return baselines.mode_share_sft_weights(
                    batch["modes"], batch["prompts"], batch["n_prompts"], h.sft_fast_share
                ), None
            return baselines.sft_weights(batch["prompts"], batch["n_prompts"]), None
        args = (batch["rewards"], batch["modes"], batch["prompts"], batch["n_prompts"], h.beta)
        prior = torch.tensor([h.prior_fast, 1.0 - h.prior_fast])
        if h.objective == "dual":
            return dual_reference_weights(*args, prior)
        if h.objective == "fixed_prior":
            return fixed_prior_weights(*args, prior)
        if h.objective == "exact_partition":
            table = batch["policy_table"]
            if torch.isnan(table).any():
                raise ConfigError(
                    "objective=exact_partition needs behaviour policies with known accuracies "
                    "and lengths (the miniature's scripted policies), not an offline file"
                )
            log_z = exact_log_partitions(table, h.beta)
            return dual_reference_weights(*args, prior, log_z=log_z)
        if h.objective == "single_reference":
            rewards, prompts = batch["rewards"], batch["prompts"]
            return baselines.single_reference_weights(
                rewards, prompts, batch["n_prompts"], h.beta
            ), None
        if h.objective == "rft":
            return baselines.rft_weights(
                batch["correct"], batch["prompts"], batch["n_prompts"]
            ), None
        mode = FAST if h.objective == "always_fast" else SLOW
        return baselines.one_mode_weights(*args, mode), None

    def forward(self, batch: dict) -> torch.Tensor:
        """Logits [N, T, V] of token sequences (input_ids, attention_mask, vision inputs)."""
        inputs = {k: batch[k] for k in ("input_ids", "attention_mask", *VISION_KEYS) if k in batch}
        return self.vlm(**inputs).logits

    def training_step(self, batch: dict, batch_idx: int) -> torch.Tensor:
        loss, rho = self.loss(batch)
        self.log("train/loss", loss, prog_bar=True, batch_size=batch["n_prompts"])
        if rho is not None:
            fast_mass = rho[:, FAST].float().mean()
            self.log("train/target_fast_mass", fast_mass, batch_size=batch["n_prompts"])
        return loss

    def loss(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weighted sequence loss of the configured objective on a batch of prompts."""
        weights, rho = self.response_weights(batch)
        rows, row_weights = self.pick_responses(batch, weights.float())
        items = batch["items"]
        prompts = batch["prompts"][rows]
        sequences = batch_sequences(
            [items[p].prompt for p in prompts.tolist()],
            [batch["responses"][r] for r in rows.tolist()],
            self.encoder.pad_id,
            self.image_token_id,
        )
        sequences = {k: v.to(self.device) for k, v in sequences.items()}
        mode_lp, body_lp, lengths = response_log_probs(
            self(sequences), sequences["input_ids"], sequences["response_mask"]
        )
        loss = sequence_loss(
            mode_lp,
            body_lp,
            lengths,
            row_weights.to(self.device),
            batch["n_prompts"],
            self.hparams.reduction,
        )
        return loss, rho

    def pick_responses(
        self, batch: dict, weights: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The responses to train on and their loss weights: all of them (``None``), or
        ``responses_per_prompt`` weighted draws per prompt from a generator seeded by
        (run seed, step, rank), so a resumed run draws what the uninterrupted one drew."""
        draws = self.hparams.responses_per_prompt
        if draws is None:
            return torch.arange(len(weights)), weights
        generator = torch.Generator().manual_seed(
            derived_seed(run_seed(), self.global_step, self.global_rank)
        )
        prompts, rows, row_weights = batch["prompts"], [], []
        for prompt in range(batch["n_prompts"]):
            members = (prompts == prompt).nonzero().squeeze(1)
            total = weights[members].sum()
            if (
                total <= 0
            ):  # nothing to learn from this prompt (e.g. RFT without a correct response)
                continue
            picked = torch.multinomial(
                weights[members] / total, draws, replacement=True, generator=generator
            )
            rows.append(members[picked])
            row_weights.append(total.expand(draws) / draws)
        if not rows:
            rows, row_weights = [torch.zeros(1, dtype=torch.long)], [torch.zeros(1)]
        return torch.cat(rows), torch.cat(row_weights)

    def transfer_batch_to_device(self, batch: dict, device: torch.device, dataloader_idx: int):
        """Keep the prompt batch where it is: each step builds the token sequences it trains on
        (or decodes) and moves those; walking every prompt and response here cost more than the
        step itself in the miniature."""
        return batch

    def configure_optimizers(self):
        return torch.optim.AdamW(
            self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay
        )

    # ----- evaluation ---------------------------------------------------------------------
    @torch.no_grad()
    def evaluate_prompts(self, items: list[PromptItem]) -> dict[str, np.ndarray]:
        """Per prompt: P(fast) exactly, and each forced mode's greedy correctness and tokens."""
        encoder, prompts = self.encoder, [item.prompt for item in items]
        first = self._first_token_logits(prompts)
        out = {"p_fast": fast_probability(first, encoder.fast_id, encoder.slow_id).cpu().numpy()}
        verify = VERIFIERS[self.hparams.verifier]
        for name, mode_id in (("fast", encoder.fast_id), ("slow", encoder.slow_id)):
            generated, texts = self.decode(prompts, mode_id)
            out[f"{name}_correct"] = np.array(
                [
                    verify(extract_answer(t), item.answer)
                    for t, item in zip(texts, items, strict=True)
                ],
                dtype=np.float64,
            )
            out[f"{name}_tokens"] = np.array([len(ids) for ids in generated], dtype=np.float64)
        out["difficulty"] = np.array([item.difficulty for item in items], dtype=np.float64)
        out["source"] = np.array([item.source for item in items], dtype=np.float64)
        return out

    @torch.no_grad()
    def decode(
        self, prompts, mode_id: int, temperature: float = 0.0
    ) -> tuple[list[list[int]], list[str]]:
        """Responses forced to start with ``mode_id`` (greedy at temperature 0, else sampled):
        their ids (with EOS) and their texts (without it)."""
        eos = self.encoder.eos_id
        generated = decode_responses(
            self.vlm,
            self.encoder,
            prompts,
            mode_id,
            self.hparams.max_new_tokens,
            self.image_token_id,
            temperature,
        )
        texts = [
            self.encoder.tokenizer.decode(ids[:-1] if ids[-1] == eos else ids) for ids in generated
        ]
        return generated, texts

    def _first_token_logits(self, prompts) -> torch.Tensor:
        return self.prompt_end(prompts)[0]

    def prompt_end(self, prompts) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """At each prompt's last position (where the mode is chosen): the next-token logits
        [B, V] and the last layer's state [B, D]; and the last layer's mean state over the
        prompt's image tokens [B, D]. Prompts are left-padded to one width."""
        width = max(len(p.input_ids) for p in prompts)
        ids = torch.full((len(prompts), width), self.encoder.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt.input_ids) :] = prompt.input_ids
            mask[row, width - len(prompt.input_ids) :] = 1
        batch = {"input_ids": ids, "attention_mask": mask}
        batch.update(_vision_batch(prompts, ids, self.image_token_id))
        batch = {k: v.to(self.device) for k, v in batch.items()}
        out = self.vlm(**batch, output_hidden_states=True)
        last = out.hidden_states[-1]
        is_image = (batch["input_ids"] == self.image_token_id).unsqueeze(-1).to(last.dtype)
        image_mean = (last * is_image).sum(1) / is_image.sum(1).clamp_min(1)
        return out.logits[:, -1], last[:, -1], image_mean

    def validation_step(self, batch: dict, batch_idx: int) -> None:
        self._outputs.append(self.evaluate_prompts(batch["items"]))

    def test_step(self, batch: dict, batch_idx: int) -> None:
        self._outputs.append(self.evaluate_prompts(batch["items"]))

    def on_validation_epoch_end(self) -> None:
        self._summarise("val")

    def on_test_epoch_end(self) -> None:
        self._summarise("test")

    def _summarise(self, split: str) -> None:
        arrays = {k: np.concatenate([o[k] for o in self._outputs]) for k in self._outputs[0]}
        self._outputs.clear()
        self.evaluation[split] = arrays
        for name, value in summary_metrics(
            arrays, self.hparams.length_cost, self._max_length()
        ).items():
            self.log(f"{split}/{name}", float(value), sync_dist=True)

    def _max_length(self) -> int:
        datamodule = getattr(self.trainer, "datamodule", None) if self._trainer else None
        return int(getattr(datamodule, "max_length", self.hparams.max_new_tokens))

    def save_pretrained(self, folder: str | Path) -> Path:
        """A local checkpoint (model + processor) that ``vlm.load_local`` reads offline."""
        folder = Path(folder)
        self.vlm.save_pretrained(folder)
        self.encoder.processor.save_pretrained(folder)
        return folder


def chosen(
    arrays: dict[str, np.ndarray], p_slow: np.ndarray | None = None
) -> dict[str, np.ndarray]:
    """Per-prompt correctness and tokens when the mode is slow with probability ``p_slow``
    (default: the model's greedy choice, slow when P(fast) < 1/2): expectations, exact."""
    if p_slow is None:
        p_slow = (arrays["p_fast"] < 0.5).astype(np.float64)
    return {
        "correct": p_slow * arrays["slow_correct"] + (1 - p_slow) * arrays["fast_correct"],
        "tokens": p_slow * arrays["slow_tokens"] + (1 - p_slow) * arrays["fast_tokens"],
        "p_slow": p_slow,
    }


def summary_metrics(arrays: dict[str, np.ndarray], length_cost: float, max_length: int) -> dict:
    """Fast rate (exact), accuracy and mean tokens (greedy), reward, routing correlation."""
    picked = chosen(arrays)
    p_slow = 1 - arrays["p_fast"]
    known = arrays["difficulty"] >= 0
    spearman = (
        float(spearmanr(arrays["difficulty"][known], p_slow[known]).statistic)
        if known.sum() > 2 and np.ptp(p_slow[known]) > 0 and np.ptp(arrays["difficulty"][known]) > 0
        else 0.0
    )
    return {
        "fast_rate": arrays["p_fast"].mean(),
        "accuracy": picked["correct"].mean(),
        "tokens": picked["tokens"].mean(),
        "reward": (picked["correct"] - length_cost * picked["tokens"] / max_length).mean(),
        "fast_accuracy": arrays["fast_correct"].mean(),
        "slow_accuracy": arrays["slow_correct"].mean(),
        "slow_rank_correlation": spearman,
    }
