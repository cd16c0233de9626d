"""An adapter to the falcon-challenge evaluator's streaming decoder interface [R].

``falcon_challenge.interface.BCIDecoder`` calls ``reset(dataset_tags)`` when a session starts,
``predict(observation)`` once per 20 ms bin (batch size 1 for H2) and ``on_done(dones)`` at the
end of each trial. A GRU + CTC decoder needs the whole trial, so this adapter buffers the bins
and decodes at ``on_done``; ``predict`` returns the last finished transcript. The session tag
selects the input path: held-in tags decode unadapted, a calibrated held-out tag uses its
adapted alignment, and any other tag is an error asking for calibration.

The falcon-challenge package is not a dependency (it pulls a large CUDA stack); this class
duck-types its interface (subclass BCIDecoder yourself where the package is installed).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ibci_fewshot.data import Session, pad_batch
from ibci_fewshot.model import IbciModule


class FewShotFalconDecoder:
    """Streaming wrapper of a trained IbciModule for one session at a time."""

    def __init__(
        self,
        module: IbciModule,
        channel_mean: np.ndarray,
        channel_std: np.ndarray,
        held_in_tags: Sequence[str] = (),
        lexicon: bool = False,
    ) -> None:
        self.module = module.eval()
        self.mean, self.std = channel_mean, channel_std
        self.held_in_tags = set(held_in_tags)
        self.lexicon = lexicon
        self.buffer: list[np.ndarray] = []
        self.tag: str | None = None
        self.last_text = ""
        self.finished: list[str] = []

    def _standardise(self, counts: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(((counts - self.mean) / self.std).astype(np.float32))

    def calibrate(self, tag: str, trials: Sequence[np.ndarray], cues: Sequence[str]) -> None:
        """Adapt to a held-out session from its calibration trials (counts [T, C]) and cues."""
        from ibci_fewshot.core import encode_text

        session = Session(
            tag=tag,
            day=0,
            x=[self._standardise(t) for t in trials],
            labels=[encode_text(c) for c in cues],
            cues=list(cues),
            is_eval=[False] * len(cues),
        )
        self.module.calibrate(tag, pad_batch([(session, list(range(len(cues))))]))

    def reset(self, dataset_tags: Sequence[str | Path] = ()) -> None:
        """Start a session; FALCON passes the file path(s), the stem is the tag."""
        self.tag = Path(dataset_tags[0]).stem if dataset_tags else None
        self.buffer, self.finished = [], []
        self.module.params_for(self.tag or "", self.held_in_tags)  # fail early if uncalibrated

    def predict(self, observation: np.ndarray) -> np.ndarray:
        """One bin of counts ([1, C] or [C]); returns the latest finished transcript."""
        self.buffer.append(np.asarray(observation).reshape(-1))
        return np.array([self.last_text])

    def observe(self, observation: np.ndarray) -> None:
        self.buffer.append(np.asarray(observation).reshape(-1))

    def on_done(self, dones: np.ndarray) -> None:
        """At a trial's end: decode the buffered bins and clear the buffer."""
        if not bool(np.asarray(dones).reshape(-1)[0]) or not self.buffer:
            return
        x = self._standardise(np.stack(self.buffer))[None]
        batch = {"x": x, "lengths": torch.tensor([x.shape[1]])}
        phi = self.module.params_for(self.tag or "", self.held_in_tags)
        self.last_text = self.module.transcribe(batch, phi, lexicon=self.lexicon)[0]
        self.finished.append(self.last_text)
        self.buffer = []
