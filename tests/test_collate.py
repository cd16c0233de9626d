"""tools/collate_results.py shows each verdict as computed, the controls and the seed count."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from collate_results import build_table, result_cells
from papers_eval import judge, load_claim_spec, run_seeds, write_claim, write_results

ERRORS = {
    "held": {"method": 0.5, "baseline": 1.0, "broken": 1.2, "oracle": 0.1},
    "did not hold": {"method": 1.1, "baseline": 1.0, "broken": 1.2, "oracle": 0.1},
    "not shown": {"method": 0.5, "baseline": 1.0, "broken": 0.4, "oracle": 0.1},
}


def write_record(folder, errors, quick=False):
    spec_file = folder / "claim.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "claim": "c",
                "method": "method",
                "baselines": ["baseline"],
                "controls": {"negative": ["broken"], "positive": ["oracle"]},
                "seeds": [0, 1, 2],
                "quick": {"seeds": [0, 1]},
                "checks": [{"name": "c", "metric": "err", "goal": "lower", "against": "baseline"}],
            }
        )
    )
    spec = load_claim_spec(spec_file, subjects=errors, metrics=["err"], quick=quick)
    noise = np.random.default_rng(0)
    results = run_seeds(spec, lambda s, seed: {"err": errors[s] + 0.01 * noise.standard_normal(20)})
    judgement = judge(spec, results)
    write_claim(
        folder / "results",
        project="demo",
        spec=spec,
        results=results,
        judgement=judgement,
        config={},
        wall_time_s=0,
    )
    return folder / "results" / "claim.json"


@pytest.mark.parametrize("verdict", list(ERRORS))
def test_each_verdict_is_rendered_as_computed(tmp_path, verdict):
    verdict_cell, controls, seeds, headline = result_cells(
        "demo", write_record(tmp_path, ERRORS[verdict])
    )
    assert verdict_cell == f"[{verdict}](projects/demo/results/claim.md)"
    assert controls == ("1/2 as required" if verdict == "not shown" else "2/2 as required")
    assert seeds == "3" and headline.startswith("err: method")


def test_a_quick_record_says_so(tmp_path):
    verdict_cell, _, seeds, _ = result_cells("demo", write_record(tmp_path, ERRORS["held"], True))
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
    verdict_cell, controls, seeds, headline = result_cells("old", tmp_path / "claim.json")
    assert verdict_cell.startswith("[pre-protocol record]") and "held]" not in verdict_cell
    assert (controls, seeds, headline) == ("none", "1", "a 1 vs b 0")


def test_table_rows_for_planned_and_unmeasured_projects(tmp_path):
    (tmp_path / "papers.toml").write_text(
        '[[paper]]\nslug = "a"\ntitle = "A"\nclaim = "x"\n'
        '[[paper]]\nslug = "b"\ntitle = "B"\nclaim = "y"\n'
    )
    (tmp_path / "projects" / "b").mkdir(parents=True)
    rows = build_table(tmp_path).splitlines()
    assert rows[2] == "| A | a | x | planned | - | - | - |"
    assert rows[3] == "| B | [b](projects/b) | y | in progress | - | - | - |"
