"""Paper-scale data: Legacy Surveys and HSC cutouts in the Multimodal Universe HDF5 layout.

Each survey folder holds ``*.hdf5`` files (MMU writes them under ``healpix=*/``) with one row per
object: ``object_id``, ``ra``, ``dec`` (degrees), ``image_array`` [N, C, H, W] (flux),
``image_ivar`` [N, C, H, W] (inverse variance), ``image_mask`` [N, C, H, W] (True = bad pixel),
``image_band`` [N, C] (band names, bytes) and ``image_psf_fwhm`` [N, C] (arcsec). Pairs are
objects in both surveys within 1 arcsec (a KD-tree on unit vectors, one-to-one). Both views are
centre-cropped to about the same sky area (20 px at 0.262" and 32 px at 0.168" by default). The
instrument latent reads a *neighbour*: the other object of the same survey whose observing
condition (mean PSF FWHM, median noise sigma) is nearest, among point sources when the catalogue
marks them (Legacy ``TYPE`` == PSF, HSC ``i_extendedness_value`` == 0): reconstructed, the real
analogue of the miniature's star in the same exposure.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

KEYS = (
    "object_id",
    "ra",
    "dec",
    "image_array",
    "image_ivar",
    "image_mask",
    "image_band",
    "image_psf_fwhm",
)


class MMUFormatError(ValueError):
    """A file does not follow the Multimodal Universe image layout."""

    user_facing = True


def read_survey(
    folder: str | Path, bands: list[str], size: int, columns: Sequence[str] = ()
) -> dict[str, np.ndarray]:
    """Every ``*.hdf5`` under ``folder`` (recursively), the requested bands in that order,
    centre-cropped to ``size`` pixels; NaN or infinite flux and zero inverse variance count
    as masked. Returns ra, dec, object_id, image, ivar, mask (True = usable), cond [N, 2]
    (mean PSF FWHM over the bands, median noise sigma over usable pixels) and, when
    ``columns`` names catalogue columns of the same files, catalogue [N, len(columns)]."""
    import h5py

    files = sorted(Path(folder).rglob("*.hdf5"))
    if not files:
        raise MMUFormatError(f"no *.hdf5 files under {folder}")
    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("ra", "dec", "object_id", "image", "ivar", "mask", "psf", "catalogue")
    }
    for path in files:
        with h5py.File(path, "r") as f:
            missing = [k for k in KEYS if k not in f]
            if missing:
                raise MMUFormatError(
                    f"{path} lacks {missing} (the MMU image layout has {list(KEYS)})"
                )
            names = [[_decode(b) for b in row] for row in f["image_band"][:]]
            # Band names may differ in case or carry a survey prefix (DES-G, HSC-G): match the
            # last letter, case-insensitively.
            index = []
            for row in names:
                short = [n.split("-")[-1].lower() for n in row]
                try:
                    index.append([short.index(b.lower()) for b in bands])
                except ValueError:
                    raise MMUFormatError(f"{path}: bands {row} lack one of {bands}") from None
            index = np.asarray(index)
            rows = np.arange(len(index))[:, None]
            image = f["image_array"][:][rows, index]
            ivar = f["image_ivar"][:][rows, index]
            bad = f["image_mask"][:][rows, index].astype(bool)
            psf = f["image_psf_fwhm"][:][rows, index]
            if (ivar < 0).any():
                raise MMUFormatError(
                    f"{path}: image_ivar has negative values; an inverse variance is >= 0 "
                    "(0 marks a pixel without data)"
                )
            parts["ra"].append(f["ra"][:].astype(np.float64))
            parts["dec"].append(f["dec"][:].astype(np.float64))
            parts["object_id"].append(f["object_id"][:].astype(np.int64))
            absent = [c for c in columns if c not in f]
            if absent:
                raise MMUFormatError(
                    f"{path} lacks the catalogue columns {absent} asked for as probe targets "
                    f"(it has {sorted(k for k in f if not k.startswith('image_'))})"
                )
            parts["catalogue"].append(
                np.stack([f[c][:].astype(np.float64) for c in columns], 1)
                if columns
                else np.zeros((len(index), 0))
            )
        image, ivar, bad = (centre_crop(a, size) for a in (image, ivar, bad))
        bad |= ~np.isfinite(image) | ~np.isfinite(ivar) | (ivar <= 0)
        parts["image"].append(np.where(bad, 0.0, image).astype(np.float32))
        parts["ivar"].append(np.where(bad, 0.0, ivar).astype(np.float32))
        parts["mask"].append((~bad).astype(np.float32))
        parts["psf"].append(psf.astype(np.float32))
    out = {k: np.concatenate(v) for k, v in parts.items()}
    out["cond"] = np.stack(
        [np.nanmean(out.pop("psf"), 1), noise_level(out["ivar"], out["mask"])], 1
    )
    return out


def _decode(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def centre_crop(images: np.ndarray, size: int) -> np.ndarray:
    """[..., H, W] -> [..., size, size] around the centre; refuses stamps smaller than size."""
    h, w = images.shape[-2:]
    if h < size or w < size:
        raise MMUFormatError(f"stamps are {h}x{w} pixels, smaller than the crop {size}")
    top, left = (h - size) // 2, (w - size) // 2
    return images[..., top : top + size, left : left + size]


def noise_level(ivar: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Median of 1/sqrt(ivar) over each object's usable pixels -> [N] (NaN if none)."""
    sigma = np.where(mask > 0, 1.0 / np.sqrt(np.maximum(ivar, 1e-30)), np.nan)
    return np.nanmedian(sigma.reshape(len(sigma), -1), axis=1)


def cross_match(
    ra_a, dec_a, ra_b, dec_b, radius_arcsec: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """One-to-one positional pairs within ``radius_arcsec`` (the MMU cross-match rule): each A
    object's nearest B object; a B object claimed twice keeps its closest A."""
    from scipy.spatial import cKDTree

    def unit(ra, dec):
        ra, dec = np.radians(ra), np.radians(dec)
        return np.stack([np.cos(dec) * np.cos(ra), np.cos(dec) * np.sin(ra), np.sin(dec)], 1)

    chord = 2 * np.sin(np.radians(radius_arcsec / 3600) / 2)
    distance, nearest = cKDTree(unit(ra_b, dec_b)).query(
        unit(ra_a, dec_a), distance_upper_bound=chord
    )
    a = np.flatnonzero(np.isfinite(distance))
    order = a[np.argsort(distance[a], kind="stable")]
    _, first = np.unique(nearest[order], return_index=True)
    kept = np.sort(order[first])
    return kept, nearest[kept]


def nearest_condition_neighbour(
    cond: np.ndarray, candidates: np.ndarray | None = None
) -> np.ndarray:
    """For each object, another object (among ``candidates``, a boolean [N]: point sources when
    the catalogue says which) with the nearest standardised condition [N, 2]."""
    from scipy.spatial import cKDTree

    pool = np.arange(len(cond)) if candidates is None else np.flatnonzero(candidates)
    if len(pool) < 2:
        raise MMUFormatError("a neighbour needs at least two candidate objects per survey")
    z = (cond - np.nanmean(cond, 0)) / (np.nanstd(cond, 0) + 1e-12)
    z = np.nan_to_num(z)
    _, idx = cKDTree(z[pool]).query(z, k=2)
    nearest = pool[idx]  # [N, 2] object indices
    self_first = nearest[:, 0] == np.arange(len(z))
    return np.where(self_first, nearest[:, 1], nearest[:, 0])


def point_sources(folder: str | Path) -> np.ndarray | None:
    """Which objects are point sources, from the catalogue columns MMU keeps (Legacy ``TYPE``
    == PSF, HSC ``i_extendedness_value`` == 0), in read_survey's order; None if absent."""
    import h5py

    flags = []
    for path in sorted(Path(folder).rglob("*.hdf5")):
        with h5py.File(path, "r") as f:
            if "TYPE" in f:
                flags.append(np.array([_decode(t).strip().upper() == "PSF" for t in f["TYPE"][:]]))
            elif "i_extendedness_value" in f:
                flags.append(f["i_extendedness_value"][:] == 0)
            else:
                return None
    return np.concatenate(flags)


def load_pairs(
    root: str | Path,
    bands_a: list[str],
    bands_b: list[str],
    size_a: int,
    size_b: int,
    radius_arcsec: float = 1.0,
    targets: Sequence[str] = (),
) -> dict[str, np.ndarray]:
    """``<root>/legacysurvey`` (instrument A) and ``<root>/hsc`` (instrument B) -> the arrays
    the DataModule trains on: image_X, ivar_X, mask_X, cond_X, neighbour_X for X in A, B, and,
    when ``targets`` names Legacy catalogue columns, ``params`` (the probes' targets on real
    data; pairs whose targets are not all finite are dropped)."""
    a = read_survey(Path(root) / "legacysurvey", bands_a, size_a, targets)
    b = read_survey(Path(root) / "hsc", bands_b, size_b)
    ia, ib = cross_match(a["ra"], a["dec"], b["ra"], b["dec"], radius_arcsec)
    if len(ia) == 0:
        raise MMUFormatError(f"no Legacy/HSC pairs within {radius_arcsec} arcsec under {root}")
    out: dict[str, np.ndarray] = {
        "object_id_A": a["object_id"][ia],
        "object_id_B": b["object_id"][ib],
    }
    for name, survey, idx, folder in (("A", a, ia, "legacysurvey"), ("B", b, ib, "hsc")):
        stars = point_sources(Path(root) / folder)
        if stars is not None and stars.sum() < 2:
            stars = None  # too few point sources: any object under the nearest condition
        neighbour = nearest_condition_neighbour(survey["cond"], stars)[idx]
        out[f"image_{name}"] = survey["image"][idx]
        out[f"ivar_{name}"] = survey["ivar"][idx]
        out[f"mask_{name}"] = survey["mask"][idx]
        out[f"cond_{name}"] = survey["cond"][idx].astype(np.float32)
        out[f"neighbour_{name}"] = survey["image"][neighbour]
    if targets:
        params = a["catalogue"][ia]
        keep = np.isfinite(params).all(1)
        if not keep.any():
            raise MMUFormatError(f"no pair has finite values of every target column {targets}")
        out = {k: v[keep] for k, v in out.items()}
        out["params"] = params[keep].astype(np.float32)
    return out
