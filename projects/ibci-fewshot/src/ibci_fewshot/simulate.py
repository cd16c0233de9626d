"""A SIMULATION of attempted-handwriting iBCI recordings with drift over days [G: the whole
generative model is this project's design; no real neural data is embedded].

- Text: sentences of 2-3 words from an embedded vocabulary, FALCON's characters ('>' between
  words, sometimes ',' after the first word, '~' or '?' at the end).
- Kinematics: each of the 31 characters has a fixed latent trajectory z(t) in R^L (a smooth pen
  velocity-like curve, seeded per character), 4-6 bins long; characters are separated by a 1-bin
  pen lift; each sentence is time-warped by a random speed factor.
- Encoding in session d: lambda_t = M_d exp(b_d + g_d * (C_d z_t)) (Hz), counts ~ Poisson(0.02 s
  x lambda_t) on 192 channels.
- Drift over days (random walks with variance proportional to the days elapsed): per-channel log
  gains g_d and baselines b_d, a rotation of the tuning in latent space C_d = C_0 expm(S_d) with
  S_d skew-symmetric, channel turnover (channels given new random tuning), and a mixing of
  neighbouring channels M_d = I + m_d N (N: the two neighbours).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.linalg import expm

from ibci_fewshot.core import CHARSET

BIN_S = 0.02
WORDS = [
    "the",
    "and",
    "you",
    "that",
    "was",
    "for",
    "are",
    "with",
    "his",
    "they",
    "this",
    "have",
    "from",
    "one",
    "had",
    "word",
    "but",
    "not",
    "what",
    "all",
    "were",
    "when",
    "your",
    "can",
    "said",
    "there",
    "use",
    "each",
    "which",
    "she",
    "how",
    "their",
    "will",
    "other",
    "about",
    "out",
    "many",
    "then",
    "them",
    "these",
    "some",
    "her",
    "would",
    "make",
    "like",
    "him",
    "into",
    "time",
    "has",
    "look",
    "two",
    "more",
    "write",
    "see",
    "number",
    "way",
    "could",
    "people",
    "than",
    "first",
    "water",
    "been",
    "call",
    "who",
    "oil",
    "its",
    "now",
    "find",
    "long",
    "down",
    "day",
    "did",
    "get",
    "come",
    "made",
    "may",
    "part",
    "over",
    "new",
    "sound",
    "take",
    "only",
    "little",
    "work",
    "know",
    "place",
    "year",
    "live",
    "me",
    "back",
    "give",
    "most",
    "very",
    "after",
    "thing",
    "our",
    "just",
    "name",
    "good",
    "man",
    "think",
    "say",
    "great",
    "where",
    "help",
    "through",
    "much",
    "before",
    "line",
    "right",
    "too",
    "mean",
    "old",
    "any",
    "same",
    "tell",
    "boy",
    "follow",
    "came",
    "want",
    "show",
    "also",
    "around",
    "form",
    "three",
    "small",
    "set",
    "put",
    "end",
    "does",
    "another",
    "well",
    "large",
    "must",
    "big",
    "even",
    "such",
    "because",
    "turn",
    "here",
    "why",
    "ask",
    "went",
    "men",
    "read",
    "need",
    "land",
    "different",
    "home",
    "us",
    "move",
    "try",
    "kind",
    "hand",
    "picture",
    "again",
    "change",
    "off",
    "play",
    "spell",
    "air",
    "away",
    "animal",
    "house",
    "point",
    "page",
    "letter",
    "mother",
    "answer",
    "found",
    "study",
    "still",
    "learn",
    "don't",
    "it's",
    "i'm",
    "can't",
    "we'll",
]


@dataclass(frozen=True)
class SessionSpec:
    """One recording session: its day, how many sentences, which are evaluation sentences."""

    day: int
    n_sentences: int
    n_eval: int = 0


def make_sentence(rng: np.random.Generator) -> str:
    words = list(rng.choice(WORDS, size=int(rng.integers(2, 4))))
    text = words[0] + ("," if rng.random() < 0.1 else "") + ">" + ">".join(words[1:])
    end = rng.random()
    return text + ("~" if end < 0.5 else "?" if end < 0.65 else "")


def character_templates(latent: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A fixed smooth latent trajectory [D_c, L] per character (sum of 3 random harmonics)."""
    templates = {}
    for char in CHARSET:
        duration = int(rng.integers(4, 7))
        t = np.linspace(0, 1, duration)[:, None]
        curve = np.zeros((duration, latent))
        for harmonic in range(1, 4):
            amplitude = rng.normal(size=latent) / harmonic
            phase = rng.uniform(0, 2 * np.pi, size=latent)
            curve += amplitude * np.sin(np.pi * harmonic * t + phase)
        templates[char] = curve
    return templates


def sentence_latents(text: str, templates, rng: np.random.Generator, latent: int) -> np.ndarray:
    """z_t [T, L] of one sentence: rest, characters with pen lifts, rest; random speed."""
    pieces = [np.zeros((2, latent))]
    for char in text:
        pieces.append(templates[char] + 0.1 * rng.normal(size=templates[char].shape))
        pieces.append(np.zeros((1, latent)))
    pieces.append(np.zeros((2, latent)))
    z = np.concatenate(pieces)
    speed = rng.uniform(0.85, 1.2)
    n_out = max(8, int(round(len(z) / speed)))
    grid = np.linspace(0, len(z) - 1, n_out)
    return np.stack([np.interp(grid, np.arange(len(z)), z[:, k]) for k in range(latent)], 1)


@dataclass(frozen=True)
class DriftScale:
    """Random-walk scales per sqrt(day) of each kind of drift, and turnover per day."""

    log_gain: float = 0.05
    baseline: float = 0.05
    rotation: float = 0.06
    turnover_per_day: float = 0.002
    mixing: float = 0.02


def session_encoders(days, channels: int, latent: int, drift: DriftScale, rng):
    """Per session (sorted days): (C_d [N, L], g_d [N], b_d [N], M_d [N, N]); drift accumulates
    over the days elapsed since the previous session."""
    tuning0 = rng.normal(size=(channels, latent)) * 0.45
    baseline = np.log(rng.uniform(8, 30, size=channels))
    log_gain = np.zeros(channels)
    skew = np.zeros((latent, latent))
    mix = 0.0
    tuning_base = tuning0.copy()
    neighbours = np.roll(np.eye(channels), 1, 1) + np.roll(np.eye(channels), -1, 1)
    encoders, previous = [], days[0]
    for day in days:
        elapsed = np.sqrt(max(day - previous, 0))
        log_gain = log_gain + drift.log_gain * elapsed * rng.normal(size=channels)
        baseline = baseline + drift.baseline * elapsed * rng.normal(size=channels)
        step = drift.rotation * elapsed * rng.normal(size=(latent, latent))
        skew = skew + (step - step.T) / 2
        replaced = rng.random(channels) < drift.turnover_per_day * (day - previous)
        tuning_base[replaced] = rng.normal(size=(int(replaced.sum()), latent)) * 0.45
        mix = mix + drift.mixing * elapsed
        tuning = tuning_base @ expm(skew)
        mixing = np.eye(channels) + mix * neighbours
        mixing = mixing / mixing.sum(1, keepdims=True)
        encoders.append((tuning, np.exp(log_gain), baseline.copy(), mixing))
        previous = day
    return encoders


def simulate_sessions(
    specs: list[SessionSpec],
    channels: int = 192,
    latent: int = 8,
    drift: DriftScale | None = None,
    seed: int = 0,
) -> list[dict]:
    """Sessions (in the order of ``specs``, whose days must increase): dicts with ``day``,
    ``spikes`` (list of int arrays [T_i, channels]), ``cues`` (list of str) and ``is_eval``."""
    days = [s.day for s in specs]
    if sorted(days) != days:
        raise ValueError("session days must increase")
    rng = np.random.default_rng(seed)
    templates = character_templates(latent, rng)
    encoders = session_encoders(days, channels, latent, drift or DriftScale(), rng)
    sessions = []
    for spec, (tuning, gain, baseline, mixing) in zip(specs, encoders, strict=True):
        spikes, cues = [], []
        for _ in range(spec.n_sentences):
            text = make_sentence(rng)
            z = sentence_latents(text, templates, rng, latent)
            rates = np.exp(np.clip(baseline + gain * (z @ tuning.T), -10, 6)) @ mixing.T
            spikes.append(rng.poisson(rates * BIN_S).astype(np.int16))
            cues.append(text)
        is_eval = [i >= spec.n_sentences - spec.n_eval for i in range(spec.n_sentences)]
        sessions.append({"day": spec.day, "spikes": spikes, "cues": cues, "is_eval": is_eval})
    return sessions
