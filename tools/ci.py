"""The CI driver: the same commands run in GitHub Actions, in `.ci/run` and on a laptop.

    uv run tools/ci.py list [--projects | --mutable]  # test units: projects, then shared packages
    uv run tools/ci.py changed --base origin/main [--json]
    uv run tools/ci.py test [UNIT ...] [--lane fast|slow|gpu] [--no-policy]
    uv run tools/ci.py policy                    # the repository policy tests only
    uv run tools/ci.py lint UNIT
    uv run tools/ci.py smoke PROJECT [--bf16-gpu]  # `train` through the real entry point
    uv run tools/ci.py mutate PROJECT [--max-children N]  # mutation lane (weekly, not in .ci/run)
    uv run tools/ci.py replicate PROJECT          # reproduce --replicate (nightly, not in .ci/run)

A test unit is a paper project (`projects/<slug>`) or a shared package (`shared/<dir>`, by its
package name). Each unit is tested in isolation: `uv sync --locked --package <name>` installs
exactly what it declares, so an undeclared import fails here rather than for a user.
`test` with no units runs the policy tests in `tests/` and every unit's lane, and ends with one
`N passed, N failed, N skipped` line; it exits non-zero when anything failed, including a unit
whose lane collected no tests.

`mutate` runs mutmut (3.8.1, from PyPI) from the project's folder with the project's own
`[tool.mutmut]` table, which must name `src/<package>/core.py` (the paper's math) and
`src/<package>/model.py` (the LightningModule's loss, sampling and data-draw path: planted
one-line bugs there passed the fast lanes of eight projects) in `only_mutate`, plus any other file
of the math or of that path (a sampler module, or data.py when the per-step draw lives there),
and narrow `pytest_add_cli_args_test_selection` to the fast tests that exercise the math and the
module's default path by value. It prints killed / survived / timed out counts and each
survivor's diff. mutmut rather than cosmic-ray: it needs no session database or per-module
config, runs straight from a project's pyproject in a src layout (its copy in `mutants/src`
shadows the editable install), and forks each mutant from a process that has already imported
the tests, which matters when every test imports torch (seconds each); cosmic-ray starts a fresh
test process per mutant. Torch does not survive every fork: forked from mutmut's main process,
which has run the tests and started torch's thread pools, permflow's workers hung (26 of the
first 69 mutants "timed out"); with `process_isolation = "forkserver"` in the project's table
they fork from a server that has only imported the tests, and none did. One torch thread per
process and two children keep the two cores from being oversubscribed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LANES = {"fast": "not slow and not gpu", "slow": "slow", "gpu": "gpu"}
NO_TESTS_COLLECTED = 5  # pytest's exit status when nothing was collected
# Two mutants at a time on two cores, each on one thread (CONVENTIONS, "Mutation testing").
MUTATION_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
MUTANT_COUNTS = {"killed": "killed", "survived": "survived", "timeout": "timed out"}  # mutmut's


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


def changed_files(base: str, head: str = "HEAD") -> list[str] | None:
    """Files changed between ``base`` and ``head``; None when git cannot tell (a new branch's
    all-zero base, a shallow clone), which callers treat as "everything changed"."""
    result = subprocess.run(
        ["git", "diff", "--name-only", f"{base}...{head}"], cwd=ROOT, capture_output=True, text=True
    )
    if result.returncode != 0 or set(base) == {"0"}:
        return None
    return [line for line in result.stdout.splitlines() if line]


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


def tally(status: int, counts: tuple[int, int, int]) -> tuple[int, int, int]:
    """Counts as CI reports them: a lane that collected nothing, or that exited non-zero with
    no failing test (a crash, an interrupt, an import error), counts as one failure."""
    passed, failed, skipped = counts
    if status == NO_TESTS_COLLECTED or (status != 0 and failed == 0):
        failed += 1
    return passed, failed, skipped


def run_pytest(
    label: str, paths: list[str], marker: str | None, sync: list[str]
) -> tuple[int, int, int]:
    """Sync the environment, run pytest, and count; a failed sync or an empty lane is a failure.

    Each lane gets its own pytest temp root, so nothing depends on what earlier runs left in
    /tmp/pytest-of-<user> (nor on its numbering), and the lane's slowest tests are printed to
    keep CI within its time budget."""
    print(f"\n=== {label} ===", flush=True)
    start = time.perf_counter()
    if _run(["uv", "sync", "--locked", *sync]) != 0:
        print(f"FAILED {label}: uv sync", flush=True)
        return 0, 1, 0
    synced = time.perf_counter() - start
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.xml"
        cmd = ["uv", "run", "--no-sync", "pytest", *paths, f"--junitxml={report}", "-q"]
        cmd += [f"--basetemp={Path(tmp) / 'pytest'}", "--durations=10"]
        if marker:
            cmd += ["-m", marker]
        status = _run(cmd)
        counts = _junit_counts(report) if report.exists() else (0, 0, 0)
    if status == NO_TESTS_COLLECTED:
        print(f"FAILED {label}: no tests collected", flush=True)
    counts = tally(status, counts)
    print(
        f"--- {label}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped "
        f"in {time.perf_counter() - start:.0f} s (uv sync {synced:.0f} s)",
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


def smoke(unit: Unit, bf16_gpu: bool = False) -> int:
    """`uv run train` from the project folder, as a user would: one `fast_dev_run` batch on the
    default device, or (``bf16_gpu``) 20 steps in bf16-mixed on one GPU."""
    if not unit.is_project:
        print(f"{unit.name} is a shared package: no `train` to smoke-test")
        return 0
    budget = ["--trainer.fast_dev_run=1"]
    if bf16_gpu:
        budget = [
            "--trainer.accelerator=gpu",
            "--trainer.devices=1",
            "--trainer.precision=bf16-mixed",
            "--trainer.max_steps=20",
        ]
    with tempfile.TemporaryDirectory() as runs:
        command = ["uv", "run", "--no-sync", "train", *budget, f"--trainer.default_root_dir={runs}"]
        return _run(command, cwd=ROOT / unit.path)


def has_mutation_config(folder: Path) -> bool:
    return "mutmut" in tomllib.loads((folder / "pyproject.toml").read_text()).get("tool", {})


MUTATION_REQUIRED = ("core.py", "model.py")  # the paper's math and the module's training path


def mutation_targets(folder: Path) -> list[str]:
    """The files ``folder``'s ``[tool.mutmut] only_mutate`` names; SystemExit when the table is
    missing or leaves out ``src/<package>/core.py`` or ``src/<package>/model.py``."""
    meta = tomllib.loads((folder / "pyproject.toml").read_text())
    targets = meta.get("tool", {}).get("mutmut", {}).get("only_mutate", [])
    package = meta.get("tool", {}).get("uv", {}).get("build-backend", {}).get("module-name")
    package = package or meta["project"]["name"].replace("-", "_")
    missing = [f"src/{package}/{name}" for name in MUTATION_REQUIRED]
    missing = [path for path in missing if path not in targets]
    if missing:
        raise SystemExit(
            f"{folder}: pyproject.toml [tool.mutmut] only_mutate must list {' and '.join(missing)}"
        )
    return targets


def mutate(folder: Path, max_children: int = 2) -> int:
    """Run mutmut in ``folder`` and print its counts and every surviving mutant's diff."""
    targets = mutation_targets(folder)
    # mutmut keeps earlier verdicts in mutants/ and skips those mutants; start from nothing.
    shutil.rmtree(folder / "mutants", ignore_errors=True)
    (folder / "mutants").mkdir()
    mutmut = str(Path(sys.executable).with_name("mutmut"))
    env = {**os.environ, **MUTATION_ENV}

    def ask(*command: str) -> str:
        return subprocess.run(
            [mutmut, *command], cwd=folder, env=env, capture_output=True, text=True
        ).stdout

    print(f"\n=== mutation lane: {folder.name} ({', '.join(targets)}) ===", flush=True)
    start = time.perf_counter()
    log = folder / "mutants" / "run.log"  # mutmut redraws a spinner per mutant: keep it out of CI
    with log.open("w") as out:
        run = [mutmut, "run", f"--max-children={max_children}"]
        code = _run(run, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if code != 0:
        print(log.read_text()[-4000:], f"\nFAILED mutation lane of {folder.name}", flush=True)
        return 1
    lines = ask("results", "--all", "true").splitlines()
    verdicts = dict(line.strip().rsplit(": ", 1) for line in lines if ": " in line)
    for name in sorted(n for n, v in verdicts.items() if v == "survived"):
        print(ask("show", name))
    untested = {n.rsplit("__mutmut_", 1)[0] for n, v in verdicts.items() if v == "no tests"}
    if untested:
        print("functions no selected test calls: " + ", ".join(sorted(untested)))
    counts = Counter(verdicts.values())
    summary = [f"{counts.pop(v, 0)} {label}" for v, label in MUTANT_COUNTS.items()]
    summary += [f"{n} {v}" for v, n in sorted(counts.items())]  # no tests, suspicious, ...
    print(f"{folder.name}: {', '.join(summary)} of {len(verdicts)} mutants in {seconds:.0f} s")
    return 0


def replicate(unit: Unit) -> int:
    """`reproduce --replicate` in the project folder, written to runs/<slug>/replication/ (the
    committed results/ stay as they are). A protocol-2 spec has no replication seeds: skipped."""
    import yaml

    spec = yaml.safe_load((ROOT / unit.path / "configs" / "claim.yaml").read_text()) or {}
    if spec.get("protocol") != 3:
        print(f"{unit.name}: configs/claim.yaml is a protocol-2 spec (no replication seeds); "
              "skipped until its fix-up moves it to protocol 3")  # fmt: skip
        return 0
    out = ROOT / "runs" / unit.path.name / "replication"
    command = ["uv", "run", "--no-sync", "reproduce", "--replicate", "--out", str(out)]
    return _run(command, cwd=ROOT / unit.path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ci.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="list test units")
    listing.add_argument("--projects", action="store_true", help="paper projects only")
    listing.add_argument("--mutable", action="store_true", help="projects with [tool.mutmut]")
    listing.add_argument("--json", action="store_true")
    changed = commands.add_parser("changed", help="units touched by a git range")
    changed.add_argument("--base", required=True)
    changed.add_argument("--head", default="HEAD")
    changed.add_argument("--json", action="store_true")
    test = commands.add_parser("test", help="run lanes in isolation (default: everything)")
    test.add_argument("units", nargs="*")
    test.add_argument("--lane", choices=sorted(LANES), default="fast")
    test.add_argument("--no-policy", action="store_true", help="skip the policy tests")
    commands.add_parser("policy", help="the repository policy tests only")
    commands.add_parser("lint", help="ruff check + format check of one unit").add_argument("unit")
    smoke_cmd = commands.add_parser("smoke", help="`train` through the real entry point")
    smoke_cmd.add_argument("unit")
    smoke_cmd.add_argument("--bf16-gpu", action="store_true", help="20 bf16-mixed steps on a GPU")
    mutate_cmd = commands.add_parser(
        "mutate", help="mutation-test one project's math and module (mutmut)"
    )
    mutate_cmd.add_argument("unit")
    mutate_cmd.add_argument("--max-children", type=int, default=2, help="parallel mutants")
    replicate_cmd = commands.add_parser("replicate", help="reproduce --replicate of one project")
    replicate_cmd.add_argument("unit")
    args = parser.parse_args(argv)

    known = units()
    by_name = {u.name: u for u in known}

    def pick(names: list[str]) -> list[Unit]:
        unknown = [n for n in names if n not in by_name]
        if unknown:
            raise SystemExit(f"unknown unit(s) {unknown}; known: {sorted(by_name)}")
        return [by_name[n] for n in names]

    if args.command == "list":
        names = [u.name for u in known if u.is_project or not (args.projects or args.mutable)]
        if args.mutable:
            names = [n for n in names if has_mutation_config(ROOT / by_name[n].path)]
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    if args.command == "changed":
        files = changed_files(args.base, args.head)
        lock = (ROOT / "uv.lock").read_text()
        picked = known if files is None else select_changed(files, known, lock)
        names = [u.name for u in picked]
        print(json.dumps(names) if args.json else "\n".join(names))
        return 0
    if args.command == "test":
        selected = pick(args.units) if args.units else known
        policy = not args.no_policy and not args.units
        return test_units(selected, args.lane, policy)
    if args.command == "lint":
        return lint(pick([args.unit])[0])
    if args.command == "policy":
        return test_units([], "fast", policy=True)
    if args.command == "replicate":
        unit = pick([args.unit])[0]
        if not unit.is_project:
            raise SystemExit(f"{unit.name} is a shared package: it has no claim to replicate")
        if _run(["uv", "sync", "--locked", "--package", unit.name]) != 0:
            return 1
        return replicate(unit)
    if args.command == "mutate":
        unit = pick([args.unit])[0]
        if not unit.is_project:
            raise SystemExit(f"{unit.name} is a shared package: the mutation lane is per project")
        # The root dev group (mutmut) and the project, in one environment.
        if _run(["uv", "sync", "--locked", "--all-packages"]) != 0:
            return 1
        return mutate(ROOT / unit.path, args.max_children)
    return smoke(pick([args.unit])[0], args.bf16_gpu)


if __name__ == "__main__":
    sys.exit(main())
