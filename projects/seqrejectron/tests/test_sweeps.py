import json

import numpy as np
import pytest

from seqrejectron.envs import EXPERT_TABLE
from seqrejectron.experiment import WorldConfig, build_world
from seqrejectron.sweeps import OTHER_EXPERT_TABLE, PROJECT, main, variant_world

TINY = WorldConfig(
    horizon=40, n_train=12, n_test=12, n_calibration=4, n_val=2, n_eval=4, hidden=16, bc_steps=20
)


def test_the_extension_worlds_change_only_what_they_name():
    plain, same = build_world(TINY, 0), variant_world(TINY, 0, 0.0, 0.0)
    for a, b in zip(plain.train, same.train, strict=True):
        np.testing.assert_array_equal(a.expert, b.expert)  # no noise, no mix: the same demos
    noisy = variant_world(TINY, 0, 0.3, 0.0)
    labels = np.concatenate([t.expert for t in noisy.train])
    clean = EXPERT_TABLE[np.concatenate([t.z for t in noisy.train])]
    # a random action w.p. 0.3 differs from the expert's w.p. 0.3 x 2/3 = 0.2
    assert 0.08 < np.mean(labels != clean) < 0.35
    other = variant_world(TINY, 0, 0.0, 0.5)
    first, second = other.test[:6], other.test[6:]
    assert all(np.array_equal(t.actions, OTHER_EXPERT_TABLE[t.z]) for t in first)
    assert all(np.array_equal(t.actions, EXPERT_TABLE[t.z]) for t in second)
    assert not np.array_equal(OTHER_EXPERT_TABLE, EXPERT_TABLE)
    # pi-hat's rollouts keep the clean expert as the oracle's reference
    assert all(np.array_equal(t.expert, EXPERT_TABLE[t.z]) for t in noisy.eval_q)


def test_the_horizon_part_reads_the_claim_record(tmp_path):
    main(["--parts", "horizon", "--out", str(tmp_path)])
    data = json.loads((tmp_path / "horizon.json").read_text())
    record = json.loads((PROJECT / "results" / "claim.json").read_text())
    row = next(
        r for r in data["rows"] if r["subject"] == "bc" and r["horizon"] == 160 and r["seed"] == 1
    )
    assert row["test_cost"] == record["metrics"]["bc"]["test_cost_H160"]["per_seed"][1]
    assert (tmp_path / "horizon.png").stat().st_size > 1000


@pytest.mark.slow
def test_every_sweep_part_runs_on_tiny_data(tmp_path):
    written = main(["--seeds", "0", "--quick", "--out", str(tmp_path)])
    rows = written["thresholds"]["rows"]
    random_time = [r for r in rows if r["subject"] == "random_time"]
    assert random_time[0]["train_stop"] == 0.0  # target 0: never stops
    assert next(r for r in rows if r["subject"] == "bc")["test_executed"] == 1.0
    assert next(r for r in rows if r["subject"] == "oracle_stop")["test_cost"] == 0.0
    for part in ("thresholds", "demos", "extensions", "horizon"):
        assert (tmp_path / f"{part}.png").exists()
    assert {r["subject"] for r in written["pointmaze"]["rows"]} >= {"seqrejectron", "bc"}
