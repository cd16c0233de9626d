import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

from papers_cli import (
    UserError,
    cli_main,
    find_project,
    quiet_fit,
    reproduce_parser,
    user_errors,
)
from papers_cli import dispatch as dispatch_module

TRAIN_SCRIPT = Path(sys.executable).with_name("train")


@pytest.fixture
def project(tmp_path, monkeypatch):
    """A minimal project folder: pyproject.toml, configs/default.yaml and a module path."""
    root = tmp_path / "demo"
    (root / "configs").mkdir(parents=True)
    (root / "src" / "demo").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "demo"\nversion = "0"\n')
    (root / "configs" / "default.yaml").write_text(
        "trainer:\n  max_steps: 3\n  limit_val_batches: 1\n  logger: false\n"
        "  enable_checkpointing: false\n"
    )
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "argv", ["train"])
    monkeypatch.chdir(elsewhere)  # the default config must not depend on the working directory
    return root


def run(project, *args):
    return cli_main(
        BoringModel,
        BoringDataModule,
        project_file=project / "src" / "demo" / "cli.py",
        args=list(args),
    )


def test_fit_is_inserted_and_default_config_is_loaded(project):
    cli = run(project)
    assert cli.subcommand == "fit"
    assert cli.trainer.global_step == 3
    assert Path(cli.trainer.default_root_dir) == Path("runs/demo")
    summary = json.loads((Path("runs/demo") / "summary_rank0.json").read_text())
    assert summary["world_size"] == 1 and summary["global_step"] == 3
    assert summary["parameter_shapes"]["layer.weight"] == [2, 32]


def test_config_files_layer_over_default(project, tmp_path):
    override = tmp_path / "short.yaml"
    override.write_text("trainer:\n  max_steps: 1\n")
    cli = run(project, "fit", "--config", str(override))
    assert cli.trainer.global_step == 1
    assert cli.trainer.limit_val_batches == 1  # still from default.yaml


def test_a_second_entry_point_starts_from_its_own_default_config(project):
    (project / "configs" / "other.yaml").write_text(
        "trainer:\n  max_steps: 2\n  logger: false\n  enable_checkpointing: false\n"
    )
    cli = cli_main(
        BoringModel,
        BoringDataModule,
        project_file=project / "src" / "demo" / "cli.py",
        args=[],
        default_config="other.yaml",
    )
    assert cli.trainer.global_step == 2
    assert cli.trainer.limit_val_batches == 1.0  # Lightning's default: default.yaml not read


def test_quiet_fit_silences_a_config_but_not_an_override(project, tmp_path):
    noisy = tmp_path / "noisy.yaml"
    noisy.write_text("trainer:\n  limit_val_batches: 2\n  max_steps: 2\n")

    def fit(*overrides):
        return quiet_fit(
            BoringModel,
            BoringDataModule,
            project_file=project / "src" / "demo" / "cli.py",
            seed=3,
            config_files=[noisy],
            overrides=list(overrides),
        )

    cli = fit()
    assert cli.trainer.global_step == 2
    assert cli.trainer.limit_val_batches == 0 and cli.trainer.logger is None
    assert cli.trainer.checkpoint_callback is None and not cli.trainer.progress_bar_callback
    assert fit("--trainer.limit_val_batches=1").trainer.limit_val_batches == 1
    assert not Path("runs").exists()  # a claim experiment leaves the working directory clean


def test_config_saved_with_overwrite(project):
    run(project, "--trainer.logger=true")
    run(project, "--trainer.logger=true")  # a rerun must not fail on the existing config.yaml
    assert list(Path("runs/demo").rglob("config.yaml"))


class SizedModel(BoringModel):
    """BoringModel with a configurable output size, to make checkpoints that do not fit."""

    def __init__(self, out_features: int = 2):
        super().__init__()
        self.layer = torch.nn.Linear(32, out_features)


def test_test_with_a_checkpoint_that_does_not_fit_is_a_config_error(project, capsys):
    def sized(*args):
        return cli_main(
            SizedModel,
            BoringDataModule,
            project_file=project / "src" / "demo" / "cli.py",
            args=list(args),
        )

    fitted = sized("fit", "--trainer.enable_checkpointing=true")
    ckpt = fitted.trainer.checkpoint_callback.best_model_path
    assert sized("test", f"--ckpt_path={ckpt}").trainer.state.finished
    with pytest.raises(SystemExit) as info:
        sized("test", f"--ckpt_path={ckpt}", "--model.out_features=3")
    assert info.value.code == 2
    message = capsys.readouterr().err.replace("\n", " ")
    assert "does not fit the model" in message and "layer.weight" in message
    with pytest.raises(SystemExit) as info:
        sized("test", "--ckpt_path=runs/demo/no_such.ckpt")
    assert info.value.code == 2
    assert "is not a file" in capsys.readouterr().err


def test_bad_inputs_exit_2_with_a_message(project, tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        run(project, "--model.no_such_key=1")
    assert info.value.code == 2
    assert "no_such_key" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        run(project, "--config", str(tmp_path / "missing.yaml"))
    assert info.value.code == 2
    (project / "configs" / "default.yaml").unlink()
    with pytest.raises(SystemExit) as info:
        run(project)
    assert info.value.code == 2
    assert "default.yaml is missing" in capsys.readouterr().err.replace("\n", " ")


def test_user_errors_print_a_paragraph_not_a_traceback(capsys, monkeypatch):
    monkeypatch.delenv("PAPERS_TRACEBACK", raising=False)
    with pytest.raises(SystemExit) as info, user_errors():
        raise UserError("put the files in /data")
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "put the files in /data" in err and "Traceback" not in err
    with pytest.raises(KeyError), user_errors():  # programming errors keep their traceback
        raise KeyError("bug")


def test_reproduce_parser_defaults_to_project_results(project, tmp_path):
    parser = reproduce_parser("demo", project_file=project / "src" / "demo" / "cli.py")
    args = parser.parse_args([])
    assert args.out == project / "results" and args.seed == 0 and not args.quick
    # a quick run never overwrites the committed record of the full one
    assert parser.parse_args(["--quick"]).out == project / "results" / "quick"
    assert parser.parse_args(["--quick", f"--out={tmp_path}"]).out == tmp_path


def test_find_project_walks_up(project):
    found = find_project(project / "src" / "demo")
    assert found.name == "demo" and found.directory == project.resolve()


def test_dispatcher_outside_a_project_lists_projects_and_fails(tmp_path):
    result = subprocess.run([str(TRAIN_SCRIPT)], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    assert "not inside a paper project" in result.stderr and "uv run train" in result.stderr
    assert "Traceback" not in result.stderr


def test_dispatcher_calls_the_registered_entry_point(project, monkeypatch):
    calls = []

    class FakeEntryPoint:
        def load(self):
            return lambda: calls.append("ran") or 0

    monkeypatch.chdir(project / "src")
    monkeypatch.setattr(
        dispatch_module,
        "entry_points",
        lambda group, name: [FakeEntryPoint()] if name == "demo" else [],
    )
    assert dispatch_module.dispatch("train") == 0 and calls == ["ran"]
    monkeypatch.setattr(dispatch_module, "entry_points", lambda group, name: [])
    assert dispatch_module.dispatch("reproduce") == 2


def test_throughput_is_logged(project):
    cli = run(
        project, "--trainer.logger=true", "--trainer.max_steps=8", "--trainer.log_every_n_steps=1"
    )
    metrics = (Path(cli.trainer.log_dir) / "metrics.csv").read_text().splitlines()[0]
    assert "samples_per_sec" in metrics and "peak_memory_mb" in metrics


def test_run_ddp_train_reports_a_failed_run(project, tmp_path):
    from papers_cli.testing import run_ddp_train

    with pytest.raises(AssertionError, match="DDP train failed"):
        run_ddp_train(project, [], tmp_path / "ddp", timeout=120)  # `demo` is not installed


def test_check_summaries_catches_ranks_that_differ():
    from papers_cli.testing import check_summaries

    good = {
        "world_size": 2,
        "strategy": "DDPStrategy",
        "parameter_shapes": {"w": [2, 3]},
        "metrics": {"loss": 1.0},
    }
    check_summaries([good, good], devices=2, reference=good)
    with pytest.raises(AssertionError, match="ran"):
        check_summaries([{**good, "world_size": 1}], devices=2)
    with pytest.raises(AssertionError, match="parameter shapes"):
        check_summaries([{**good, "parameter_shapes": {"w": [3, 3]}}], 2, reference=good)
    with pytest.raises(AssertionError, match="logged"):
        check_summaries([{**good, "metrics": {}}], 2, reference=good)
