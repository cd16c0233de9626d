"""Sessions from FALCON H2 NWB files (real, from a data root; or simulated, written as NWB by
simulate.py and read back by the same reader), their splits, and the training episodes.

Splits (both sources): held-in sessions train stage 1 and stage 2, except the LAST
``n_val_sessions`` held-in sessions, which are treated as new sessions for validation (tuning of
every method's adaptation knobs) [G]; the last ``n_minival`` sentences of each training held-in
session are the minival (`validate`). Held-out sessions are the test split: the first
``n_calibration`` trials are the few-shot calibration set (FALCON: the first 3 trials), trials
with ``eval_mask`` are scored.

Meta-episodes from the data's own drift [R]: with ``meta_sessions = m > 0`` the latest m training
held-in sessions are kept out of stage 1 and feed stage 2 only. The backbone then never saw them,
so an episode from one of them carries the recordings' real across-day drift relative to the
days the backbone was trained on (the drift a held-out session brings), not a synthetic one.
With ``meta_sessions = 0`` both stages draw from every training session (the design note's
episodes, made to drift by ``IbciModule``'s synthetic episode drift).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveInt
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset

from ibci_fewshot.core import encode_text
from ibci_fewshot.nwb import HELD_IN, HELD_OUT, find_sessions, read_session, session_file
from ibci_fewshot.nwb import write_session as write_nwb
from ibci_fewshot.simulate import DriftScale, SessionSpec, simulate_sessions
from papers_cli import ConfigError, init_arguments
from papers_data import EpochShuffle, cache_dir, config_hash, drawn_by_trainer, resolve_data_root
from papers_gpu import run_seed

HOW_TO_GET = (
    "FALCON H2 is DANDI dataset 000950 (participant T5, attempted handwriting): "
    "`dandi download DANDI:000950` and pass the folder holding sub-T5-held-in-calib/ and "
    "sub-T5-held-out-calib/ as --data.root."
)


@dataclass
class Session:
    """One session, preprocessed: x [T_i, C] float (standardised), labels, cues, flags."""

    tag: str
    day: int
    x: list[torch.Tensor]
    labels: list[list[int]]
    cues: list[str]
    is_eval: list[bool]
    index: int = -1  # position among the training held-in sessions (-1: not one)
    counts: list[np.ndarray] = field(default_factory=list, repr=False)

    def eval_indices(self) -> list[int]:
        return [i for i, e in enumerate(self.is_eval) if e]

    def calibration_indices(self, n: int) -> list[int]:
        """The first ``n`` non-evaluation trials (FALCON's few-shot split for n = 3)."""
        if n < 1:
            raise ConfigError(
                "zero calibration sentences: few-shot adaptation needs at least one "
                "(n_calibration >= 1)"
            )
        pool = [i for i, e in enumerate(self.is_eval) if not e]
        if len(pool) < n:
            raise ConfigError(
                f"session {self.tag} has {len(pool)} calibration trials, fewer than {n}"
            )
        return pool[:n]

    def extra_indices(self, after: int) -> list[int]:
        """Non-evaluation trials after the first ``after`` (the many-sentence controls)."""
        return [i for i, e in enumerate(self.is_eval) if not e][after:]


def pad_batch(sessions_and_indices: list[tuple[Session, list[int]]]) -> dict[str, torch.Tensor]:
    """Sentences -> x [N, T, C], lengths [N], y [N, L], y_lengths [N], session [N] (padded)."""
    xs, ys, sess = [], [], []
    for session, indices in sessions_and_indices:
        for i in indices:
            xs.append(session.x[i])
            ys.append(session.labels[i])
            sess.append(session.index)
    n, t_max, c = len(xs), max(x.shape[0] for x in xs), xs[0].shape[1]
    x = torch.zeros(n, t_max, c)
    y = torch.zeros(n, max(len(v) for v in ys), dtype=torch.long)
    for k, (xi, yi) in enumerate(zip(xs, ys, strict=True)):
        x[k, : xi.shape[0]] = xi
        y[k, : len(yi)] = torch.tensor(yi)
    return {
        "x": x,
        "lengths": torch.tensor([xi.shape[0] for xi in xs]),
        "y": y,
        "y_lengths": torch.tensor([len(v) for v in ys]),
        "session": torch.tensor(sess),
    }


class EpisodeSet(Dataset):
    """Item i: a seeded episode (one training session; support + query sentences) for stage 1,
    from the sessions at ``stage1``, and one for stage 2, from the sessions at ``stage2`` (drawn
    apart, so that the two stages can read disjoint sessions)."""

    def __init__(self, sessions, train_indices, n_support, n_query, n_items, seed, stage1, stage2):
        self.sessions, self.train_indices = sessions, train_indices
        self.n_support, self.n_query, self.n_items, self.seed = n_support, n_query, n_items, seed
        self.pools = {"stage1": list(stage1), "stage2": list(stage2)}

    def __len__(self) -> int:
        return self.n_items

    def __getitem__(self, item: int) -> dict[str, dict[str, torch.Tensor]]:
        rng = np.random.default_rng([self.seed, item])
        out = {}
        for stage, pool in self.pools.items():
            s = pool[int(rng.integers(len(pool)))]
            chosen = rng.choice(self.train_indices[s], self.n_support + self.n_query, replace=False)
            out[stage] = {
                "support": pad_batch([(self.sessions[s], list(chosen[: self.n_support]))]),
                "query": pad_batch([(self.sessions[s], list(chosen[self.n_support :]))]),
            }
        return out


def collate_episodes(items: list[dict]) -> dict:
    """Episodes stay lists (each has its own padding): ``episodes`` for stage 1,
    ``meta_episodes`` for stage 2."""
    return {
        "episodes": [item["stage1"] for item in items],
        "meta_episodes": [item["stage2"] for item in items],
    }


class IbciDataModule(LightningDataModule):
    """FALCON H2 sessions (``root``) or the simulated miniature, written as NWB and read back.

    ``seed`` fixes the simulation and the episode draws; by default the run's seed.
    """

    def __init__(
        self,
        root: str | None = None,
        channels: PositiveInt = 192,
        n_calibration: NonNegativeInt = 3,
        n_minival: PositiveInt = 5,
        n_val_sessions: PositiveInt = 1,
        meta_sessions: NonNegativeInt = 0,
        n_support: PositiveInt = 3,
        n_query: PositiveInt = 5,
        episodes_per_batch: PositiveInt = 4,
        episodes_per_epoch: PositiveInt = 64,
        sim_held_in_days: list[NonNegativeInt] | None = None,
        sim_held_out_days: list[NonNegativeInt] | None = None,
        sim_sentences: PositiveInt = 30,
        sim_calibration_pool: PositiveInt = 90,
        sim_eval: PositiveInt = 20,
        sim_drift_scale: NonNegativeFloat = 0.6,
        num_workers: NonNegativeInt = 0,
        seed: NonNegativeInt | None = None,
    ) -> None:
        super().__init__()
        # Passed explicitly, not read from the caller's frame: the mutation lane wraps __init__
        # in a trampoline, and Lightning would read the wrapper's frame and store nothing
        # (papers_cli.hparams; builtin types, so weights_only checkpoint loading accepts them).
        self.save_hyperparameters(init_arguments(locals()))
        self.sessions_ready = False

    # ---------------------------------------------------------------- sources
    def held_in_days(self) -> list[int]:
        return list(self.hparams.sim_held_in_days or list(range(0, 49, 4)) + [52])

    def held_out_days(self) -> list[int]:
        return list(self.hparams.sim_held_out_days or [60, 75, 95, 120])

    def simulated_root(self, seed: int) -> Path:
        """Write the simulated sessions as FALCON NWB once per config (cached), return the root."""
        h = self.hparams
        config = {
            "held_in": self.held_in_days(),
            "held_out": self.held_out_days(),
            "sentences": h.sim_sentences,
            "pool": h.sim_calibration_pool,
            "eval": h.sim_eval,
            "drift": h.sim_drift_scale,
            "channels": h.channels,
            "seed": seed,
            "version": 2,
            **({"n_val": h.n_val_sessions} if h.n_val_sessions != 1 else {}),
        }
        root = cache_dir() / "ibci-fewshot" / f"sim-{config_hash(config)}"
        if (root / "done").is_file():
            return root
        tmp = root.with_name(root.name + f".{os.getpid()}.tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        held_in, n_val = self.held_in_days(), h.n_val_sessions
        specs = [SessionSpec(d, h.sim_sentences) for d in held_in[:-n_val]]
        specs += [
            SessionSpec(d, h.sim_calibration_pool + h.sim_eval, h.sim_eval)
            for d in held_in[-n_val:]
        ]
        specs += [
            SessionSpec(d, h.sim_calibration_pool + h.sim_eval, h.sim_eval)
            for d in self.held_out_days()
        ]
        base = DriftScale()
        drift = DriftScale(*(h.sim_drift_scale * getattr(base, k) for k in base.__annotations__))
        simulated = simulate_sessions(specs, channels=h.channels, drift=drift, seed=seed)
        for spec, session in zip(specs, simulated, strict=True):
            split = HELD_IN if spec.day in held_in else HELD_OUT
            path = session_file(tmp, split, spec.day)
            write_nwb(path, session["spikes"], session["cues"], session["is_eval"], _date(path))
        (tmp / "done").write_text("simulated FALCON-H2-format sessions\n")
        try:
            os.replace(tmp, root)
        except OSError:  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
        return root

    # ---------------------------------------------------------------- setup
    def setup(self, stage: str | None = None) -> None:
        if self.sessions_ready:
            return
        h = self.hparams
        seed = self.seed = run_seed() if h.seed is None else h.seed
        if h.root is not None:
            root = resolve_data_root(
                h.root, "ibci-fewshot", [f"sub-T5-{HELD_IN}/", f"sub-T5-{HELD_OUT}/"], HOW_TO_GET
            )
        else:
            root = self.simulated_root(seed)
        held_in_files, held_out_files = find_sessions(root, HELD_IN), find_sessions(root, HELD_OUT)
        if len(held_in_files) < 2 or not held_out_files:
            raise ConfigError(
                f"{root} needs at least 2 held-in NWB files (*{HELD_IN}*/*.nwb) and one held-out "
                f"(*{HELD_OUT}*/*.nwb); found {len(held_in_files)} and {len(held_out_files)}. "
                + HOW_TO_GET
            )
        if len(held_in_files) - h.n_val_sessions - h.meta_sessions < 1:
            raise ConfigError(
                f"{len(held_in_files)} held-in sessions leave none for stage 1 after "
                f"n_val_sessions={h.n_val_sessions} and meta_sessions={h.meta_sessions}"
            )
        raw_in = [read_session(p, h.channels) for p in held_in_files]
        raw_out = [read_session(p, h.channels) for p in held_out_files]
        first = raw_in[0]["date"]
        train_raw = raw_in[: -h.n_val_sessions]
        stacked = np.concatenate([np.concatenate(r["spikes"]) for r in train_raw]).astype(float)
        self.channel_mean = stacked.mean(0)
        self.channel_std = stacked.std(0) + 1e-3  # silent channels stay finite
        self.train_sessions = [self._session(r, first, i) for i, r in enumerate(train_raw)]
        self.val_sessions = [self._session(r, first) for r in raw_in[-h.n_val_sessions :]]
        self.test_sessions = [self._session(r, first) for r in raw_out]
        self.lexicon_words = [w for r in train_raw for c in r["cues"] for w in _words(c)]
        self.train_indices = [list(range(len(s.x) - h.n_minival)) for s in self.train_sessions]
        short = [
            s.tag
            for s, idx in zip(self.train_sessions, self.train_indices, strict=True)
            if len(idx) < h.n_support + h.n_query
        ]
        if short:
            raise ConfigError(
                f"held-in sessions {short} have fewer than n_support + n_query = "
                f"{h.n_support + h.n_query} training sentences after the minival"
            )
        for session in [*self.val_sessions, *self.test_sessions]:
            session.calibration_indices(h.n_calibration)  # raises for 0 or too few
        self.sessions_ready = True

    def _session(self, raw: dict, first, index: int = -1) -> Session:
        x = [
            torch.from_numpy(((s - self.channel_mean) / self.channel_std).astype(np.float32))
            for s in raw["spikes"]
        ]
        return Session(
            tag=raw["tag"],
            day=(raw["date"] - first).days,
            x=x,
            labels=[encode_text(c) for c in raw["cues"]],
            cues=raw["cues"],
            is_eval=raw["is_eval"],
            index=index,
            counts=raw["spikes"],
        )

    @property
    def val_session(self) -> Session:
        """The latest validation session."""
        return self.val_sessions[-1]

    def stage_pools(self) -> tuple[list[int], list[int]]:
        """Indices of the training sessions stage 1 and stage 2 draw episodes from."""
        n, m = len(self.train_sessions), self.hparams.meta_sessions
        every = list(range(n))
        return (every[: n - m], every[n - m :]) if m else (every, every)

    @property
    def n_sessions(self) -> int:
        """Training held-in sessions (the session-layer backbone has one layer each)."""
        if self.hparams.root is None:
            return len(self.held_in_days()) - self.hparams.n_val_sessions
        return self._n_real()

    def _n_real(self) -> int:
        self.setup()
        return len(self.train_sessions)

    # ---------------------------------------------------------------- loaders
    def train_dataloader(self) -> DataLoader:
        h = self.hparams
        episodes = EpisodeSet(
            self.train_sessions,
            self.train_indices,
            h.n_support,
            h.n_query,
            h.episodes_per_epoch,
            self.seed,
            *self.stage_pools(),
        )
        consumed = drawn_by_trainer(self, len(episodes), h.episodes_per_batch)
        return DataLoader(
            episodes,
            batch_size=h.episodes_per_batch,
            sampler=EpochShuffle(len(episodes), self.seed, consumed),
            collate_fn=collate_episodes,
            num_workers=h.num_workers,
        )

    def val_dataloader(self) -> DataLoader:
        minival = [
            pad_batch([(s, list(range(len(s.x) - self.hparams.n_minival, len(s.x))))])
            for s in self.train_sessions
        ]
        return DataLoader(minival, batch_size=None, collate_fn=lambda b: b)

    def test_dataloader(self) -> DataLoader:
        """One item per held-out session: its calibration sentences and its scored ones."""
        items = [self.deployment_item(s, self.hparams.n_calibration) for s in self.test_sessions]
        return DataLoader(items, batch_size=None, collate_fn=lambda b: b)

    def deployment_item(self, session: Session, n_calibration: int) -> dict:
        return {
            "tag": session.tag,
            "day": session.day,
            "calibration": pad_batch([(session, session.calibration_indices(n_calibration))]),
            "eval": pad_batch([(session, session.eval_indices())]),
            "cues": [session.cues[i] for i in session.eval_indices()],
        }


def _words(cue: str) -> list[str]:
    import re

    return [w for w in re.split(r"[>~,?]", cue) if w]


def _date(path: Path):
    from ibci_fewshot.nwb import session_date

    return session_date(path)
