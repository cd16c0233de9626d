"""Rewrite results/claim.json's diagnosis with the current rules of claim.diagnose (after the
run: the tuning-edge findings were added once the registered run had tuned two subjects to the
top of their grids). Nothing trains; the numbers are the record's.

    uv run python results/rediagnose.py
"""

from pathlib import Path

from counterfactual_instruments.claim import CLAIM_FILE, METRICS, SUBJECTS, diagnose
from papers_eval import rediagnose

if __name__ == "__main__":
    record = Path(__file__).resolve().parent / "claim.json"
    rediagnose(record, CLAIM_FILE, diagnose, subjects=tuple(SUBJECTS), metrics=METRICS)
    print(f"rewrote the diagnosis of {record}")
