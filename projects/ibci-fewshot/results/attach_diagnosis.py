"""Rewrites the diagnosis of results/claim.json with the current rules of `claim.diagnose`.

The record (`uv run reproduce --replicate` at ebd2da9) carries the diagnosis its run wrote; those
rules read only the registered seeds' preconditions and so left the `not shown` from the
replication seeds unexplained. The rules were extended after reading the run (replication
preconditions, a precondition every seed passes but its 3-seed interval does not, the budget
evidence as "converged") and applied here to the recorded numbers; papers_eval resolves every
cite and the record says the diagnosis was written after the run.

    cd projects/ibci-fewshot && uv run python results/attach_diagnosis.py
"""

from pathlib import Path

from ibci_fewshot import claim
from papers_eval import rediagnose

HERE = Path(__file__).parent


def main() -> None:
    rediagnose(
        HERE / "claim.json",
        claim.CLAIM_FILE,
        claim.diagnose,
        subjects=claim.SUBJECTS,
        metrics=claim.METRICS,
    )


if __name__ == "__main__":
    main()
