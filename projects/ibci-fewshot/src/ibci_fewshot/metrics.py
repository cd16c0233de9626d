"""FALCON H2's metrics and the lexicon decoder (a cheap language-model stand-in).

FALCON scores a session by corpus-level edit distance: CER = sum_i ED(pred_i, ref_i) /
sum_i |ref_i| over characters; WER the same over words, where '>' is a space, '#' is dropped and
'~ , ! ?' are split off as words of their own (the evaluator's ``_convert``). Held-out sessions
are averaged with equal weight.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance (insertions, deletions, substitutions cost 1)."""
    previous = list(range(len(b) + 1))
    for i, item in enumerate(a, start=1):
        current = [i]
        for j, other in enumerate(b, start=1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (item != other))
            )
        previous = current
    return previous[-1]


def falcon_words(text: str) -> list[str]:
    """FALCON's word split: '>' -> ' ', '#' dropped, '~ , ! ?' split off, then split on ' '."""
    text = text.replace(">", " ").replace("#", "")
    text = re.sub(r"([~,!?])", r" \1", text)
    return text.split(" ")


def plain_text(text: str) -> str:
    """The same words as plain text (for torchmetrics): words joined by single spaces."""
    return " ".join(w for w in falcon_words(text) if w)


def sentence_errors(predictions: Sequence[str], references: Sequence[str]):
    """Per sentence: (char edits, ref chars, word edits, ref words) as integer arrays."""
    rows = [
        (
            edit_distance(p, r),
            len(r),
            edit_distance(falcon_words(p), falcon_words(r)),
            len(falcon_words(r)),
        )
        for p, r in zip(predictions, references, strict=True)
    ]
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def session_rates(predictions: Sequence[str], references: Sequence[str]) -> tuple[float, float]:
    """FALCON's (CER, WER) of one session."""
    errors = sentence_errors(predictions, references)
    return errors[:, 0].sum() / errors[:, 1].sum(), errors[:, 2].sum() / errors[:, 3].sum()


def per_item_rates(sessions: Sequence[tuple[Sequence[str], Sequence[str]]]):
    """(CER items, WER items): one value per evaluation sentence, scaled so that their mean is
    the average over sessions of the sessions' corpus-level rates (FALCON's number). A sentence of
    session s with e edits contributes e * N / (S * R_s) (N sentences, S sessions, R_s the
    session's reference length), so paired bootstraps resample sentences."""
    blocks = [sentence_errors(p, r) for p, r in sessions]
    n_items, n_sessions = sum(len(b) for b in blocks), len(blocks)
    cer = [b[:, 0] * n_items / (n_sessions * b[:, 1].sum()) for b in blocks]
    wer = [b[:, 2] * n_items / (n_sessions * b[:, 3].sum()) for b in blocks]
    return np.concatenate(cer).astype(float), np.concatenate(wer).astype(float)


class Lexicon:
    """Snap each decoded word to the nearest vocabulary word by edit distance (ties: the more
    frequent, i.e. earlier, word). Punctuation tokens pass through. [G] a language-model stand-in;
    whether the paper's 7.41% used a language model is unknown."""

    def __init__(self, words: Sequence[str]) -> None:
        self.words = list(dict.fromkeys(words))

    def snap_word(self, word: str) -> str:
        if not word or word in self.words:
            return word
        return min(self.words, key=lambda w: edit_distance(word, w))

    def __call__(self, text: str) -> str:
        """A decoded sentence in FALCON's characters -> the same with every word snapped."""
        parts = re.split(r"([>~,?])", text)
        return "".join(p if p in ">~,?" else self.snap_word(p) for p in parts)
