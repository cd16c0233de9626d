"""The default path through the LightningModule: which view feeds which encoder, each objective's
terms by value, and that a few steps lower the loss."""

import pytest
import torch

from counterfactual_instruments.core import chi2_loss, info_nce
from counterfactual_instruments.model import CounterfactualInstrumentsModule


def make_batch(n=4, seed=0, grad=False):
    g = torch.Generator().manual_seed(seed)
    batch = {}
    for x, bands, size in (("A", 3, 16), ("B", 5, 24)):
        batch[f"image_{x}"] = torch.randn(n, bands, size, size, generator=g)
        batch[f"neighbour_{x}"] = torch.randn(n, bands, size, size, generator=g)
        batch[f"ivar_{x}"] = torch.rand(n, bands, size, size, generator=g) + 0.5
        batch[f"mask_{x}"] = (torch.rand(n, bands, size, size, generator=g) > 0.1).float()
        batch[f"cond_{x}"] = torch.randn(n, 2, generator=g)
    batch["params"] = torch.randn(n, 6, generator=g)
    batch["partner_image_B"] = torch.randn(n, 5, 24, 24, generator=g)
    batch["partner_neighbour_B"] = torch.randn(n, 5, 24, 24, generator=g)
    batch["partner_cond_B"] = torch.randn(n, 2, generator=g)
    if grad:
        for key in ("image_A", "image_B", "neighbour_A", "neighbour_B"):
            batch[key].requires_grad_(True)
    return batch


def module(objective, **kwargs):
    torch.manual_seed(0)
    return CounterfactualInstrumentsModule(objective=objective, width=8, **kwargs)


def inputs_reaching_instrument_encoder(model, batch):
    """Which views the instrument encoder's outputs depend on (non-zero gradient)."""
    outputs = []
    handle = model.instrument_encoder.register_forward_hook(lambda m, i, o: outputs.append(o))
    model.objective_terms(batch)
    handle.remove()
    views = ("image_A", "image_B", "neighbour_A", "neighbour_B")
    grads = torch.autograd.grad(
        sum(o.sum() for o in outputs), [batch[v] for v in views], allow_unused=True
    )
    return {v for v, g in zip(views, grads, strict=True) if g is not None and g.abs().sum() > 0}


def test_the_targets_own_view_never_reaches_the_instrument_encoder():
    batch = make_batch(grad=True)
    assert inputs_reaching_instrument_encoder(module("counterfactual"), batch) == {
        "neighbour_A",
        "neighbour_B",
    }
    # the leakage ablation reads the target's own views: the same test sees the difference
    leaky = inputs_reaching_instrument_encoder(module("same_object"), make_batch(grad=True))
    assert leaky == {"image_A", "image_B"}


def amplified(model):
    """At initialisation the encoders give almost the same latent for every view and the
    decoders' outputs are tiny beside the unit-variance test images, so chi2 barely depends on
    which latents feed which decoder (a term built from the wrong view passed a by-value check
    within its tolerance). Spread the latents (a fixed offset per instrument, encoder and item,
    the same on every call) and scale the output layers up."""

    def spread(salt):
        def hook(encoder, args, out):
            seed = 1000 * salt + "AB".index(args[1]) * 100 + out.shape[0]
            return out + 3.0 * torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))

        return hook

    for salt, encoder in enumerate((model.encoder, model.instrument_encoder)):
        if encoder is not None:
            encoder.register_forward_hook(spread(salt))
    with torch.no_grad():
        for decoder in (model.decoders or {}).values():
            decoder.out.weight.mul_(30.0)
    return model


def test_counterfactual_terms_by_value():
    model = amplified(module("counterfactual", self_weight=0.5))
    batch = make_batch()
    terms = model.objective_terms(batch)
    e, s, d = model.encoder, model.instrument_encoder, model.decoders
    zp_a, zp_b = e(batch["image_A"], "A"), e(batch["image_B"], "B")
    zs_a, zs_b = s(batch["neighbour_A"], "A"), s(batch["neighbour_B"], "B")

    def chi2(x, pred):
        return chi2_loss(pred, batch[f"image_{x}"], batch[f"ivar_{x}"], batch[f"mask_{x}"])

    cross = chi2("B", d["B"](zp_a, zs_b)) + chi2("A", d["A"](zp_b, zs_a))
    own = chi2("B", d["B"](zp_b, zs_b)) + chi2("A", d["A"](zp_a, zs_a))
    torch.testing.assert_close(terms["counterfactual"], cross)
    torch.testing.assert_close(terms["self"], 0.5 * own)
    # the check can tell the views apart: each latent swapped gives another value
    for wrong in (
        chi2("B", d["B"](zp_b, zs_b)) + chi2("A", d["A"](zp_b, zs_a)),
        chi2("B", d["B"](zp_a, zs_a * 0 + zs_b.flip(0))) + chi2("A", d["A"](zp_b, zs_a)),
        chi2("B", d["B"](zp_a, zs_b)) + chi2("A", d["A"](zp_b, zs_b * 0 + zs_a.flip(0))),
    ):
        assert not torch.isclose(terms["counterfactual"], wrong, rtol=1e-3)
    assert "self" not in module("counterfactual", self_weight=0.0).objective_terms(batch)


def test_baseline_objectives_by_value():
    batch = make_batch()

    def chi2(x, pred):
        return chi2_loss(pred, batch[f"image_{x}"], batch[f"ivar_{x}"], batch[f"mask_{x}"])

    ae = amplified(module("autoencoder"))
    z_a, z_b = ae.encoder(batch["image_A"], "A"), ae.encoder(batch["image_B"], "B")
    torch.testing.assert_close(
        ae.objective_terms(batch)["self"],
        chi2("A", ae.decoders["A"](z_a)) + chi2("B", ae.decoders["B"](z_b)),
    )
    tr = amplified(module("translation"))
    z_a, z_b = tr.encoder(batch["image_A"], "A"), tr.encoder(batch["image_B"], "B")
    torch.testing.assert_close(
        tr.objective_terms(batch)["translation"],
        chi2("B", tr.decoders["B"](z_a)) + chi2("A", tr.decoders["A"](z_b)),
    )
    sr = amplified(module("self_reconstruction"))
    zp = {x: sr.encoder(batch[f"image_{x}"], x) for x in "AB"}
    zs = {x: sr.instrument_encoder(batch[f"image_{x}"], x) for x in "AB"}
    torch.testing.assert_close(
        sr.objective_terms(batch)["self"],
        chi2("A", sr.decoders["A"](zp["A"], zs["A"]))
        + chi2("B", sr.decoders["B"](zp["B"], zs["B"])),
    )
    assert not torch.isclose(  # translation's terms cross the instruments
        tr.objective_terms(batch)["translation"],
        chi2("A", tr.decoders["A"](z_a)) + chi2("B", tr.decoders["B"](z_b)),
        rtol=1e-3,
    )
    assert not torch.isclose(  # the self-reconstruction reads each view's own z_s
        sr.objective_terms(batch)["self"],
        chi2("A", sr.decoders["A"](zp["A"], zs["A"]))
        + chi2("B", sr.decoders["B"](zp["B"], zs["A"].flip(0))),
        rtol=1e-3,
    )
    assert ae.encoder.trunk[-1].out_features == 16 + 4  # as wide as the dual encoder's two latents
    contrastive = amplified(module("contrastive", temperature=0.2))
    z_a, z_b = (contrastive.encoder(batch[f"image_{x}"], x) for x in "AB")
    torch.testing.assert_close(
        contrastive.objective_terms(batch)["info_nce"], info_nce(z_a, z_b, 0.2)
    )
    assert not torch.isclose(info_nce(z_a, z_b, 0.2), info_nce(z_a, z_a, 0.2), rtol=1e-3)


def test_the_oracle_decodes_the_true_parameters_and_condition():
    oracle = module("oracle")
    assert oracle.encoder is None and oracle.instrument_encoder is None
    batch = make_batch()
    base = oracle.objective_terms(batch)["counterfactual"]
    moved = dict(batch, params=batch["params"] + 1.0)
    assert not torch.allclose(oracle.objective_terms(moved)["counterfactual"], base)
    view = oracle.counterfactual_view(batch)
    torch.testing.assert_close(view, oracle.decoders["B"](batch["params"], batch["partner_cond_B"]))


def test_the_counterfactual_view_reads_the_partners_instrument_latent():
    batch = make_batch()
    dual = module("counterfactual")
    # the method reads the object beside the partner (the star of that exposure), not the
    # partner galaxy itself
    other = dict(batch, partner_neighbour_B=batch["partner_neighbour_B"].flip(0))
    assert not torch.allclose(dual.counterfactual_view(batch), dual.counterfactual_view(other))
    galaxy = dict(batch, partner_image_B=batch["partner_image_B"].flip(0))
    torch.testing.assert_close(dual.counterfactual_view(batch), dual.counterfactual_view(galaxy))
    expected = dual.decoders["B"](
        dual.encoder(batch["image_A"], "A"),
        dual.instrument_encoder(batch["partner_neighbour_B"], "B"),
    )
    torch.testing.assert_close(dual.counterfactual_view(batch), expected)
    leaky = module("same_object")  # reads the partner's own view, as it was trained
    torch.testing.assert_close(
        leaky.counterfactual_view(batch),
        leaky.decoders["B"](
            leaky.encoder(batch["image_A"], "A"),
            leaky.instrument_encoder(batch["partner_image_B"], "B"),
        ),
    )
    other = dict(batch, partner_image_B=batch["partner_image_B"].flip(0))
    # translation has no instrument latent: the partner cannot change its view
    translation = module("translation")
    torch.testing.assert_close(
        translation.counterfactual_view(batch), translation.counterfactual_view(other)
    )
    assert module("contrastive").counterfactual_view(batch) is None


@pytest.mark.parametrize("objective", ["counterfactual", "contrastive", "oracle"])
def test_a_few_steps_lower_the_loss(objective):
    model = module(objective)
    batch = make_batch(n=8)
    for x in "AB":  # a learnable structure: every item's view is a shifted copy of one image
        batch[f"image_{x}"] = batch[f"image_{x}"][:1] + 0.3 * torch.arange(8.0).view(8, 1, 1, 1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(30):
        loss = sum(model.objective_terms(batch).values())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0]


def test_flow_decoder_objective_and_its_noise_are_seeded_by_step():
    model = module("counterfactual", decoder="flow")
    batch = make_batch(n=2)
    first, again = model.objective_terms(batch), model.objective_terms(batch)
    torch.testing.assert_close(
        first["counterfactual"], again["counterfactual"]
    )  # same step, same noise
    view = model.counterfactual_view(batch)
    assert view.shape == (2, 5, 24, 24)
    with pytest.raises(ValueError, match="no decoder"):
        CounterfactualInstrumentsModule(objective="contrastive", decoder="flow")


@pytest.mark.parametrize("decoder", ["deterministic", "flow"])
def test_render_is_the_decoder_or_the_seeded_mean_of_flow_draws(decoder):
    """The one renderer behind the counterfactual views and the swap diagnostic: the
    deterministic decoder's output as is; for the flow decoder the mean of ``flow_samples``
    draws, the same for the same latents (a seeded generator) and changed by z_s."""
    model = module("counterfactual", decoder=decoder, flow_samples=2, flow_steps=2).eval()
    z_p, z_s = torch.randn(3, 16), torch.randn(3, 4)
    shape = (3, 5, 24, 24)
    view = model.render("B", z_p, z_s, shape)
    assert view.shape == shape
    torch.testing.assert_close(view, model.render("B", z_p, z_s, shape))
    assert not torch.allclose(view, model.render("B", z_p, z_s + 1.0, shape))
    if decoder == "deterministic":
        torch.testing.assert_close(view, model.decoders["B"](z_p, z_s))
    else:
        generator = torch.Generator().manual_seed(0)
        draws = [model.decoders["B"].sample(z_p, z_s, shape, generator) for _ in range(2)]
        torch.testing.assert_close(view, torch.stack(draws).mean(0))


def capture_logs(model) -> dict:
    logged = {}
    model.log = lambda name, value, **kwargs: logged.__setitem__(name, float(value))
    return logged


def test_steps_log_the_objective_and_the_views_chi2_by_value():
    """training_step returns (and validation/test log) the sum of the objective's terms;
    test_step also logs the counterfactual view's chi2 (eq. 2) against the noise-free truth."""
    model = module("counterfactual").eval()
    batch = make_batch(n=3)
    g = torch.Generator().manual_seed(5)
    batch["truth_B"] = torch.randn(3, 5, 24, 24, generator=g)
    batch["partner_ivar_B"] = torch.rand(3, 5, 24, 24, generator=g) + 0.5
    total = float(sum(model.objective_terms(batch).values()))
    logged = capture_logs(model)
    assert float(model.training_step(batch, 0)) == pytest.approx(total, rel=1e-6)
    assert set(model.loss_terms) == {"counterfactual", "self"}
    model.validation_step(batch, 0)
    model.test_step(batch, 0)
    view = model.counterfactual_view(batch)
    chi2 = chi2_loss(view, batch["truth_B"], batch["partner_ivar_B"])
    assert logged["train/loss"] == logged["val/loss"] == logged["test/loss"] == pytest.approx(total)
    assert logged["test/counterfactual_chi2"] == pytest.approx(float(chi2), rel=1e-6)


def test_test_epoch_end_logs_each_metrics_finite_mean(monkeypatch):
    from types import SimpleNamespace

    import numpy as np

    from counterfactual_instruments import evaluation

    model = module("counterfactual")
    metrics = {"psf_r2": np.array([0.2, np.nan, 0.4]), "recall_at_1": np.array([np.nan])}
    monkeypatch.setattr(evaluation, "evaluate", lambda m, d: metrics)
    stub = SimpleNamespace(datamodule=object(), world_size=1)
    monkeypatch.setattr(type(model), "trainer", property(lambda self: stub))
    logged = capture_logs(model)
    model.on_test_epoch_end()
    assert logged["test/psf_r2"] == pytest.approx(0.3)
    assert np.isnan(logged["test/recall_at_1"])
    stub.world_size = 2  # probes need the whole training split in one process
    logged.clear()
    model.on_test_epoch_end()
    assert logged == {}


@pytest.mark.parametrize("schedule", ["cosine", "constant"])
def test_optimizer_is_adamw_with_a_cosine_decay_to_zero_per_step(schedule):
    model = module(
        "counterfactual", lr=0.01, weight_decay=0.1, lr_schedule=schedule, lr_decay_steps=10
    )
    config = model.configure_optimizers()
    optimizer = config if schedule == "constant" else config["optimizer"]
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.param_groups[0]["weight_decay"] == 0.1
    assert optimizer.param_groups[0]["lr"] == 0.01
    if schedule == "constant":
        return
    assert config["lr_scheduler"]["interval"] == "step"
    scheduler = config["lr_scheduler"]["scheduler"]
    rates = []
    for _ in range(10):
        optimizer.step()
        scheduler.step()
        rates.append(optimizer.param_groups[0]["lr"])
    assert rates[4] == pytest.approx(0.005) and rates[-1] == pytest.approx(0.0, abs=1e-12)
