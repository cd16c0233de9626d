"""Dataset roots: where real data is looked for, and the error when it is not there."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

DATA_ROOT_ENV = "PAPERS_DATA_ROOT"


class DatasetNotFoundError(FileNotFoundError):
    """A real dataset is missing. The message says which files were expected, where, and how
    to get them. ``user_facing`` tells the papers CLI to print it without a traceback."""

    user_facing = True

    def __init__(
        self,
        dataset: str,
        root: Path | None,
        expected: Iterable[str] = (),
        how_to_get: str = "",
        missing: Iterable[str] = (),
    ) -> None:
        self.dataset, self.root = dataset, root
        self.expected, self.missing = list(expected), list(missing)
        where = (
            f"under {root}"
            if root is not None
            else f"because no data root was given (pass --data.root=/path/to/{dataset} "
            f"or set ${DATA_ROOT_ENV} so that ${DATA_ROOT_ENV}/{dataset} holds the files)"
        )
        lines = [f"The real '{dataset}' dataset was not found {where}."]
        if self.missing:
            lines.append("Missing: " + ", ".join(self.missing) + ".")
        if self.expected:
            lines.append("Expected files: " + ", ".join(self.expected) + ".")
        if how_to_get:
            lines.append(how_to_get)
        lines.append(
            "This run needs real data and will not substitute synthetic data; the embedded "
            "miniature runs with the project's default config instead (`uv run train`)."
        )
        super().__init__(" ".join(lines))


def resolve_data_root(
    root: str | os.PathLike | None,
    dataset: str,
    expected: Iterable[str] = (),
    how_to_get: str = "",
) -> Path:
    """The folder holding ``dataset``: ``root`` when given, else ``$PAPERS_DATA_ROOT/<dataset>``.

    Raises ``DatasetNotFoundError`` when neither is set or the folder does not exist.
    """
    if root is None and os.environ.get(DATA_ROOT_ENV):
        root = Path(os.environ[DATA_ROOT_ENV]) / dataset
    if root is None:
        raise DatasetNotFoundError(dataset, None, expected, how_to_get)
    root = Path(root).expanduser()
    if not root.is_dir():
        raise DatasetNotFoundError(dataset, root, expected, how_to_get, missing=[str(root)])
    return root


def require_files(
    root: str | os.PathLike, dataset: str, expected: Iterable[str], how_to_get: str = ""
) -> dict[str, Path]:
    """Map each expected relative path to its file under ``root``; raise if any is missing."""
    root, expected = Path(root), list(expected)
    missing = [name for name in expected if not (root / name).is_file()]
    if missing:
        raise DatasetNotFoundError(dataset, root, expected, how_to_get, missing=missing)
    return {name: root / name for name in expected}
