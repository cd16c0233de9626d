"""Cherry-pick one paper out of the monorepo: `uv run tools/export_project.py <slug> <dest>`.

The result is a standalone uv project: the paper's folder, the shared packages it uses (copied
under `shared/`, sources rewritten from `workspace = true` to paths), plain `train` and
`reproduce` scripts (the dispatchers are not needed when the project is alone), the root's uv,
pytest and ruff settings, a `uv.lock` and a `requirements.txt` for users without uv.

The lock starts as a copy of the workspace's and is then re-locked online with a plain
`uv lock`: uv keeps every version the copy already pins, so the export installs what the
monorepo tested, and it drops the packages the project does not use. It is not `--offline`:
an offline lock needs the registry metadata of every platform split in uv's cache, which
`uv sync` never fetches, so it failed on a fresh machine (issue 13). Hand-filtering the workspace
lock instead would mean rewriting uv's resolution markers, which uv does correctly itself.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import tomli_w

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ci import units, workspace_dependents  # noqa: E402

IGNORE = shutil.ignore_patterns(
    ".venv",
    "runs",
    "lightning_logs",
    "mutants",
    "__pycache__",
    "*.pyc",
    ".pytest_cache",
    ".ruff_cache",
    "*.egg-info",
)


def shared_dependencies(slug: str, lock_text: str) -> list[str]:
    """Workspace packages ``slug`` depends on, directly or through each other."""
    dependents = workspace_dependents(lock_text)
    return sorted(name for name, users in dependents.items() if slug in users)


def _rewrite_sources(pyproject: dict, paths: dict[str, str]) -> None:
    sources = pyproject.get("tool", {}).get("uv", {}).get("sources", {})
    for name in list(sources):
        if sources[name].get("workspace"):
            sources[name] = {"path": paths[name], "editable": True}


def export(slug: str, dest: Path, lock: bool = True) -> Path:
    by_name = {u.name: u for u in units(ROOT)}
    if slug not in by_name or not by_name[slug].is_project:
        known = sorted(u.name for u in by_name.values() if u.is_project)
        raise SystemExit(f"unknown project '{slug}'; projects: {known}")
    if dest.exists() and any(dest.iterdir()):
        raise SystemExit(f"{dest} exists and is not empty")
    project = by_name[slug]
    shutil.copytree(ROOT / project.path, dest, ignore=IGNORE, dirs_exist_ok=True)

    needed = shared_dependencies(slug, (ROOT / "uv.lock").read_text())
    folder_of = {name: by_name[name].path.name for name in needed}
    for name in needed:
        target = dest / "shared" / folder_of[name]
        shutil.copytree(ROOT / by_name[name].path, target, ignore=IGNORE)
        data = tomllib.loads((target / "pyproject.toml").read_text())
        _rewrite_sources(data, {n: f"../{folder_of[n]}" for n in folder_of})
        data.get("project", {}).pop("scripts", None)  # the dispatchers; the project has its own
        (target / "pyproject.toml").write_text(tomli_w.dumps(data))

    root = tomllib.loads((ROOT / "pyproject.toml").read_text())
    data = tomllib.loads((dest / "pyproject.toml").read_text())
    _rewrite_sources(data, {n: f"shared/{folder_of[n]}" for n in folder_of})
    # The dispatchers' targets become plain scripts: papers.train -> train, papers.reproduce ->
    # reproduce (e.g. `<package>.cli:main` and `<package>.claim:main`).
    groups = data["project"].pop("entry-points", {})
    data["project"].setdefault("scripts", {}).update(
        {command: groups[f"papers.{command}"][slug] for command in ("train", "reproduce")}
    )
    tool = data.setdefault("tool", {})
    uv = tool.setdefault("uv", {})
    for key in ("python-downloads", "constraint-dependencies"):
        uv[key] = root["tool"]["uv"][key]
    tool["pytest"] = root["tool"]["pytest"]
    tool["pytest"]["ini_options"]["testpaths"] = ["tests"]
    tool["ruff"] = root["tool"]["ruff"]
    tool["ruff"]["src"] = ["src", "shared/*/src"]
    (dest / "pyproject.toml").write_text(tomli_w.dumps(data))
    (dest / ".gitignore").write_text((ROOT / ".gitignore").read_text())

    if lock:
        # Start from the workspace's lock so the export pins the versions the monorepo tested.
        shutil.copy(ROOT / "uv.lock", dest / "uv.lock")
        subprocess.run(["uv", "lock"], cwd=dest, check=True)
        requirements = subprocess.run(
            ["uv", "export", "--frozen", "--format", "requirements-txt", "--no-hashes", "--no-dev"],
            cwd=dest,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        (dest / "requirements.txt").write_text(
            "# For users without uv: python -m pip install -r requirements.txt\n" + requirements
        )
    return dest


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slug")
    parser.add_argument("dest", type=Path)
    args = parser.parse_args(argv)
    dest = export(args.slug, args.dest.resolve())
    print(f"exported {args.slug} to {dest}\n  cd {dest} && uv run pytest && uv run train")
    return 0


if __name__ == "__main__":
    sys.exit(main())
