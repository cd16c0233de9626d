import datetime as dt

import numpy as np
import pytest

from ibci_fewshot.core import CHARSET, N_CLASSES, encode_text
from ibci_fewshot.data import IbciDataModule
from ibci_fewshot.nwb import DataFormatError, read_session, session_file, write_session
from ibci_fewshot.simulate import DriftScale, SessionSpec, session_encoders, simulate_sessions
from papers_cli import ConfigError
from papers_data import DATA_ROOT_ENV, DatasetNotFoundError

DATE = dt.date(2023, 4, 17)


def trials(n, channels=192, seed=0, bins=(7, 5, 9, 6)):
    rng = np.random.default_rng(seed)
    return [
        rng.poisson(0.5, size=(bins[i % len(bins)], channels)).astype(np.int16) for i in range(n)
    ]


def test_reader_round_trips_the_falcon_layout(tmp_path):
    spikes = trials(3)
    cues = ["it's>ok~", "why>me?", "a,>b"]
    path = write_session(tmp_path / "s_ses-20230417.nwb", spikes, cues, [False, False, True], DATE)
    session = read_session(path, channels=192)
    assert session["cues"] == cues and session["date"] == DATE
    assert session["is_eval"] == [False, False, True]
    for read, written in zip(session["spikes"], spikes, strict=True):
        np.testing.assert_array_equal(read, written)


def test_trials_split_at_gaps_just_above_21_ms_and_join_below(tmp_path):
    spikes = trials(3)
    cues = ["ab", "cd", "ef"]
    above = write_session(
        tmp_path / "a_ses-20230417.nwb", spikes, cues, [False] * 3, DATE, gaps=[0.0215, 0.0212]
    )
    assert [len(s) for s in read_session(above)["spikes"]] == [7, 5, 9]
    below = write_session(
        tmp_path / "b_ses-20230417.nwb", spikes, cues, [False] * 3, DATE, gaps=[0.0205, 0.5]
    )
    # the first two trials join into one: 2 stretches for 3 cues is an error, not a silent shift
    with pytest.raises(DataFormatError, match="2 trials by timestamp gaps"):
        read_session(below)


def test_eval_mask_false_inside_a_trial_keeps_the_trial_whole(tmp_path):
    spikes = trials(2)
    partial = np.ones(5, bool)
    partial[1:3] = False
    path = write_session(
        tmp_path / "m_ses-20230417.nwb",
        spikes,
        ["ab", "cd"],
        [False, True],
        DATE,
        eval_bins=[np.zeros(7, bool), partial],
    )
    session = read_session(path)
    assert [len(s) for s in session["spikes"]] == [7, 5]
    assert session["is_eval"] == [False, True]


def test_the_data_have_31_characters_not_the_evaluators_28(tmp_path):
    """FALCON's H2 config says out_dim 28; the cues use 31 characters, all of which the loader
    and the model's 32 classes (blank + 31) accept."""
    cues = [CHARSET[:16], CHARSET[16:]]
    path = write_session(tmp_path / "c_ses-20230417.nwb", trials(2), cues, [False] * 2, DATE)
    session = read_session(path)
    labels = {k for cue in session["cues"] for k in encode_text(cue)}
    assert len(labels) == 31 > 28 and N_CLASSES == 32


@pytest.mark.parametrize(
    ("skip", "message"), [(("binned_spikes",), "binned_spikes"), (("cue",), "cue")]
)
def test_missing_fields_are_clear_errors(tmp_path, skip, message):
    path = write_session(
        tmp_path / "x_ses-20230417.nwb", trials(2), ["ab", "cd"], [False] * 2, DATE, skip=skip
    )
    with pytest.raises(DataFormatError, match=message):
        read_session(path)


def test_a_channel_count_other_than_the_models_is_an_error(tmp_path):
    path = write_session(
        tmp_path / "w_ses-20230417.nwb", trials(2, channels=96), ["ab", "cd"], [False] * 2, DATE
    )
    with pytest.raises(DataFormatError, match="96 channels but the model expects 192"):
        read_session(path, channels=192)


def test_a_character_outside_the_set_is_an_error(tmp_path):
    path = write_session(
        tmp_path / "q_ses-20230417.nwb", trials(2), ["ab", "c!d"], [False] * 2, DATE
    )
    with pytest.raises(DataFormatError, match="outside FALCON H2's 31"):
        read_session(path)


def test_simulated_drift_grows_with_days_and_is_seeded():
    days = [0, 10, 40, 160]
    encoders = session_encoders(days, 64, 8, DriftScale(), np.random.default_rng(0))
    again = session_encoders(days, 64, 8, DriftScale(), np.random.default_rng(0))
    other = session_encoders(days, 64, 8, DriftScale(), np.random.default_rng(1))
    tuning0 = encoders[0][0]
    distances = [np.linalg.norm(e[0] - tuning0) / np.linalg.norm(tuning0) for e in encoders]
    gains = [np.abs(np.log(e[1]) - np.log(encoders[0][1])).mean() for e in encoders]
    assert distances[0] == 0 and distances[1] < distances[2] < distances[3]
    assert gains[1] < gains[2] < gains[3]
    np.testing.assert_array_equal(encoders[3][0], again[3][0])
    assert not np.allclose(encoders[3][0], other[3][0])


def test_simulation_is_seeded():
    specs = [SessionSpec(0, 3), SessionSpec(5, 3, n_eval=1)]
    first, again = simulate_sessions(specs, 16, seed=2), simulate_sessions(specs, 16, seed=2)
    assert first[1]["cues"] == again[1]["cues"] and first[1]["is_eval"] == [False, False, True]
    np.testing.assert_array_equal(first[1]["spikes"][0], again[1]["spikes"][0])
    assert simulate_sessions(specs, 16, seed=3)[1]["cues"] != first[1]["cues"]


def tiny_module(**overrides):
    settings = {
        "sim_held_in_days": [0, 5, 10],
        "sim_held_out_days": [30, 60],
        "sim_sentences": 16,
        "sim_calibration_pool": 8,
        "sim_eval": 4,
        "n_minival": 2,
        "seed": 0,
        **overrides,
    }
    return IbciDataModule(**settings)


def test_the_default_path_writes_falcon_nwb_and_reads_it_back():
    data = tiny_module()
    data.setup()
    root = data.simulated_root(0)
    assert session_file(root, "held-out-calib", 30).is_file()
    assert len(data.train_sessions) == 2 and len(data.test_sessions) == 2
    assert data.val_session.day == 10 and [s.day for s in data.test_sessions] == [30, 60]
    session = data.test_sessions[0]
    assert session.calibration_indices(3) == [0, 1, 2] and len(session.eval_indices()) == 4
    assert (
        session.x[0].shape[1] == 192
        and abs(float(np.mean([x.mean() for x in data.train_sessions[0].x]))) < 0.2
    )


def test_zero_calibration_sentences_is_a_clear_error():
    with pytest.raises(ConfigError, match="zero calibration"):
        tiny_module(n_calibration=0).setup()


def test_missing_real_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatasetNotFoundError, match="DANDI"):
        tiny_module(root=str(tmp_path / "nothing")).setup()


def test_the_streaming_adapter_decodes_like_the_batch_path():
    """Bins streamed through predict/on_done give the batch transcription of each trial; an
    unseen, uncalibrated session tag is refused until it is calibrated."""
    import torch

    from ibci_fewshot.data import pad_batch
    from ibci_fewshot.falcon import FewShotFalconDecoder
    from ibci_fewshot.model import IbciModule, UnknownSessionError

    data = tiny_module()
    data.setup()
    torch.manual_seed(0)
    module = IbciModule(n_sessions=2, hidden=16, projection=8).eval()
    adapter = FewShotFalconDecoder(module, data.channel_mean, data.channel_std)
    session = data.test_sessions[0]
    with pytest.raises(UnknownSessionError):
        adapter.reset([f"/data/{session.tag}.nwb"])
    calibration = session.calibration_indices(3)
    adapter.calibrate(
        session.tag,
        [session.counts[i] for i in calibration],
        [session.cues[i] for i in calibration],
    )
    adapter.reset([f"/data/{session.tag}.nwb"])
    for i in session.eval_indices()[:2]:
        for row in session.counts[i]:
            adapter.predict(row[None])
        adapter.on_done(np.array([True]))
    batch = pad_batch([(session, session.eval_indices()[:2])])
    expected = module.transcribe(batch, module.params_for(session.tag))
    # Texts from argmaxes computed through other batch shapes (bin by bin vs a padded batch):
    # exact, because each step's best class leads the next by at least 4e-3 in log-probability
    # (measured), thousands of times the float32 reordering.
    assert adapter.finished == expected
