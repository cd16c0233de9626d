"""Helpers shared by the repository policy tests (imported through conftest's sys.path)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

README_SECTIONS = (
    "## The paper",
    "## Quick start",
    "## The method in code",
    "## Paper scale",
    "## Reconstructed vs stated",
    "## Results",
)


def project_dirs(root: Path = ROOT) -> list[Path]:
    return sorted(p.parent for p in (root / "projects").glob("*/pyproject.toml"))


def pyproject(folder: Path) -> dict:
    return tomllib.loads((folder / "pyproject.toml").read_text())


def copy_repository(destination: Path) -> Path:
    """Copy the working tree as git sees it (tracked and untracked-but-not-ignored files)."""
    listing = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for name in filter(None, listing.split("\0")):
        source = ROOT / name
        if source.is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return destination


PROJECTS = project_dirs()
needs_projects = pytest.mark.skipif(not PROJECTS, reason="no project under projects/ yet")


def structure_problems(folder: Path) -> list[str]:
    """What a project folder lacks; empty when it follows the skeleton."""
    problems = []
    meta = pyproject(folder)
    name = meta["project"]["name"]
    if name != folder.name:
        problems.append(f"project name {name!r} differs from its folder {folder.name!r}")
    readme = (folder / "README.md").read_text() if (folder / "README.md").is_file() else ""
    problems += [f"README lacks '{s}'" for s in README_SECTIONS if s not in readme]
    for config in ("configs/default.yaml", "configs/paper.yaml"):
        if not (folder / config).is_file():
            problems.append(f"missing {config}")
    if not list((folder / "tests").glob("test_*.py")):
        problems.append("no tests/test_*.py")
    scripts = meta["project"].get("scripts", {})
    if name not in scripts:
        problems.append(f"no unique script [project.scripts] {name} = ...")
    if {"train", "reproduce"} & set(scripts):
        problems.append("declares train/reproduce scripts: those belong to the dispatchers")
    groups = meta["project"].get("entry-points", {})
    for group in ("papers.train", "papers.reproduce"):
        target = groups.get(group, {}).get(name)
        if target is None:
            problems.append(f"no entry point {name} in group {group}")
            continue
        module = target.split(":")[0].replace(".", "/") + ".py"
        if not (folder / "src" / module).is_file():
            problems.append(f"{group} points at missing module {module}")
    package = meta.get("tool", {}).get("uv", {}).get("build-backend", {}).get("module-name")
    package = package or name.replace("-", "_")
    reproduce = groups.get("papers.reproduce", {}).get(name)
    if reproduce not in (None, f"{package}.claim:main"):
        problems.append(f"papers.reproduce is {reproduce}, not {package}.claim:main")
    if (folder / "src" / package / "cli.py").is_file():
        graph = import_graph(folder / "src" / package)
        if f"{package}.claim" in reachable(graph, f"{package}.cli"):
            problems.append("cli.py imports claim.py (directly or through other modules)")
    uv_settings = set(meta.get("tool", {}).get("uv", {})) - {"sources", "build-backend"}
    if uv_settings:
        problems.append(f"member-level [tool.uv] settings are ignored by uv: {sorted(uv_settings)}")
    return problems


# ----------------------------------------------------------- a package's own import graph


def packages(folder: Path) -> list[Path]:
    return sorted(p for p in (folder / "src").iterdir() if (p / "__init__.py").is_file())


def module_name(package: Path, path: Path) -> str:
    parts = [package.name, *path.relative_to(package).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom in ``tree`` (function bodies included), less TYPE_CHECKING's."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (absolute and relative imports)."""
    files = {module_name(package, p): p for p in package.rglob("*.py")}
    known = set(files)

    def owner(name: str) -> str | None:
        """The package's module that importing ``name`` runs (``pkg.mod.attr`` -> ``pkg.mod``)."""
        while name:
            if name in known:
                return name
            name = name.rpartition(".")[0]
        return None

    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        here = name if is_package else name.rpartition(".")[0]
        targets = set()
        for node in _import_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets |= {owner(alias.name) for alias in node.names}
                continue
            base = node.module or ""
            if node.level:
                anchor = here.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            # `from pkg import mod` imports the submodule; `from pkg import name` runs pkg only.
            targets |= {owner(f"{base}.{alias.name}") or owner(base) for alias in node.names}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in graph.get(todo.pop(), ()):
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


# ----------------------------------------------------------------------- the mutation lane


def mutation_config_problems(folder: Path) -> list[str]:
    """What ``folder``'s ``[tool.mutmut]`` table gets wrong for `tools/ci.py mutate`: the files
    it mutates must include core.py and model.py and exist, the selected tests must exist (file
    and, for ``file::name``, the test function) and at least one of them must drive the
    LightningModule (its file imports ``<package>.model`` or ``<package>.cli``)."""
    meta = pyproject(folder)
    table = meta.get("tool", {}).get("mutmut")
    if table is None:
        return ["no [tool.mutmut] table"]
    package = meta.get("tool", {}).get("uv", {}).get("build-backend", {}).get("module-name")
    package = package or meta["project"]["name"].replace("-", "_")
    targets = table.get("only_mutate", [])
    problems = [
        f"only_mutate lacks src/{package}/{name}"
        for name in ("core.py", "model.py")
        if f"src/{package}/{name}" not in targets
    ]
    problems += [f"only_mutate names missing {t}" for t in targets if not (folder / t).is_file()]
    # mutmut's trampoline hides __init__'s frame from an argument-less save_hyperparameters()
    problems += [
        f"{t} calls save_hyperparameters() without arguments: pass init_arguments(locals())"
        for t in targets
        if (folder / t).is_file() and ".save_hyperparameters()" in (folder / t).read_text()
    ]
    overlap = set(targets) & set(table.get("do_not_mutate", []))
    if overlap:
        problems.append(f"both only_mutate and do_not_mutate: {sorted(overlap)}")
    problems += [
        f"also_copy names missing {p}"
        for p in table.get("also_copy", [])
        if not (folder / p).exists()
    ]
    if table.get("source_paths") != ["src"]:
        problems.append('source_paths must be ["src"] (a single file breaks sibling imports)')
    selection = table.get("pytest_add_cli_args_test_selection", [])
    if not selection:
        problems.append("no pytest_add_cli_args_test_selection")
    drives_the_module = False
    for entry in selection:
        file, _, name = entry.partition("::")
        path = folder / file
        if not path.is_file():
            problems.append(f"selected test file {file} does not exist")
            continue
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        if name and name.split("[")[0].split("::")[0] not in defined:
            problems.append(f"selected test {entry} does not exist")
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)} | {
            a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names
        }
        drives_the_module |= bool({f"{package}.model", f"{package}.cli"} & imported)
    if selection and not drives_the_module:
        problems.append(f"no selected test imports {package}.model or {package}.cli")
    return problems
