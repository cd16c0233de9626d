"""Value tests of the training path the claim runs (issue 56): stage 1's loss, the cross-day
meta-episodes, the learned step-size shapes, the validation sessions and the claim's
adaptation diagnostics."""

import math

import pytest
import torch

from ibci_fewshot import core
from ibci_fewshot.claim import adaptation_diagnostics, start_against_identity
from ibci_fewshot.data import IbciDataModule, collate_episodes
from ibci_fewshot.model import IbciModule, merge_batches


def episode(seed: int, session: int, n: int = 2, channels: int = 6):
    g = torch.Generator().manual_seed(seed)
    return {
        "x": torch.randn(n, 8, channels, generator=g),
        "lengths": torch.tensor([8, 7][:n]),
        "y": torch.tensor([[1, 2], [3, 0]][:n]),
        "y_lengths": torch.tensor([2, 1][:n]),
        "session": torch.full((n,), session),
    }


def small_module(**kwargs) -> IbciModule:
    torch.manual_seed(0)
    defaults = dict(
        channels=6, n_sessions=2, projection=4, hidden=8, kernel=2, stride=1, dropout=0.0
    )
    return IbciModule(**{**defaults, **kwargs})


def hand_ctc(module, batch, session_layers=False):
    x = core.gaussian_smooth(batch["x"], module.hparams.smooth_sigma)
    if session_layers:
        layers = module.session_layers
        w, b = layers.weight[batch["session"]], layers.bias[batch["session"]]
        x = torch.nn.functional.softsign(torch.einsum("btc,bdc->btd", x, w) + b[:, None])
    log_probs, lengths = module.decoder(x, batch["lengths"])
    return torch.nn.functional.ctc_loss(
        log_probs.transpose(0, 1),
        batch["y"],
        lengths,
        batch["y_lengths"],
        blank=core.BLANK,
        reduction="mean",
        zero_infinity=True,
    )


@pytest.mark.parametrize("backbone", ["pooled", "session_layers"])
def test_stage_one_loss_is_the_ctc_of_every_sentence_of_every_episode(backbone):
    """Eq. 1 by hand with the augmentation off: every support and query sentence of every
    episode in one padded batch, through the identity (pooled) or each sentence's own session
    layer; with the augmentation on, the same draws by hand."""
    module = small_module(backbone=backbone, white_noise=0.0, offset_sd=0.0, gain_sd=0.0)
    with torch.no_grad():  # session layers away from the identity, so routing matters
        if module.session_layers is not None:
            module.session_layers.weight.mul_(torch.tensor([0.5, 2.0])[:, None, None])
            module.session_layers.bias.add_(torch.tensor([[0.3], [-0.3]]))
    episodes = [
        {"support": episode(1, 0), "query": episode(2, 1)},
        {"support": episode(3, 1), "query": episode(4, 0, n=1)},
    ]
    batch = merge_batches([e[p] for e in episodes for p in ("support", "query")])
    assert batch["x"].shape[0] == 7
    expected = hand_ctc(module, batch, session_layers=backbone == "session_layers")
    torch.testing.assert_close(module.stage1_loss(episodes), expected)

    noisy = small_module(backbone=backbone, white_noise=0.3, offset_sd=0.2, gain_sd=0.1)
    torch.manual_seed(5)
    loss = noisy.stage1_loss(episodes)
    torch.manual_seed(5)
    augmented = dict(batch, x=core.drift_augment(batch["x"], 0.3, 0.2, 0.1))
    torch.testing.assert_close(
        loss, hand_ctc(noisy, augmented, session_layers=backbone == "session_layers")
    )
    assert not torch.isclose(loss, hand_ctc(noisy, batch, backbone == "session_layers"))


def test_training_step_reads_stage_one_episodes_then_the_meta_episodes():
    module = small_module(stage1_steps=1, episode_gain_sd=0, episode_offset_sd=0, episode_mix_sd=0)
    module.log = lambda *a, **k: None
    stage1 = [{"support": episode(1, 0), "query": episode(2, 0)}]
    stage2 = [{"support": episode(3, 1), "query": episode(4, 1)}]
    batch = {"episodes": stage1, "meta_episodes": stage2}

    def seeded(loss_of, *args):  # the same augmentation draws for both calls
        torch.manual_seed(7)
        return loss_of(*args)

    module.stage = lambda: 1
    torch.testing.assert_close(
        seeded(module.training_step, batch, 0), seeded(module.stage1_loss, stage1)
    )
    module.stage = lambda: 2
    torch.testing.assert_close(
        seeded(module.training_step, batch, 0), seeded(module.meta_loss, stage2)
    )
    assert not torch.isclose(module.meta_loss(stage2), module.meta_loss(stage1))


def test_meta_loss_without_synthetic_drift_is_the_query_loss_after_the_inner_steps():
    """Eq. 3 by hand for one episode, with the episode drift off: the inner steps of eq. 2 from
    phi_0 with the learned (per-row) step sizes on the support, the CTC on the query."""
    module = small_module(
        episode_gain_sd=0, episode_offset_sd=0, episode_mix_sd=0, step_size_shape="row"
    )
    module.log = lambda *a, **k: None
    with torch.no_grad():
        module.log_step["weight"].copy_(torch.linspace(-3, -1, 6)[:, None])
    ep = {"support": episode(1, 0), "query": episode(2, 0)}
    phi = {k: v.detach().clone() for k, v in module.start_params().items()}
    for _ in range(module.hparams.inner_steps):
        phi = {k: v.requires_grad_(True) for k, v in phi.items()}
        loss = module.loss(ep["support"], phi)
        grads = torch.autograd.grad(loss, list(phi.values()))
        phi = {
            k: (v - module.log_step[k].detach().exp() * g).detach()
            for (k, v), g in zip(phi.items(), grads, strict=True)
        }
    expected = module.loss(ep["query"], phi)
    torch.testing.assert_close(module.meta_loss([ep]), expected, rtol=1e-5, atol=1e-6)


def test_step_size_shapes():
    weight, bias = torch.zeros(5, 5), torch.zeros(5)
    assert core.step_size_shape(weight, "tensor") == ()
    assert core.step_size_shape(weight, "row") == (5, 1)
    assert core.step_size_shape(bias, "row") == (5,)
    assert core.step_size_shape(weight, "element") == (5, 5)
    with pytest.raises(ValueError, match="unknown step-size shape"):
        core.step_size_shape(weight, "column")
    module = small_module(step_size_shape="row", inner_lr=0.2)
    assert module.log_step["weight"].shape == (6, 1) and module.log_step["bias"].shape == (6,)
    torch.testing.assert_close(module.log_step["weight"], torch.full((6, 1), math.log(0.2)))


def test_per_row_step_sizes_scale_each_row_of_the_inner_step():
    """adapt with a [C, 1] step: row i of W moves by step_i times row i of the gradient."""
    c = 4
    target = torch.randn(c, c, generator=torch.Generator().manual_seed(0))

    def loss_of(phi):
        return 0.5 * ((phi["weight"] - target) ** 2).sum() + 0.5 * (phi["bias"] ** 2).sum()

    start = {"weight": torch.eye(c), "bias": torch.ones(c)}
    steps = torch.tensor([0.1, 0.2, 0.3, 0.4])
    log_step = {"weight": steps.log()[:, None], "bias": steps.log()}
    moved = core.adapt(loss_of, start, log_step, steps=1)
    torch.testing.assert_close(
        moved["weight"], torch.eye(c) - steps[:, None] * (torch.eye(c) - target)
    )
    torch.testing.assert_close(moved["bias"], 1 - steps)


def test_change_norms_leave_out_the_start():
    start = {"weight": torch.eye(3) * 10, "bias": torch.zeros(3)}
    phi = {
        "weight": start["weight"] + torch.diag(torch.tensor([3.0, 0.0, 4.0])),
        "bias": torch.ones(3),
    }
    norms = core.change_norms(phi, start)
    assert norms == pytest.approx({"weight": 5.0, "bias": math.sqrt(3)})


def tiny_data(**overrides):
    settings = {
        "sim_held_in_days": [0, 5, 10, 15, 20],
        "sim_held_out_days": [30, 60],
        "sim_sentences": 12,
        "sim_calibration_pool": 8,
        "sim_eval": 4,
        "n_minival": 2,
        "n_query": 3,
        "seed": 0,
        **overrides,
    }
    data = IbciDataModule(**settings)
    data.setup()
    return data


def test_validation_sessions_are_the_latest_held_in_and_never_trained_on():
    data = tiny_data(n_val_sessions=2)
    assert [s.day for s in data.val_sessions] == [15, 20] and data.val_session.day == 20
    assert [s.day for s in data.train_sessions] == [0, 5, 10]
    assert data.n_sessions == 3
    # adapted like held-out sessions: calibration and evaluation trials
    assert all(len(s.eval_indices()) == 4 for s in data.val_sessions)


def test_meta_sessions_feed_stage_two_only():
    data = tiny_data(n_val_sessions=2, meta_sessions=1, episodes_per_epoch=40)
    assert data.stage_pools() == ([0, 1], [2])
    items = [data.train_dataloader().dataset[i] for i in range(40)]
    # each sentence carries its training session's index (data.Session.index)
    stage1 = {int(i["stage1"]["support"]["session"][0]) for i in items}
    stage2 = {int(i["stage2"]["query"]["session"][0]) for i in items}
    assert stage1 == {0, 1} and stage2 == {2}
    batch = collate_episodes(items[:3])
    assert len(batch["episodes"]) == len(batch["meta_episodes"]) == 3
    # without meta sessions both stages draw from every training session
    assert tiny_data(n_val_sessions=2).stage_pools() == ([0, 1, 2], [0, 1, 2])


def test_too_many_set_aside_sessions_is_a_clear_error():
    from papers_cli import ConfigError

    with pytest.raises(ConfigError, match="leave none for stage 1"):
        tiny_data(n_val_sessions=2, meta_sessions=3)


def test_start_against_identity_is_zero_at_the_identity_and_signs_a_better_start():
    data = tiny_data(n_val_sessions=2)
    module = IbciModule(n_sessions=3, hidden=16, projection=8).eval()
    torch.testing.assert_close(
        torch.as_tensor(start_against_identity(module, data.val_sessions)),
        torch.zeros(8, dtype=torch.float64),
    )
    with torch.no_grad():  # a start that silences every channel decodes nothing right
        module.phi0["weight"].zero_()
    assert start_against_identity(module, data.val_sessions).shape == (8,)


def test_adaptation_diagnostics_by_hand():
    from ibci_fewshot.baselines import Adapted
    from ibci_fewshot.data import pad_batch

    data = tiny_data(n_val_sessions=2)
    module = IbciModule(n_sessions=3, hidden=16, projection=8).eval()
    session = data.val_sessions[0]
    start = {k: v.detach() for k, v in module.start_params().items()}
    phi = {"weight": start["weight"] * 1.5, "bias": start["bias"] + 0.5}
    evaluation = pad_batch([(session, session.eval_indices())])
    out = adaptation_diagnostics("meta_alignment", module, session, 3, Adapted(phi), evaluation)
    assert out["change_weight"] == pytest.approx(0.5 * math.sqrt(192), rel=1e-5)
    assert out["change_bias"] == pytest.approx(0.5 * math.sqrt(192), rel=1e-5)
    calibration = pad_batch([(session, session.calibration_indices(3))])
    with torch.no_grad():
        assert out["support_ctc_before"] == pytest.approx(float(module.loss(calibration, start)))
        assert out["support_ctc_after"] == pytest.approx(float(module.loss(calibration, phi)))


def test_a_stored_backbone_reloads_with_its_own_seed_sessions(monkeypatch):
    """A claim job that reloads a backbone rebuilds the sessions that backbone trained on, in
    a process whose last seed_everything was another seed (a bug once scored every seed's
    backbone on seed 0's recordings)."""
    from ibci_fewshot import claim
    from ibci_fewshot.claim import Job, backbone_path, fit_job, load_models, store_backbone

    settings = {
        "stage1_steps": 1,
        "meta_steps": 0,
        "meta_sessions": 1,
        "alignment": "affine",
        "meta_order": "first",
        "extra_args": [
            "--data.sim_held_in_days=[0,5,10,15,20]",
            "--data.n_val_sessions=2",
            "--data.sim_held_out_days=[30,60]",
            "--data.sim_sentences=12",
            "--data.sim_calibration_pool=8",
            "--data.sim_eval=4",
            "--data.n_minival=2",
            "--data.n_query=3",
            "--model.hidden=8",
            "--model.projection=4",
        ],
    }
    fitted = fit_job(Job("pooled", 3, {}, "fit"), settings)
    assert fitted["data"]["seed"] == 3
    key = store_backbone(fitted)
    monkeypatch.setenv("PL_GLOBAL_SEED", "0")
    load_models.cache_clear()
    try:
        data = load_models(pooled=key)["data"]
    finally:
        load_models.cache_clear()
    assert data.seed == 3
    expected = tiny_data(seed=3, n_val_sessions=2, sim_sentences=12)
    assert data.train_sessions[0].cues == expected.train_sessions[0].cues
    other = tiny_data(seed=0, n_val_sessions=2, sim_sentences=12)
    assert data.train_sessions[0].cues != other.train_sessions[0].cues
    assert backbone_path(key).is_file() and claim.BACKBONE_OF["meta_alignment"] == "pooled_meta"


def test_diagnosis_reads_the_replication_preconditions_and_the_same_backbone_rival():
    """On a synthetic record: a replication precondition that every seed passes but whose
    3-seed interval crosses the bar is a `check` finding; with fair registered seeds and the
    method ahead of plain-gradient alignment on its own backbone, the set-aside is named."""
    from ibci_fewshot.claim import CLAIM_FILE, METRICS, SUBJECTS, diagnose
    from papers_eval import load_claim_spec

    spec = load_claim_spec(CLAIM_FILE, subjects=SUBJECTS, metrics=METRICS, allow_dirty=True)
    advantage = {"estimate": -0.07, "ci": [-0.3, 0.2]}
    outcomes = {c.name: {"passed": False, "advantage": advantage} for c in spec.checks}
    record = {
        "verdict": "not shown",
        "preconditions": [
            {"name": c.name, "passed": True, "advantage": {"estimate": 0.1}}
            for c in spec.preconditions
        ],
        "controls": [{"name": "shuffled_transcripts", "role": "negative", "behaved": True}],
        "outcomes": {"meta_alignment": outcomes},
        "metrics": {
            "meta_alignment": {"test_wer": {"mean": 0.54}},
            "gradient_alignment_same_backbone": {"test_wer": {"mean": 0.63}},
        },
        "budget": {"gap_change": 0.007},
        "replication": {
            "controls": [],
            "preconditions": {
                "start_no_worse_than_identity": {"passed": False, "advantage": {"estimate": 0.17}}
            },
            "metrics": {
                "meta_alignment": {
                    "val_start_minus_identity_wer": {"per_seed": [-0.2, -0.01, -0.2]}
                }
            },
        },
    }
    findings = diagnose(record, spec=spec)
    causes = [(f.cause, f.summary.split(":")[0]) for f in findings]
    assert causes[0] == (
        "check",
        "precondition start_no_worse_than_identity failed on the replication seeds",
    )
    assert findings[1].cause == "implementation" and "set aside" in findings[1].summary
    # a seed on the wrong side of the bar: meta-training did not transfer
    record["replication"]["metrics"]["meta_alignment"]["val_start_minus_identity_wer"] = {
        "per_seed": [-0.2, 0.05, -0.2]
    }
    assert diagnose(record, spec=spec)[0].cause == "implementation"
    # no gain on its own backbone either: the idea
    record["metrics"]["gradient_alignment_same_backbone"]["test_wer"]["mean"] = 0.5
    assert diagnose(record, spec=spec)[-1].cause == "idea"


def logged_by(module):
    calls = {}

    def log(name, value, **kwargs):
        calls[name] = (float(value), kwargs.get("prog_bar", False))

    module.log = log
    return calls


def test_the_logged_training_values_are_the_losses_they_name():
    """Stage 1 logs its loss as train/ctc; stage 2 logs the query CTC after the inner steps,
    before them at phi_0 and at the identity, each tensor's mean inner change and the mean
    step size, by hand."""
    module = small_module(
        episode_gain_sd=0, episode_offset_sd=0, episode_mix_sd=0, step_size_shape="row"
    )
    ep = {"support": episode(1, 0), "query": episode(2, 0)}
    other = {"support": episode(5, 1), "query": episode(6, 1)}
    calls = logged_by(module)
    loss = module.stage1_loss([ep])
    assert calls["train/ctc"] == (pytest.approx(float(loss)), True)

    with torch.no_grad():
        module.phi0["bias"].add_(0.3)  # phi_0 away from the identity
    calls = logged_by(module)
    loss = module.meta_loss([ep, other])
    assert calls["train/meta_query_ctc"] == (pytest.approx(float(loss)), True)
    first = logged_by(module)
    module.meta_loss([ep])  # the two-episode values are means over episodes
    start = {k: v.detach() for k, v in module.start_params().items()}
    with torch.no_grad():
        before = float(module.loss(ep["query"], start))
        identity = float(module.loss(ep["query"], module.zero_shot_params()))
    assert first["train/ctc"] == (pytest.approx(before, rel=1e-5), True)
    assert first["train/meta_query_ctc_identity"][0] == pytest.approx(identity, rel=1e-5)
    assert before != pytest.approx(identity)
    _, adapted = core.episode_loss(
        module.decoder,
        module.form,
        {**ep["support"], "x": module.smooth(ep["support"]["x"])},
        {**ep["query"], "x": module.smooth(ep["query"]["x"])},
        module.start_params(),
        module.step_sizes(),
        module.hparams.inner_steps,
    )
    for k, v in core.change_norms(adapted, start).items():
        assert first[f"train/inner_change_{k}"][0] == pytest.approx(v, rel=1e-4)
    second = logged_by(module)
    module.meta_loss([other])
    for key in ("train/ctc", "train/meta_query_ctc_identity", "train/inner_change_weight"):
        assert calls[key][0] == pytest.approx((first[key][0] + second[key][0]) / 2, rel=1e-4)
    steps = torch.cat([v.detach().exp().flatten() for v in module.log_step.values()])
    assert calls["train/inner_lr_mean"][0] == pytest.approx(float(steps.mean()))


def test_first_order_meta_gradient_of_phi0_is_the_query_gradient_at_the_adapted_layer():
    """FOMAML through the module (meta_order first): d(meta loss)/d(phi_0) equals the query
    loss's gradient at phi_k; second order differs."""
    module = small_module(episode_gain_sd=0, episode_offset_sd=0, episode_mix_sd=0)
    logged_by(module)
    ep = {"support": episode(1, 0), "query": episode(2, 0)}
    module.meta_loss([ep]).backward()
    got = {k: v.grad.clone() for k, v in module.phi0.items()}
    _, adapted = core.episode_loss(
        module.decoder,
        module.form,
        {**ep["support"], "x": module.smooth(ep["support"]["x"])},
        {**ep["query"], "x": module.smooth(ep["query"]["x"])},
        {k: v.detach() for k, v in module.start_params().items()},
        {k: v.detach() for k, v in module.step_sizes().items()},
        module.hparams.inner_steps,
    )
    phi = {k: v.detach().requires_grad_(True) for k, v in adapted.items()}
    expected = torch.autograd.grad(module.loss(ep["query"], phi), list(phi.values()))
    for g, e in zip(got.values(), expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-6)
    second = small_module(
        episode_gain_sd=0, episode_offset_sd=0, episode_mix_sd=0, meta_order="second"
    )
    logged_by(second)
    second.meta_loss([ep]).backward()
    assert not torch.allclose(second.phi0["weight"].grad, got["weight"], rtol=1e-3, atol=1e-6)


def test_the_session_layer_backbone_starts_its_new_layer_at_the_held_in_mean():
    """At the first meta step the session-layer backbone's phi_0 becomes the mean held-in layer
    (and stays frozen with the backbone); later meta steps do not reset it."""
    module = small_module(
        backbone="session_layers",
        stage1_steps=0,
        episode_gain_sd=0,
        episode_offset_sd=0,
        episode_mix_sd=0,
    )
    logged_by(module)
    with torch.no_grad():
        module.session_layers.weight.mul_(torch.tensor([0.5, 1.5])[:, None, None])
        module.session_layers.bias.add_(torch.tensor([[0.2], [0.4]]))
    ep = {"support": episode(1, 0), "query": episode(2, 0)}
    calls = logged_by(module)
    loss = module.meta_loss([ep])
    mean = module.session_layers.mean_layer()
    # the new layer's form: affine + softsign, in the inner steps and in the logged loss
    smoothed = {p: {**ep[p], "x": module.smooth(ep[p]["x"])} for p in ("support", "query")}
    expected, _ = core.episode_loss(
        module.decoder,
        "affine_softsign",
        smoothed["support"],
        smoothed["query"],
        {k: v.detach() for k, v in module.start_params().items()},
        {k: v.detach() for k, v in module.step_sizes().items()},
        module.hparams.inner_steps,
    )
    torch.testing.assert_close(loss, expected)
    with torch.no_grad():
        before = float(module.loss(ep["query"], dict(module.start_params())))
    assert calls["train/ctc"][0] == pytest.approx(before, rel=1e-5)
    torch.testing.assert_close(module.phi0["weight"].detach(), mean["weight"])
    torch.testing.assert_close(module.phi0["bias"].detach(), torch.full((6,), 0.3))
    assert not any(p.requires_grad for p in module.session_layers.parameters())
    assert not any(p.requires_grad for p in module.decoder.parameters())
    with torch.no_grad():
        module.phi0["bias"].add_(1.0)
    type(module).global_step = property(lambda self: 5)  # a later meta step
    try:
        module.meta_loss([ep])
    finally:
        del type(module).global_step
    torch.testing.assert_close(module.phi0["bias"].detach(), torch.full((6,), 1.3))


def test_episode_support_and_query_are_distinct_sentences_drawn_by_the_seed():
    data = tiny_data(n_val_sessions=2, meta_sessions=1, n_support=3, n_query=5)
    episodes = data.train_dataloader().dataset
    for item in range(20):
        for stage in ("stage1", "stage2"):
            drawn = episodes[item][stage]
            sentences = {
                (int(n), round(float(x[:n].sum()), 4))
                for part in ("support", "query")
                for x, n in zip(drawn[part]["x"], drawn[part]["lengths"], strict=True)
            }
            # 8 sentences of one session, none twice (drawn without replacement)
            assert len(sentences) == 8
    again = tiny_data(n_val_sessions=2, meta_sessions=1, n_support=3, n_query=5)
    torch.testing.assert_close(
        again.train_dataloader().dataset[3]["stage2"]["query"]["x"],
        episodes[3]["stage2"]["query"]["x"],
    )
    other = tiny_data(n_val_sessions=2, meta_sessions=1, n_support=3, n_query=5, seed=1)
    assert other.train_dataloader().dataset[3]["stage1"]["support"]["x"].shape[0] == 3
