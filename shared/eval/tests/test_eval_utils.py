import json

import numpy as np
import pytest

from papers_eval import (
    RESULTS_FIELDS,
    bootstrap_ci,
    line_plot,
    load_results,
    markdown_table,
    pareto_front,
    pareto_plot,
    write_results,
)


def test_bootstrap_ci_brackets_the_mean_and_is_seeded():
    values = np.random.default_rng(0).normal(1.0, 1.0, size=400)
    lo, hi = bootstrap_ci(values, seed=1)
    assert lo < values.mean() < hi
    assert 0.1 < hi - lo < 0.4  # about 2 * 1.96 / sqrt(400)
    assert bootstrap_ci(values, seed=1) == (lo, hi)
    assert bootstrap_ci([1.0, 1.0, 1.0]) == (1.0, 1.0)


def test_pareto_front_keeps_only_non_dominated_points():
    costs = [1, 2, 3, 2, 4]
    scores = [0.5, 0.7, 0.9, 0.6, 0.8]
    assert pareto_front(costs, scores) == [0, 1, 2]
    with pytest.raises(ValueError):
        pareto_front([1, 2], [1])


def test_markdown_table_formats_values_and_intervals():
    table = markdown_table(
        {
            "method": {"acc": 0.91234, "cost": 3},
            "baseline": {"acc": {"mean": 0.5, "ci": [0.4, 0.6]}},
        }
    )
    lines = table.splitlines()
    assert lines[0] == "| method | acc | cost |"
    assert lines[2] == "| method | 0.912 | 3 |"
    assert lines[3] == "| baseline | 0.5 [0.4, 0.6] | - |"


def test_results_record_has_every_field(tmp_path):
    path = write_results(
        tmp_path,
        project="demo",
        experiment="toy",
        claim="method beats baseline",
        criterion="acc(method) > acc(baseline)",
        holds=True,
        metrics={"method": {"acc": np.float32(0.9), "nan": float("nan")}, "baseline": {"acc": 0.5}},
        config={"lr": 1e-3},
        seeds=[0],
        wall_time_s=1.234,
    )
    record = load_results(path)
    assert set(RESULTS_FIELDS) <= set(record)
    assert record["metrics"]["method"]["acc"] == pytest.approx(0.9)
    assert record["metrics"]["method"]["nan"] is None  # strict JSON
    json.loads(path.read_text())
    md = (tmp_path / "claim.md").read_text()
    assert "| method |" in md and "Holds in this run:** yes" in md
    (tmp_path / "broken.json").write_text("{}")
    with pytest.raises(ValueError, match="missing fields"):
        load_results(tmp_path / "broken.json")


def test_plots_write_png_files(tmp_path):
    png = line_plot(
        tmp_path / "a.png",
        [1, 2, 4],
        {"m": [0.1, 0.5, 0.9]},
        xlabel="x",
        ylabel="y",
        bands={"m": ([0, 0.4, 0.8], [0.2, 0.6, 1.0])},
    )
    front = pareto_plot(tmp_path / "b.png", {"a": (1, 0.5), "b": (2, 0.9)}, xlabel="c", ylabel="s")
    for p in (png, front):
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_git_revision_ignores_rewritten_results_but_not_code(tmp_path):
    import subprocess

    from papers_eval import git_revision

    def git(*args):
        subprocess.run(
            ["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
        )

    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "claim.json").write_text("{}")
    (tmp_path / "core.py").write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "init")
    results = tmp_path / "results"
    (results / "claim.json").write_text('{"rerun": true}')
    assert not git_revision(results, ignore=results).endswith("+dirty")
    assert git_revision(results).endswith("+dirty")
    (tmp_path / "core.py").write_text("x = 2\n")
    assert git_revision(results, ignore=results).endswith("+dirty")


def test_provenance_names_revision_hardware_time_and_command(tmp_path):
    import time

    from papers_eval import provenance

    record = provenance(tmp_path, "python -m some.experiment", time.perf_counter() - 2.0, ["--x"])
    assert set(record) == {"git_revision", "hardware", "wall_time_s", "command"}
    assert record["command"] == "python -m some.experiment --x"
    assert 2.0 <= record["wall_time_s"] < 60
    assert record["git_revision"] == "unknown"  # tmp_path is not a git repository
    assert {"cpu_count", "torch"} <= set(record["hardware"])
