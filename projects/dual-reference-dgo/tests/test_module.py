"""The LightningModule's default training path by value: the objective's weights, the weighted
response draw (``pick_responses``) and the loss built from it; and the image ablation."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from dual_dgo import baselines
from dual_dgo.core import (
    dual_reference_weights,
    exact_log_partitions,
    fixed_prior_weights,
    response_log_probs,
)
from dual_dgo.data import DualDgoDataModule, collate_prompts
from dual_dgo.evaluation import ablate_images
from dual_dgo.model import DualDgoModule
from dual_dgo.vlm import batch_sequences
from papers_gpu import derived_seed, run_seed

# prompt 0: three responses; prompt 1: two with zero weight (skipped); prompt 2: two
PROMPTS = torch.tensor([0, 0, 0, 1, 1, 2, 2])
WEIGHTS = torch.tensor([0.1, 0.3, 0.6, 0.0, 0.0, 0.25, 0.25])


def draw(weights, draws, step=0, prompts=PROMPTS, n_prompts=3, rank=0):
    """``DualDgoModule.pick_responses`` on a stand-in module (no VLM needed to draw)."""
    stub = SimpleNamespace(
        hparams=SimpleNamespace(responses_per_prompt=draws), global_step=step, global_rank=rank
    )
    batch = {"prompts": prompts, "n_prompts": n_prompts}
    return DualDgoModule.pick_responses(stub, batch, weights)


def test_pick_responses_draws_inside_each_prompt_and_carries_its_total_weight():
    rows, row_weights = draw(WEIGHTS, 3, step=5)
    assert len(rows) == 6  # prompt 1 has nothing to learn from: no draw
    assert set(rows[:3].tolist()) <= {0, 1, 2} and set(rows[3:].tolist()) <= {5, 6}
    torch.testing.assert_close(row_weights, torch.tensor([1 / 3] * 3 + [0.5 / 3] * 3))
    # the draws are the documented generator's: seeded by (run seed, step, rank), prompt by prompt
    generator = torch.Generator().manual_seed(derived_seed(run_seed(), 5, 0))
    first = torch.multinomial(WEIGHTS[:3] / 1.0, 3, replacement=True, generator=generator)
    third = torch.multinomial(WEIGHTS[5:] / 0.5, 3, replacement=True, generator=generator)
    assert rows.tolist() == [*first.tolist(), *(third + 5).tolist()]
    assert torch.equal(draw(WEIGHTS, 3, step=5)[0], rows)  # a resumed step draws the same


def test_pick_responses_frequencies_follow_the_weights_and_the_loss_is_unbiased():
    per_response_loss = torch.tensor([1.0, 2.0, 4.0, 9.0, 9.0, 3.0, 5.0])
    exact = (WEIGHTS * per_response_loss).sum().item()  # Eq. 5 on every response
    counts, estimates = np.zeros(7), []
    for step in range(3000):
        rows, row_weights = draw(WEIGHTS, 1, step=step)
        np.add.at(counts, rows.numpy(), 1)
        estimates.append((row_weights * per_response_loss[rows]).sum().item())
    share = counts[:3] / counts[:3].sum()
    np.testing.assert_allclose(share, [0.1, 0.3, 0.6], atol=4 * np.sqrt(0.25 / 3000))
    assert counts[3:5].sum() == 0 and counts[5] == pytest.approx(counts[6], rel=0.15)
    assert np.mean(estimates) == pytest.approx(exact, rel=0.03)


def test_pick_responses_all_responses_or_a_zero_weight_stand_in():
    rows, row_weights = draw(WEIGHTS, None)
    assert rows.tolist() == list(range(7)) and torch.equal(row_weights, WEIGHTS)
    rows, row_weights = draw(torch.zeros(7), 2)
    assert rows.tolist() == [0] and row_weights.tolist() == [0.0]


@pytest.fixture(scope="module")
def tiny():
    """A tiny module and four miniature training prompts (their responses, encoded)."""
    torch.manual_seed(0)
    data = DualDgoDataModule(n_train=4, n_val=2, n_test=2, seed=3)
    data.setup()
    module = DualDgoModule(hidden=32, layers=1, vision_hidden=32, beta=0.3).eval()
    return module, data, collate_prompts(data.splits["train"])


def test_pick_responses_draws_its_own_responses_on_each_rank():
    """The draw's generator is seeded by (run seed, step, rank): under DDP two ranks at the
    same step draw independently (each rank holds other prompts, but the same generator
    would pair their draws), and the same rank and step draw the same responses again."""
    weights = torch.full((60,), 1.0)
    prompts = torch.arange(60) // 6  # 10 prompts of 6 equally weighted responses
    first = draw(weights, 4, step=3, prompts=prompts, n_prompts=10, rank=0)[0]
    again = draw(weights, 4, step=3, prompts=prompts, n_prompts=10, rank=0)[0]
    other = draw(weights, 4, step=3, prompts=prompts, n_prompts=10, rank=1)[0]
    assert torch.equal(first, again) and not torch.equal(first, other)


def one_by_one_log_likelihoods(module, batch, per_token=False) -> torch.Tensor:
    """log pi(y_i|x_i) of every response, each in a batch of its own (no padding)."""
    out = []
    for row, response in enumerate(batch["responses"]):
        prompt = batch["items"][batch["prompts"][row]].prompt
        sequence = batch_sequences(
            [prompt], [response], module.encoder.pad_id, module.image_token_id
        )
        mode, body, length = response_log_probs(
            module(sequence), sequence["input_ids"], sequence["response_mask"]
        )
        out.append((mode + body)[0] / (length[0] if per_token else 1))
    return torch.stack(out)


def test_the_token_mean_ablation_divides_each_sequence_by_its_length_in_the_module(tiny):
    """``model.reduction="token_mean"`` reaches the module's loss: each response's
    log-likelihood divided by its response length, then Eq. 5's weighted sum."""
    module, _, batch = tiny
    prior = torch.tensor([0.5, 0.5], dtype=torch.float64)
    weights, _ = dual_reference_weights(
        batch["rewards"], batch["modes"], batch["prompts"], batch["n_prompts"], 0.3, prior
    )
    saved = (module.hparams.reduction, module.hparams.responses_per_prompt)
    try:
        module.hparams.reduction, module.hparams.responses_per_prompt = "token_mean", None
        with torch.no_grad():
            per_token = one_by_one_log_likelihoods(module, batch, per_token=True)
            total = one_by_one_log_likelihoods(module, batch)
            got = module.loss(batch)[0]
        expected = -(weights.double() * per_token.double()).sum() / batch["n_prompts"]
        assert got.item() == pytest.approx(expected.item(), rel=1e-5)
        summed = -(weights.double() * total.double()).sum() / batch["n_prompts"]
        assert abs(summed.item() - expected.item()) > 1e-3  # the two reductions differ here
    finally:
        module.hparams.reduction, module.hparams.responses_per_prompt = saved


def test_the_module_loss_is_eq5_on_every_response_and_on_the_weighted_draw(tiny):
    module, _, batch = tiny
    prior = torch.tensor([0.5, 0.5], dtype=torch.float64)
    weights, _ = dual_reference_weights(
        batch["rewards"], batch["modes"], batch["prompts"], batch["n_prompts"], 0.3, prior
    )
    with torch.no_grad():
        log_likelihood = one_by_one_log_likelihoods(module, batch)
        module.hparams.responses_per_prompt = None
        every = module.loss(batch)[0]
        expected = -(weights.double() * log_likelihood.double()).sum() / batch["n_prompts"]
        assert every.item() == pytest.approx(expected.item(), rel=1e-5)
        module.hparams.responses_per_prompt = 2
        drawn = module.loss(batch)[0]
    rows, row_weights = DualDgoModule.pick_responses(module, batch, weights.float())
    by_hand = -(row_weights.double() * log_likelihood[rows].double()).sum() / batch["n_prompts"]
    assert drawn.item() == pytest.approx(by_hand.item(), rel=1e-5)
    assert sorted(set(batch["prompts"][rows].tolist())) == [0, 1, 2, 3]  # 2 draws per prompt
    assert len(rows) == 8


@pytest.mark.parametrize(
    "objective",
    ["dual", "single_reference", "sft", "rft", "always_fast", "always_slow", "fixed_prior",
     "exact_partition"],
)  # fmt: skip
def test_response_weights_of_every_objective_by_value(tiny, objective):
    module, _, batch = tiny
    module.hparams.objective, module.hparams.sft_warmup_epochs = objective, 0
    module.hparams.prior_fast = 0.3
    got, _ = module.response_weights(batch)
    args = (batch["rewards"], batch["modes"], batch["prompts"], batch["n_prompts"], 0.3)
    prior = torch.tensor([0.3, 0.7], dtype=torch.float64)
    expected = {
        "dual": lambda: dual_reference_weights(*args, prior)[0],
        "single_reference": lambda: baselines.single_reference_weights(
            batch["rewards"], batch["prompts"], batch["n_prompts"], 0.3
        ),
        "sft": lambda: baselines.sft_weights(batch["prompts"], batch["n_prompts"]),
        "rft": lambda: baselines.rft_weights(
            batch["correct"], batch["prompts"], batch["n_prompts"]
        ),
        "always_fast": lambda: baselines.one_mode_weights(*args, mode=0),
        "always_slow": lambda: baselines.one_mode_weights(*args, mode=1),
        "fixed_prior": lambda: fixed_prior_weights(*args, prior)[0],
        "exact_partition": lambda: dual_reference_weights(
            *args, prior, log_z=exact_log_partitions(batch["policy_table"], 0.3)
        )[0],
    }[objective]()
    torch.testing.assert_close(got.double(), expected.double(), rtol=1e-6, atol=1e-9)
    # during the SFT warm-up every objective trains SFT on the mixture
    module.hparams.sft_warmup_epochs = 1
    warm, rho = module.response_weights(batch)
    torch.testing.assert_close(warm, baselines.sft_weights(batch["prompts"], batch["n_prompts"]))
    assert rho is None
    module.hparams.objective, module.hparams.sft_warmup_epochs = "dual", 0
    module.hparams.prior_fast = 0.5


def test_the_warm_start_with_a_fixed_share_gives_every_miniature_prompt_that_fast_mass():
    """The claim's warm start (``sft_fast_share``) on the source-tag miniature: every training
    prompt's fast responses carry 0.25 of its weight, on both sources (8 fast / 1 slow and
    1 fast / 8 slow), while plain SFT's fast mass is the sample share 8/9 or 1/9."""
    data = DualDgoDataModule(
        n_train=24, n_val=2, n_test=2, seed=5, counts_by="source", n_fast=8, n_slow=1,
        n_fast_b=1, n_slow_b=8,
    )  # fmt: skip
    data.setup()
    batch = collate_prompts(data.splits["train"])
    stub = SimpleNamespace(
        hparams=SimpleNamespace(objective="sft", sft_warmup_epochs=0, sft_fast_share=0.25),
        current_epoch=0,
    )
    sources = torch.tensor([item.source for item in data.splits["train"]])
    assert set(sources.tolist()) == {0, 1}
    for share, expected in ((0.25, torch.full((24,), 0.25)), (None, None)):
        stub.hparams.sft_fast_share = share
        weights, rho = DualDgoModule.response_weights(stub, batch)
        fast = torch.zeros(24).index_add(0, batch["prompts"], weights * (batch["modes"] == 0))
        total = torch.zeros(24).index_add(0, batch["prompts"], weights)
        torch.testing.assert_close(total, torch.ones(24))
        if expected is None:  # plain SFT imitates the counts
            expected = torch.where(sources == 0, 8 / 9, 1 / 9)
        torch.testing.assert_close(fast, expected.float())
        assert rho is None


def test_image_ablation_takes_the_pixels_and_keeps_the_text(tiny):
    _, data, _ = tiny
    items = data.splits["train"]
    zeroed = ablate_images(items, "zeroed", seed=0)
    shuffled = ablate_images(items, "shuffled", seed=0)
    generator = torch.Generator().manual_seed(0)  # one permutation per prompt, drawn in order
    for item, zero, mixed in zip(items, zeroed, shuffled, strict=True):
        pixels = item.prompt.vision["pixel_values"]  # [1, 3, 36, 36]
        assert torch.equal(zero.prompt.input_ids, item.prompt.input_ids)
        assert torch.count_nonzero(zero.prompt.vision["pixel_values"]) == 0
        order = torch.randperm(36 * 36, generator=generator)
        expected = pixels.flatten(-2)[..., order].reshape(pixels.shape)  # every channel alike
        assert torch.equal(mixed.prompt.vision["pixel_values"], expected)
        assert not torch.equal(expected, pixels)
        assert torch.equal(mixed.prompt.input_ids, item.prompt.input_ids)
        assert mixed.responses is item.responses and mixed.answer == item.answer
    assert torch.count_nonzero(items[0].prompt.vision["pixel_values"]) > 0  # originals untouched
    again = ablate_images(items, "shuffled", seed=0)
    assert torch.equal(
        again[1].prompt.vision["pixel_values"], shuffled[1].prompt.vision["pixel_values"]
    )
    with pytest.raises(ValueError, match="how must be 'zeroed' or 'shuffled', got 'blurred'"):
        ablate_images(items, "blurred", seed=0)
