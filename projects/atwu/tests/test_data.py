import datetime as dt
import json

import faker.providers.date_time as faker_dates
import pytest
import torch
from faker import Faker

from atwu.data import (
    BIRTH_DATES,
    PROMPT,
    TOKEN_CLASSES,
    DataFormatError,
    UnlearningDataModule,
    _birth_date,
    corpus_texts,
    encode_qa,
    generate_tofu_mini,
    load_tofu,
    prompt_ids,
    set_prompt_format,
    train_tokenizer,
)
from atwu.rwku import load_rwku_target
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
    # fine-tuning sees every fact author_repeats (3) times; real TOFU has no generic corpus
    assert len(data.forget_set) == 2 and len(data.finetune_set) == 3 * (2 + 6 + 3)
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


def test_rwku_loader_reads_a_bare_target_folder(tmp_path):
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
    probes = load_rwku_target(str(tmp_path), "Stephen_King").probes
    assert set(probes) == {"forget_level1", "forget_level2", "forget_level3", "neighbor_level1"}
    assert probes["forget_level3"][0].answer == "Carrie"
    assert probes["forget_level1"][0].subject == "Stephen King"
    assert probes["neighbor_level1"][0].question.endswith("Question: Who wrote Dracula?\n")
    with pytest.raises(DatasetNotFoundError, match="Stephen_King"):
        load_rwku_target(str(tmp_path), "Someone_Else")


def small_world(seed: int = 0, authors: int = 8, forget: int = 2, collateral: int = 2):
    return generate_tofu_mini(authors, forget, collateral, num_generic=40, seed=seed)


def test_generator_is_seeded_and_splits_authors():
    a, b = small_world(seed=1), small_world(seed=1)
    assert a.forget == b.forget and a.retain == b.retain and a.generic == b.generic
    assert small_world(seed=2).forget != a.forget
    assert len(a.forget) == 2 * 8 and len(a.collateral) == 2 * 8 and len(a.retain) == 4 * 8
    groups = [{it.subject for it in split} for split in (a.forget, a.collateral, a.retain)]
    assert not (groups[0] & groups[1] or groups[0] & groups[2] or groups[1] & groups[2])
    # the generic corpus is about one-off people: no author appears in it
    names = set().union(*groups)
    assert not any(name in it.answer for it in a.generic + a.generic_eval for name in names)
    assert len({it.question.split(" ")[0] for it in a.generic}) > 3  # several phrasings
    for item in a.forget + a.retain:
        start, end = item.answer_spans[0]
        value = item.answer[start:end]
        assert value in item.paraphrased_answer
        assert all(value not in p for p in item.perturbed_answers)


def test_each_collateral_author_shares_three_values_with_a_forget_author():
    data = small_world(authors=10, forget=3, collateral=3)

    def values(items, subject):
        return {it.answer[slice(*it.answer_spans[0])] for it in items if it.subject == subject}

    forget_authors = list(dict.fromkeys(it.subject for it in data.forget))
    for k, author in enumerate(dict.fromkeys(it.subject for it in data.collateral)):
        shared = values(data.collateral, author) & values(data.forget, forget_authors[k % 3])
        assert len(shared) >= 3


def test_token_classes_mark_value_name_template_and_eos():
    data = small_world()
    tokenizer = train_tokenizer(corpus_texts(data), 400)
    for item in data.forget[:8]:
        encoded = encode_qa(
            tokenizer, item.question, item.answer, item.answer_spans, 128, item.name_spans
        )
        by_class = {
            c: [t for t, k in zip(encoded["input_ids"], encoded["token_class"], strict=True)
                if k == c]
            for c in (TOKEN_CLASSES["name"], TOKEN_CLASSES["value"], TOKEN_CLASSES["eos"])
        }  # fmt: skip
        assert tokenizer.decode(by_class[TOKEN_CLASSES["name"]]).strip() == item.subject
        assert by_class[TOKEN_CLASSES["eos"]] == [tokenizer.eos_token_id]
        assert item.answer[slice(*item.answer_spans[0])] in tokenizer.decode(
            by_class[TOKEN_CLASSES["value"]]
        )


def test_relevance_marks_exactly_the_value_tokens():
    data = small_world()
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
        data = UnlearningDataModule(
            num_authors=6, num_forget_authors=1, num_collateral_authors=1, num_generic=40,
            vocab_size=300, seed=3,
        )  # fmt: skip
        data.setup()
        return next(iter(data.train_dataloader()))[0]

    one, two = first_batch(), first_batch()
    for part in ("pretrain", "finetune", "forget", "retain"):
        torch.testing.assert_close(one[part]["input_ids"], two[part]["input_ids"])


def test_prompt_formats_build_the_same_prompt_everywhere():
    """plain (TOFU-mini), plain_bos (BOS then the plain prompt) and chat (the tokenizer's own
    template); a tokenizer without a BOS token or a chat template is a clear error."""
    data = small_world()
    tokenizer = train_tokenizer(corpus_texts(data), 400)
    question = data.forget[0].question
    plain = prompt_ids(tokenizer, question)
    assert tokenizer.decode(plain) == PROMPT.format(question=question)
    with pytest.raises(DataFormatError, match="chat template"):
        set_prompt_format(tokenizer, "chat")
    with pytest.raises(DataFormatError, match="BOS"):
        set_prompt_format(tokenizer, "plain_bos")
    tokenizer.bos_token = "<eos>"  # any special token stands in for a checkpoint's BOS
    set_prompt_format(tokenizer, "plain_bos")
    assert prompt_ids(tokenizer, question) == [tokenizer.bos_token_id, *plain]
    tokenizer.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %} Answer:"
    set_prompt_format(tokenizer, "chat")
    chat = prompt_ids(tokenizer, question)
    assert tokenizer.decode(chat) == f"[{question}] Answer:"
    encoded = encode_qa(tokenizer, question, data.forget[0].answer)
    assert encoded["input_ids"][: len(chat)] == chat and encoded["labels"][len(chat)] != -100


def test_generated_birth_dates_do_not_depend_on_the_day_the_data_is_made(monkeypatch):
    """Faker's date_of_birth counts ages from today, so TOFU-mini changed at midnight (an oracle
    test flipped on 2026-12-02); the fixed range gives the same draws on any day."""

    def draws():
        fake = Faker()
        fake.seed_instance(3)
        return [_birth_date(fake) for _ in range(50)]

    today = draws()

    class NextYear(dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(2027, 6, 1)

    monkeypatch.setattr(faker_dates, "datetime", NextYear)
    assert draws() == today
    assert all(BIRTH_DATES[0] < d <= BIRTH_DATES[1] for d in today)
