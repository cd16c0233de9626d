"""The embedded miniature, named as simulated: parametric galaxies seen by two instruments.

Every galaxy has intrinsic parameters theta (log flux, half-light radius, Sersic index, shear
g1 and g2, a colour that sets the per-band flux ratios). GalSim renders it through

- instrument A, "Legacy-like": 0.262"/pixel, 16 x 16 stamp (4.2"), bands g r z, a Moffat
  (beta 3.5) PSF whose FWHM is drawn per observation in [0.9, 2.0]", more sky noise;
- instrument B, "HSC-like": 0.168"/pixel, 24 x 24 stamp (4.0"), bands g r i z y, a
  Kolmogorov PSF with FWHM in [0.45, 1.0]", a third of A's noise (seeing ranges of the
  two surveys: DECam about 0.9-2", HSC about 0.45-1").

An observation's condition is (PSF FWHM, noise sigma). Stated simplification: the galaxy is
achromatic in shape (colour only scales the bands) and one observation has one PSF for all its
bands, so each observation is one GalSim render scaled per band. Each training pair also holds a
*neighbour* per instrument: another object rendered under the same observation's condition (an
object in the same exposure); the method's instrument encoder reads it (the design note's
reconstruction of where the instrument latent comes from). By default the neighbour is a star
(a point source of random flux and colour: the instrument's own response, as surveys measure
their PSF); ``neighbour="galaxy"`` draws another galaxy, from which a PSF is hard to read (the
third pilot: the instrument latent then explained 29% of the condition's variance).
Each test galaxy i has a fixed
partner j and the noise-free truth of i under B's condition of j: the exact counterfactual.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PARAMS = ("log_flux", "half_light_radius", "sersic_n", "g1", "g2", "colour")
CONDITIONS = ("psf_fwhm", "noise_sigma")
SERSIC_GRID = (0.5, 1.0, 1.5, 2.5, 4.0)  # a new n rebuilds GalSim's Sersic table: quantised


@dataclass(frozen=True)
class Instrument:
    """One instrument's pixel grid, bands, PSF family and noise range."""

    name: str
    pixel_scale: float  # arcsec / pixel
    size: int  # stamp side in pixels
    bands: tuple[str, ...]
    psf: str  # "moffat" or "kolmogorov"
    fwhm_range: tuple[float, float]  # arcsec
    noise_range: tuple[float, float]  # sky sigma per pixel, in flux units
    colour_slopes: tuple[float, ...]  # d log10(flux_b) / d colour, one per band


LEGACY_LIKE = Instrument(
    "A", 0.262, 16, ("g", "r", "z"), "moffat", (0.9, 2.0), (1.5, 4.5), (-0.3, 0.0, 0.35)
)
HSC_LIKE = Instrument(
    "B",
    0.168,
    24,
    ("g", "r", "i", "z", "y"),
    "kolmogorov",
    (0.45, 1.0),
    (0.5, 1.5),
    (-0.3, 0.0, 0.2, 0.35, 0.45),
)
INSTRUMENTS = {"A": LEGACY_LIKE, "B": HSC_LIKE}


def draw_parameters(n: int, rng: np.random.Generator) -> np.ndarray:
    """theta [n, 6] in PARAMS order: log10 flux in [3.0, 3.6], radius log-uniform in [0.3,
    1.0]", n from SERSIC_GRID, |g| < 0.45, colour in [-1, 1]."""
    log_flux = rng.uniform(3.0, 3.6, n)
    radius = np.exp(rng.uniform(np.log(0.3), np.log(1.0), n))
    sersic = rng.choice(SERSIC_GRID, n)
    g = 0.45 * np.sqrt(rng.uniform(0.0, 1.0, n))
    angle = rng.uniform(0.0, np.pi, n)
    colour = rng.uniform(-1.0, 1.0, n)
    return np.stack(
        [log_flux, radius, sersic, g * np.cos(2 * angle), g * np.sin(2 * angle), colour], 1
    )


def draw_conditions(n: int, instrument: Instrument, rng: np.random.Generator) -> np.ndarray:
    """[n, 2]: per-observation PSF FWHM (arcsec) and noise sigma, uniform in the ranges."""
    return np.stack(
        [rng.uniform(*instrument.fwhm_range, n), rng.uniform(*instrument.noise_range, n)], 1
    )


def render(theta: np.ndarray, condition: np.ndarray, instrument: Instrument) -> np.ndarray:
    """Noise-free [bands, size, size] image of one galaxy under one observation's PSF (a
    radius of 0 draws a point source, a star)."""
    import galsim

    log_flux, radius, sersic, g1, g2, colour = (float(v) for v in theta)
    if radius == 0:
        galaxy = galsim.DeltaFunction(flux=1.0)
    else:
        galaxy = galsim.Sersic(n=sersic, half_light_radius=radius, flux=1.0).shear(g1=g1, g2=g2)
    fwhm = float(condition[0])
    if instrument.psf == "moffat":
        psf = galsim.Moffat(beta=3.5, fwhm=fwhm)
    else:
        psf = galsim.Kolmogorov(fwhm=fwhm)
    stamp = galsim.Convolve(galaxy, psf).drawImage(
        nx=instrument.size, ny=instrument.size, scale=instrument.pixel_scale
    )
    profile = stamp.array.astype(np.float64)
    fluxes = 10.0 ** (log_flux + colour * np.asarray(instrument.colour_slopes))
    return (fluxes[:, None, None] * profile[None]).astype(np.float32)


def observe(clean: np.ndarray, noise_sigma: float, rng: np.random.Generator) -> np.ndarray:
    """Add Gaussian sky noise of the observation's sigma to a noise-free image."""
    return (clean + noise_sigma * rng.standard_normal(clean.shape)).astype(np.float32)


def draw_stars(n: int, rng: np.random.Generator) -> np.ndarray:
    """Point sources in the PARAMS layout: radius 0, random log flux and colour."""
    stars = np.zeros((n, len(PARAMS)))
    stars[:, 0] = rng.uniform(3.0, 3.6, n)
    stars[:, 2] = SERSIC_GRID[0]
    stars[:, 5] = rng.uniform(-1.0, 1.0, n)
    return stars


def simulate_pairs(
    n: int, seed: int, n_truth: int = 0, neighbour: str = "star"
) -> dict[str, np.ndarray]:
    """n galaxies seen by both instruments, with neighbours and (for the last ``n_truth``)
    partners and counterfactual truths.

    Returns params [n, 6]; for each instrument X in (A, B): image_X [n, bands, s, s] (observed),
    cond_X [n, 2], neighbour_X [n, bands, s, s] (a star or another galaxy under the same condition,
    observed with its own noise draw), neighbour_params_X [n, 6]; and ``partner`` [n] (-1
    outside the truth set; a partner indexes the truth set's own galaxies) with
    ``truth_B`` [n, 5, 24, 24]: galaxy i, noise-free, under B's condition of its partner.
    """
    rng = np.random.default_rng(seed)
    params = draw_parameters(n, rng)
    out: dict[str, np.ndarray] = {"params": params.astype(np.float32)}
    for name, instrument in INSTRUMENTS.items():
        cond = draw_conditions(n, instrument, rng)
        if neighbour == "star":
            neighbour_params = draw_stars(n, rng)
        elif neighbour == "galaxy":
            neighbour_params = draw_parameters(n, rng)  # objects outside the catalogue's pairs
        else:
            raise ValueError(f"neighbour must be 'star' or 'galaxy', not {neighbour!r}")
        images, neighbours = [], []
        for i in range(n):
            images.append(observe(render(params[i], cond[i], instrument), cond[i, 1], rng))
            clean = render(neighbour_params[i], cond[i], instrument)
            neighbours.append(observe(clean, cond[i, 1], rng))
        out[f"image_{name}"] = np.stack(images)
        out[f"cond_{name}"] = cond.astype(np.float32)
        out[f"neighbour_{name}"] = np.stack(neighbours)
        out[f"neighbour_params_{name}"] = neighbour_params.astype(np.float32)
    partner = np.full(n, -1, dtype=np.int64)
    truth = np.zeros((n, len(HSC_LIKE.bands), HSC_LIKE.size, HSC_LIKE.size), np.float32)
    if n_truth:
        first = n - n_truth
        # A derangement of the truth set: every galaxy gets another galaxy's B condition.
        shift = rng.integers(1, n_truth)
        partner[first:] = first + (np.arange(n_truth) + shift) % n_truth
        for i in range(first, n):
            truth[i] = render(params[i], out["cond_B"][partner[i]], HSC_LIKE)
    out["partner"] = partner
    out["truth_B"] = truth
    return out
