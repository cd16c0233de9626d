import json
from pathlib import Path

import numpy as np
import pytest

from graphmet.cli import run_claim_experiment, train
from papers_cli.testing import run_ddp_train, user_error_message
from papers_eval import load_results

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((PROJECT / "configs").glob("*.yaml"))


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_train_fast_dev_run_through_the_cli(tiny_args):
    cli = train([*tiny_args, "--trainer.fast_dev_run=1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


@pytest.mark.parametrize("processor", ["graphmet", "message_passing"])
def test_both_processors_train_on_a_global_reanalysis_fixture(
    tiny_args, tmp_path, processor, write_fixture
):
    root = tmp_path / "era"
    write_fixture(root, np.linspace(-87.5, 87.5, 8), np.arange(0, 360, 30.0), times=12)
    cli = train(
        [
            *tiny_args,
            "--trainer.fast_dev_run=1",
            f"--data.root={root}",
            "--data.source=reanalysis",
            "--data.variables=[z@500, t@850, t2m]",
            "--data.icosahedral_refinements=1",
            "--data.modes=16",
            "--data.val_fraction=0.4",
            f"--model.processor={processor}",
        ]
    )
    assert cli.model.hparams.channels == 3 and cli.trainer.global_step == 1
    assert cli.model.net.graph.num_mesh == 42


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/rmse"]
    again = train([*tiny_args, "--seed_everything=3"]).trainer.callback_metrics["val/rmse"]
    assert first.item() == again.item()


def test_short_run_lowers_the_loss(tiny_args):
    untrained = train(["validate", *tiny_args])
    trained = train([*tiny_args, "--trainer.max_steps=60", "--trainer.val_check_interval=60"])
    before = untrained.trainer.callback_metrics["val/rmse"].item()
    assert trained.trainer.callback_metrics["val/rmse"].item() < 0.7 * before


def test_two_process_ddp_run_matches_single_process(tiny_args, tmp_path):
    single = tmp_path / "single"
    train([*tiny_args, f"--trainer.default_root_dir={single}"])
    reference = json.loads((single / "summary_rank0.json").read_text())
    ranks = run_ddp_train(PROJECT, tiny_args, tmp_path / "ddp", reference=reference)
    assert len(ranks) == 2


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
        (["--model.processor=transformer"], "'graphmet', 'message_passing'"),  # wrong choice
        (["--data.basis=wavelet"], "'laplacian', 'fourier'"),
        (["--data.val_fraction=1.0"], "data.val_fraction"),  # out of range
        (["--model.rank=0"], "model.rank"),
        (["--data.domain=regional"], "set --data.domain=periodic"),  # advect needs the torus
        (["--data.modes=31"], "data.modes=31 must be even"),
        (["--data.mesh_levels=4"], "The mesh follows data.grid"),  # 8 mesh cells, 4 levels
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, capsys, flags, expected):
    assert expected in user_error_message(train, [*tiny_args, *flags], capsys)


def test_reproduce_quick_writes_the_results_record(tmp_path):
    metrics = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_results(tmp_path / "claim.json")
    assert record["project"] == "graphmet" and record["metrics"].keys() == metrics.keys()
    expected = {"graphmet", "gnn1", "gnn2", "control_graphmet", "graphmet_spectral"}
    assert expected | {"graphmet_no_spectral_loss", "graphmet_channel_pairs"} <= metrics.keys()
    assert set(record["extra"]["checks"]) >= {
        "graphmet_long_lead_rmse_lower",
        "gnn_activity_decays",
    }
    for name in (
        "claim.md",
        "rmse_vs_lead.png",
        "activity_vs_lead.png",
        "spectra_last_lead.png",
        "latent_energy.png",
        "spread_skill.png",
        "control_activity.png",
        "curves.json",
    ):
        assert (tmp_path / name).is_file(), name
