"""The fitted model on disk: parameters (theta, phi, gamma) and the per-policy timely risks.

``train`` writes both at the end of every fit (beside Lightning's ``last.ckpt``, which holds the
same parameters and the MCEM state for resuming):

- ``fitted_params.json``: the hazard families, the covariate count, the coverage L and the
  fitted blocks; ``load_fit`` rebuilds the model from it without Lightning;
- ``timely_risk.csv``: one row per target policy: ``policy_id``, ``reported`` (a claim reported
  by tau), ``timely_risk`` = F(L | x) (Eq. R1 with the target's shift) and
  ``expected_unreported`` = pi_i, the expected number of occurred-but-unreported first events
  (Eq. E1; 0 for reported policies), whose sum is the IBNR count (Eq. R2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from survival_delay.core import Cohort, JointModel

PARAMS_FILE = "fitted_params.json"
RISK_FILE = "timely_risk.csv"


def save_fit(
    folder: str | Path,
    joint: JointModel,
    blocks: dict[str, torch.Tensor],
    config: dict[str, Any],
    target: Cohort,
    policy_ids: np.ndarray | None = None,
) -> tuple[Path, Path]:
    """Write ``fitted_params.json`` and ``timely_risk.csv`` into ``folder``; returns both paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    record = {
        "config": config,
        "blocks": {k: v.detach().cpu().tolist() for k, v in blocks.items()},
        "parameter_layout": {
            "theta": f"{joint.event.family.name} baseline + {joint.event.n_coef} PH coefficients",
            "phi": f"{joint.delay.family.name} baseline + {joint.delay.n_coef} PH coefficients",
            "gamma": "the target cohort's log risk shift",
        },
    }
    params_path = folder / PARAMS_FILE
    params_path.write_text(json.dumps(record, indent=1) + "\n")
    risk_path = folder / RISK_FILE
    policy_risks(joint, blocks, target, config["horizon"], policy_ids).to_csv(
        risk_path, index=False
    )
    return params_path, risk_path


def policy_risks(
    joint: JointModel,
    blocks: dict[str, torch.Tensor],
    target: Cohort,
    horizon: float,
    policy_ids: np.ndarray | None = None,
) -> pd.DataFrame:
    """The per-policy table of ``timely_risk.csv`` (module docstring)."""
    with torch.no_grad():
        theta, phi, gamma = blocks["theta"], blocks["phi"], blocks["gamma"]
        risk = joint.timely_risk(theta, target.x, horizon, gamma)
        pi = joint.posterior_event_prob(theta, phi, target, gamma)
    ids = np.arange(len(target)) if policy_ids is None else np.asarray(policy_ids)
    return pd.DataFrame(
        {
            "policy_id": ids,
            "reported": target.reported.cpu().numpy(),
            "timely_risk": risk.cpu().numpy(),
            "expected_unreported": pi.cpu().numpy(),
        }
    )


def load_fit(path: str | Path) -> tuple[JointModel, dict[str, torch.Tensor], dict[str, Any]]:
    """Rebuild the model and its fitted blocks from ``fitted_params.json``."""
    record = json.loads(Path(path).read_text())
    config = record["config"]
    joint = JointModel.build(
        config["n_features"],
        config["event_family"],
        config["delay_family"],
        config["delay_covariates"],
        tuple(config["cuts"]) if config.get("cuts") else None,
        config["quad_nodes"],
    )
    blocks = {k: torch.tensor(v, dtype=torch.float64) for k, v in record["blocks"].items()}
    return joint, blocks, config
