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
from papers_eval import load_claim_spec
from papers_eval.claim_record import attach_diagnosis, load_claim

HERE = Path(__file__).parent


def main() -> None:
    record = load_claim(HERE / "claim.json", require_v3=True)
    spec = load_claim_spec(
        claim.CLAIM_FILE, subjects=claim.SUBJECTS, metrics=claim.METRICS, allow_dirty=True
    )
    attach_diagnosis(HERE / "claim.json", claim.diagnose(record, spec=spec))


if __name__ == "__main__":
    main()
