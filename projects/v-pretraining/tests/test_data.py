"""The miniature's streams and problems, and the DataModule on real-format fixtures."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch

from papers_cli import ConfigError
from vpretrain import miniature
from vpretrain.data import VPretrainDataModule

SMALL = dict(block_size=16, batch_size=4, n_feedback=32, n_val=16, n_test=16, perplexity_blocks=4)


@pytest.fixture(scope="module")
def tokenizer():
    return miniature.train_tokenizer()


def test_problems_are_seeded_distinct_and_split_by_name():
    a, b = miniature.problems("feedback", 50, 0), miniature.problems("feedback", 50, 0)
    assert a == b and len({p.question for p in a}) == 50
    assert miniature.problems("feedback", 50, 1) != a
    for split in ("feedback", "val", "test"):
        for p in miniature.problems(split, 40, 0):
            assert p.question.split()[0] in miniature.NAMES[split]
            x, y = map(int, re.findall(r"\d+", p.question))
            plus = any(v.split()[0] in p.question for v in miniature.GAINS)
            assert int(p.answer) == (x + y if plus else x - y) >= 0
            assert p.solution == f"#### {p.answer}"
    names = [set(miniature.NAMES[s]) for s in ("narrative", "feedback", "val", "test")]
    assert all(names[i].isdisjoint(names[j]) for i in range(4) for j in range(i + 1, 4))


def test_the_noisy_stream_corrupts_answer_digits_only_and_knows_the_right_ones(tokenizer):
    stream = miniature.build_stream(tokenizer, miniature.prose_split("val"), 0.5, 0.3, seed=0)
    eos = tokenizer.eos_token_id
    docs = np.split(stream.clean_ids, np.flatnonzero(stream.clean_ids == eos) + 1)
    checked = 0
    for doc in docs:
        text = tokenizer.decode(doc[:-1])
        match = re.fullmatch(r"(\w+) has (\d+) \w+\. \w+ (.+?)\. How many .*\n#### (\d+)", text)
        if match:  # every clean worked problem states the right answer
            a, b = int(match[2]), int(re.findall(r"\d+", match[3])[0])
            plus = any(v.split()[0] == match[3].split()[0] for v in miniature.GAINS)
            assert int(match[4]) == (a + b if plus else a - b)
            checked += 1
    assert checked > 100
    assert (stream.ids[~stream.corrupted] == stream.clean_ids[~stream.corrupted]).all()
    assert (stream.ids[stream.corrupted] != stream.clean_ids[stream.corrupted]).all()
    assert stream.result[stream.corrupted].all()
    digits = set(tokenizer.convert_tokens_to_ids(list("0123456789")))
    assert set(stream.ids[stream.result].tolist()) <= digits
    # about 30% of the answers are wrong (an answer is wrong when one of its digits is)
    answers = np.split(
        stream.corrupted[stream.result],
        np.flatnonzero(np.diff(np.flatnonzero(stream.result)) > 1) + 1,
    )
    rate = np.mean([a.any() for a in answers])
    assert 0.22 < rate < 0.38


def test_the_stream_is_seeded_and_packed_across_documents(tokenizer):
    a = miniature.build_stream(tokenizer, miniature.prose_split("val"), 0.3, 0.3, seed=0)
    b = miniature.build_stream(tokenizer, miniature.prose_split("val"), 0.3, 0.3, seed=0)
    c = miniature.build_stream(tokenizer, miniature.prose_split("val"), 0.3, 0.3, seed=1)
    assert np.array_equal(a.ids, b.ids) and not np.array_equal(a.ids, c.ids)
    blocks = a.blocks(17)
    assert blocks["ids"].shape[1] == 17
    eos = tokenizer.eos_token_id
    assert ((blocks["ids"] == eos).sum(1) > 0).any()  # documents end inside blocks
    assert not (blocks["ids"][:, 0] == eos).all()  # and blocks start mid-document


def test_the_clean_stream_is_the_noisy_text_with_every_answer_right():
    noisy = VPretrainDataModule(**SMALL, stream="noisy")
    clean = VPretrainDataModule(**SMALL, stream="clean")
    noisy.setup()
    clean.setup()
    assert torch.equal(noisy.train_set.blocks["clean_ids"], clean.train_set.blocks["ids"])
    assert not clean.train_set.blocks["corrupted"].any()
    assert noisy.train_set.blocks["corrupted"].any()


def test_feedback_mixed_in_adds_exactly_the_feedback_documents():
    mixed = VPretrainDataModule(**SMALL, mix_feedback=True)
    mixed.setup()
    text = mixed.tokenizer.decode(mixed.stream.ids)
    for problem in mixed.feedback.problems[:5]:
        assert f"{problem.question}\n{problem.solution}" in text


def test_problem_tensors_mark_the_answer_and_left_pad_the_prompt():
    data = VPretrainDataModule(**SMALL)
    data.setup()
    p = data.test_problems
    tok = data.tokenizer
    for i in range(3):
        answer = p.input_ids[i][p.answer_mask[i]]
        assert tok.decode(answer) == p.problems[i].solution + tok.eos_token
        prompt = p.prompt_ids[i][p.prompt_mask[i].bool()]
        assert tok.decode(prompt) == p.problems[i].question + "\n"
        assert p.prompt_mask[i, -1] == 1  # left padding: the prompt ends the row


def write_real_fixtures(root, overlap=False):
    corpus = root / "corpus"
    corpus.mkdir()
    lines = [{"text": f"Document {i} talks about rivers and towns. " * 20} for i in range(60)]
    (corpus / "part.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    gsm = root / "gsm8k"
    gsm.mkdir()
    train = [
        {
            "question": f"Tom has {i} apples and eats 1. How many are left?",
            "answer": f"He has {i}-1=<<{i}-1={i - 1}>>{i - 1} left.\n#### {i - 1}",
        }
        for i in range(2, 40)
    ]
    test = [
        {
            "question": f"Sue has {i} pears and buys 2. How many now?",
            "answer": f"{i}+2=<<{i}+2={i + 2}>>{i + 2}\n#### {i + 2:,}",
        }
        for i in range(1000, 1010)
    ]
    if overlap:
        test.append(train[0])
    (gsm / "train.jsonl").write_text("\n".join(json.dumps(x) for x in train))
    (gsm / "test.jsonl").write_text("\n".join(json.dumps(x) for x in test))
    return corpus, gsm


def test_the_real_path_packs_the_corpus_and_splits_gsm8k(tmp_path):
    corpus, gsm = write_real_fixtures(tmp_path)
    data = VPretrainDataModule(
        corpus=str(corpus),
        gsm8k=str(gsm),
        block_size=32,
        batch_size=2,
        n_feedback=16,
        n_val=8,
        n_test=10,
        perplexity_blocks=2,
    )
    data.setup()
    assert len(data.tokenizer) > 150_000  # the real Qwen2.5 BPE, built offline
    assert data.train_set.blocks["ids"].shape[1] == 33
    assert not data.train_set.blocks["corrupted"].any()
    assert (
        len(data.feedback) == 16 and len(data.val_problems) == 8 and len(data.test_problems) == 10
    )
    feedback = {p.question for p in data.feedback.problems}
    assert feedback.isdisjoint(p.question for p in data.val_problems.problems)
    assert data.test_problems.problems[0].answer == "1002"  # "#### 1,002" normalised
    assert "<<" not in data.feedback.problems[0].solution


def test_feedback_that_overlaps_the_evaluation_is_refused(tmp_path):
    corpus, gsm = write_real_fixtures(tmp_path, overlap=True)
    data = VPretrainDataModule(
        corpus=str(corpus),
        gsm8k=str(gsm),
        block_size=32,
        n_feedback=38,
        n_val=1,
        n_test=11,
    )
    with pytest.raises(ConfigError, match="overlap|feedback"):
        data.setup()


def test_the_real_path_needs_both_the_corpus_and_gsm8k(tmp_path):
    with pytest.raises(ConfigError, match="together"):
        VPretrainDataModule(corpus=str(tmp_path))
