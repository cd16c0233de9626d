"""FALCON H2 NWB files: the reader (the only loader, for real and simulated data) and a writer.

Layout read (as falcon_challenge.dataloaders.load_nwb's H2 branch does) [V: design note]:
acquisition ``binned_spikes`` (TimeSeries [bins, 192] at 20 ms with timestamps), acquisition
``eval_mask`` (bool per bin), and the ``trials`` table with a ``cue`` column (the prompted
sentence in FALCON's 31 characters). Trials are the stretches between timestamp gaps > 21 ms.
A trial counts as an evaluation trial when any of its bins has ``eval_mask`` true [R]; bins with
a false mask inside a trial stay in the trial (the decoder sees whole sentences).
Folder layout (DANDI 000950): ``sub-T5-held-in-calib/*.nwb``, ``sub-T5-held-out-calib/*.nwb``;
the session date is the ``ses-YYYYMMDD`` part of the file name.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import numpy as np

from ibci_fewshot.core import CHARSET

GAP_S = 0.021  # FALCON's trial split: timestamp gaps above 21 ms
TRIAL_GAP_S = 0.5  # the simulator's gap between trials
HELD_IN, HELD_OUT = "held-in-calib", "held-out-calib"
FIRST_DAY = dt.date(2022, 5, 18)  # the first held-in session of FALCON H2 (T5)


class DataFormatError(ValueError):
    """An NWB file does not have the fields or values this project needs."""

    user_facing = True


def session_date(path: str | Path) -> dt.date:
    match = re.search(r"ses-(\d{8})", Path(path).name)
    if match is None:
        raise DataFormatError(f"{path}: no ses-YYYYMMDD in the file name")
    return dt.datetime.strptime(match.group(1), "%Y%m%d").date()


def read_session(path: str | Path, channels: int | None = None) -> dict:
    """One FALCON H2 NWB file -> dict(tag, date, spikes [list of int arrays [T_i, C]], cues,
    is_eval). Raises DataFormatError for a missing field, a channel count other than
    ``channels``, a character outside the 31, or trials that do not match the cues."""
    from pynwb import NWBHDF5IO

    path = Path(path)
    with NWBHDF5IO(str(path), "r") as io:
        nwb = io.read()
        for name in ("binned_spikes", "eval_mask"):
            if name not in nwb.acquisition:
                raise DataFormatError(
                    f"{path.name}: no acquisition '{name}' (FALCON H2 files hold binned_spikes "
                    "[bins, 192] and eval_mask)"
                )
        series = nwb.acquisition["binned_spikes"]
        spikes = np.asarray(series.data[()])
        time = np.asarray(series.timestamps[()])
        mask = np.asarray(nwb.acquisition["eval_mask"].data[()]).astype(bool)
        if nwb.trials is None or "cue" not in nwb.trials.colnames:
            raise DataFormatError(f"{path.name}: no trials table with a 'cue' column")
        cues = [str(c) for c in nwb.trials["cue"][:]]
    if spikes.ndim != 2 or len(time) != len(spikes) or len(mask) != len(spikes):
        raise DataFormatError(
            f"{path.name}: binned_spikes {spikes.shape}, {len(time)} timestamps and "
            f"{len(mask)} eval_mask values do not line up"
        )
    if channels is not None and spikes.shape[1] != channels:
        raise DataFormatError(
            f"{path.name} has {spikes.shape[1]} channels but the model expects {channels}; "
            f"set --data.channels={spikes.shape[1]} (and the model follows)"
        )
    for cue in cues:
        bad = sorted({c for c in cue if c not in CHARSET})
        if bad:
            raise DataFormatError(
                f"{path.name}: the cue {cue!r} holds {bad}, outside FALCON H2's 31 characters"
            )
    ends = np.flatnonzero(np.concatenate([np.diff(time) > GAP_S, [True]])) + 1
    starts = np.concatenate([[0], ends[:-1]])
    if len(starts) != len(cues):
        raise DataFormatError(
            f"{path.name}: {len(starts)} trials by timestamp gaps > 21 ms but {len(cues)} cues "
            "in the trials table"
        )
    return {
        "tag": path.stem,
        "date": session_date(path),
        "spikes": [spikes[a:b] for a, b in zip(starts, ends, strict=True)],
        "cues": cues,
        "is_eval": [bool(mask[a:b].any()) for a, b in zip(starts, ends, strict=True)],
    }


def find_sessions(root: str | Path, split: str) -> list[Path]:
    """The NWB files of a split (``held-in-calib`` / ``held-out-calib``) sorted by date."""
    files = [p for p in Path(root).glob(f"*{split}*/*.nwb")]
    return sorted(files, key=session_date)


def write_session(
    path: str | Path,
    spikes: list[np.ndarray],
    cues: list[str],
    is_eval: list[bool],
    date: dt.date,
    gaps: list[float] | None = None,
    eval_bins: list[np.ndarray] | None = None,
    skip: tuple[str, ...] = (),
) -> Path:
    """Write one session in FALCON H2's layout (used by the simulator and the test fixtures).

    ``gaps``: seconds between consecutive trials (default 0.5); ``eval_bins``: a per-trial bool
    mask overriding ``is_eval``; ``skip``: fields to leave out (fixtures for bad input)."""
    from pynwb import NWBHDF5IO, NWBFile, TimeSeries

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    start = dt.datetime.combine(date, dt.time(12), tzinfo=dt.UTC)
    nwb = NWBFile(
        session_description="SIMULATED FALCON-H2-format session (ibci-fewshot simulator)",
        identifier=path.stem,
        session_start_time=start,
    )
    gaps = gaps or [TRIAL_GAP_S] * max(len(spikes) - 1, 0)
    times, masks, t = [], [], 0.0
    if "cue" not in skip:
        nwb.add_trial_column("cue", "the prompted sentence")
    for i, trial in enumerate(spikes):
        stamps = t + np.arange(len(trial)) * 0.02
        times.append(stamps)
        mask = eval_bins[i] if eval_bins is not None else np.full(len(trial), is_eval[i])
        masks.append(np.asarray(mask, dtype=bool))
        extra = {} if "cue" in skip else {"cue": cues[i]}
        nwb.add_trial(start_time=float(stamps[0]), stop_time=float(stamps[-1] + 0.02), **extra)
        t = float(stamps[-1]) + (gaps[i] if i < len(gaps) else TRIAL_GAP_S)
    timestamps = np.concatenate(times)
    if "binned_spikes" not in skip:
        nwb.add_acquisition(
            TimeSeries(
                name="binned_spikes",
                data=np.concatenate(spikes).astype(np.int16),
                timestamps=timestamps,
                unit="count",
            )
        )
    nwb.add_acquisition(
        TimeSeries(name="eval_mask", data=np.concatenate(masks), timestamps=timestamps, unit="n.a.")
    )
    with NWBHDF5IO(str(path), "w") as io:
        io.write(nwb)
    return path


def session_file(root: Path, split: str, day: int, subject: str = "SIM") -> Path:
    """FALCON's naming: sub-<S>-<split>/sub-<S>-<split>_ses-YYYYMMDD_behavior+ecephys.nwb."""
    date = FIRST_DAY + dt.timedelta(days=day)
    folder = f"sub-{subject}-{split}"
    return root / folder / f"{folder}_ses-{date:%Y%m%d}_behavior+ecephys.nwb"
