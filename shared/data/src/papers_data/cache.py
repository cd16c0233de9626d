"""On-disk cache for generated miniature data, keyed by a hash of the generator's config."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

CACHE_ENV = "PAPERS_CACHE_DIR"


def cache_dir() -> Path:
    """``$PAPERS_CACHE_DIR`` when set, else ``~/.cache/papers``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "papers")


def config_hash(config: Mapping[str, Any]) -> str:
    """A short stable hash of a JSON-serialisable config (key order does not matter)."""
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cached_generate(
    name: str,
    config: Mapping[str, Any],
    generate: Callable[[], Mapping[str, np.ndarray]],
    directory: str | os.PathLike | None = None,
) -> dict[str, np.ndarray]:
    """Return ``generate()``'s arrays, computing them once per distinct ``config``.

    The arrays are stored as ``<dir>/<name>/<hash>.npz`` with the config beside them as JSON.
    Writes go to a temporary file first, so concurrent runs never read a half-written cache.
    The config must include everything the generator depends on, seed included.
    """
    folder = Path(directory or cache_dir()) / name
    key = config_hash(config)
    path = folder / f"{key}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as stored:
            return {k: stored[k] for k in stored.files}
    arrays = {k: np.asarray(v) for k, v in generate().items()}
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"{key}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    (folder / f"{key}.json").write_text(json.dumps(config, sort_keys=True, default=str, indent=1))
    return arrays
