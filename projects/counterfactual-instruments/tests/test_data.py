import h5py
import numpy as np
import pytest

from counterfactual_instruments.data import (
    CounterfactualInstrumentsDataModule,
    derangement,
    probe_target_count,
)
from counterfactual_instruments.evaluation import hsm_moments
from counterfactual_instruments.mmu import (
    MMUFormatError,
    cross_match,
    load_pairs,
    nearest_condition_neighbour,
    point_sources,
    read_survey,
)
from counterfactual_instruments.simulate import HSC_LIKE, LEGACY_LIKE, render, simulate_pairs
from papers_cli import ConfigError
from papers_data import DATA_ROOT_ENV, DatasetNotFoundError


# -- the simulator ----------------------------------------------------------------------------
def test_renders_are_seeded():
    a, b = simulate_pairs(6, seed=3, n_truth=3), simulate_pairs(6, seed=3, n_truth=3)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["image_A"], simulate_pairs(6, seed=4, n_truth=3)["image_A"])


def test_a_galaxy_keeps_its_flux_across_instruments():
    theta = np.array([3.3, 0.3, 1.0, 0.1, -0.1, 0.5])  # compact: the stamps hold its light
    a = render(theta, np.array([1.2, 1.0]), LEGACY_LIKE)
    b = render(theta, np.array([0.7, 1.0]), HSC_LIKE)
    expected = 10 ** (3.3 + 0.5 * np.asarray(LEGACY_LIKE.colour_slopes))
    np.testing.assert_allclose(a.sum((1, 2)), expected, rtol=0.1)
    # the bands both instruments share (g, r, z) carry the same flux
    shared = [HSC_LIKE.bands.index(band) for band in LEGACY_LIKE.bands]
    np.testing.assert_allclose(a.sum((1, 2)), b[shared].sum((1, 2)), rtol=0.1)


@pytest.mark.parametrize(("instrument", "fwhm"), [(LEGACY_LIKE, 1.3), (HSC_LIKE, 0.7)])
def test_a_stars_measured_psf_width_matches_the_request(instrument, fwhm):
    star = np.array([3.3, 0.01, 0.5, 0.0, 0.0, 0.0])  # a point source
    image = render(star, np.array([fwhm, 1.0]), instrument)
    sigma = hsm_moments(image[None], instrument.pixel_scale)[0, 0]
    # a Gaussian's FWHM is 2.355 sigma; Moffat and Kolmogorov wings widen the moments a little
    assert 2.355 * sigma == pytest.approx(fwhm, rel=0.15)


def test_neighbours_share_the_condition_and_truths_use_the_partners():
    sim = simulate_pairs(8, seed=0, n_truth=4)
    assert (sim["partner"][:4] == -1).all()
    partner = sim["partner"][4:]
    assert set(partner) == set(range(4, 8)) and (partner != np.arange(4, 8)).all()
    for i in range(4, 8):
        expected = render(sim["params"][i], sim["cond_B"][sim["partner"][i]], HSC_LIKE)
        np.testing.assert_allclose(sim["truth_B"][i], expected, rtol=1e-5, atol=1e-6)
    # a neighbour is another object seen under the target observation's PSF: its noise-free
    # render from its own parameters and the target's condition is what was observed, up to noise
    i = 2
    clean = render(sim["neighbour_params_B"][i], sim["cond_B"][i], HSC_LIKE)
    residual = sim["neighbour_B"][i] - clean
    assert residual.std() == pytest.approx(sim["cond_B"][i, 1], rel=0.1)


def test_derangement_has_no_fixed_point():
    order = derangement(50, np.random.default_rng(0))
    assert sorted(order) == list(range(50)) and (order != np.arange(50)).all()


def test_datamodule_scales_flux_keeps_chi2_and_standardises_on_train(tmp_path):
    data = CounterfactualInstrumentsDataModule(n_train=20, n_val=6, n_test=8, seed=1)
    data.setup()
    train, test = data.train_set.arrays, data.test_set.arrays
    assert len(data.train_set) == 20 and len(data.val_set) == 6 and len(data.test_set) == 8
    raw_sigma = data.raw["cond_B"][:20, 1]
    # images / 10 and ivar * 100: the noise in scaled units has unit chi2 per pixel
    np.testing.assert_allclose(train["ivar_B"][:, 0, 0, 0].numpy(), 100 / raw_sigma**2, rtol=1e-5)
    np.testing.assert_allclose(train["params"].numpy().mean(0), 0, atol=1e-5)
    assert {"truth_B", "partner_image_B", "partner_ivar_B"} <= set(test)
    partner = test["partner"].numpy()
    np.testing.assert_array_equal(test["partner_image_B"].numpy(), test["image_B"].numpy()[partner])


def test_shuffled_pairs_repairs_only_training_and_validation_views():
    true = CounterfactualInstrumentsDataModule(n_train=20, n_val=6, n_test=8, seed=1)
    shuffled = CounterfactualInstrumentsDataModule(
        n_train=20, n_val=6, n_test=8, seed=1, shuffle_pairs=True
    )
    true.setup(), shuffled.setup()
    a, b = true.train_set.arrays, shuffled.train_set.arrays
    assert (a["image_A"] == b["image_A"]).all() and not (a["image_B"] == b["image_B"]).all(
        dim=(1, 2, 3)
    ).any()
    assert (true.test_set.arrays["image_B"] == shuffled.test_set.arrays["image_B"]).all()


def test_the_miniature_refuses_real_data_geometry():
    with pytest.raises(ConfigError, match="only apply to real data"):
        CounterfactualInstrumentsDataModule(n_train=4, n_val=2, n_test=2, size_b=32).setup()


# -- Multimodal Universe HDF5 -----------------------------------------------------------------
def write_survey(path, ra, dec, bands, size=40, scale=1.0, psf=1.0, ivar=1.0, drop=None):
    n = len(ra)
    rng = np.random.default_rng(len(bands))
    with h5py.File(path, "w") as f:
        fields = {
            "object_id": np.arange(n) + 100,
            "ra": np.asarray(ra, float),
            "dec": np.asarray(dec, float),
            "image_array": (scale * rng.normal(size=(n, len(bands), size, size))).astype(
                np.float32
            ),
            "image_ivar": np.full((n, len(bands), size, size), ivar, np.float32),
            "image_mask": np.zeros((n, len(bands), size, size), bool),
            "image_band": np.array([[b.encode() for b in bands]] * n),
            "image_psf_fwhm": np.full((n, len(bands)), psf, np.float32)
            + np.arange(n)[:, None] * 0.1,
        }
        for key, value in fields.items():
            if key != drop:
                f[key] = value
    return path


ARCSEC = 1 / 3600


@pytest.fixture
def mmu_root(tmp_path):
    """Equal 40 px cutouts covering different sky areas (0.262 vs 0.168 "/px), Legacy with 4 bands
    in a scrambled order and HSC with 5, a pixel with zero inverse variance, a pair across RA =
    0/360, a Legacy object with two HSC candidates inside 1", and objects without a partner."""
    legacy, hsc = tmp_path / "legacysurvey" / "healpix=1", tmp_path / "hsc" / "healpix=1"
    legacy.mkdir(parents=True), hsc.mkdir(parents=True)
    write_survey(
        legacy / "001-of-001.hdf5",
        ra=[359.99999, 10.0, 20.0, 50.0],
        dec=[0.0, 5.0, -5.0, 30.0],
        bands=["DES-Z", "DES-G", "DES-I", "DES-R"],
    )
    path = write_survey(
        hsc / "001-of-001.hdf5",
        ra=[0.00001, 10.0 + 0.3 * ARCSEC, 10.0 + 0.8 * ARCSEC, 20.0 + 0.5 * ARCSEC, 80.0],
        dec=[0.0, 5.0, 5.0, -5.0, 0.0],
        bands=["HSC-G", "HSC-R", "HSC-I", "HSC-Z", "HSC-Y"],
        psf=0.6,
    )
    with h5py.File(path, "r+") as f:
        ivar = f["image_ivar"][:]
        ivar[1, 0, 20, 20] = 0.0
        f["image_ivar"][...] = ivar
    return tmp_path


def test_mmu_loader_pairs_crops_orders_bands_and_masks(mmu_root):
    pairs = load_pairs(mmu_root, ["g", "r", "z"], ["g", "r", "i", "z", "y"], size_a=16, size_b=24)
    # RA wrap-around pairs object 0 with 0; object 1 takes the closer of two candidates (0.3")
    np.testing.assert_array_equal(pairs["object_id_A"], [100, 101, 102])
    np.testing.assert_array_equal(pairs["object_id_B"], [100, 101, 103])
    assert pairs["image_A"].shape == (3, 3, 16, 16) and pairs["image_B"].shape == (3, 5, 24, 24)
    # the bands come in the requested order, whatever the file's order
    with h5py.File(mmu_root / "legacysurvey" / "healpix=1" / "001-of-001.hdf5") as f:
        g_band = f["image_array"][0, 1, 12:28, 12:28]  # DES-G is column 1 in the file
    np.testing.assert_array_equal(pairs["image_A"][0, 0], g_band)
    # zero inverse variance is masked (pixel 20 -> 12 after the 24 px centre crop of 40)
    assert pairs["mask_B"][1, 0, 12, 12] == 0 and pairs["ivar_B"][1, 0, 12, 12] == 0
    assert pairs["mask_B"].sum() == pairs["mask_B"].size - 1
    # the condition is (mean PSF FWHM, median noise sigma); neighbours are other objects
    np.testing.assert_allclose(pairs["cond_B"][:, 1], 1.0)
    assert not np.array_equal(pairs["neighbour_A"][0], pairs["image_A"][0])


def test_cross_match_is_one_to_one_within_the_radius():
    ra_a, dec_a = np.array([10.0, 10.0 + 0.5 * ARCSEC, 30.0]), np.zeros(3)
    ra_b, dec_b = np.array([10.0 + 0.2 * ARCSEC, 30.0 + 2 * ARCSEC]), np.zeros(2)
    a, b = cross_match(ra_a, dec_a, ra_b, dec_b, radius_arcsec=1.0)
    # both A objects 0 and 1 find B 0; the closer (A 0, 0.2") keeps it; A 2 is 2" away
    np.testing.assert_array_equal(a, [0]) and np.testing.assert_array_equal(b, [0])


def test_nearest_condition_neighbour_is_never_the_object_itself():
    cond = np.array([[1.0, 1.0], [1.01, 1.0], [2.0, 3.0], [2.05, 3.0]])
    np.testing.assert_array_equal(nearest_condition_neighbour(cond), [1, 0, 3, 2])


def test_bad_mmu_files_give_clear_errors(tmp_path, mmu_root):
    write_survey(tmp_path / "no_psf.hdf5", [1.0], [0.0], ["G"], drop="image_psf_fwhm")
    with pytest.raises(MMUFormatError, match="image_psf_fwhm"):
        read_survey(tmp_path, ["g"], 16)
    with pytest.raises(MMUFormatError, match="lack one of"):  # 5 bands asked of a 4-band file
        load_pairs(mmu_root, ["g", "r", "i", "z", "y"], ["g"], 16, 24)
    with pytest.raises(MMUFormatError, match="smaller than the crop"):
        load_pairs(mmu_root, ["g"], ["g"], 48, 24)
    far = tmp_path / "far"
    for survey, ra in (("legacysurvey", 1.0), ("hsc", 2.0)):
        (far / survey).mkdir(parents=True)
        write_survey(far / survey / "x.hdf5", [ra, ra + 0.5], [0.0, 0.0], ["G", "R"])
    with pytest.raises(MMUFormatError, match="no Legacy/HSC pairs"):
        load_pairs(far, ["g"], ["g"], 16, 24)
    negative = tmp_path / "negative"
    negative.mkdir()
    write_survey(negative / "x.hdf5", [1.0], [0.0], ["G"], ivar=-1.0)
    with pytest.raises(MMUFormatError, match="negative"):
        read_survey(negative, ["g"], 16)


def test_missing_real_data_names_what_to_put_where(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    data = CounterfactualInstrumentsDataModule(
        root=str(tmp_path / "missing"), n_train=2, n_val=1, n_test=1
    )
    with pytest.raises(DatasetNotFoundError, match="legacysurvey"):
        data.setup()


def test_real_data_through_the_datamodule(mmu_root):
    data = CounterfactualInstrumentsDataModule(
        root=str(mmu_root), n_train=1, n_val=1, n_test=1, bands_a=["g", "r", "i", "z"]
    )
    data.setup()
    item = data.test_set[0]
    assert item["image_A"].shape == (4, 16, 16) and item["image_B"].shape == (5, 24, 24)
    assert "params" not in item and "truth_B" not in item  # no simulator truth on real data
    too_many = CounterfactualInstrumentsDataModule(root=str(mmu_root), n_train=2, n_val=1, n_test=1)
    with pytest.raises(ConfigError, match="fewer than"):  # three pairs for four items
        too_many.setup()


def test_neighbours_prefer_point_sources_under_the_nearest_condition(tmp_path):
    cond = np.array([[1.0, 1.0], [1.01, 1.0], [2.0, 3.0], [2.05, 3.0], [1.02, 1.0]])
    stars = np.array([False, False, True, False, True])
    np.testing.assert_array_equal(nearest_condition_neighbour(cond, stars), [4, 4, 4, 2, 2])
    folder = tmp_path / "legacy"
    folder.mkdir()
    write_survey(folder / "x.hdf5", [1.0, 2.0], [0.0, 0.0], ["G"])
    assert point_sources(folder) is None  # no catalogue column: any object may serve
    with h5py.File(folder / "x.hdf5", "r+") as f:
        f["TYPE"] = np.array([b"PSF", b"SER "])
    np.testing.assert_array_equal(point_sources(folder), [True, False])


def test_star_neighbours_show_the_psf_itself():
    sim = simulate_pairs(4, seed=5, neighbour="star")
    stars = sim["neighbour_params_A"]
    assert (stars[:, 1] == 0).all()  # point sources
    clean = render(stars[0], sim["cond_A"][0], LEGACY_LIKE)
    sigma = hsm_moments(clean[None], LEGACY_LIKE.pixel_scale)[0, 0]
    assert 2.355 * sigma == pytest.approx(sim["cond_A"][0, 0], rel=0.15)
    with pytest.raises(ValueError, match="star"):
        simulate_pairs(2, seed=0, neighbour="planet")


def test_catalogue_columns_become_the_probes_targets_on_real_data(mmu_root):
    """Probes of real catalogue quantities: --data.probe_variables names Legacy columns; they
    become ``params`` of the paired objects (standardised on train like the miniature's), a pair
    with a non-finite value is dropped, an absent column is a clear error."""
    legacy = next((mmu_root / "legacysurvey").rglob("*.hdf5"))
    with h5py.File(legacy, "r+") as f:
        f["SHAPE_R"] = np.array([1.0, np.nan, 3.0, 4.0])
        f["FLUX_R"] = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
    pairs = load_pairs(mmu_root, ["g"], ["g"], 16, 24, targets=["SHAPE_R", "FLUX_R"])
    np.testing.assert_array_equal(pairs["object_id_A"], [100, 102])  # 101's SHAPE_R is NaN
    np.testing.assert_array_equal(pairs["params"], [[1.0, 10.0], [3.0, 30.0]])
    assert len(pairs["image_B"]) == len(pairs["neighbour_A"]) == 2
    with pytest.raises(MMUFormatError, match="Z_SPEC"):
        load_pairs(mmu_root, ["g"], ["g"], 16, 24, targets=["Z_SPEC"])
    data = CounterfactualInstrumentsDataModule(
        root=str(mmu_root),
        n_train=1,
        n_val=1,
        n_test=1,
        bands_a=["g"],
        bands_b=["g"],
        probe_variables=["FLUX_R"],
    )
    data.setup()
    assert data.n_params == 1 and probe_target_count([]) == 6
    assert data.test_set[0]["params"].shape == (1,)
    assert data.train_set[0]["params"].item() == pytest.approx(0.0)  # standardised on train
    miniature = CounterfactualInstrumentsDataModule(probe_variables=["FLUX_R"])
    with pytest.raises(ConfigError, match="real data"):
        miniature.setup()


def test_the_cli_sizes_the_oracle_by_the_catalogue_columns(mmu_root, tiny_args):
    """The module's n_params follows --data.probe_variables (the oracle's z_p is the targets)."""
    from counterfactual_instruments.cli import train

    legacy = next((mmu_root / "legacysurvey").rglob("*.hdf5"))
    with h5py.File(legacy, "r+") as f:
        f["FLUX_R"] = np.array([10.0, 20.0, 30.0, 40.0], np.float32)
    sizes = [a for a in tiny_args if not a.startswith(("--data.n_", "--data.batch"))]
    cli = train(
        [*sizes, f"--data.root={mmu_root}", "--data.n_train=1", "--data.n_val=1",
         "--data.n_test=1", "--data.batch_size=1", "--data.probe_variables=[FLUX_R]",
         "--model.objective=oracle", "--trainer.max_steps=1"]
    )  # fmt: skip
    assert cli.model.hparams.n_params == 1 and cli.trainer.global_step == 1
