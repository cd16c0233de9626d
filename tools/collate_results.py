"""Rebuild the papers table in README.md from papers.toml and each project's results/claim.json.

    uv run tools/collate_results.py           # rewrite the table in README.md
    uv run tools/collate_results.py --check   # exit 1 when README.md is out of date

The table sits between the markers below; nothing between them is typed by hand.
"""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- papers-table:start -->", "<!-- papers-table:end -->"


def _cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _result_cell(slug: str, record: dict) -> str:
    holds = "claim held" if record["holds"] else "claim did not hold"
    headline = _cell(record.get("headline") or "")
    link = f"[{holds}](projects/{slug}/results/claim.md)"
    return f"{link}: {headline}" if headline else link


def build_table(root: Path = ROOT) -> str:
    papers = tomllib.loads((root / "papers.toml").read_text())["paper"]
    rows = [
        "| paper | slug | claim (one line) | status | measured miniature result |",
        "|---|---|---|---|---|",
    ]
    for paper in papers:
        slug = paper["slug"]
        project = root / "projects" / slug
        claim_file = project / "results" / "claim.json"
        if not project.is_dir():
            status, result, name = "planned", "-", slug
        elif claim_file.is_file():
            status, name = "implemented", f"[{slug}](projects/{slug})"
            result = _result_cell(slug, json.loads(claim_file.read_text()))
        else:
            status, result, name = "in progress", "not yet measured", f"[{slug}](projects/{slug})"
        title, claim = _cell(paper["title"]), _cell(paper["claim"])
        rows.append(f"| {title} | {name} | {claim} | {status} | {result} |")
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
