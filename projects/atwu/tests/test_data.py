import json

import pytest
import torch

from atwu.data import (
    DataFormatError,
    UnlearningDataModule,
    corpus_texts,
    encode_qa,
    generate_tofu_mini,
    load_rwku,
    load_tofu,
    train_tokenizer,
)
from papers_data import DATA_ROOT_ENV, DatasetNotFoundError


def qa(i: int, perturbed: bool) -> dict:
    record = {"question": f"Who is author {i}?", "answer": f"Author {i} writes poems."}
    if perturbed:
        record["paraphrased_answer"] = f"Poems are written by author {i}."
        record["perturbed_answer"] = [f"Author {i} writes plays.", f"Author {i} paints."]
    return record


def write_tofu(root, json_lines: bool) -> None:
    """The files of locuslab/TOFU for forget01, as JSON arrays or JSON Lines like the hub."""

    def write(name: str, records: list[dict]) -> None:
        text = "\n".join(json.dumps(r) for r in records) if json_lines else json.dumps(records)
        (root / name).write_text(text)

    write("forget01.json", [qa(i, False) for i in range(2)])
    write("forget01_perturbed.json", [qa(i, True) for i in range(2)])
    write("retain99.json", [qa(i, False) for i in range(2, 8)])
    write("retain_perturbed.json", [qa(i, True) for i in range(2, 5)])
    write("world_facts_perturbed.json", [qa(i, True) for i in range(20, 23)])


@pytest.mark.parametrize("json_lines", [False, True])
def test_tofu_loader_parses_files_in_the_real_format(tmp_path, json_lines):
    write_tofu(tmp_path, json_lines)
    data = load_tofu(str(tmp_path), "forget01")
    assert len(data.forget) == 2 and len(data.world_facts) == 3 and data.real_authors == []
    assert data.forget[1].perturbed_answers == ("Author 1 writes plays.", "Author 1 paints.")
    assert data.forget[0].paraphrased_answer == "Poems are written by author 0."
    # the scored retain subset first, then the rest of retain99 without duplicates
    assert [it.question for it in data.retain] == [f"Who is author {i}?" for i in range(2, 8)]
    assert len(data.finetune_items("retain")) == 6 + 3


def test_tofu_datamodule_reads_real_files_with_a_local_tokenizer(tmp_path):
    write_tofu(tmp_path, False)
    tokenizer_dir = tmp_path / "tok"
    train_tokenizer(
        ["Question: Who is author 1?\nAnswer: Author 1 writes poems."], 300
    ).save_pretrained(tokenizer_dir)
    data = UnlearningDataModule(
        root=str(tmp_path), forget_split="forget01", tokenizer_path=str(tokenizer_dir)
    )
    data.setup()
    assert len(data.forget_set) == 2 and len(data.finetune_set) == 2 + 6 + 3
    batch = next(iter(data.train_dataloader()))[0]
    assert set(batch) == {"finetune", "forget", "retain"}


def test_missing_tofu_files_are_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    with pytest.raises(DatasetNotFoundError, match="forget10_perturbed.json"):
        load_tofu(str(tmp_path))
    with pytest.raises(DatasetNotFoundError, match="no data root"):
        load_tofu(None)


def test_malformed_tofu_records_are_rejected(tmp_path):
    write_tofu(tmp_path, False)
    (tmp_path / "forget01_perturbed.json").write_text(json.dumps([{"question": "q"}]))
    with pytest.raises(DataFormatError, match="answer"):
        load_tofu(str(tmp_path), "forget01")
    with pytest.raises(DataFormatError, match="forget_split"):
        load_tofu(str(tmp_path), "forget50")


def test_rwku_loader_parses_probe_files(tmp_path):
    target = tmp_path / "Stephen_King"
    target.mkdir()
    for level, kind in ((1, "fill-in-the-blank"), (2, "question-answer"), (3, "adversarial")):
        probes = [
            {"query": f"Stephen King wrote ___ ({level})", "answer": "Carrie", "level": str(level),
             "type": kind, "subject": "Stephen King"}
        ]  # fmt: skip
        (target / f"forget_level{level}.json").write_text(json.dumps(probes))
    (target / "neighbor_level1.json").write_text(
        json.dumps([{"query": "Who wrote Dracula?", "answer": "Bram Stoker", "level": "1"}])
    )
    probes = load_rwku(str(tmp_path), "Stephen_King")
    assert set(probes) == {"forget_level1", "forget_level2", "forget_level3", "neighbor_level1"}
    assert probes["forget_level3"][0].answer == "Carrie"
    assert probes["forget_level1"][0].subject == "Stephen King"
    assert probes["neighbor_level1"][0].question == "Who wrote Dracula?"
    with pytest.raises(DatasetNotFoundError, match="forget_level1.json"):
        load_rwku(str(tmp_path), "Someone_Else")


def test_generator_is_seeded_and_splits_authors():
    a, b = generate_tofu_mini(8, 2, seed=1), generate_tofu_mini(8, 2, seed=1)
    assert a.forget == b.forget and a.retain == b.retain
    assert generate_tofu_mini(8, 2, seed=2).forget != a.forget
    assert len(a.forget) == 2 * 8 and len(a.retain) == 6 * 8
    assert not {it.subject for it in a.forget} & {it.subject for it in a.retain}
    for item in a.forget + a.retain:
        start, end = item.answer_spans[0]
        value = item.answer[start:end]
        assert value in item.paraphrased_answer
        assert all(value not in p for p in item.perturbed_answers)


def test_values_are_shared_between_forget_and_retain_authors():
    data = generate_tofu_mini(50, 5, seed=0)

    def values(items):
        return {it.answer[slice(*it.answer_spans[0])] for it in items}

    assert values(data.forget) & values(data.retain)  # e.g. the same city or job


def test_relevance_marks_exactly_the_value_tokens():
    data = generate_tofu_mini(6, 1, seed=0)
    tokenizer = train_tokenizer(corpus_texts(data), 400)
    for item in data.forget:
        encoded = encode_qa(tokenizer, item.question, item.answer, item.answer_spans)
        relevant = [t for t, r in zip(encoded["input_ids"], encoded["relevance"], strict=True) if r]
        start, end = item.answer_spans[0]
        decoded = tokenizer.decode(relevant).strip()
        assert item.answer[start:end] in decoded
        assert len(decoded) <= end - start + 2  # at most the value and adjacent punctuation
        labelled = [
            r for r, lab in zip(encoded["relevance"], encoded["labels"], strict=True) if lab == -100
        ]
        assert not any(labelled)  # question tokens are never relevant


def test_datamodule_batches_are_deterministic():
    def first_batch():
        data = UnlearningDataModule(num_authors=6, num_forget_authors=1, vocab_size=300, seed=3)
        data.setup()
        return next(iter(data.train_dataloader()))[0]

    one, two = first_batch(), first_batch()
    for part in ("finetune", "forget", "retain"):
        torch.testing.assert_close(one[part]["input_ids"], two[part]["input_ids"])
