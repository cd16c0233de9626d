import math

import numpy as np
import pandas as pd
import pytest
import torch

from papers_cli import ConfigError
from papers_data import DATA_ROOT_ENV, DatasetNotFoundError
from survival_delay.data import (
    CohortShards,
    DataFormatError,
    SurvivalDelayDataModule,
    load_tables,
    tables_to_cohort,
)
from survival_delay.simulate import Truth, simulate_study

AS_OF = "2024-01-01"


def fixture_tables():
    policies = pd.DataFrame(
        {
            "id": [1, 2, 3, 4, 5],
            "enroll_date": ["2022-01-01", "2023-07-01", "2023-10-01", "2021-06-01", "2023-12-01"],
            "end_or_lapse_date": [None, None, "2023-11-01", None, None],
            "age": [30.0, 45.0, 50.0, 61.0, 22.0],
            "urban": [1, 0, 1, 1, 0],
        }
    )
    claims = pd.DataFrame(
        {
            "id": [1, 2, 3, 5],
            "event_date": ["2022-03-01", "2023-09-01", "2023-10-15", "2023-12-20"],
            # id 5's report comes after the as-of date: not yet known
            "report_date": ["2022-04-01", "2023-11-15", "2023-12-01", "2024-02-01"],
        }
    )
    return policies, claims


def test_tables_become_a_cohort_with_the_documented_rules():
    cohort, frame = tables_to_cohort(*fixture_tables(), AS_OF, horizon_years=1.0)
    assert cohort.x.shape == (5, 2) and cohort.x.dtype == torch.float64
    assert cohort.reported.tolist() == [True, True, True, False, False]
    year = 365.25
    assert cohort.window[0].item() == pytest.approx(730 / year)
    assert cohort.exposure[0].item() == pytest.approx(1.0)  # capped at coverage L
    assert cohort.exposure[2].item() == pytest.approx(31 / year)  # lapsed after a month
    assert cohort.event_time[1].item() == pytest.approx(62 / year)
    assert cohort.delay[1].item() == pytest.approx(75 / year)
    assert math.isnan(cohort.event_time[4].item())  # reported after tau -> unreported


@pytest.mark.parametrize("suffix", ["csv", "parquet"])
def test_loader_reads_csv_and_parquet_fixtures(tmp_path, suffix):
    policies, claims = fixture_tables()
    for name, table in (("policies", policies), ("claims", claims)):
        path = tmp_path / f"{name}.{suffix}"
        table.to_csv(path, index=False) if suffix == "csv" else table.to_parquet(path)
    cohort = load_tables(str(tmp_path), AS_OF)
    assert len(cohort) == 5 and int(cohort.reported.sum()) == 3


def test_multiple_claims_keep_the_first_or_are_an_error():
    policies, claims = fixture_tables()
    extra = pd.DataFrame({"id": [1], "event_date": ["2022-02-01"], "report_date": ["2022-02-10"]})
    claims = pd.concat([claims, extra])
    cohort, _ = tables_to_cohort(policies, claims, AS_OF)
    assert cohort.event_time[0].item() == pytest.approx(31 / 365.25)  # the earlier event
    with pytest.raises(DataFormatError, match="several claims"):
        tables_to_cohort(policies, claims, AS_OF, multiple_claims="error")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda p, c: c.assign(report_date=c["event_date"].where(c["id"] != 2, "2023-08-01")),
            "before their event",
        ),
        (
            lambda p, c: c.assign(event_date=c["event_date"].where(c["id"] != 1, None)),
            "missing event_date",
        ),
        (
            lambda p, c: p.assign(enroll_date=p["enroll_date"].where(p["id"] != 3, None)),
            "missing enroll_date",
        ),
        (
            lambda p, c: pd.concat(
                [
                    c,
                    pd.DataFrame(
                        {"id": [99], "event_date": ["2023-01-01"], "report_date": ["2023-02-01"]}
                    ),
                ]
            ),
            "unknown policy ids",
        ),
        (lambda p, c: pd.concat([p, p.iloc[:1]]), "unique"),
        (lambda p, c: p.assign(age=["a", "b", "c", "d", "e"]), "numeric"),
        (
            lambda p, c: c.assign(event_date=c["event_date"].where(c["id"] != 2, "2023-01-01")),
            "before enrolment",
        ),
    ],
    ids=[
        "report-before-event",
        "missing-event",
        "missing-enrol",
        "unknown-id",
        "duplicate-policy",
        "text-covariate",
        "event-before-enrolment",
    ],
)
def test_bad_tables_are_clear_errors(edit, message):
    policies, claims = fixture_tables()
    edited = edit(policies, claims)
    if "enroll_date" in edited.columns:
        policies = edited
    else:
        claims = edited
    with pytest.raises(DataFormatError, match=message):
        tables_to_cohort(policies, claims, AS_OF)
    assert DataFormatError.user_facing


def test_missing_real_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatasetNotFoundError, match="policies"):
        load_tables(str(tmp_path), AS_OF)
    with pytest.raises(DatasetNotFoundError):
        load_tables(None, AS_OF)


def test_simulator_is_seeded_and_respects_the_observation_rule():
    a, _ = simulate_study(1, Truth(), 300, 100)
    b, _ = simulate_study(1, Truth(), 300, 100)
    c, _ = simulate_study(2, Truth(), 300, 100)
    assert torch.equal(a.cohort.x, b.cohort.x) and not torch.equal(a.cohort.x, c.cohort.x)
    rep = a.cohort.reported.numpy()
    t, d = a.true_time, a.true_delay
    expected = (t <= a.cohort.exposure.numpy()) & (t + d <= a.cohort.window.numpy())
    np.testing.assert_array_equal(rep, expected)


def test_shards_partition_the_subjects():
    source, target = simulate_study(0, Truth(), 101, 50)
    shards = CohortShards(source.cohort, target.cohort, 2)
    ids = torch.cat([shards[r]["source_ids"] for r in range(2)])
    assert sorted(ids.tolist()) == list(range(101))
    assert len(shards[0]["target"]) + len(shards[1]["target"]) == 50


def test_datamodule_real_tables_split_source_and_target(tmp_path):
    policies, claims = fixture_tables()
    policies.to_csv(tmp_path / "policies.csv", index=False)
    claims.to_csv(tmp_path / "claims.csv", index=False)
    data = SurvivalDelayDataModule(
        root=str(tmp_path), as_of=AS_OF, min_source_window=1.5, n_features=2
    )
    data.setup()
    assert len(data.source) == 2 and len(data.target) == 3
    with pytest.raises(ConfigError, match="n_features"):
        SurvivalDelayDataModule(root=str(tmp_path), as_of=AS_OF, n_features=3).setup()
    with pytest.raises(ConfigError, match="as-of date"):
        SurvivalDelayDataModule(root=str(tmp_path), n_features=2).setup()
