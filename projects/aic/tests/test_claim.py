import pytest

from aic.cli import run_claim_experiment


@pytest.mark.slow
def test_claim_holds_in_the_miniature(tmp_path):
    out = run_claim_experiment(["--out", str(tmp_path)])
    grid = {k: v for k, v in out["verdicts"].items() if k.startswith("lava-crossing")}
    for verdict in grid.values():  # direction and margin on the grid world, where it must show
        assert verdict["compute_saved_pct"] >= 25
        assert verdict["targeted_hurts_more"]
    assert out["holds"]
