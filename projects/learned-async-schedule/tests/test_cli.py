import json
from pathlib import Path

import numpy as np
import pytest
import torch

from async_schedule import claim
from async_schedule.claim import Runner, run_claim_experiment, schedule_flags
from async_schedule.cli import train
from async_schedule.core import ConvexSchedule
from async_schedule.model import AsyncDiffusionModule
from papers_cli.testing import check_resume, run_ddp_train, user_error_message
from papers_eval import load_claim

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted(p for p in (PROJECT / "configs").glob("*.yaml") if p.name != "claim.yaml")


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_train_fast_dev_run_through_the_cli(tiny_args):
    cli = train([*tiny_args, "--trainer.fast_dev_run=1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


def test_probe_freezes_the_window_average_and_resets_the_model(tiny_args):
    cli = train([*tiny_args, "--trainer.limit_val_batches=0", "--model.probe_diagnostics=true"])
    model = cli.model
    assert not model.probing and not any(p.requires_grad for p in model.schedule.parameters())
    report = model.probe_report
    assert report["probe_steps"] == 3 and 1 <= report["window_length"] <= 3
    probe_mean = torch.stack(model.probe_curves[report["window_start"] :]).mean(0)
    with torch.no_grad():
        frozen = model.schedule(torch.linspace(0, 1, 101, dtype=torch.float64))
    assert torch.allclose(frozen, probe_mean, atol=1e-6)  # f* = the window's mean curve
    assert cli.trainer.global_step == 6 and model.main_stage_step == 3
    # the speed penalty's gradient always points away from lag (it is zero only at the identity)
    gradients = report["gradients"]
    assert set(gradients) == {"lead", "lag", "speed"} and len(model.probe_gradients) == 3
    assert gradients["speed"]["more_lag_derivative_mean"] > 0


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/loss"]
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/loss"]
    other = train([*tiny_args, "--seed_everything=4"]).trainer.callback_metrics["val/loss"]
    assert first.item() == again.item() and first.item() != other.item()


@pytest.mark.parametrize("config", ["synchronous.yaml", "sfd.yaml", "class_conditional.yaml"])
def test_baselines_and_conditional_config_train_and_sample(tiny_args, config):
    cli = train(
        [*tiny_args, f"--config={PROJECT / 'configs' / config}", "--trainer.limit_val_batches=0"]
    )
    labels = torch.arange(4) if cli.model.hparams.num_classes else None
    lead, lag = cli.model.generate(
        4, steps=3, generator=torch.Generator().manual_seed(0), labels=labels
    )
    assert lead.shape == (4, 8, 1, 1) and lag.shape == (4, 1, 16, 16) and torch.isfinite(lag).all()


def test_autoguidance_uses_the_weaker_guide(tiny_args):
    model = train([*tiny_args, "--trainer.limit_val_batches=0"]).model
    generator = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    plain = model.generate(4, 3, generator())
    guided = model.generate(4, 3, generator(), guidance_scale=2.0, guide=model.network)
    self_guided = model.generate(4, 3, generator(), guidance_scale=2.0, guide=model.ema.module)
    assert torch.allclose(plain[1], self_guided[1], atol=1e-5)  # guide == model: no change
    assert not torch.allclose(plain[1], guided[1])


def test_two_process_ddp_run_freezes_the_schedule_on_every_rank(tiny_args, tmp_path):
    """The probe ends mid-run under plain DDP (gloo, 2 processes): DDP ignores the schedule,
    whose gradient is averaged by hand, so both ranks freeze the same f* and carry on."""
    args = [*tiny_args, "--model.probe_steps=3", "--model.schedule_init=-1"]
    single = tmp_path / "single"
    train([*args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, args, tmp_path / "ddp", reference=reference)
    halves = [r["metrics"]["schedule/f_half"] for r in ranks]
    assert all(r["global_step"] == 6 for r in ranks)
    assert halves[0] == halves[1]  # one f* on every rank (all-reduced: the same bits on each)
    start = ConvexSchedule(8, -1.0)(torch.tensor(0.5, dtype=torch.float64)).item()
    assert halves[0] != pytest.approx(start, abs=1e-7)  # the probe moved f before freezing


def test_resuming_after_the_probe_keeps_f_star_and_the_trained_network(tiny_args, tmp_path):
    """The old bug: `probing` came from the config, so a run resumed past the probe refroze f
    (a new window mean), reset the network and EMA to their initial weights and overwrote the
    probe report. Now the probe state is in the checkpoint and none of that happens."""
    args = [
        *[a for a in tiny_args if "enable_checkpointing" not in a],
        "--trainer.limit_val_batches=0",
        "--model.probe_steps=3",
        "--model.schedule_init=-1",
        "--trainer.enable_checkpointing=true",
    ]
    first = train([*args, "--trainer.max_steps=8", f"--trainer.default_root_dir={tmp_path / 'a'}"])
    path = first.trainer.checkpoint_callback.last_model_path or (
        first.trainer.checkpoint_callback.best_model_path
    )
    state = torch.load(path, weights_only=True)["las_probe"]
    assert state["probing"] is False and state["initial_network"] is None
    assert len(state["curves"]) == 3 and state["report"] == first.model.probe_report
    trained = {k: v.clone() for k, v in first.model.network.state_dict().items()}
    hparams = {k: v for k, v in first.model.hparams.items() if not k.startswith("_")}
    initial = AsyncDiffusionModule(**hparams).network.state_dict()
    resumed = train(
        [*args, "--trainer.max_steps=9", f"--trainer.default_root_dir={tmp_path / 'b'}",
         f"--ckpt_path={path}"]
    )  # fmt: skip
    model = resumed.model
    assert not model.probing and len(model.probe_curves) == 3  # no new probe steps
    assert model.probe_report == first.model.probe_report  # not overwritten by a refreeze
    assert model.schedule_slopes() == first.model.schedule_slopes()  # f* untouched
    # one step after resuming: next to the trained weights, far from the initial ones
    step = max((model.network.state_dict()[k] - v).abs().max().item() for k, v in trained.items())
    reset = max((trained[k] - v).abs().max().item() for k, v in initial.items())
    assert step < 0.1 * reset


@pytest.mark.slow
@pytest.mark.parametrize("probe_steps", [3, 12], ids=["resume_after_probe", "resume_in_probe"])
def test_resume_continues_exactly_across_the_probe(tiny_args, tmp_path, probe_steps):
    """16 steps straight vs 8 + resume + 8 (8 batches per epoch). probe_steps=3: the checkpoint
    is past the probe, and a resumed run must not refreeze f or reset the trained network;
    probe_steps=12: the probe continues from the checkpoint and freezes at the same step."""
    args = [
        *[a for a in tiny_args if "enable_checkpointing" not in a],
        f"--model.probe_steps={probe_steps}",
        "--trainer.limit_val_batches=0",
        "--model.schedule_init=-1",
    ]
    check_resume(train, args, steps=16, root_dir=tmp_path)  # parameters, optimizer, f_half
    saved = torch.load(next((tmp_path / "half").rglob("*.ckpt")), weights_only=True)
    state = saved["las_probe"]
    assert state["probing"] == (probe_steps > 8) and len(state["curves"]) == min(probe_steps, 8)
    assert (state["initial_network"] is None) == (probe_steps <= 8)  # nothing left to reset to


def test_train_test_scores_a_checkpoint(tiny_args, tmp_path):
    """`train test --ckpt_path`: FD-digit, precision/recall and class coverage on the test
    digits from a saved checkpoint; `train` also leaves its report (samples, schedule)."""
    args = [a for a in tiny_args if "enable_checkpointing" not in a]
    fitted = train([*args, "--trainer.limit_val_batches=0", "--model.test_samples=64"])
    checkpoint = next(tmp_path.rglob("*.ckpt"))
    report = next(tmp_path.rglob("report/report.json"))
    assert {"samples.png", "schedule.png"} <= {p.name for p in report.parent.iterdir()}
    assert json.loads(report.read_text())["probe"]["probe_steps"] == 3
    tested = train(["test", *args, "--model.test_samples=64", f"--ckpt_path={checkpoint}"])
    metrics = tested.trainer.callback_metrics
    assert {"test/fd_digit", "test/class_tv", "test/precision", "test/loss"} <= set(metrics)
    assert 0 <= metrics["test/class_tv"] <= 1 and metrics["test/fd_digit"] > 0
    assert tested.model.schedule_slopes() == pytest.approx(fitted.model.schedule_slopes())


def test_bad_inputs_exit_2_with_a_message(tiny_args, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        train([*tiny_args, "--model.no_such_option=1"])
    assert info.value.code == 2
    with pytest.raises(SystemExit) as info:
        train([*tiny_args, f"--data.root={tmp_path / 'missing'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "no_such_option" in err and "not found" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--model.schedule=cosine"], "'learned', 'frozen', 'synchronous', 'power', 'sfd'"),
        (["--model.ode_method=rk4"], "'euler', 'heun'"),  # a wrong choice lists the choices
        (["--model.sfd_delta=1.5"], "model.sfd_delta"),  # out of range
        (["--model.power_exponent=0.5"], "v>=1"),
        (["--model.schedule=frozen"], "needs --model.frozen_slopes"),  # combinations
        (["--model.width=30"], "multiple of 4"),
        (["--model.lead_size=3"], "a multiple of the token grid"),
        (["--model.lead_channels=4"], "set --model.lead_channels=8"),  # the data disagree
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, capsys, flags, expected):
    assert expected in user_error_message(train, [*tiny_args, *flags], capsys)


def test_reproduce_quick_writes_the_claim_record(tmp_path):
    """The quick pipeline with --replicate: every subject once (no duplicates), the in-family
    control built from the fitted member, the reach and long-probe evidence, the replication,
    and a diagnosis that cites the record whenever the verdict is not held."""
    outcome = run_claim_experiment(["--quick", "--replicate", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "learned-async-schedule" and record["verdict"] == outcome["verdict"]
    assert set(record["metrics"]) == {
        "las", "synchronous", "power", "sfd", "zero_probe", "in_family_lag"
    }  # fmt: skip
    assert {c["name"]: (c["role"], c.get("kind")) for c in record["controls"]} == {
        "zero_probe": ("negative", "negative"), "in_family_lag": ("positive", "in_family")
    }  # fmt: skip
    trials = record["tuning"]["trials"]
    assert [t["params"]["power_exponent"] for t in trials["power"]] == [2.0, 5.0]
    flags = record["config"]["flags"]
    assert len({tuple(f) for f in flags.values()}) == len(flags)  # no subject is another's run
    assert "--model.schedule=frozen" in flags["in_family_lag"]
    evidence = record["evidence"]
    assert evidence["las_probe"]["0"]["probe_steps"] == 4
    assert max(evidence["zero_probe_max_lag"]) < 0.01  # the start: ~ the identity
    reach = evidence["reach"]
    assert reach["winner"] in ("power", "sfd") and set(reach["las_to_winner"]) == {"0"}
    assert 0 <= reach["best_member_to_winner"] <= reach["synchronous_to_winner"] + 1e-9
    starts = evidence["long_probe"]["starts"]
    assert evidence["long_probe"]["steps"] == 6 and set(starts) == {
        "identity_start", "strong_lag_start"
    }  # fmt: skip
    assert (
        starts["strong_lag_start"]["f_half_start"] < 0.35 < starts["identity_start"]["f_half_start"]
    )  # the strong-lag probe starts far from the identity
    assert set(evidence["tuning_edges"]) == {"power", "sfd"}
    assert record["replication"]["seeds"] == [1]
    assert "las_probe" in evidence["replication"]
    if record["verdict"] not in ("held", "held, not replicated"):
        assert record["diagnosis"]
    for name in ("claim.md", "learned_schedule.png", "samples.png"):
        assert (tmp_path / name).is_file()


def test_ablation_command_runs_its_variants_quickly(tmp_path):
    """The ablation command (quick): last iterate vs window mean, f learned throughout."""
    from async_schedule.claim import run_ablations

    record = run_ablations(
        ["--quick", "--out", str(tmp_path), "--only", "last_iterate", "learned_throughout"]
    )
    assert set(record["rows"]) == {"last_iterate", "learned_throughout"}
    assert "--model.average=last" in record["rows"]["last_iterate"]["flags"]
    assert record["rows"]["learned_throughout"]["probe"]["0"] is None  # never froze
    assert (tmp_path / "ablations.md").is_file()


@pytest.mark.slow  # about 60 s: two spawned workers import torch and build the data
def test_parallel_prefetch_gives_the_sequential_results(tmp_path, monkeypatch):
    """Two worker processes of the shared job runner give bit for bit the results of the jobs
    run one after the other in this process (one thread each), and a rerun loads them all
    from the runner's cache instead of training again."""
    monkeypatch.setattr(claim, "JOBS_DIR", tmp_path / "jobs")
    settings = {"main_steps": 4, "probe_steps": 4, "num_samples": 32, "sample_steps": 4}
    jobs = [(schedule_flags(s, {}, settings), 0, "test") for s in ("las", "synchronous")]
    parallel = Runner(settings, quick=True)
    parallel.prefetch(jobs, workers=2)
    sequential = Runner(settings, quick=True)
    sequential.prefetch(jobs, workers=1, fresh=True)
    assert not any(r.cached for r in sequential.jobs)
    for flags, seed, _ in jobs:
        mine, theirs = parallel.cache[(tuple(flags), seed)], sequential.cache[(tuple(flags), seed)]
        assert mine["fd_digit"] == theirs["fd_digit"]
        assert mine["slopes"] == theirs["slopes"]
        assert np.array_equal(mine["preview"], theirs["preview"])
        assert mine["preview"].shape == (64, 1, 16, 16)
    rerun = Runner(settings, quick=True)
    rerun.prefetch(jobs, workers=2)  # everything cached: nothing is retrained
    assert all(r.cached for r in rerun.jobs) and len(rerun.jobs) == 2
    key = (tuple(jobs[0][0]), 0)
    assert rerun.cache[key]["fd_digit"] == parallel.cache[key]["fd_digit"]
