"""Marks the record as re-specified after the judged record at 8e4628a (outcome known).

`write_claim` notes a re-specification itself when it finds the earlier record at
results/claim.json and moves it under results/history/. For this run (issue 54, git 70eac68)
the earlier record had already been moved there by hand (`git mv`, in the commit that
re-specified configs/claim.yaml), so the run wrote `respecified_after: null`. This script sets
the field to the earlier record's revision and renders claim.md again; nothing else changes.

    cd projects/learned-async-schedule && uv run python results/mark_respecification.py
"""

import json
from pathlib import Path

from papers_eval.claim_record import load_claim, render_markdown

HERE = Path(__file__).parent
EARLIER = HERE / "history" / "8e4628a0617f" / "claim.json"


def main() -> None:
    record = load_claim(HERE / "claim.json", require_v3=True)
    earlier = json.loads(EARLIER.read_text())
    revision = str(earlier["git_revision"]).split(" ")[0].removesuffix("+dirty")
    assert earlier.get("spec_sha256") != record["spec_sha256"]  # the spec did change
    record["respecified_after"] = revision
    (HERE / "claim.json").write_text(json.dumps(record, indent=2) + "\n")
    (HERE / "claim.md").write_text(render_markdown(record))


if __name__ == "__main__":
    main()
