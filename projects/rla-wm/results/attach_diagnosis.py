"""Rewrites the diagnosis of results/claim.json with the current rules of `claim.diagnose`.

The record (`uv run reproduce --replicate` at dfafffc) carries the diagnosis its run wrote. While
it ran, its tuning phase showed three learning-rate choices on an end of their grids (token flow
at the top, the pixel model and regression at the bottom), which those rules did not name, and
they named only the first of several unexplained failed checks. The rules were extended (a
``check`` finding per tuned rate on a grid end; every failed check the specific rules do not
explain gets an ``undetermined`` finding) and applied here to the recorded numbers; papers_eval
resolves every cite and the record says the diagnosis was written after the run.

    cd projects/rla-wm && uv run python results/attach_diagnosis.py
"""

from pathlib import Path

from papers_eval import rediagnose
from rlawm import claim

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
