"""The CI driver: the same commands run in GitHub Actions, in `.ci/run` and on a laptop.

    uv run tools/ci.py list                      # test units: projects, then shared packages
    uv run tools/ci.py changed --base origin/main [--json]
    uv run tools/ci.py test [UNIT ...] [--lane fast|slow|gpu] [--no-policy]
    uv run tools/ci.py lint UNIT
    uv run tools/ci.py smoke PROJECT             # fast_dev_run through the real `train`

A test unit is a paper project (`projects/<slug>`) or a shared package (`shared/<dir>`, by its
package name). Each unit is tested in isolation: `uv sync --locked --package <name>` installs
exactly what it declares, so an undeclared import fails here rather than for a user.
`test` with no units runs the policy tests in `tests/` and every unit's lane, and ends with one
`N passed, N failed, N skipped` line; it exits non-zero when anything failed, including a unit
whose lane collected no tests.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANES = {"fast": "not slow and not gpu", "slow": "slow", "gpu": "gpu"}
NO_TESTS_COLLECTED = 5  # pytest's exit status when nothing was collected


@dataclass(frozen=True)
class Unit:
    name: str  # the package name, e.g. "permflow" or "papers-data"
    path: Path  # relative to ROOT
    is_project: bool


def units(root: Path = ROOT) -> list[Unit]:
    """Every project, then every shared package, in name order."""
    found = []
    for folder, is_project in (("projects", True), ("shared", False)):
        for pyproject in sorted((root / folder).glob("*/pyproject.toml")):
            name = tomllib.loads(pyproject.read_text())["project"]["name"]
            found.append(Unit(name, pyproject.parent.relative_to(root), is_project))
    return found


def workspace_dependents(lock_text: str) -> dict[str, set[str]]:
    """For each workspace package, the workspace packages that depend on it (transitively),
    read from uv.lock's dependency graph."""
    lock = tomllib.loads(lock_text)
    local = {
        p["name"]
        for p in lock.get("package", [])
        if {"editable", "virtual", "directory"} & set(p.get("source", {}))
    }
    direct: dict[str, set[str]] = {name: set() for name in local}
    for package in lock.get("package", []):
        if package["name"] not in local:
            continue
        for dep in package.get("dependencies", []):
            if dep["name"] in local:
                direct[dep["name"]].add(package["name"])
    closure = {}
    for name in local:
        seen, stack = set(), [name]
        while stack:
            for parent in direct[stack.pop()]:
                if parent not in seen:
                    seen.add(parent)
                    stack.append(parent)
        closure[name] = seen
    return closure


def select_changed(changed_files: list[str], all_units: list[Unit], lock_text: str) -> list[Unit]:
    """Units a change touches.

    A project's own files select it; a shared package's files select it and every unit that
    depends on it; any other file (root config, tools, tests, CI) selects all units.
    """
    by_path = {str(u.path): u for u in all_units}
    dependents = workspace_dependents(lock_text)
    selected: set[str] = set()
    for file in changed_files:
        parts = Path(file).parts
        if len(parts) >= 2 and parts[0] in ("projects", "shared"):
            unit = by_path.get(f"{parts[0]}/{parts[1]}")
            if unit is None:  # a deleted or not-yet-packaged folder
                continue
            selected.add(unit.name)
            if not unit.is_project:
                selected |= dependents.get(unit.name, set())
        else:
            return all_units
    return [u for u in all_units if u.name in selected]


def changed_files(base: str, head: str = "HEAD") -> list[str]:
    out = subprocess.run(
        ["git", "diff", "--name-only", f"{base}...{head}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [line for line in out.splitlines() if line]


def _run(cmd: list[str], **kwargs) -> int:
    print("$ " + " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=kwargs.pop("cwd", ROOT), **kwargs).returncode


def _junit_counts(report: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a pytest JUnit XML report; errors count as failed."""
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    total, skipped = int(suite.get("tests", 0)), int(suite.get("skipped", 0))
    failed = int(suite.get("failures", 0)) + int(suite.get("errors", 0))
    return total - failed - skipped, failed, skipped


def run_pytest(
    label: str, paths: list[str], marker: str | None, sync: list[str]
) -> tuple[int, int, int]:
    """Sync the environment, run pytest, and count; a failed sync or an empty lane is a failure."""
    print(f"\n=== {label} ===", flush=True)
    start = time.perf_counter()
    if _run(["uv", "sync", "--locked", *sync]) != 0:
        print(f"FAILED {label}: uv sync", flush=True)
        return 0, 1, 0
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        cmd = ["uv", "run", "--no-sync", "pytest", *paths, f"--junitxml={report}", "-q"]
        if marker:
            cmd += ["-m", marker]
        status = _run(cmd)
        counts = _junit_counts(report) if report.exists() else (0, 0, 0)
    if status == NO_TESTS_COLLECTED:
        print(f"FAILED {label}: no tests collected", flush=True)
        counts = (counts[0], counts[1] + 1, counts[2])
    elif status != 0 and counts[1] == 0:  # crashed or interrupted outside any test
        counts = (counts[0], 1, counts[2])
    print(
        f"--- {label}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped "
        f"in {time.perf_counter() - start:.0f} s",
        flush=True,
    )
    return counts


def test_units(selected: list[Unit], lane: str, policy: bool) -> int:
    totals = [0, 0, 0]

    def add(counts):
        for i, c in enumerate(counts):
            totals[i] += c

    if policy:
        add(run_pytest("policy tests", ["tests"], None, ["--all-packages"]))
    for unit in selected:
        add(
            run_pytest(
                f"{unit.name} [{lane}]",
                [str(unit.path / "tests")],
                LANES[lane],
                ["--package", unit.name],
            )
        )
    passed, failed, skipped = totals
    print(f"\n{passed} passed, {failed} failed, {skipped} skipped", flush=True)
    return 1 if failed else 0


def lint(unit: Unit) -> int:
    ruff = ["uv", "run", "--no-sync", "ruff"]
    return _run([*ruff, "check", str(unit.path)]) or _run(
        [*ruff, "format", "--check", str(unit.path)]
    )


def smoke(unit: Unit) -> int:
    """`uv run train --trainer.fast_dev_run=1` from the project folder, as a user would."""
    if not unit.is_project:
        raise SystemExit(f"{unit.name} is a shared package; smoke runs a project's `train`")
    with tempfile.TemporaryDirectory() as runs:
        return _run(
            [
                "uv",
                "run",
                "--no-sync",
                "train",
                "--trainer.fast_dev_run=1",
                f"--trainer.default_root_dir={runs}",
            ],
            cwd=ROOT / unit.path,
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ci.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list test units")
    listing.add_argument("--projects", action="store_true", help="paper projects only")
    listing.add_argument("--json", action="store_true")
    changed = commands.add_parser("changed", help="units touched by a git range")
    changed.add_argument("--base", required=True)
    changed.add_argument("--head", default="HEAD")
    changed.add_argument("--json", action="store_true")
    test = commands.add_parser("test", help="run lanes in isolation (default: everything)")
    test.add_argument("units", nargs="*")
    test.add_argument("--lane", choices=sorted(LANES), default="fast")
    test.add_argument("--no-policy", action="store_true", help="skip the policy tests")
    for name in ("lint", "smoke"):
        commands.add_parser(name).add_argument("unit")
    args = parser.parse_args(argv)

    known = units()
    by_name = {u.name: u for u in known}

    def pick(names: list[str]) -> list[Unit]:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise SystemExit(f"unknown unit(s) {unknown}; known: {sorted(by_name)}")
        return [by_name[n] for n in names]

    if args.command == "list":
        names = [u.name for u in known if u.is_project or not args.projects]
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    if args.command == "changed":
        picked = select_changed(
            changed_files(args.base, args.head), known, (ROOT / "uv.lock").read_text()
        )
        names = [u.name for u in picked]
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    if args.command == "test":
        selected = pick(args.units) if args.units else known
        policy = not args.no_policy and not args.units
        return test_units(selected, args.lane, policy)
    if args.command == "lint":
        return lint(pick([args.unit])[0])
    return smoke(pick([args.unit])[0])


if __name__ == "__main__":
    sys.exit(main())
