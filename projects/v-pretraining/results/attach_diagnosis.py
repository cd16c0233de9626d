"""Adds the findings of results/diagnosis.yaml (written after reading the run) to the rule-based
diagnosis that `reproduce` wrote into results/claim.json, through papers_eval's
attach_diagnosis (every cite is resolved against the record; the record then says the
diagnosis was written after the run).

    cd projects/v-pretraining && uv run python results/attach_diagnosis.py
"""

from pathlib import Path

import yaml

from papers_eval.claim_record import attach_diagnosis, load_claim
from papers_eval.diagnosis import from_mapping

HERE = Path(__file__).parent


def main() -> None:
    record = load_claim(HERE / "claim.json", require_v3=True)
    after = "(written after the run) "
    rules = [f for f in record.get("diagnosis") or [] if not f["summary"].startswith(after)]
    added = yaml.safe_load((HERE / "diagnosis.yaml").read_text())
    for finding in added:
        finding["summary"] = after + " ".join(finding["summary"].split())
    attach_diagnosis(HERE / "claim.json", from_mapping(rules) + from_mapping(added))


if __name__ == "__main__":
    main()
