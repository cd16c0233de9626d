from pathlib import Path

import numpy as np
import pytest
import torch

from monotone_preferences.claim import run_claim_experiment
from monotone_preferences.cli import train
from monotone_preferences.core import IsotonicRegressor, NonNegativeLinear
from papers_cli.testing import check_resume, run_train_test, user_error_message
from papers_eval import load_claim

PROJECT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((PROJECT / "configs").glob("*.yaml"))
NET = ["--model.estimator=monotone_net", "--trainer.max_epochs=2"]


@pytest.mark.parametrize(
    "config", [c for c in CONFIGS if c.name != "claim.yaml"], ids=lambda p: p.name
)
def test_every_config_parses(config, capsys):
    with pytest.raises(SystemExit) as info:
        train(["fit", "--config", str(config), "--print_config"])
    assert info.value.code == 0, capsys.readouterr().err


def test_train_fast_dev_run_of_the_network(tiny_args):
    cli = train([*tiny_args, *NET, "--trainer.fast_dev_run=1"])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


@pytest.mark.parametrize(("family", "branch"), [("linear", "linear"), ("min", "isotonic")])
def test_through_the_module_the_fit_tracks_the_right_branch(tiny_args, family, branch):
    """`train` (default: the robust estimator) on linear data follows the NNLS fit, on a
    min-type evaluator the isotonic fit, and no optimizer step is taken."""
    args = [*tiny_args, f"--data.family={family}", "--data.n_train=300", "--data.noise=0.2"]
    cli = train(args)
    model, data = cli.model, cli.datamodule
    assert cli.trainer.global_step == 0 and model.fitted.chosen_ == branch
    x, y, _ = (t.numpy() for t in data.train_set.tensors)
    x_test = data.test_set.tensors[0].numpy()
    reference = (NonNegativeLinear if branch == "linear" else IsotonicRegressor)().fit(x, y)
    np.testing.assert_allclose(model.predict_numpy(x_test), reference.predict(x_test), atol=1e-4)
    assert cli.trainer.callback_metrics["fit/weight_linear"] == float(branch == "linear")


def test_same_seed_same_metrics(tiny_args):
    first = train([*tiny_args, *NET, "--seed_everything=3"]).trainer.callback_metrics["val/mse"]
    again = train([*tiny_args, *NET, "--seed_everything=3"]).trainer.callback_metrics["val/mse"]
    assert first.item() == again.item()


def test_short_run_of_the_network_lowers_the_loss(tiny_args):
    untrained = train(["validate", *tiny_args, *NET])
    trained = train([*tiny_args, *NET, "--trainer.max_epochs=15"])
    before = untrained.trainer.callback_metrics["val/mse"].item()
    assert trained.trainer.callback_metrics["val/mse"].item() < 0.7 * before


def test_the_network_resumes_exactly(tiny_args, tmp_path):
    args = [*tiny_args, "--model.estimator=monotone_net"]
    check_resume(train, args, steps=8, root_dir=tmp_path / "resume")  # 4 batches an epoch


def test_train_saves_the_fitted_estimator_and_test_scores_it(tiny_args, tmp_path):
    args = [a for a in tiny_args if "checkpointing" not in a]
    fitted = train([*args, "--data.family=min"])
    checkpoint = Path(fitted.trainer.checkpoint_callback.last_model_path)
    assert checkpoint.name == "last.ckpt" and checkpoint.is_file()
    state = torch.load(checkpoint, weights_only=True)["fitted_estimator"]
    assert set(state["parts"]) == {"linear", "isotonic"}
    x_test, y_test, _ = (t.numpy() for t in fitted.datamodule.test_set.tensors)
    expected = np.mean((fitted.model.predict_numpy(x_test) - y_test) ** 2)
    stdout = run_train_test(PROJECT, [*args, "--data.family=min"], checkpoint)
    line = next(row for row in stdout.splitlines() if "test/mse" in row)
    assert float(line.split("│")[2]) == pytest.approx(expected, rel=1e-4)
    assert "test/excess_error" in stdout and "test/violation_rate" in stdout


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("--model.estimator=ridge", "estimator"),  # a choice that does not exist
        ("--model.folds=0", "folds"),  # out of range
        ("--data.rho=1.5", "rho"),  # not a correlation
        ("--data.n_train=0", "n_train"),
        ("--data.family=cubic", "family"),
        ("--model.no_such_option=1", "no_such_option"),  # unknown key
    ],
)
def test_bad_values_exit_2_with_one_paragraph(tiny_args, flag, message, capsys):
    assert message in user_error_message(train, [*tiny_args, flag], capsys)


def test_data_that_contradict_the_config_exit_2(tiny_args, tmp_path, capsys):
    real = [*tiny_args, "--data.source=rdataset", "--data.rdataset=satgpa"]
    assert "in_features" in user_error_message(train, real, capsys)  # satgpa has 3 criteria
    too_big = [*real, "--data.in_features=3", "--data.n_train=990"]
    assert "fewer than" in user_error_message(train, too_big, capsys)
    table = [*tiny_args, "--data.source=table"]
    assert "spec_path" in user_error_message(train, table, capsys)
    (tmp_path / "t.csv").write_text("a,b,y\n1,2,3\nNA,1,2\n")
    (tmp_path / "s.yaml").write_text("target: y\ncriteria: {a: 1, b: 1}\n")
    nan = [
        *table,
        f"--data.table_path={tmp_path / 't.csv'}",
        f"--data.spec_path={tmp_path / 's.yaml'}",
    ]
    assert "NA cells" in user_error_message(train, nan, capsys)
    (tmp_path / "s.yaml").write_text("target: y\ncriteria: {a: 1, b: 3}\n")
    assert "direction" in user_error_message(train, nan, capsys)


def test_reproduce_quick_writes_a_judged_record(tmp_path):
    outcome = run_claim_experiment(["--quick", "--out", str(tmp_path)])
    record = load_claim(tmp_path / "claim.json")
    assert record["project"] == "monotone-preferences" and record["quick"]
    assert record["verdict"] == outcome["verdict"]
    assert {c["role"] for c in record["controls"]} == {"negative", "positive"}
    assert set(record["metrics"]) == {
        "robust", "ols", "nnls", "glm", "additive", "hgb_monotone", "robust_hgb", "monotone_net",
        "isotonic", "hgb", "l11_erm", "oracle",
    }  # fmt: skip
    evidence = record["evidence"]
    assert evidence["violation_rate"]["robust"] == 0.0  # monotone by construction
    assert "robust_weight_on_linear_branch" in evidence
    assert record["jobs"]["jobs"] > 0  # the shared runner's per-job times
    assert (tmp_path / "claim.md").is_file() and (tmp_path / "error_vs_n.png").is_file()


def test_a_bad_claim_file_stops_before_training(tmp_path, monkeypatch):
    from monotone_preferences import claim

    bad = tmp_path / "claim.yaml"
    text = (PROJECT / "configs" / "claim.yaml").read_text()
    bad.write_text(text.replace("seeds: [0, 1, 2, 3, 4]", "seeds: [0]"))
    monkeypatch.setattr(claim, "CLAIM_FILE", bad)
    monkeypatch.setattr(claim, "run_jobs", lambda *a, **k: pytest.fail("ran before validating"))
    with pytest.raises(ValueError, match="at least 3 seeds"):
        run_claim_experiment(["--out", str(tmp_path / "out")])
