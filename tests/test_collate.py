"""tools/collate_results.py shows each verdict as computed, the controls and the seed count."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from collate_results import build_table, build_times_table, result_cells
from papers_eval import (
    Replication,
    finding,
    judge,
    load_claim_spec,
    run_seeds,
    write_claim,
    write_results,
)

ERRORS = {
    "held": {"method": 0.5, "baseline": 1.0, "broken": 1.2, "oracle": 0.1},
    "did not hold": {"method": 1.1, "baseline": 1.0, "broken": 1.2, "oracle": 0.1},
    "not shown": {"method": 0.5, "baseline": 1.0, "broken": 0.4, "oracle": 0.1},
}


def write_record(
    folder, errors, quick=False, protocol=2, replicate_with=None, diagnosis=None, wall_time_s=0
):
    folder.mkdir(parents=True, exist_ok=True)
    spec_file = folder / "claim.yaml"
    raw = {
        "claim": "c",
        "method": "method",
        "baselines": ["baseline"],
        "controls": {"negative": ["broken"], "positive": ["oracle"]},
        "seeds": [0, 1, 2],
        "quick": {"seeds": [0, 1]},
        "checks": [{"name": "c", "metric": "err", "goal": "lower", "against": "baseline"}],
    }
    if protocol == 3:
        raw["protocol"] = 3
        raw["replication"] = {"seeds": [10, 11, 12]}
        raw["controls"]["positive"] = [
            {"name": "oracle", "kind": "oracle", "pipeline": "model", "why": "true labels"}
        ]
    spec_file.write_text(yaml.safe_dump(raw))
    spec = load_claim_spec(spec_file, subjects=errors, metrics=["err"], quick=quick)
    noise = np.random.default_rng(0)

    def run(subject_errors, spec):
        return run_seeds(
            spec, lambda s, seed: {"err": subject_errors[s] + 0.01 * noise.standard_normal(20)}
        )

    results = run(errors, spec)
    replication = None
    if replicate_with is not None:
        rspec = spec.for_replication()
        rresults = run(replicate_with, rspec)
        replication = Replication(rspec, rresults, judge(rspec, rresults))
    write_claim(
        folder / "results",
        project="demo",
        spec=spec,
        results=results,
        judgement=judge(spec, results),
        config={},
        wall_time_s=wall_time_s,
        replication=replication,
        diagnosis=diagnosis,
    )
    return folder / "results" / "claim.json"


@pytest.mark.parametrize("verdict", list(ERRORS))
def test_a_protocol_2_record_shows_its_verdict_marked_protocol_v2(tmp_path, verdict):
    cells = result_cells("demo", write_record(tmp_path, ERRORS[verdict]))
    verdict_cell, controls, seeds, diagnosis, headline = cells
    computed = "held, not replicated" if verdict == "held" else verdict
    assert verdict_cell == f"[{computed}](projects/demo/results/claim.md) (protocol v2)"
    assert controls == ("1/2 as required" if verdict == "not shown" else "2/2 as required")
    assert seeds == "3" and diagnosis == "-" and headline.startswith("err: method")


def test_protocol_3_verdicts_with_and_without_replication(tmp_path):
    held, did_not = ERRORS["held"], ERRORS["did not hold"]
    cells = result_cells("demo", write_record(tmp_path / "a", held, protocol=3,
                                              replicate_with=held))  # fmt: skip
    assert cells[0] == "[held](projects/demo/results/claim.md)"
    assert cells[2] == "3 + 3 replication" and cells[3] == "-"
    cells = result_cells("demo", write_record(tmp_path / "b", held, protocol=3))
    assert cells[0] == "[held, not replicated](projects/demo/results/claim.md)"
    cells = result_cells("demo", write_record(tmp_path / "c", held, protocol=3,
                                              replicate_with=did_not))  # fmt: skip
    assert cells[0].startswith("[mixed]") and cells[3] == "missing"
    cells = result_cells(
        "demo",
        write_record(
            tmp_path / "d",
            did_not,
            protocol=3,
            diagnosis=finding(
                "check", "the bar sits in the noise", ("metrics.method.err.mean", "")
            ),
        ),
    )
    assert cells[0] == "[did not hold](projects/demo/results/claim.md) (replication not run)"
    assert cells[3] == "check: the bar sits in the noise"


def test_a_quick_record_says_so(tmp_path):
    verdict_cell, _, seeds, _, _ = result_cells(
        "demo", write_record(tmp_path, ERRORS["held"], True)
    )
    assert verdict_cell.endswith("(quick run)") and seeds == "2"


def test_a_schema_1_record_is_never_shown_as_a_verdict(tmp_path):
    write_results(
        tmp_path,
        project="old",
        experiment="x",
        claim="c",
        criterion="a > b",
        holds=True,
        metrics={"m": {"a": 1.0}},
        config={},
        seeds=[0],
        wall_time_s=0.0,
        headline="a 1 vs b 0",
    )
    verdict_cell, controls, seeds, diagnosis, headline = result_cells(
        "old", tmp_path / "claim.json"
    )
    assert verdict_cell.startswith("[pre-protocol record]") and "held]" not in verdict_cell
    assert (controls, seeds, diagnosis, headline) == ("none", "1", "-", "a 1 vs b 0")


def test_table_rows_for_planned_and_unmeasured_projects(tmp_path):
    (tmp_path / "papers.toml").write_text(
        '[[paper]]\nslug = "a"\ntitle = "A"\nclaim = "x"\n'
        '[[paper]]\nslug = "b"\ntitle = "B"\nclaim = "y"\n'
    )
    (tmp_path / "projects" / "b").mkdir(parents=True)
    rows = build_table(tmp_path).splitlines()
    assert rows[2] == "| A | a | x | planned | - | - | - | - |"
    assert rows[3] == "| B | [b](projects/b) | y | in progress | - | - | - | - |"


def test_the_times_table_lists_each_full_record_with_its_wall_time_and_seeds(tmp_path):
    """A full record's wall time, seeds (registered + replication), cores and the 20-minute
    budget; a --quick record and a project without a record get no row."""
    (tmp_path / "papers.toml").write_text(
        "".join(f'[[paper]]\nslug = "{s}"\ntitle = "{s}"\nclaim = "x"\n' for s in "abcd")
    )
    projects = tmp_path / "projects"
    write_record(projects / "a", ERRORS["held"], protocol=3, replicate_with=ERRORS["held"],
                 wall_time_s=1500)  # fmt: skip
    write_record(projects / "b", ERRORS["held"], wall_time_s=90)
    write_record(projects / "c", ERRORS["held"], quick=True, wall_time_s=20)
    (projects / "d").mkdir()
    rows = build_times_table(tmp_path).splitlines()
    assert len(rows) == 4
    a, b = (row.split(" | ") for row in rows[2:])
    assert a[:3] == ["| a", "25.0 min", "3 + 3"] and a[-1] == "no |"
    assert b[:3] == ["| b", "1.5 min", "3"] and b[-1] == "yes |"
    assert a[3] == "-"  # no job summary in these records
