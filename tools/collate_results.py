"""Rebuild the papers table and the claim-run times table in README.md from papers.toml and each
project's results/claim.json.

    uv run tools/collate_results.py           # rewrite the table in README.md
    uv run tools/collate_results.py --check   # exit 1 when README.md is out of date

Each table sits between its markers below; nothing between them is typed by hand.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from papers_eval import RecordSchemaError, load_claim, load_results

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- papers-table:start -->", "<!-- papers-table:end -->"
TIMES_START, TIMES_END = "<!-- run-times:start -->", "<!-- run-times:end -->"
BUDGET_S = 20 * 60  # every full `reproduce` should finish within 20 minutes on 2 cores


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def result_cells(slug: str, claim_file: Path) -> list[str]:
    """[verdict (linked to claim.md), controls, seeds, diagnosis, headline] of one record.

    The verdict is shown as computed (held / held, not replicated / did not hold / mixed / not
    shown), with what a reader must know beside it: "(replication not run)", "(protocol v2)" for
    a record judged before protocol v3, "(dirty tree, allowed)", "(re-specified)", "(quick run)".
    The diagnosis column lists the causes of a verdict that is not held ("missing" when a v3
    record has none). A schema-1 record (before the claim protocol) is shown as such: its
    project typed its own criterion and ran no controls, so it is never displayed as a verdict.
    """
    link = f"projects/{slug}/results/claim.md"
    try:
        record = load_claim(claim_file)
    except RecordSchemaError:
        record = load_results(claim_file)
        own = "held" if record["holds"] else "did not hold"
        verdict = f"[pre-protocol record]({link}) (its own criterion: {own})"
        return [verdict, "none", str(len(record["seeds"])), "-", _headline(record)]
    verdict = f"[{record['verdict']}]({link})"
    verdict += "".join(f" ({mark})" for mark in _marks(record))
    behaved = sum(c["behaved"] for c in record["controls"])
    controls = f"{behaved}/{len(record['controls'])} as required"
    seeds = str(len(record["seeds"]))
    replication = record.get("replication") or {}
    if replication.get("run"):
        seeds += f" + {len(replication['seeds'])} replication"
    return [verdict, controls, seeds, _diagnosis_cell(record), _headline(record)]


def _marks(record: dict) -> list[str]:
    marks = []
    if record.get("protocol", 2) < 3:
        marks.append("protocol v2")
    elif not (record.get("replication") or {}).get("run") and record["verdict"] != (
        "held, not replicated"
    ):
        marks.append("replication not run")
    provenance = record.get("provenance") or {}
    if provenance.get("dirty") or "+dirty" in str(record.get("git_revision", "")).split(" ")[0]:
        marks.append("dirty tree, allowed" if provenance.get("allow_dirty") else "dirty tree")
    if record.get("respecified_after"):
        marks.append(f"re-specified after {record['respecified_after'][:7]}, outcome known")
    if record["quick"]:
        marks.append("quick run")
    return marks


def _diagnosis_cell(record: dict) -> str:
    if record["verdict"] == "held" or record.get("protocol", 2) < 3:
        return "-"
    diagnosis = record.get("diagnosis")
    if isinstance(diagnosis, list) and diagnosis:
        return _cell("; ".join(f"{d['cause']}: {d['summary']}" for d in diagnosis))
    if record["verdict"] == "held, not replicated":
        return "-"
    return "invalid" if isinstance(diagnosis, dict) else "missing"


def _headline(record: dict) -> str:
    return _cell(record.get("headline") or "") or "-"


def build_table(root: Path = ROOT) -> str:
    papers = tomllib.loads((root / "papers.toml").read_text())["paper"]
    columns = [
        "paper",
        "slug",
        "claim (one line)",
        "verdict",
        "controls",
        "seeds",
        "diagnosis",
        "measured miniature result",
    ]
    empty = ["-"] * (len(columns) - 4)
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for paper in papers:
        slug = paper["slug"]
        project = root / "projects" / slug
        claim_file = project / "results" / "claim.json"
        if not project.is_dir():
            name, cells = slug, ["planned", *empty]
        elif claim_file.is_file():
            name, cells = f"[{slug}](projects/{slug})", result_cells(slug, claim_file)
        else:
            name, cells = f"[{slug}](projects/{slug})", ["in progress", *empty]
        title, claim = _cell(paper["title"]), _cell(paper["claim"])
        rows.append(f"| {title} | {name} | {claim} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def build_times_table(root: Path = ROOT) -> str:
    """One row per project with a full (not --quick) record: the wall time the record states,
    the seeds it ran (registered + replication), its jobs (run / loaded from the job cache; "-"
    for records written before the shared runner), the commit and the core count it ran on."""
    papers = tomllib.loads((root / "papers.toml").read_text())["paper"]
    columns = ["project", "reproduce wall time", "seeds", "jobs run / cached", "cores", "commit",
               "within 20 min"]  # fmt: skip
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for paper in papers:
        claim_file = root / "projects" / paper["slug"] / "results" / "claim.json"
        if not claim_file.is_file():
            continue
        record = load_claim(claim_file)
        if record.get("quick"):
            continue
        seconds = record.get("wall_time_s")
        seeds = str(len(record.get("seeds") or []))
        replication = record.get("replication") or {}
        if replication.get("seeds") and replication.get("run", True):
            seeds += f" + {len(replication['seeds'])}"
        jobs = record.get("jobs") or {}
        ran = f"{jobs['ran']} / {jobs['cached']}" if "ran" in jobs else "-"
        cores = (record.get("hardware") or {}).get("cpu_count", "-")
        commit = (record.get("git_revision") or "-")[:12]
        within = "-" if seconds is None else ("yes" if seconds <= BUDGET_S else "no")
        cells = [paper["slug"], _minutes(seconds), seeds, ran, str(cores), commit, within]
        rows.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(rows)


def _replace_between(readme: str, start: str, end: str, table: str) -> str:
    if start not in readme or end not in readme:
        raise SystemExit(f"README.md lacks the markers {start} and {end}")
    head, rest = readme.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{table}\n{end}{tail}"


def render_readme(readme: str, table: str, times: str | None = None) -> str:
    readme = _replace_between(readme, START, END, table)
    if times is not None:
        readme = _replace_between(readme, TIMES_START, TIMES_END, times)
    return readme


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if README.md is stale")
    args = parser.parse_args(argv)
    readme_path = ROOT / "README.md"
    current = readme_path.read_text()
    updated = render_readme(current, build_table(), build_times_table())
    if args.check:
        if updated != current:
            print("README.md's generated tables are stale: run `uv run tools/collate_results.py`")
            return 1
        return 0
    readme_path.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
