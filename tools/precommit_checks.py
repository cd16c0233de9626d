"""Small file checks for the local pre-commit hooks: `precommit_checks.py CHECK FILE...`.

pre-commit-hooks' own checks live in a GitHub-hosted repository that cannot be fetched where
this repository is built, so the few we need are here. Each prints the offending files and exits 1.
"""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import yaml

MAX_BYTES = 1024 * 1024


def trailing_whitespace(path: Path) -> str | None:
    lines = path.read_bytes().split(b"\n")
    bad = [i + 1 for i, line in enumerate(lines) if line.rstrip(b"\r") != line.rstrip()]
    return f"trailing whitespace on lines {bad[:10]}" if bad else None


def end_of_file(path: Path) -> str | None:
    data = path.read_bytes()
    if data and (not data.endswith(b"\n") or data.endswith(b"\n\n")):
        return "must end with exactly one newline"
    return None


def valid_yaml(path: Path) -> str | None:
    try:
        list(yaml.safe_load_all(path.read_text()))
    except yaml.YAMLError as error:
        return f"invalid YAML: {error}"
    return None


def valid_toml(path: Path) -> str | None:
    try:
        tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as error:
        return f"invalid TOML: {error}"
    return None


def large_file(path: Path) -> str | None:
    size = path.stat().st_size
    return f"{size / 2**20:.1f} MiB is over the 1 MiB limit" if size > MAX_BYTES else None


CHECKS = {
    "trailing-whitespace": trailing_whitespace,
    "end-of-file": end_of_file,
    "yaml": valid_yaml,
    "toml": valid_toml,
    "large-files": large_file,
}


def main(argv: list[str]) -> int:
    check, files = CHECKS[argv[0]], argv[1:]
    problems = [(f, msg) for f in files if (msg := check(Path(f)))]
    for file, message in problems:
        print(f"{file}: {message}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
