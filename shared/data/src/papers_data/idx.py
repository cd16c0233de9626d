"""The IDX format of MNIST, Fashion-MNIST, EMNIST and KMNIST (LeCun et al.).

Header: two zero bytes, a type code, the number of dimensions, then each dimension as a
big-endian uint32; the data follow in C order and big-endian byte order.
"""

from __future__ import annotations

import gzip
import os
import struct
from pathlib import Path

import numpy as np

_IDX_TYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _open(path: Path, mode: str):
    return gzip.open(path, mode) if path.suffix == ".gz" else open(path, mode)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (optionally gzip-compressed) into an array in native byte order."""
    path = Path(path)
    with _open(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_TYPES:
        raise ValueError(f"{path} is not an IDX file (bad magic number {raw[:4]!r})")
    dtype, ndim = _IDX_TYPES[raw[2]], raw[3]
    header = 4 + 4 * ndim
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: header promises shape {shape} ({expected} bytes of data) but the file "
            f"holds {len(raw) - header}; it is truncated or not an IDX file"
        )
    return (
        np.frombuffer(raw, dtype=dtype, offset=header)
        .reshape(shape)
        .astype(dtype.newbyteorder("="))
    )


def write_idx(path: str | os.PathLike, array: np.ndarray) -> Path:
    """Write ``array`` as an IDX file (gzip-compressed when the name ends in ``.gz``)."""
    path = Path(path)
    codes = {dtype.newbyteorder("="): code for code, dtype in _IDX_TYPES.items()}
    native = np.dtype(array.dtype).newbyteorder("=")
    if native not in codes:
        raise ValueError(f"IDX cannot store dtype {array.dtype}")
    big_endian = np.ascontiguousarray(array).astype(native.newbyteorder(">"))
    header = bytes([0, 0, codes[native], array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    with _open(path, "wb") as f:
        f.write(header + big_endian.tobytes())
    return path
