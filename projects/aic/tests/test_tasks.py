import re
import typing
from pathlib import Path

import numpy as np
import pytest
import yaml

from aic.data import AicDataModule, generate
from aic.tasks import (
    CHARS,
    STDLIB_FILES,
    TASKS,
    Episode,
    TaskName,
    encode_text,
    get_task,
    longest_program,
    make_env,
    read_text_corpus,
    stdlib_corpus,
    synthetic_programs,
    text_windows,
)
from papers_cli import ConfigError, UserError
from papers_data import DatasetNotFoundError

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
ENV_TASKS = [t for t in TASKS.values() if t.domain != "language"]


def test_there_are_twelve_tasks_in_three_domains():
    assert len(TASKS) == 12
    assert {t.domain for t in TASKS.values()} == {"grid", "robotics", "language"}


@pytest.mark.parametrize("task", ENV_TASKS, ids=lambda t: t.name)
def test_every_environment_builds_offline(task):
    env = make_env(task.env_id, **task.make_kwargs)
    env.reset(seed=0)
    env.close()


def test_every_task_in_the_configs_is_registered():
    claim = yaml.safe_load((CONFIGS / "claim.yaml").read_text())["settings"]
    get_task(claim["task"], claim.get("env_id"))
    for config in ("default.yaml", "paper.yaml"):
        data = yaml.safe_load((CONFIGS / config).read_text()).get("data", {})
        get_task(data.get("task", "lava-crossing"), data.get("env_id"))


def run_expert(task, seed):
    episode = Episode(task, seed)
    while not episode.done:
        episode.step(episode.expert_action())
    episode.close()
    return episode


@pytest.mark.parametrize("task", ENV_TASKS, ids=lambda t: t.name)
def test_oracle_experts_solve_their_tasks(task):
    for seed in range(2):
        episode = run_expert(task, seed)
        if task.domain == "grid" or task.env_id.startswith("PointMaze"):
            assert episode.success
        elif "Pendulum" in task.env_id:
            assert episode.length == task.max_eval_steps  # balanced for the whole episode
        else:  # Reacher: far better than doing nothing (about -43 for random actions)
            assert episode.total_return > -12 and episode.difficulty() < 0.1


def test_grid_q_values_rank_the_expert_action_first():
    episode = Episode(TASKS["lava-crossing"], 0)
    for _ in range(5):
        q = episode.q_values()  # Q* / V*: the optimal action keeps all of the return
        assert q.max() == pytest.approx(1.0) and q.min() >= 0
        if q.min() > 0:  # a non-optimal turn costs at least two steps: gamma ** 2
            assert q.min() <= 0.95**2 + 1e-6
        episode.step(episode.expert_action())
    episode.close()


def test_synthetic_programs_answers_follow_the_chain():
    text, labels = synthetic_programs(4000, seed=3)
    assert len(text) == len(labels) == 4000
    answers = [m for m in re.finditer(r"([a-h=0-9;]+)\?([a-h])=(\d)", text)]
    assert answers
    for match in answers:
        defs = dict(s.split("=") for s in match.group(1).split(";") if "=" in s)
        value = match.group(2)
        depth = 0
        while not value.isdigit():
            value, depth = defs[value], depth + 1
        assert value == match.group(3)
        assert labels[match.start(3)] == depth
    noise = [i for i, c in enumerate(text) if labels[i] == -1]
    assert noise and all(text[i].isdigit() for i in noise)


def test_stdlib_corpus_is_pinned_and_present():
    corpus = stdlib_corpus()
    assert len(STDLIB_FILES) == 10 and len(corpus) > 50_000
    assert "def dedent" in corpus  # textwrap.py


def test_text_corpus_path_reads_real_files_and_missing_is_clear(tmp_path):
    (tmp_path / "a.txt").write_text("hello world\n" * 50)
    assert read_text_corpus(str(tmp_path)).startswith("hello")
    arrays = generate("stdlib-lm", 20, 0, 8, text_path=str(tmp_path))
    assert arrays["obs"].shape == (20, 8)
    with pytest.raises(DatasetNotFoundError, match="txt"):
        read_text_corpus(str(tmp_path / "missing"))
    with pytest.raises(DatasetNotFoundError):
        AicDataModule(task="stdlib-lm", text_path=str(tmp_path / "missing")).setup()


def test_unknown_task_and_env_id_are_user_errors():
    with pytest.raises(UserError, match="Unknown task"):
        get_task("sokoban")
    with pytest.raises(UserError, match="MiniGrid-NoSuchThing-v0"):
        get_task("lava-crossing", "MiniGrid-NoSuchThing-v0")
    assert get_task("lava-crossing", "MiniGrid-LavaCrossingS11N5-v0").env_id.endswith("S11N5-v0")
    with pytest.raises(ConfigError, match="reads text"):
        get_task("program-lm", "MiniGrid-Empty-6x6-v0")


def test_the_task_choices_are_the_registered_tasks():
    assert set(typing.get_args(TaskName)) == set(TASKS)


@pytest.mark.parametrize("name", ["lava-crossing", "reacher", "program-lm"])
def test_generated_states_are_seeded(name):
    a, b = generate(name, 50, 1, 16), generate(name, 50, 1, 16)
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])
    assert not np.array_equal(a["obs"], generate(name, 50, 2, 16)["obs"])


def test_every_program_fits_the_default_context():
    """An answer's whole program (back to the separator before it) lies inside a 32-character
    window, so its depth label describes a question the window can answer."""
    context = 32
    assert longest_program() <= context
    text, labels = synthetic_programs(20_000, seed=5)
    windows = text_windows(encode_text(text), context, 3000, seed=1, labels=labels)
    answers = np.flatnonzero(windows["difficulty"] > 0)
    assert len(answers) > 100 and set(windows["difficulty"][answers]) == {1, 2, 3, 4}
    for i in answers:
        window = "".join(CHARS[t] for t in windows["obs"][i])
        query = window.rindex("?")
        assert "|" in window[:query] or "#" in window[:query], window
        start = max(window[:query].rfind("|"), window[:query].rfind("#")) + 1
        program = window[start:query]
        assert program.count(";") == windows["difficulty"][i] + 1, window


def test_a_context_too_short_for_the_programs_is_refused():
    with pytest.raises(ConfigError, match="longest synthetic program"):
        AicDataModule(task="program-lm", context=16)
