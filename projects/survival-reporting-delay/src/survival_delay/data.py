"""Data: the real-format table loader and the simulated miniature behind one DataModule.

Real format (CSV or parquet, in ``<root>``):
    policies.{csv,parquet}  id, enroll_date, end_or_lapse_date, <numeric covariates...>
    claims.{csv,parquet}    id, event_date, report_date
plus an as-of date tau. Times become years since enrolment (days / 365.25). Rules:
    - policy ids must be unique; a claim whose id is not a policy is an error;
    - enroll_date missing, or after tau, is an error; end_or_lapse_date missing = still in force;
    - a claim with a missing date, an event before enrolment, or a report before its event is
      an error;
    - several claims of one policy: ``multiple_claims="first"`` (default) keeps the earliest
      event (the model is for the first event), ``"error"`` refuses them;
    - claims reported after tau are not yet known at tau and are dropped (so one snapshot of the
      tables can be cut at several as-of dates); claims whose event lies after the lapse or
      after coverage L are not counted events (the policy is simply event-free in coverage);
    - the first event must be the one observed (ConfigError otherwise): a policy whose earliest
      counted event is still unreported at tau while a later claim of it is reported has an
      unobserved first event (the model's T), and keeping the later claim as "the first event"
      would bias T upwards; such policies are refused, naming their ids. The rule can only be
      checked when the claims table holds claims reported after tau (a later snapshot cut at
      tau, which is the recommended input); from a snapshot taken at tau it cannot be seen;
    - covariates must be numeric and complete.
Window c = tau - enroll, exposure c' = min(c, L, lapse - enroll).

Dates known to the day (every enrolment, event and report date at midnight, the usual export)
are day-resolution times: enrolment starts at the beginning of its day, an event on day e
happened in [e, e + 1 day), and reports dated tau are known at tau (the window runs to the end
of tau's day, c = tau - enroll + 1 day). Reported T and D are then interval-censored on
[T, T + 1 day) and [D, D + 1 day) in the likelihood (Eq. H5 of hazards.py), so events on the
enrolment date (T = 0) and same-day reports (D = 0) are ordinary data. With times of day,
times are exact.

The DataModule hands the whole cohort to the LightningModule as one batch (one shard per
process under DDP, so each process runs the E-step and the likelihood on its own subjects).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
from jsonargparse.typing import (
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    restricted_string_type,
)
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from papers_cli import ConfigError
from papers_data import DatasetNotFoundError, resolve_data_root
from survival_delay.core import Cohort
from survival_delay.simulate import Truth, simulate_study

DATASET = "survival-reporting-delay"
HOW_TO_GET = (
    "Export two tables from the policy administration system: policies(id, enroll_date, "
    "end_or_lapse_date, covariates...) and claims(id, event_date, report_date), as CSV or "
    "parquet, into this folder, and pass the snapshot's as-of date with --data.as_of."
)
DAYS_PER_YEAR = 365.25
IsoDate = restricted_string_type("IsoDate", r"^\d{4}-\d{2}-\d{2}$", "a date, YYYY-MM-DD")


class DataFormatError(ValueError):
    """The tables do not have the shape or values this project needs."""

    user_facing = True


EXPECTED = ["policies.csv (or .parquet)", "claims.csv (or .parquet)"]


def _read_table(root: Path, name: str) -> pd.DataFrame:
    for suffix, reader in ((".parquet", pd.read_parquet), (".csv", pd.read_csv)):
        path = root / f"{name}{suffix}"
        if path.is_file():
            return reader(path)
    raise DatasetNotFoundError(
        DATASET, root, EXPECTED, HOW_TO_GET, missing=[f"{name}.parquet or {name}.csv"]
    )


def _dates(frame: pd.DataFrame, column: str, table: str) -> pd.Series:
    if column not in frame:
        raise DataFormatError(f"{table} has no column {column!r} (columns: {list(frame.columns)})")
    try:
        return pd.to_datetime(frame[column])
    except (ValueError, TypeError) as error:
        raise DataFormatError(
            f"{table}.{column} holds values that are not dates: {error}"
        ) from None


def tables_to_cohort(
    policies: pd.DataFrame,
    claims: pd.DataFrame,
    as_of: str,
    horizon_years: float = 1.0,
    covariates: list[str] | None = None,
    multiple_claims: str = "first",
) -> tuple[Cohort, pd.DataFrame]:
    """Apply the rules of the module docstring; returns the Cohort and a per-policy frame."""
    tau = pd.Timestamp(as_of)
    if "id" not in policies or "id" not in claims:
        raise DataFormatError("both tables need an 'id' column")
    if policies["id"].duplicated().any():
        dup = policies.loc[policies["id"].duplicated(), "id"].tolist()[:5]
        raise DataFormatError(f"policy ids must be unique; repeated: {dup}")
    enroll = _dates(policies, "enroll_date", "policies")
    lapse = _dates(policies, "end_or_lapse_date", "policies")
    if enroll.isna().any():
        bad = policies.loc[enroll.isna(), "id"].tolist()[:5]
        raise DataFormatError(f"policies with a missing enroll_date: {bad}")
    if (enroll > tau).any():
        bad = policies.loc[enroll > tau, "id"].tolist()[:5]
        raise DataFormatError(f"policies enrolled after the as-of date {tau.date()}: {bad}")
    covariates = covariates or [
        c for c in policies.columns if c not in ("id", "enroll_date", "end_or_lapse_date")
    ]
    x = policies[covariates]
    if not all(pd.api.types.is_numeric_dtype(x[c]) for c in covariates):
        raise DataFormatError(
            f"covariates must be numeric; got dtypes {dict(x.dtypes.astype(str))}"
        )
    if x.isna().any().any():
        raise DataFormatError(
            f"covariates have missing values in {x.columns[x.isna().any()].tolist()}"
        )

    event = _dates(claims, "event_date", "claims")
    report = _dates(claims, "report_date", "claims")
    if event.isna().any() or report.isna().any():
        bad = claims.loc[event.isna() | report.isna(), "id"].tolist()[:5]
        raise DataFormatError(f"claims with a missing event_date or report_date (ids {bad})")
    unknown = ~claims["id"].isin(policies["id"])
    if unknown.any():
        raise DataFormatError(
            f"claims for unknown policy ids: {claims.loc[unknown, 'id'].tolist()[:5]}"
        )
    if (report < event).any():
        bad = claims.loc[report < event, "id"].tolist()[:5]
        raise DataFormatError(f"claims reported before their event date (ids {bad})")
    claims = claims.assign(event_date=event, report_date=report)
    day_resolution = all(
        bool((dates.dropna() == dates.dropna().dt.normalize()).all())
        for dates in (enroll, event, report)
    )
    day = pd.Timedelta(days=1) if day_resolution else pd.Timedelta(0)
    _refuse_hidden_first_events(policies, enroll, lapse, claims, tau, day, horizon_years)
    claims = claims[claims["report_date"] <= tau]  # not yet known at tau
    if claims["id"].duplicated().any():
        if multiple_claims == "error":
            dup = claims.loc[claims["id"].duplicated(), "id"].tolist()[:5]
            raise DataFormatError(
                f"several claims for policies {dup}; pass multiple_claims='first' to keep the "
                "earliest event of each policy (the model is for the first event)"
            )
        if multiple_claims != "first":
            raise DataFormatError(
                f"multiple_claims must be 'first' or 'error', not {multiple_claims!r}"
            )
        claims = claims.sort_values("event_date").drop_duplicates("id", keep="first")

    frame = pd.DataFrame({"id": policies["id"], "enroll": enroll, "lapse": lapse})
    frame = frame.merge(claims[["id", "event_date", "report_date"]], on="id", how="left")
    if (frame["event_date"] < frame["enroll"]).any():
        bad = frame.loc[frame["event_date"] < frame["enroll"], "id"].tolist()[:5]
        raise DataFormatError(f"claims with an event before enrolment (ids {bad})")
    years = lambda delta: delta.dt.total_seconds().to_numpy() / 86400 / DAYS_PER_YEAR  # noqa: E731
    window = years(tau + day - frame["enroll"])
    to_lapse = years(frame["lapse"] - frame["enroll"])
    exposure = np.fmin(
        np.minimum(window, horizon_years), np.where(np.isnan(to_lapse), np.inf, to_lapse)
    )
    exposure = np.clip(exposure, 0, None)
    t = years(frame["event_date"] - frame["enroll"])
    d = years(frame["report_date"] - frame["event_date"])
    reported = ~np.isnan(t) & (t < exposure if day_resolution else t <= exposure)
    width = np.where(reported, day.total_seconds() / 86400 / DAYS_PER_YEAR, 0.0)
    cohort = Cohort(
        torch.as_tensor(x.to_numpy(float)),
        torch.as_tensor(window),
        torch.as_tensor(exposure),
        torch.as_tensor(reported),
        torch.as_tensor(np.where(reported, t, np.nan)),
        torch.as_tensor(np.where(reported, d, np.nan)),
        torch.as_tensor(width) if day_resolution else None,
        torch.as_tensor(width) if day_resolution else None,
    )
    return cohort.check(), frame.assign(window=window, exposure=exposure, reported=reported)


def _refuse_hidden_first_events(
    policies: pd.DataFrame,
    enroll: pd.Series,
    lapse: pd.Series,
    claims: pd.DataFrame,
    tau: pd.Timestamp,
    day: pd.Timedelta,
    horizon_years: float,
) -> None:
    """ConfigError naming the policies whose first counted event is unreported at tau while a
    later claim of theirs is reported (the module docstring's first-event rule)."""
    ends = pd.DataFrame({"id": policies["id"], "enroll": enroll, "lapse": lapse})
    merged = claims.merge(ends, on="id")
    coverage_end = merged["enroll"] + pd.to_timedelta(horizon_years * DAYS_PER_YEAR, unit="D")
    cut = pd.Series(tau + day, index=merged.index)
    end = pd.concat([coverage_end, merged["lapse"].fillna(coverage_end), cut], axis=1).min(axis=1)
    inside = merged["event_date"] < end if day_resolution(day) else merged["event_date"] <= end
    counted = merged[inside]
    if counted.empty:
        return
    counted = counted.sort_values(["id", "event_date", "report_date"])
    first_unreported = counted.groupby("id")["report_date"].first() > tau
    any_reported = (counted["report_date"] <= tau).groupby(counted["id"]).any()
    hidden = first_unreported & any_reported
    if hidden.any():
        ids = hidden[hidden].index.tolist()
        raise ConfigError(
            f"policies {ids[:20]}{' ...' if len(ids) > 20 else ''} ({len(ids)} in all) have a "
            f"first claim event still unreported at the as-of date {tau.date()} while a later "
            "claim of theirs is reported. The model is for the first event, which for these "
            "policies is unobserved (not the later reported one), so they cannot be used as "
            "they are: drop these policies, or choose an as-of date by which their first claim "
            "is reported."
        )


def day_resolution(day: pd.Timedelta) -> bool:
    return day > pd.Timedelta(0)


def load_tables(
    root: str | None,
    as_of: str,
    horizon_years: float = 1.0,
    covariates: list[str] | None = None,
    multiple_claims: str = "first",
) -> Cohort:
    """Read policies and claims (CSV or parquet) from the data root; DatasetNotFoundError if
    they are missing."""
    folder = resolve_data_root(root, DATASET, EXPECTED, HOW_TO_GET)
    policies, claims = _read_table(folder, "policies"), _read_table(folder, "claims")
    return tables_to_cohort(policies, claims, as_of, horizon_years, covariates, multiple_claims)[0]


def split_by_window(cohort: Cohort, min_source_window: float) -> tuple[Cohort, Cohort]:
    """Source = subjects followed at least ``min_source_window``; target = the rest."""
    long = cohort.window >= min_source_window
    return cohort.subset(long.nonzero().squeeze(-1)), cohort.subset((~long).nonzero().squeeze(-1))


class CohortShards(Dataset):
    """Item r is shard r of (source, target): subjects r, r + W, r + 2W, ... for W shards.

    ``source_ids`` (the shard's source subject indices) comes first so that the shared
    throughput monitor, which sizes a batch by its first tensor, counts subjects.
    """

    def __init__(self, source: Cohort, target: Cohort, shards: int) -> None:
        self.source, self.target, self.shards = source, target, shards

    def __len__(self) -> int:
        return self.shards

    def __getitem__(self, r: int) -> dict:
        ids = torch.arange(r, len(self.source), self.shards)
        target_ids = torch.arange(r, len(self.target), self.shards)
        return {
            "source_ids": ids,
            "source": self.source.subset(ids),
            "target": self.target.subset(target_ids),
        }


class SurvivalDelayDataModule(LightningDataModule):
    """Simulated source/target cohorts (default) or the real tables under ``root``.

    With real tables the source is every policy followed for at least ``min_source_window``
    years at the as-of date and the target is the newly enrolled rest.
    """

    def __init__(
        self,
        root: str | None = None,
        as_of: IsoDate | None = None,
        min_source_window: PositiveFloat = 1.5,
        horizon: PositiveFloat = 1.0,
        n_source: PositiveInt = 3000,
        n_target: PositiveInt = 1000,
        target_window: PositiveFloat = 0.5,
        gamma: float = 0.4,
        n_features: NonNegativeInt = 1,
        seed: NonNegativeInt = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.target_truth: np.ndarray | None = None
        self.target_ids: np.ndarray | None = None  # policy ids (real tables), else row numbers

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        if h.root is not None:
            resolve_data_root(h.root, DATASET, EXPECTED, HOW_TO_GET)  # missing folder first
            if h.as_of is None:
                raise ConfigError(
                    "real tables need the snapshot's as-of date: --data.as_of=YYYY-MM-DD"
                )
            folder = resolve_data_root(h.root, DATASET, EXPECTED, HOW_TO_GET)
            cohort, frame = tables_to_cohort(
                _read_table(folder, "policies"), _read_table(folder, "claims"), h.as_of, h.horizon
            )
            if cohort.x.shape[1] != h.n_features:
                raise ConfigError(
                    f"the policies table has {cohort.x.shape[1]} covariates but "
                    f"data.n_features={h.n_features}; set --data.n_features={cohort.x.shape[1]}"
                )
            self.source, self.target = split_by_window(cohort, h.min_source_window)
            long = cohort.window.numpy() >= h.min_source_window
            self.target_ids = frame["id"].to_numpy()[~long]
            return
        beta = (0.5, -0.3, 0.2, 0.0)[: h.n_features] + (0.0,) * max(0, h.n_features - 4)
        truth = Truth(beta=beta, gamma=h.gamma, horizon=h.horizon)
        source, target = simulate_study(
            h.seed, truth, h.n_source, h.n_target, target_window=h.target_window
        )
        self.source, self.target = source.cohort, target.cohort
        self.target_truth = target.true_risk
        self.truth = truth

    def _loader(self) -> DataLoader:
        world = self.trainer.world_size if self.trainer is not None else 1
        return DataLoader(
            CohortShards(self.source, self.target, world),
            batch_size=None,
            collate_fn=lambda item: item,
            num_workers=0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader()

    def val_dataloader(self) -> DataLoader:
        return self._loader()

    def test_dataloader(self) -> DataLoader:
        return self._loader()
