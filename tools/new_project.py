"""Create a paper project from the skeleton: `uv run tools/new_project.py <slug>`.

Writes projects/<slug>/ (README with the required sections, pyproject with the unique script,
both entry points (`train` in cli.py, `reproduce` = claim.py's `main`) and the mutation lane's
table, configs/default.yaml and paper.yaml, src/<package>/ with core, baselines, model, data, cli
and claim, and tests), then adds it to uv.lock. The generated project trains, passes
its tests and writes a results record; its example method is a stand-in to replace with the paper.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = Path(__file__).resolve().parent / "project_template"
SLUG = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


def render(text: str, slug: str, package: str, title: str) -> str:
    class_name = "".join(part.capitalize() for part in package.split("_"))
    for key, value in {
        "__slug__": slug,
        "__package__": package,
        "__Class__": class_name,
        "__title__": title,
    }.items():
        text = text.replace(key, value)
    return text


def create(
    slug: str,
    package: str | None = None,
    title: str | None = None,
    root: Path = ROOT,
    lock: bool = True,
) -> Path:
    """Render the template into ``root/projects/<slug>`` and (by default) update uv.lock."""
    if not SLUG.match(slug):
        raise SystemExit(f"'{slug}' is not a valid slug: use lowercase words joined by '-'")
    package = package or slug.replace("-", "_")
    if not package.isidentifier():
        raise SystemExit(f"'{package}' is not a valid Python package name")
    target = root / "projects" / slug
    if target.exists():
        raise SystemExit(f"{target} already exists")
    title = title or slug
    for source in sorted(TEMPLATE.rglob("*.tmpl")):
        relative = source.relative_to(TEMPLATE).with_suffix("")  # drop .tmpl
        relative = Path(*(package if part == "package" else part for part in relative.parts))
        if relative.parts[0] == "src":
            relative = Path("src", *relative.parts[1:])
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        destination.write_text(render(source.read_text(), slug, package, title))
    (target / "results").mkdir()
    if lock:
        subprocess.run(["uv", "lock"], cwd=root, check=True)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("slug", help="the paper's slug, e.g. permflow or survival-reporting-delay")
    parser.add_argument("--package", help="import name (default: slug with '-' -> '_')")
    parser.add_argument("--title", help="the paper's title")
    args = parser.parse_args(argv)
    target = create(args.slug, args.package, args.title)
    print(
        f"created {target.relative_to(ROOT)}; next:\n"
        f"  cd {target.relative_to(ROOT)} && uv run pytest && uv run train\n"
        f"then replace the example method in src/*/core.py with the paper's."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
