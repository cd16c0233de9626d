"""Rebuild the papers table in README.md from papers.toml and each project's results/claim.json.

    uv run tools/collate_results.py           # rewrite the table in README.md
    uv run tools/collate_results.py --check   # exit 1 when README.md is out of date

The table sits between the markers below; nothing between them is typed by hand.
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

from papers_eval import RecordSchemaError, load_claim, load_results

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- papers-table:start -->", "<!-- papers-table:end -->"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def result_cells(slug: str, claim_file: Path) -> list[str]:
    """[verdict (linked to claim.md), controls, seeds, headline] of one project's record.

    A schema-1 record (before the claim protocol) is shown as such: its project typed its own
    criterion and ran no controls, so it is never displayed as a verdict.
    """
    link = f"projects/{slug}/results/claim.md"
    try:
        record = load_claim(claim_file)
    except RecordSchemaError:
        record = load_results(claim_file)
        own = "held" if record["holds"] else "did not hold"
        verdict = f"[pre-protocol record]({link}) (its own criterion: {own})"
        controls = "none"
    else:
        quick = " (quick run)" if record["quick"] else ""
        verdict = f"[{record['verdict']}]({link}){quick}"
        behaved = sum(c["behaved"] for c in record["controls"])
        controls = f"{behaved}/{len(record['controls'])} as required"
    headline = _cell(record.get("headline") or "") or "-"
    return [verdict, controls, str(len(record["seeds"])), headline]


def build_table(root: Path = ROOT) -> str:
    papers = tomllib.loads((root / "papers.toml").read_text())["paper"]
    columns = [
        "paper",
        "slug",
        "claim (one line)",
        "verdict",
        "controls",
        "seeds",
        "measured miniature result",
    ]
    rows = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for paper in papers:
        slug = paper["slug"]
        project = root / "projects" / slug
        claim_file = project / "results" / "claim.json"
        if not project.is_dir():
            name, cells = slug, ["planned", "-", "-", "-"]
        elif claim_file.is_file():
            name, cells = f"[{slug}](projects/{slug})", result_cells(slug, claim_file)
        else:
            name, cells = f"[{slug}](projects/{slug})", ["in progress", "-", "-", "-"]
        title, claim = _cell(paper["title"]), _cell(paper["claim"])
        rows.append(f"| {title} | {name} | {claim} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def render_readme(readme: str, table: str) -> str:
    if START not in readme or END not in readme:
        raise SystemExit(f"README.md lacks the markers {START} and {END}")
    head, rest = readme.split(START, 1)
    _, tail = rest.split(END, 1)
    return f"{head}{START}\n{table}\n{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if README.md is stale")
    args = parser.parse_args(argv)
    readme_path = ROOT / "README.md"
    current = readme_path.read_text()
    updated = render_readme(current, build_table())
    if args.check:
        if updated != current:
            print("README.md's papers table is stale: run `uv run tools/collate_results.py`")
            return 1
        return 0
    readme_path.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
