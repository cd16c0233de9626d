"""The language LightningModule by value: what the constructor builds from its defaults, the
optimizers, the fit-start checks, the checkpoint hooks, the feedback draw, g_down and its EMA,
the designer's loss and logs, every arm's loss and logs, the refresh schedule, and the
evaluation hooks (what validation and test log, with which values).

These close the mutation lane's gaps in model.py (`uv run tools/ci.py mutate v-pretraining`):
each test pins a number the default path computes, not only that a step runs."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from papers_cli import ConfigError
from vpretrain import baselines, core, formats, model
from vpretrain.model import VPretrainModule, build_learner


class Recorder:
    """Stands in for LightningModule.log: name -> (value, keyword arguments)."""

    def __init__(self):
        self.logged = {}

    def __call__(self, name, value, **kwargs):
        self.logged[name] = (value.detach().clone() if torch.is_tensor(value) else value, kwargs)

    def value(self, name) -> float:
        return float(self.logged[name][0])


def attach(module, **trainer):
    """A stand-in Trainer: what the hooks read of it (datamodule, global_step)."""
    module._trainer = SimpleNamespace(**trainer)
    return module


# --- the constructor and the learner it builds --------------------------------------------
DEFAULTS = {
    "arm": "vpretrain",
    "pretrained": None,
    "init_from": None,
    "vocab_size": 2048,
    "hidden_size": 96,
    "layers": 3,
    "heads": 4,
    "max_positions": 256,
    "lr": 1e-3,
    "weight_decay": 0.0,
    "top_k": 16,
    "lambda_max": 0.9,
    "designer_lr": 3e-3,
    "designer_width": 64,
    "kappa": 0.05,
    "mu": 0.0,
    "smoothing": 0.1,
    "temperature": 1.0,
    "fixed_mixing": 0.5,
    "refresh_every": 10,
    "feedback_batch": 128,
    "gradient_ema": 0.5,
    "preconditioner": "identity",
    "optimizer": "adamw",
    "value_positions": "all",
    "max_new_tokens": 6,
    "attn_implementation": "eager",
}


def test_a_default_module_stores_its_defaults_and_builds_the_learner_and_designer_from_them():
    signature = inspect.signature(VPretrainModule.__init__).parameters
    assert {n: p.default for n, p in signature.items() if n != "self"} == DEFAULTS
    module = VPretrainModule()
    assert dict(module.hparams) == DEFAULTS  # read from a built module too (mutation lane)
    config = module.learner.config
    built = (config.vocab_size, config.hidden_size, config.intermediate_size,
             config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads,
             config.max_position_embeddings, config.tie_word_embeddings,
             config._attn_implementation)  # fmt: skip
    assert built == (2048, 96, 384, 3, 4, 2, 256, True, "eager")
    assert module.automatic_optimization is False
    designer = module.designer
    assert isinstance(designer, core.TargetDesigner)
    assert (designer.k, designer.lambda_max) == (16, 0.9)
    reference = core.TargetDesigner(96, 16, 64, 0.9)  # hidden size, K, width, lambda_max
    assert [p.shape for p in designer.parameters()] == [p.shape for p in reference.parameters()]
    optimizer = module.designer_optimizer
    assert type(optimizer) is torch.optim.Adam and optimizer.defaults["lr"] == 3e-3
    assert {id(p) for p in optimizer.param_groups[0]["params"]} == {
        id(p) for p in designer.parameters()
    }
    assert module.downstream_gradient == {} and module.feedback is None


def test_one_head_gets_one_key_value_head_and_arms_without_a_designer_have_none():
    module = VPretrainModule(arm="plain", vocab_size=64, hidden_size=16, layers=1, heads=1)
    assert module.learner.config.num_key_value_heads == 1
    assert module.learner.config.intermediate_size == 64
    assert module.designer is None and module.designer_optimizer is None
    assert VPretrainModule(arm="random_gradient", vocab_size=64, hidden_size=16, layers=1).designer


@pytest.mark.parametrize("arm", ["vpretrain", "random_gradient", "alignment_reweight", "plain"])
def test_only_the_valued_arms_check_that_attention_supports_the_jvp(arm, monkeypatch):
    checked = []
    monkeypatch.setattr(formats, "check_attention_supports_jvp", checked.append)
    module = VPretrainModule(arm=arm, vocab_size=64, hidden_size=16, layers=1)
    assert checked == ([module.learner] if arm in model.VALUED_ARMS else [])


def test_bad_mixing_and_top_k_are_clear_errors_and_the_ends_of_the_mixing_range_are_allowed():
    small = dict(vocab_size=64, hidden_size=16, layers=1)
    message = "--model.fixed_mixing is a probability: choose it in [0, 1]"
    for bad in (1.5, -0.1):
        with pytest.raises(ConfigError) as error:
            VPretrainModule(arm="fixed_soft", fixed_mixing=bad, **small)
        assert str(error.value) == message
    for ok in (0.0, 1.0):
        VPretrainModule(arm="fixed_soft", fixed_mixing=ok, **small)
    VPretrainModule(arm="plain", fixed_mixing=1.5, **small)  # only the fixed_soft arm reads it
    with pytest.raises(ConfigError, match="top_k"):
        VPretrainModule(arm="plain", top_k=64, **small)


def test_the_module_passes_pretrained_attention_and_lambda_max_on(tmp_path):
    tiny = build_learner(None, 64, 16, 1, 2, 32)
    tiny.save_pretrained(tmp_path / "ckpt")
    module = VPretrainModule(arm="plain", pretrained=str(tmp_path / "ckpt"), vocab_size=999,
                             attn_implementation="sdpa")  # fmt: skip
    assert (module.learner.config.hidden_size, module.learner.config.vocab_size) == (16, 64)
    assert module.learner.config._attn_implementation == "sdpa"
    for (name, a), b in zip(
        tiny.state_dict().items(), module.learner.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), name
    designer = VPretrainModule(vocab_size=64, hidden_size=16, layers=1, lambda_max=0.5).designer
    assert designer.lambda_max == 0.5


def test_init_from_loads_the_learner_weights(tmp_path):
    small = dict(arm="plain", vocab_size=64, hidden_size=16, layers=1)
    torch.manual_seed(1)
    source = VPretrainModule(**small)
    torch.save(source.learner.state_dict(), tmp_path / "learner.pt")
    torch.manual_seed(2)
    loaded = VPretrainModule(init_from=tmp_path / "learner.pt", **small)
    fresh = VPretrainModule(**small)
    for (name, a), b in zip(
        source.learner.state_dict().items(),
        loaded.learner.state_dict().values(),
        strict=True,
    ):
        assert torch.equal(a, b), name
    assert not all(torch.equal(a, c) for a, c in zip(
        source.learner.state_dict().values(), fresh.learner.state_dict().values(), strict=True
    ))  # fmt: skip


def test_build_learner_loads_a_local_checkpoint_offline_with_the_attention_asked_for(
    tmp_path, monkeypatch
):
    tiny = build_learner(None, 64, 16, 1, 2, 32)
    assert tiny.config._attn_implementation == "eager"  # the default
    tiny.save_pretrained(tmp_path / "ckpt")
    loaded = build_learner(str(tmp_path / "ckpt"), 9, 9, 9, 9, 9)  # sizes come from the folder
    assert loaded.config.hidden_size == 16 and loaded.config._attn_implementation == "eager"
    for (name, a), b in zip(tiny.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    calls = []
    original = model.AutoModelForCausalLM.from_pretrained

    def spy(path, **kwargs):
        calls.append((path, kwargs))
        return original(path, **kwargs)

    monkeypatch.setattr(model.AutoModelForCausalLM, "from_pretrained", spy)
    build_learner(str(tmp_path / "ckpt"), 9, 9, 9, 9, 9, attn_implementation="sdpa")
    assert calls == [
        (str(tmp_path / "ckpt"), {"local_files_only": True, "attn_implementation": "sdpa"})
    ]


def test_a_missing_checkpoint_says_what_to_put_where(tmp_path):
    missing = tmp_path / "nothing"
    with pytest.raises(ConfigError) as error:
        build_learner(str(missing), 64, 16, 1, 2, 32)
    text = str(error.value)
    assert text.startswith(f"--model.pretrained {missing}: no local checkpoint there (")
    assert text.endswith(
        "). Put a Hugging Face folder (config.json, model.safetensors, tokenizer files) there, "
        "e.g. Qwen2.5-0.5B downloaded on a machine with internet."
    )


# --- optimizers, fit start, checkpoints -----------------------------------------------------
def test_the_learner_optimizer_is_adamw_or_plain_sgd_over_the_learner_only():
    small = dict(vocab_size=64, hidden_size=16, layers=1, lr=0.02)
    adamw = VPretrainModule(weight_decay=0.1, **small).configure_optimizers()
    assert type(adamw) is torch.optim.AdamW
    assert adamw.defaults["lr"] == 0.02 and adamw.defaults["weight_decay"] == 0.1
    module = VPretrainModule(optimizer="sgd", weight_decay=0.1, **small)
    sgd = module.configure_optimizers()
    assert type(sgd) is torch.optim.SGD
    assert (sgd.defaults["lr"], sgd.defaults["momentum"], sgd.defaults["weight_decay"]) == (
        0.02, 0, 0
    )  # fmt: skip
    learner = {id(p) for p in module.learner.parameters()}
    assert {id(p) for p in sgd.param_groups[0]["params"]} == learner


def test_fit_start_takes_the_feedback_and_refuses_annotation_arms_on_real_data(data):
    small = dict(vocab_size=64, hidden_size=16, layers=1)
    module = attach(VPretrainModule(arm="plain", **small), datamodule=data)
    module.on_fit_start()
    assert module.feedback is data.feedback
    kept = attach(VPretrainModule(arm="plain", **small), datamodule=data)
    kept.feedback = "mine"
    kept.on_fit_start()
    assert kept.feedback == "mine"  # a feedback set given before fit is kept
    alone = attach(VPretrainModule(arm="plain", **small))  # a trainer without a data module
    alone.on_fit_start()
    assert alone.feedback is None
    attach(VPretrainModule(arm="oracle", **small)).on_fit_start()  # nothing says it is real
    real = SimpleNamespace(real=True, feedback="real feedback")
    for arm in ("oracle", "in_family"):
        module = attach(VPretrainModule(arm=arm, **small), datamodule=real)
        with pytest.raises(ConfigError) as error:
            module.on_fit_start()
        assert str(error.value) == (
            f"--model.arm {arm} needs the miniature's annotations of corrupted numbers; real "
            "corpora have none."
        )
    module = attach(VPretrainModule(value_positions="results", **small), datamodule=real)
    with pytest.raises(ConfigError) as error:
        module.on_fit_start()
    assert str(error.value) == (
        "--model.value_positions results needs the miniature's annotations of stated results; "
        "real corpora have none: use all."
    )
    fine = attach(VPretrainModule(arm="plain", **small), datamodule=real)
    fine.on_fit_start()
    assert fine.feedback == "real feedback"
    attach(VPretrainModule(value_positions="results", **small), datamodule=data).on_fit_start()


def test_the_checkpoint_carries_the_designer_optimizer_and_g_down(data, tools):
    module, _ = tools.module_for(data)
    module.training_step(tools.batch_of(data, 5), 0)
    checkpoint = {}
    module.on_save_checkpoint(checkpoint)
    assert set(checkpoint) == {"designer_optimizer", "downstream_gradient"}
    assert checkpoint["downstream_gradient"] == module.downstream_gradient
    assert checkpoint["downstream_gradient"] is not module.downstream_gradient
    restored, _ = tools.module_for(data)
    restored.on_load_checkpoint(checkpoint)
    state = restored.designer_optimizer.state_dict()
    saved = module.designer_optimizer.state_dict()
    assert state["param_groups"] == saved["param_groups"] and len(state["state"]) > 0
    for key, value in saved["state"].items():
        assert torch.equal(state["state"][key]["exp_avg_sq"], value["exp_avg_sq"])
    assert restored.downstream_gradient.keys() == module.downstream_gradient.keys()
    for name, g in module.downstream_gradient.items():
        assert torch.equal(restored.downstream_gradient[name], g)
    plain, _ = tools.module_for(data, arm="plain")
    empty = {}
    plain.on_save_checkpoint(empty)
    assert empty == {"downstream_gradient": {}}
    plain.downstream_gradient = {"stale": torch.ones(1)}
    plain.on_load_checkpoint(checkpoint)  # a designer's state is ignored where there is none
    assert plain.downstream_gradient.keys() == module.downstream_gradient.keys()
    plain.on_load_checkpoint({})
    assert plain.downstream_gradient == {}
    fresh, _ = tools.module_for(data)
    fresh.on_load_checkpoint({"downstream_gradient": {}})  # no designer state saved: untouched
    assert fresh.designer_optimizer.state_dict()["state"] == {}


# --- g_down: the feedback draw, the gradient, its EMA, the random control ------------------
def test_the_feedback_minibatch_is_the_documented_seeded_draw(data, tools):
    module, _ = tools.module_for(data, feedback_batch=5)
    for step in (0, 7):
        generator = torch.Generator().manual_seed(1_000_003 * step + 17)
        index = torch.randperm(len(data.feedback), generator=generator)[:5]
        drawn = module.feedback_minibatch(step)
        expected = data.feedback.subset(index)
        assert drawn.keys() == expected.keys()
        for key, value in expected.items():
            assert torch.equal(drawn[key], value), key


def feedback_gradient(module, step):
    named = dict(module.learner.named_parameters())
    loss = module.downstream_loss(module.feedback_minibatch(step))
    return dict(zip(named, torch.autograd.grad(loss, list(named.values())), strict=True))


def test_g_down_is_the_feedback_gradient_then_its_ema(data, tools):
    module, _ = tools.module_for(data, gradient_ema=0.2)
    first = feedback_gradient(module, 0)
    module.refresh_downstream_gradient(0)
    assert module.downstream_gradient.keys() == first.keys()
    for name, g in first.items():  # the first refresh takes the fresh gradient whole
        assert torch.allclose(module.downstream_gradient[name], g, atol=1e-7), name
    second = feedback_gradient(module, 4)
    module.refresh_downstream_gradient(4)
    for name, g in second.items():
        expected = 0.2 * first[name] + 0.8 * g
        assert torch.allclose(module.downstream_gradient[name], expected, atol=1e-7), name
    assert all(not g.requires_grad for g in module.downstream_gradient.values())


def test_the_random_control_draws_the_documented_noise_at_g_downs_norm(data, tools):
    module, _ = tools.module_for(data, arm="random_gradient")
    true = feedback_gradient(module, 3)
    module.refresh_downstream_gradient(3)
    generator = torch.Generator().manual_seed(7_919 * 3 + 3)
    noise = {n: torch.randn(g.shape, generator=generator) for n, g in true.items()}
    norm = torch.sqrt(sum((g**2).sum() for g in true.values()))
    noise_norm = torch.sqrt(sum((g**2).sum() for g in noise.values()))
    for name, g in noise.items():
        expected = g * norm / noise_norm
        assert torch.allclose(module.downstream_gradient[name], expected, rtol=1e-5), name


def test_the_tangent_is_g_down_or_the_adam_preconditioned_g_down(data, tools):
    module, optimizer = tools.module_for(data, preconditioner="adam", arm="plain")
    module.training_step(tools.batch_of(data, 6), 0)  # Adam has state now
    module.downstream_gradient = {n: torch.full_like(p, 2.0) for n, p in
                                  module.learner.named_parameters()}  # fmt: skip
    scales = core.adam_preconditioner(optimizer, dict(module.learner.named_parameters()))
    assert any(not torch.allclose(s, torch.ones_like(s)) for s in scales.values())
    # a LightningOptimizer wraps the torch one; a bare torch optimizer is used as it is
    for handed in (SimpleNamespace(optimizer=optimizer), optimizer):
        module.optimizers = lambda handed=handed: handed
        tangent = module.tangent()
        assert tangent.keys() == scales.keys()
        for name, s in scales.items():
            assert torch.equal(tangent[name], s * 2.0), name
    identity, _ = tools.module_for(data)
    identity.downstream_gradient = {"w": torch.arange(3.0)}
    assert identity.tangent() is identity.downstream_gradient


# --- the designer's targets, loss and logs --------------------------------------------------
def test_the_designers_loss_and_logs_are_eq_7_by_value(data, tools):
    h = dict(kappa=0.3, mu=0.2, smoothing=0.2, temperature=0.7, lr=2e-3, top_k=4)
    module, _ = tools.module_for(data, **h)
    module.refresh_downstream_gradient(0)
    batch = tools.corrupted_batch(data)  # it holds stated results: the mask keeps positions
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    positions = batch["result"][:, 1:]
    assert positions.any()
    slots, q, d_at, loss, logs = module.designed_targets(inputs, observed, positions)
    named = dict(module.learner.named_parameters())
    log_probs, directions, hidden = core.log_probs_and_directions(
        module.learner, named, module.tangent(), inputs
    )
    assert torch.equal(slots, core.candidates(log_probs, observed, 4))
    at = log_probs.gather(-1, slots)
    assert torch.allclose(d_at, directions.gather(-1, slots))
    mixing, scores = module.designer(hidden.detach().float(), at.detach())
    expected_q = core.soft_targets(mixing, scores, 0.7)
    assert torch.allclose(q, expected_q) and q.requires_grad
    value = core.predicted_decrease(expected_q, d_at, 2e-3, positions)
    scale = d_at.std()
    kl, entropy = core.designer_regularisers(expected_q, 0.2, positions)
    objective = value / (2e-3 * scale)
    # every term is large enough for a wrong sign or scale to show
    assert min(abs(float(objective)), float(kl), float(entropy)) > 1e-3
    expected_loss = -objective + 0.3 * kl - 0.2 * entropy
    assert torch.allclose(loss, expected_loss, rtol=1e-5)
    assert set(logs) == {"value", "mixing", "designer_kl", "d_scale", "score_scale",
                         "score_entropy"}  # fmt: skip
    assert torch.allclose(logs["value"], value) and not logs["value"].requires_grad
    assert torch.allclose(logs["mixing"], mixing.mean())
    assert torch.allclose(logs["designer_kl"], kl)
    assert torch.allclose(logs["d_scale"], scale)
    assert torch.equal(logs["score_scale"], module.designer.score_scale.detach())
    assert torch.allclose(logs["score_entropy"], core.score_entropy(scores, 0.7))
    # the same batch with every position counted gives another value (the mask is passed on)
    _, _, _, _, everywhere = module.designed_targets(inputs, observed)
    assert not torch.allclose(everywhere["value"], logs["value"])


def test_the_designer_loss_scale_is_floored_where_d_has_no_spread(data, tools):
    module, _ = tools.module_for(data, kappa=0.0, mu=0.0)
    module.downstream_gradient = {n: torch.zeros_like(p) for n, p in
                                  module.learner.named_parameters()}  # fmt: skip
    batch = tools.batch_of(data, 7)
    _, _, d_at, loss, logs = module.designed_targets(batch["ids"][:, :-1], batch["ids"][:, 1:])
    assert torch.count_nonzero(d_at) == 0
    assert float(logs["d_scale"]) == pytest.approx(1e-12) and float(loss) == 0.0


def test_the_alignment_arm_gets_the_learners_slots_and_directions_without_a_designer(data, tools):
    module, _ = tools.module_for(data, arm="alignment_reweight")
    module.refresh_downstream_gradient(0)
    batch = tools.batch_of(data, 8)
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    slots, at, d_at, loss, logs = module.designed_targets(inputs, observed)
    log_probs, directions, _ = core.log_probs_and_directions(
        module.learner, dict(module.learner.named_parameters()), module.tangent(), inputs
    )
    assert torch.allclose(at, log_probs.gather(-1, slots))
    assert torch.allclose(d_at, directions.gather(-1, slots))
    assert loss is None and logs == {}


# --- every arm's loss and logs, the refresh schedule -----------------------------------------
def arm_step(data, tools, arm, index=9, **overrides):
    """(module, batch, log_probs before the step, the recorded logs, the returned loss)."""
    module, _ = tools.module_for(data, arm=arm, **overrides)
    recorder = Recorder()
    module.log = recorder
    batch = tools.batch_of(data, index)
    with torch.no_grad():
        log_probs = module.learner_log_probs(batch["ids"][:, :-1])
    loss = module.training_step(batch, 0)
    return module, batch, log_probs, recorder, loss


def nll_of(log_probs, targets):
    return -log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def test_plain_and_oracle_losses_are_the_nll_of_their_targets(data, tools):
    _, batch, log_probs, logs, loss = arm_step(data, tools, "plain")
    observed = nll_of(log_probs, batch["ids"][:, 1:]).mean()
    assert float(loss) == pytest.approx(float(observed), rel=1e-5)
    assert not loss.requires_grad
    assert logs.value("train/loss") == pytest.approx(float(observed), rel=1e-5)
    assert logs.value("train/observed_nll") == pytest.approx(float(observed), rel=1e-5)
    assert logs.logged["train/loss"][1] == {"prog_bar": True}
    assert set(logs.logged) == {"train/loss", "train/observed_nll"}
    batch_index = next(i for i in range(40) if tools.batch_of(data, i)["corrupted"][:, 1:].any())
    _, batch, log_probs, logs, loss = arm_step(data, tools, "oracle", index=batch_index)
    clean = nll_of(log_probs, batch["clean_ids"][:, 1:]).mean()
    observed = nll_of(log_probs, batch["ids"][:, 1:]).mean()
    assert float(loss) == pytest.approx(float(clean), rel=1e-5)
    assert abs(float(clean) - float(observed)) > 1e-4
    assert logs.value("train/observed_nll") == pytest.approx(float(observed), rel=1e-5)


def test_the_fixed_soft_and_alignment_losses_by_value(data, tools):
    _, batch, log_probs, logs, loss = arm_step(data, tools, "fixed_soft", fixed_mixing=0.3)
    slots = core.candidates(log_probs, batch["ids"][:, 1:], 4)
    at = log_probs.gather(-1, slots)
    expected = core.soft_cross_entropy(at, baselines.fixed_soft_targets(at, 0.3))
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    module, _ = tools.module_for(data, arm="alignment_reweight")
    module.refresh_downstream_gradient(0)
    batch = tools.batch_of(data, 9)
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    _, _, d_at, _, _ = module.designed_targets(inputs, observed)
    weights = baselines.alignment_token_weights(
        d_at[..., core.OBSERVED].detach(), torch.ones_like(observed, dtype=torch.float32)
    )
    with torch.no_grad():
        nll = nll_of(module.learner_log_probs(inputs), observed)
    recorder = Recorder()
    module.log = recorder
    loss = module.training_step(batch, 0)
    assert float(loss) == pytest.approx(float((weights * nll).mean()), rel=1e-4)
    assert recorder.value("train/weight_max") == pytest.approx(float(weights.max()), rel=1e-4)


@pytest.mark.parametrize("arm", ["vpretrain", "random_gradient"])
def test_the_methods_loss_is_eq_1_on_its_detached_targets_and_the_designer_steps(data, tools, arm):
    module, _ = tools.module_for(data, arm=arm, designer_lr=1e-3)
    recorder = Recorder()
    module.log = recorder
    batch = tools.batch_of(data, 10)
    inputs, observed = batch["ids"][:, :-1], batch["ids"][:, 1:]
    module.refresh_downstream_gradient(0)
    with torch.no_grad():
        slots, q, _, _, logs = module.designed_targets(inputs, observed)
        expected = core.soft_cross_entropy(module.learner_log_probs(inputs).gather(-1, slots), q)
    designer_before = [p.detach().clone() for p in module.designer.parameters()]
    _, _, _, designer_loss, _ = module.designed_targets(inputs, observed)
    designer_grads = torch.autograd.grad(
        designer_loss, list(module.designer.parameters()), allow_unused=True
    )
    loss = module.training_step(batch, 0)
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    assert recorder.value("train/value") == pytest.approx(float(logs["value"]), rel=1e-4)
    assert {"train/mixing", "train/designer_kl", "train/d_scale", "train/score_scale",
            "train/score_entropy"} <= set(recorder.logged)  # fmt: skip
    # Adam's first step is -lr * sign(gradient) where the gradient is not tiny: the designer
    # descends its own loss (eq. 7), with the learner's loss adding nothing to its gradient
    checked = 0
    for before, after, grad in zip(
        designer_before, module.designer.parameters(), designer_grads, strict=True
    ):
        if grad is None:
            continue
        clear = grad.abs() > 1e-5
        step = (after.detach() - before)[clear]
        assert torch.allclose(step, -1e-3 * grad[clear].sign(), rtol=1e-3, atol=1e-7)
        checked += int(clear.sum())
    assert checked > 0


@pytest.mark.parametrize("arm", ["vpretrain", "alignment_reweight", "plain"])
def test_g_down_is_refreshed_every_refresh_every_steps_and_whenever_it_is_missing(data, tools, arm):
    module, _ = tools.module_for(data, arm=arm, refresh_every=3)
    refreshed = []
    original = module.refresh_downstream_gradient

    def spy(step):
        refreshed.append(step)
        original(step)

    module.refresh_downstream_gradient = spy
    for step in range(5):
        attach(module, global_step=step)
        if step == 2:
            module.downstream_gradient = {}  # e.g. a checkpoint saved without it
        module.training_step(tools.batch_of(data, 11 + step), step)
    assert refreshed == ([0, 2, 3] if arm in model.VALUED_ARMS else [])


# --- evaluation ---------------------------------------------------------------------------
def test_validation_and_test_log_answer_nll_pass_at_1_prose_nll_and_perplexity(data, tools):
    module, _ = tools.module_for(data, arm="plain", max_new_tokens=3)
    attach(module, datamodule=data)
    recorder = Recorder()
    module.log = recorder
    problems = next(iter(data.test_dataloader()[0]))
    prose = next(iter(data.test_dataloader()[1]))
    module.on_test_epoch_start()
    module.on_test_epoch_end()
    assert recorder.logged == {}  # no prose blocks seen: no perplexity
    module.test_step(problems, 0, 0)
    nll = core.answer_nll(module.learner_log_probs, problems["input_ids"],
                          problems["attention_mask"], problems["answer_mask"])  # fmt: skip
    assert recorder.value("test/answer_nll") == pytest.approx(float(nll.mean()), rel=1e-5)
    assert recorder.logged["test/answer_nll"][1] == {
        "add_dataloader_idx": False,
        "batch_size": len(problems["index"]),
    }
    answers = module.greedy_answers(problems)
    chosen = [data.test_problems.problems[int(i)] for i in problems["index"]]
    expected = formats.pass_at_1(answers, chosen).mean()
    assert recorder.value("test/pass_at_1") == pytest.approx(float(expected))
    assert recorder.logged["test/pass_at_1"][1] == {
        "add_dataloader_idx": False,
        "batch_size": len(chosen),
    }
    assert torch.equal(module.pass_at_1(problems), torch.tensor(formats.pass_at_1(
        answers, chosen), dtype=torch.float32))  # fmt: skip
    module.test_step(prose, 0, 1)
    token = module.token_nll(prose["ids"])
    assert recorder.value("test/prose_nll") == pytest.approx(float(token), rel=1e-6)
    assert recorder.logged["test/prose_nll"][1] == {"add_dataloader_idx": False}
    second = {"ids": prose["ids"].flip(0)[:2]}
    module.test_step(second, 1, 1)
    module.on_test_epoch_end()
    mean = (float(token) + float(module.token_nll(second["ids"]))) / 2
    assert recorder.value("test/perplexity") == pytest.approx(np.exp(mean), rel=1e-5)

    recorder.logged.clear()
    module.on_validation_epoch_start()
    module.validation_step(problems, 0, 0)
    module.validation_step(prose, 0, 1)
    module.on_validation_epoch_end()
    assert set(recorder.logged) == {"val/answer_nll", "val/prose_nll", "val/perplexity"}
    assert recorder.value("val/answer_nll") == pytest.approx(float(nll.mean()), rel=1e-5)
    assert recorder.value("val/perplexity") == pytest.approx(float(np.exp(float(token))))
    recorder.logged.clear()
    module.validation_step(problems, 0)  # the default dataloader index is the problems'
    assert set(recorder.logged) == {"val/answer_nll"}
    module.test_step(problems, 0)
    assert set(recorder.logged) == {"val/answer_nll", "test/answer_nll", "test/pass_at_1"}


def test_learner_log_probs_are_the_log_softmax_of_the_masked_forward(data, tools):
    module, _ = tools.module_for(data, arm="plain")
    ids = tools.batch_of(data, 12)["ids"][:, :8]
    mask = torch.ones_like(ids)
    mask[0, :3] = 0  # left padding on the first row
    with torch.no_grad():
        logits = module.learner(input_ids=ids, attention_mask=mask).logits
        log_probs = module.learner_log_probs(ids, mask)
        unmasked = module.learner_log_probs(ids)
    assert torch.allclose(log_probs, torch.log_softmax(logits.float(), -1), atol=1e-6)
    assert not torch.allclose(log_probs[0], unmasked[0], atol=1e-4)
