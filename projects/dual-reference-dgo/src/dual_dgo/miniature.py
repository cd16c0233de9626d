"""The embedded miniature: a visual digit-sum task and two scripted behaviour policies.

A prompt is a 36x36 image, a 3x3 grid of 12x12 cells; the first k cells (reading order; k drawn
with P(k) proportional to 1/k, so easy prompts are common) hold a
digit drawn from a fixed 5x3 glyph font (scaled x2, random brightness, pixel noise), the rest are
empty. The question asks for the sum of the digits mod 10; the difficulty is k (1..k_max), visible
as the number of filled cells. The glyphs are synthetic, not MNIST: a tiny VLM trained for a
minute on 2 CPU cores has to be able to read them.

Behaviour policies (scripted, with known accuracies and lengths, so the positive control can use
the exact partition functions of Eq. 3 in core.py):

- fast ``mu_F``: ``<fast> A: d``, correct with probability p_F(k) = clip(fast_intercept -
  fast_slope k, 0.02, 0.98), else a uniformly drawn wrong digit;
- slow ``mu_S``: ``<think> s1 s2 ... sk </think> A: d`` (the running sum mod 10 after each
  cell; one token per cell, so step i reads cell i at a fixed offset), correct with
  probability p_S(k) = 1 - slow_error k; a wrong trace has one
  slipped running sum at a uniformly drawn step, carried to the answer.

Sample counts per prompt (``TaskConfig.counts``) follow one of two schedules:

- ``counts_by="difficulty"``: n_F(k) falls linearly from ``n_fast`` at k = 1 to
  ``n_fast_hard`` at k = k_max and n_S(k) rises from ``n_slow`` to ``n_slow_hard`` (rounded half
  up), as when a data pipeline spends more reasoning samples on hard inputs (the record at
  c731642; these counts point the way good routing does);
- ``counts_by="source"`` (the registered design since issue 49's second round): each prompt
  comes from one of two data sources, drawn independently of the difficulty (P(source b) =
  ``source_share``) and visible as a tag in the question (``src1 sum ?`` / ``src2 sum ?``);
  source a was collected with ``n_fast`` fast and ``n_slow`` slow samples per prompt, source b
  with ``n_fast_b`` and ``n_slow_b``. Imitating the counts then routes by the tag, which says
  nothing about whether the fast answer is right; only an objective that divides the counts out
  can route by the reward.

Why it matters: single-reference DGO pools the samples, so its weights
equal Eq. 7's with the prior replaced by the sample share n_m / (n_F + n_S); its mode logit is
the method's shifted by log(n_F/n_S) - log(alpha_F/alpha_S). With constant counts that shift is
one number for every prompt (log 3 for 2 fast and 6 slow), which a single scalar (a prior, a
logit bias) undoes; with counts that vary by prompt it is not.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

FONT = {  # 5 rows x 3 columns
    "0": ["###", "#.#", "#.#", "#.#", "###"],
    "1": [".#.", "##.", ".#.", ".#.", "###"],
    "2": ["###", "..#", "###", "#..", "###"],
    "3": ["###", "..#", ".##", "..#", "###"],
    "4": ["#.#", "#.#", "###", "..#", "..#"],
    "5": ["###", "#..", "###", "..#", "###"],
    "6": ["###", "#..", "###", "#.#", "###"],
    "7": ["###", "..#", ".#.", ".#.", ".#."],
    "8": ["###", "#.#", "###", "#.#", "###"],
    "9": ["###", "#.#", "###", "..#", "###"],
}
GLYPHS = {
    d: np.array([[c == "#" for c in row] for row in rows], np.float32) for d, rows in FONT.items()
}
CELL, GRID = 12, 3
IMAGE_SIZE = CELL * GRID
QUESTION = "sum ?"
SOURCE_TAGS = ("src1", "src2")  # the question's source tag under counts_by="source"
MODE_TOKENS = {"fast": "<fast>", "slow": "<think>"}
END_THINK = "</think>"
ANSWER_TAG = "A:"


@dataclass(frozen=True)
class TaskConfig:
    """What the generator depends on (hashed into the cache key)."""

    k_max: int = 8
    fast_intercept: float = 1.6
    fast_slope: float = 0.6
    slow_error: float = 0.01
    noise: float = 0.1
    n_fast: int = 4  # fast samples per prompt at k = 1 ...
    n_slow: int = 2  # ... and slow ones
    n_fast_hard: int = 1  # at k = k_max (linear in between, rounded half up)
    n_slow_hard: int = 8
    counts_by: str = "difficulty"  # or "source": counts set by a visible source tag
    n_fast_b: int = 1  # source b's counts (counts_by="source"; source a: n_fast, n_slow)
    n_slow_b: int = 8
    source_share: float = 0.5  # P(source b), drawn independently of the difficulty
    length_cost: float = 0.2  # lambda in r = 1[correct] - lambda len / len_max
    difficulty: str = "harmonic"  # P(k) proportional to 1/k (easy prompts common) or "uniform"

    def fast_accuracy(self, k: int) -> float:
        return float(np.clip(self.fast_intercept - self.fast_slope * k, 0.02, 0.98))

    def slow_accuracy(self, k: int) -> float:
        return float(np.clip(1.0 - self.slow_error * k, 0.05, 1.0))

    def counts(self, k: int, source: int | None = None) -> tuple[int, int]:
        """(n_F, n_S) for a prompt of difficulty k from data source ``source`` (0 = a, 1 = b).

        ``counts_by="source"``: (n_fast, n_slow) for source a, (n_fast_b, n_slow_b) for source
        b, whatever k. ``counts_by="difficulty"``: each count linear in k between its value at
        k = 1 and at k = k_max, rounded half up (equal ends: the same count for every prompt);
        the source plays no part."""
        if self.counts_by == "source":
            if source not in (0, 1):
                raise ValueError(f"counts_by='source' needs source 0 or 1, got {source!r}")
            return (self.n_fast, self.n_slow) if source == 0 else (self.n_fast_b, self.n_slow_b)
        if self.counts_by != "difficulty":
            raise ValueError(f"counts_by must be 'difficulty' or 'source', got {self.counts_by!r}")
        share = 0.0 if self.k_max == 1 else (k - 1) / (self.k_max - 1)

        def between(easy: int, hard: int) -> int:
            return int(np.floor(easy + (hard - easy) * share + 0.5))

        return between(self.n_fast, self.n_fast_hard), between(self.n_slow, self.n_slow_hard)

    def difficulty_probabilities(self) -> np.ndarray:
        if self.difficulty not in ("harmonic", "uniform"):
            raise ValueError(f"difficulty must be 'harmonic' or 'uniform', got {self.difficulty!r}")
        weights = (
            1.0 / np.arange(1, self.k_max + 1)
            if self.difficulty == "harmonic"
            else np.ones(self.k_max)
        )
        return weights / weights.sum()

    @property
    def max_length(self) -> int:
        return slow_length(self.k_max)

    def as_dict(self) -> dict:
        return asdict(self)


def fast_length() -> int:
    """Tokens of a fast response: <fast> A: d </s>."""
    return 4


def slow_length(k: int) -> int:
    """Tokens of a slow response: <think>, k running sums, </think> A: d </s>."""
    return k + 5


def reward(correct: bool | np.ndarray, length: int | np.ndarray, task: TaskConfig):
    """r = 1[correct] - lambda len / len_max (the verifier plus the length cost)."""
    return np.asarray(correct, np.float64) - task.length_cost * np.asarray(length) / task.max_length


def render(digits: list[int], rng: np.random.Generator, noise: float) -> np.ndarray:
    """The prompt image [36, 36] in [0, 1]: glyphs in the first len(digits) cells."""
    image = np.zeros((IMAGE_SIZE, IMAGE_SIZE), np.float32)
    for cell, digit in enumerate(digits):
        row, col = divmod(cell, GRID)
        glyph = np.kron(GLYPHS[str(digit)], np.ones((2, 2), np.float32))  # [10, 6]
        top, left = row * CELL + 1, col * CELL + 3
        image[top : top + 10, left : left + 6] = glyph * rng.uniform(0.7, 1.0)
    image += noise * rng.standard_normal(image.shape).astype(np.float32)
    return np.clip(image, 0.0, 1.0)


def fast_response(
    digits: list[int], rng: np.random.Generator, task: TaskConfig
) -> tuple[str, bool]:
    answer = sum(digits) % 10
    correct = rng.random() < task.fast_accuracy(len(digits))
    if not correct:
        answer = int(rng.choice([d for d in range(10) if d != answer]))
    return f"{MODE_TOKENS['fast']} {ANSWER_TAG} {answer}", bool(correct)


def slow_response(
    digits: list[int], rng: np.random.Generator, task: TaskConfig
) -> tuple[str, bool]:
    correct = rng.random() < task.slow_accuracy(len(digits))
    slip = -1 if correct else int(rng.integers(len(digits)))
    steps, running = [], 0
    for step, digit in enumerate(digits):
        running = (running + digit) % 10
        if step == slip:
            running = int(rng.choice([d for d in range(10) if d != running]))
        steps.append(str(running))
    body = " ".join(steps)
    return f"{MODE_TOKENS['slow']} {body} {END_THINK} {ANSWER_TAG} {running}", bool(correct)


def generate_split(n: int, seed: int, task: TaskConfig) -> list[dict]:
    """n prompts in the offline file's layout (formats.py), images as arrays.

    Each prompt of difficulty k (and source s under ``counts_by="source"``, drawn from its own
    generator seeded by (seed, index, 1), shown as the question's tag) gets task.counts(k, s) =
    (n_F, n_S) responses of mu_F and mu_S, scored by the verifier (exact answer match) and the
    length cost. Prompts and images depend on the seed only; each prompt's responses on (seed,
    index), so changing the sample counts keeps the prompts (the count-swap check compares the
    same prompts).
    """
    rng = np.random.default_rng(seed)
    records = []
    for index in range(n):
        k = int(rng.choice(np.arange(1, task.k_max + 1), p=task.difficulty_probabilities()))
        digits = [int(d) for d in rng.integers(0, 10, size=k)]
        image = render(digits, rng, task.noise)
        draws = np.random.default_rng([seed, index])
        source, question = None, QUESTION
        if task.counts_by == "source":  # its own stream: the prompts and images stay the same
            source = int(np.random.default_rng([seed, index, 1]).random() < task.source_share)
            question = f"{SOURCE_TAGS[source]} {QUESTION}"
        responses = []
        n_fast, n_slow = task.counts(k, source)
        for mode, count, policy, length in [
            ("fast", n_fast, fast_response, fast_length()),
            ("slow", n_slow, slow_response, slow_length(k)),
        ]:
            for _ in range(count):
                text, correct = policy(digits, draws, task)
                responses.append(
                    {
                        "mode": mode,
                        "behavior": f"scripted_{mode}",
                        "text": text,
                        "reward": float(reward(correct, length, task)),
                    }
                )
        records.append(
            {
                "id": f"{seed}-{index}",
                "image": image,
                "question": question,
                "answer": str(sum(digits) % 10),
                "difficulty": k,
                "digits": digits,
                "source": source,
                "responses": responses,
            }
        )
    return records
