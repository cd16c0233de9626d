import base64
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from dual_dgo.data import DualDgoDataModule
from dual_dgo.formats import (
    OfflineFormatError,
    convert_cli,
    convert_grouped_dgo,
    extract_answer,
    numeric_match,
    read_offline,
    score_missing,
)
from dual_dgo.miniature import TaskConfig, fast_length, generate_split, slow_length
from dual_dgo.vlm import PromptEncoder, build_mini_processor, build_mini_tokenizer
from papers_data import DATA_ROOT_ENV, DatasetNotFoundError


def test_the_jsonl_reader_parses_every_image_form_and_keeps_missing_rewards(offline_root):
    records = read_offline(offline_root / "train.jsonl")
    assert [r["id"] for r in records] == ["a", "b", "c", "d"]
    assert all(r["image"].size == (28, 28) and r["image"].mode == "RGB" for r in records)
    assert records[2]["difficulty"] is None
    assert (
        records[2]["responses"][0]["reward"] is None and records[0]["responses"][1]["reward"] == 0.8
    )
    assert records[0]["responses"][0]["behavior"] == "instruct"


def test_parquet_with_raw_image_bytes_reads_like_jsonl(offline_root, make_records, tmp_path):
    rows = make_records(offline_root)
    for row in rows:  # parquet stores the bytes themselves
        if "images" in row and isinstance(row["images"][0], dict):
            row["images"] = [{"bytes": base64.b64decode(row["images"][0]["bytes"]), "path": None}]
    rows = [r for r in rows if "images" in r and not isinstance(r["images"][0], str)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "train.parquet")
    records = read_offline(tmp_path / "train.parquet")
    assert len(records) == 1 and records[0]["image"].size == (28, 28)


def test_missing_rewards_are_scored_by_the_verifier_and_the_length_cost(offline_root):
    records = read_offline(offline_root / "train.jsonl")
    score_missing(
        records, "exact", length_cost=0.5, max_length=10, count_tokens=lambda t: len(t.split()) + 1
    )
    fast, slow = records[2]["responses"]
    assert fast["reward"] == pytest.approx(1 - 0.5 * 4 / 10)  # <fast> A: 7 </s>: correct
    assert slow["reward"] == pytest.approx(0 - 0.5 * 7 / 10)  # answers 5, the truth is 7
    assert records[1]["responses"][0]["reward"] == 0.0  # given rewards are kept


@pytest.mark.parametrize(
    ("text", "answer", "expected"),
    [
        ("<think> ... </think> A: 1,234", "1234", True),
        ("A: -7.", "-7", True),
        ("so \\boxed{3,000} done", "3000", True),
        ("A: 12", "13", False),
        ("no answer here", "1", False),
    ],
)
def test_numeric_verifier_handles_separators_negatives_and_boxed(text, answer, expected):
    assert numeric_match(extract_answer(text), answer) is expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda r: r["responses"][0].update(mode="medium"), "mode must be fast or slow"),
        (lambda r: r["responses"][0].update(text="A: 7"), "must start with <fast>"),
        (lambda r: r.pop("images"), "needs at least one image"),
        (lambda r: r.pop("answer"), "missing 'answer'"),
    ],
)
def test_malformed_records_name_the_problem(offline_root, make_records, tmp_path, change, message):
    record = make_records(offline_root)[0]
    change(record)
    path = offline_root / "bad.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(OfflineFormatError, match=message):
        read_offline(path)


def test_grouped_dgo_json_converts_with_completions_or_generated_texts(tmp_path):
    groups = [
        {
            "prompt": "sum ?",
            "completions": ["<think> 3 </think> A: 3", "A: 3"],
            "weights": [1, 2],
            "ground_truth": 3,
            "images": ["x.png"],
        },
        {"prompt": "sum ?", "generated_texts": ["A: 5"], "ground_truth": "5", "image": "y.png"},
    ]
    records = convert_grouped_dgo(groups)
    assert [r["mode"] for r in records[0]["responses"]] == ["slow", "fast"]
    assert records[0]["responses"][1]["text"] == "<fast> A: 3"
    assert records[0]["answer"] == "3" and "weights" not in records[0]
    assert records[1]["image"] == "y.png"
    (tmp_path / "grouped.json").write_text(json.dumps(groups))
    convert_cli([str(tmp_path / "grouped.json"), str(tmp_path / "out.jsonl")])
    lines = (tmp_path / "out.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["responses"][0]["mode"] == "fast"
    with pytest.raises(OfflineFormatError, match="'completions' or 'generated_texts'"):
        convert_grouped_dgo([{"prompt": "p", "ground_truth": 1}])


def test_missing_offline_data_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    data = DualDgoDataModule(root=str(tmp_path / "nowhere"), n_train=4, n_val=4, n_test=4)
    with pytest.raises(DatasetNotFoundError, match="train.jsonl"):
        data.setup()
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "train.jsonl").write_text("")
    data = DualDgoDataModule(root=str(tmp_path / "half"), n_train=4, n_val=4, n_test=4)
    with pytest.raises(DatasetNotFoundError, match="val.jsonl or val.parquet"):
        data.setup()


def test_the_scripted_policies_hit_their_target_accuracy_and_lengths():
    task = TaskConfig(n_fast=4, n_slow=4)
    records = generate_split(3000, seed=5, task=task)
    for k in (1, 3, 6):
        mine = [r for r in records if r["difficulty"] == k]
        for mode, target in (("fast", task.fast_accuracy(k)), ("slow", task.slow_accuracy(k))):
            hits = [
                extract_answer(x["text"]) == r["answer"]
                for r in mine
                for x in r["responses"]
                if x["mode"] == mode
            ]
            se = np.sqrt(target * (1 - target) / len(hits)) + 1e-3
            assert abs(np.mean(hits) - target) < 4 * se, (k, mode)
    tokenizer = build_mini_tokenizer()
    for x in records[0]["responses"]:
        length = fast_length() if x["mode"] == "fast" else slow_length(records[0]["difficulty"])
        assert len(tokenizer(x["text"], add_special_tokens=False)["input_ids"]) + 1 == length


def test_the_generator_is_seeded_and_the_counts_do_not_change_the_prompts():
    a = generate_split(20, seed=1, task=TaskConfig())
    b = generate_split(
        20, seed=1, task=TaskConfig(n_fast=6, n_slow=2, n_fast_hard=6, n_slow_hard=2)
    )
    again = generate_split(20, seed=1, task=TaskConfig())
    assert [r["digits"] for r in a] == [r["digits"] for r in b]
    assert all(np.array_equal(x["image"], y["image"]) for x, y in zip(a, b, strict=True))
    assert a[3]["responses"] == again[3]["responses"]
    assert sum(x["mode"] == "fast" for x in b[0]["responses"]) == 6


def test_the_image_shows_the_digits_in_the_first_cells():
    record = generate_split(1, seed=0, task=TaskConfig(noise=0.0))[0]
    image = record["image"]
    filled = [
        image[r * 12 : (r + 1) * 12, c * 12 : (c + 1) * 12].max() > 0
        for r in range(3)
        for c in range(3)
    ]
    assert filled == [i < record["difficulty"] for i in range(9)]


def test_prompt_and_response_tokens_and_image_tokens():
    encoder = PromptEncoder(build_mini_processor())
    record = generate_split(1, seed=0, task=TaskConfig())[0]
    prompt = encoder.encode_prompt(record["image"], record["question"])
    tokens = encoder.tokenizer.convert_ids_to_tokens(prompt.input_ids)
    assert tokens == ["<s>", *["<image>"] * 9, "sum", "?", "=>"]  # one BOS, 9 image tokens
    assert prompt.vision["pixel_values"].shape == (1, 3, 36, 36)
    ids = encoder.encode_response("<think> 3 7 </think> A: 7")
    assert ids[0] == encoder.slow_id and ids[-1] == encoder.eos_id
    assert encoder.count_tokens("<think> 3 7 </think> A: 7") == len(ids)
    with pytest.raises(ValueError, match="must start with a mode token"):
        encoder.encode_response("A: 7")


def test_a_template_that_writes_its_own_bos_and_think_block_is_handled():
    """Qwen3-style: the template writes the BOS itself and, in non-thinking mode, an empty
    <think></think> block in the generation prompt; the tokenizer knows <think> already."""
    processor = build_mini_processor()
    processor.chat_template = (
        "<s>{% for message in messages %}{% for part in message['content'] %}"
        "{% if part['type'] == 'image' %}<image> {% else %}{{ part['text'] }} {% endif %}"
        "{% endfor %}{% endfor %}{% if add_generation_prompt %}=> <think> </think> {% endif %}"
    )
    encoder = PromptEncoder(processor)
    assert encoder.added_tokens == 0  # <think> was already in the vocabulary
    prompt = encoder.encode_prompt(np.zeros((36, 36)), "sum ?")
    tokens = encoder.tokenizer.convert_ids_to_tokens(prompt.input_ids)
    assert tokens.count("<s>") == 1 and tokens[-1] == "=>" and "<think>" not in tokens


def test_a_tokenizer_without_mode_tokens_gets_them_added():
    processor = build_mini_processor()
    tokenizer = processor.tokenizer
    vocab = {
        t: i for t, i in tokenizer.get_vocab().items() if t not in ("<fast>", "<think>", "</think>")
    }
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(
        models.WordLevel(vocab={t: i for i, t in enumerate(vocab)}, unk_token="<unk>")
    )
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    processor.tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
    )
    encoder = PromptEncoder(processor)
    assert encoder.added_tokens == 3
    ids = encoder.encode_response("<fast> A: 7")
    assert (
        ids[0] == encoder.fast_id
        and encoder.tokenizer.convert_ids_to_tokens(int(ids[0])) == "<fast>"
    )


def test_the_miniature_datamodule_marks_correct_responses_and_the_policy_table():
    data = DualDgoDataModule(n_train=8, n_val=4, n_test=4, seed=0)
    data.setup()
    item = data.splits["train"][0]
    task = data.task
    k = item.difficulty
    n_fast, n_slow = task.counts(k)  # 3 fast and 4 slow at k = 3
    assert item.modes.tolist() == [0] * n_fast + [1] * n_slow
    expected = task.slow_accuracy(k)
    assert item.policy_table[1, 0].item() == pytest.approx(expected)
    good = 1 - task.length_cost * slow_length(k) / task.max_length
    assert item.policy_table[1, 1].item() == pytest.approx(good)
    for reward, correct, mode in zip(item.rewards, item.correct, item.modes, strict=True):
        length = fast_length() if mode == 0 else slow_length(k)
        assert reward.item() == pytest.approx(
            float(correct) - task.length_cost * length / task.max_length, abs=1e-6
        )
    assert isinstance(item.prompt.input_ids, torch.Tensor)


def test_only_response_tokens_carry_loss_in_a_real_batch_and_decoded_counts_match():
    from dual_dgo.vlm import batch_sequences, build_tiny_vlm, decode_responses

    encoder = PromptEncoder(build_mini_processor())
    records = generate_split(3, seed=2, task=TaskConfig())
    prompts = [encoder.encode_prompt(r["image"], r["question"]) for r in records]
    responses = [encoder.encode_response(r["responses"][-1]["text"]) for r in records]
    image_id = encoder.tokenizer.convert_tokens_to_ids("<image>")
    batch = batch_sequences(prompts, responses, encoder.pad_id, image_id)
    mask = batch["response_mask"].bool()
    assert not mask[batch["input_ids"] == image_id].any()  # image tokens carry no loss
    for row, (prompt, response) in enumerate(zip(prompts, responses, strict=True)):
        assert mask[row].sum().item() == len(response)
        assert not mask[row, : len(prompt.input_ids)].any()
        assert batch["input_ids"][row][mask[row]].tolist() == response.tolist()
    torch.manual_seed(0)
    model = build_tiny_vlm(encoder.tokenizer, hidden=32, layers=1, heads=4, vision_hidden=32)
    for mode in (encoder.fast_id, encoder.slow_id):
        for ids in decode_responses(model, encoder, prompts, mode, 12, image_id):
            assert ids[0] == mode and len(ids) <= 13
            if ids[-1] == encoder.eos_id:  # a finished response: its count is its text's
                assert encoder.count_tokens(encoder.tokenizer.decode(ids[:-1])) == len(ids)
            else:  # cut at max_new_tokens: no EOS was generated
                assert encoder.count_tokens(encoder.tokenizer.decode(ids)) == len(ids) + 1


def test_the_default_counts_fall_for_fast_and_rise_for_slow_with_the_digit_count():
    task = TaskConfig()
    assert [task.counts(k) for k in range(1, 9)] == [
        (4, 2), (4, 3), (3, 4), (3, 5), (2, 5), (2, 6), (1, 7), (1, 8)
    ]  # fmt: skip
    constant = TaskConfig(n_fast=2, n_slow=6, n_fast_hard=2, n_slow_hard=6)
    assert {constant.counts(k) for k in range(1, 9)} == {(2, 6)}
    for record in generate_split(30, seed=2, task=task):
        modes = [r["mode"] for r in record["responses"]]
        assert (modes.count("fast"), modes.count("slow")) == task.counts(record["difficulty"])


SOURCE = TaskConfig(counts_by="source", n_fast=8, n_slow=1, n_fast_b=1, n_slow_b=8)


def test_the_source_schedule_sets_the_counts_by_the_tag_whatever_the_difficulty():
    assert [SOURCE.counts(k, 0) for k in (1, 4, 8)] == [(8, 1)] * 3
    assert [SOURCE.counts(k, 1) for k in (1, 4, 8)] == [(1, 8)] * 3
    with pytest.raises(ValueError, match="needs source 0 or 1, got None"):
        SOURCE.counts(2)
    with pytest.raises(ValueError, match="counts_by must be 'difficulty' or 'source'"):
        TaskConfig(counts_by="tag").counts(1)
    records = generate_split(40, seed=2, task=SOURCE)
    for record in records:
        modes = [r["mode"] for r in record["responses"]]
        expected = (8, 1) if record["source"] == 0 else (1, 8)
        assert (modes.count("fast"), modes.count("slow")) == expected
        assert record["question"] == ("src1 sum ?" if record["source"] == 0 else "src2 sum ?")
    # the prompts and images are the difficulty schedule's: only the tag and the counts differ
    plain = generate_split(40, seed=2, task=TaskConfig())
    assert [r["digits"] for r in plain] == [r["digits"] for r in records]
    assert all(np.array_equal(x["image"], y["image"]) for x, y in zip(plain, records, strict=True))
    assert {r["source"] for r in plain} == {None} and {r["question"] for r in plain} == {"sum ?"}


def test_the_source_is_drawn_independently_of_the_difficulty_with_its_share():
    records = generate_split(4000, seed=7, task=SOURCE)
    source = np.array([r["source"] for r in records])
    k = np.array([r["difficulty"] for r in records])
    assert abs(source.mean() - 0.5) < 4 * np.sqrt(0.25 / len(source))
    for level in (1, 2, (3, 8)):  # easy, two digits, the rest: the same share of source b
        mask = k == level if isinstance(level, int) else (k >= level[0]) & (k <= level[1])
        assert abs(source[mask].mean() - 0.5) < 4 * np.sqrt(0.25 / mask.sum()), level
    share = TaskConfig(counts_by="source", source_share=0.2)
    tagged = np.array([r["source"] for r in generate_split(4000, seed=7, task=share)])
    assert abs(tagged.mean() - 0.2) < 4 * np.sqrt(0.16 / 4000)


def test_the_datamodule_encodes_the_source_tag_and_its_counts():
    data = DualDgoDataModule(
        n_train=12, n_val=2, n_test=2, seed=4, counts_by="source", n_fast=8, n_slow=1,
        n_fast_b=1, n_slow_b=8,
    )  # fmt: skip
    data.setup()
    tokenizer = data.encoder.tokenizer
    sources = set()
    for item in data.splits["train"]:
        sources.add(item.source)
        tokens = tokenizer.convert_ids_to_tokens(item.prompt.input_ids.tolist())
        assert ("src1" if item.source == 0 else "src2") in tokens and "<unk>" not in tokens
        fast = 8 if item.source == 0 else 1
        assert item.modes.tolist() == [0] * fast + [1] * (9 - fast)
    assert sources == {0, 1}
    plain = DualDgoDataModule(n_train=2, n_val=2, n_test=2, seed=4)
    plain.setup()
    assert {item.source for item in plain.splits["train"]} == {-1}
