import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from torch.func import functional_call, jvp
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from papers_cli import ConfigError, UserError
from papers_data import DatasetNotFoundError
from vpretrain.formats import (
    DataFormatError,
    Problem,
    check_attention_supports_jvp,
    check_top_k,
    encode_problem,
    extract_final_number,
    load_tokenizer,
    normalize_number,
    pack_documents,
    pass_at_1,
    read_gsm8k,
    read_text_corpus,
    refuse_overlap,
    split_feedback,
)

NATALIA = {
    "question": "Natalia sold clips to 48 of her friends in April, and then she sold half as many "
    "clips in May. How many clips did Natalia sell altogether in April and May?",
    "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
    "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72",
}


def write_jsonl(path, records):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def qwen():
    return load_tokenizer(None)  # ~5 s: the 151k-rank BPE is converted once per module


@pytest.fixture
def bos_tokenizer():
    """A word-level tokenizer with BOS ``<s>``, EOS ``</s>`` and no chat template."""
    words = ["<unk>", "<s>", "</s>", "how", "many", "?", "2", "+", "3", "=", "5", "####", "=>"]
    model = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    model.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=model, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def test_gsm8k_solutions_lose_annotations_and_answers_are_normalised(tmp_path):
    path = tmp_path / "train.jsonl"
    records = [
        NATALIA,
        {"question": "Q2", "answer": "It costs 1,000+200 = <<1000+200=1200>>1,200.\n#### 1,200"},
        {"question": "Q3", "answer": "2-5 = <<2-5=-3>>-3\n#### -3"},
        {"question": "Q4", "answer": "Half of 7 is 3.50\n#### 3.50"},
    ]
    first, second, third, fourth = (json.dumps(r) for r in records)
    path.write_text("\n".join([first, second, "", "   ", third, fourth, "", ""]))  # blank lines
    problems = read_gsm8k(path)
    assert problems[0] == Problem(
        question=NATALIA["question"],
        solution="Natalia sold 48/2 = 24 clips in May.\n"
        "Natalia sold 48+24 = 72 clips altogether in April and May.\n#### 72",
        answer="72",
    )
    assert [p.answer for p in problems] == ["72", "1200", "-3", "3.5"]
    assert problems[1].solution == "It costs 1,000+200 = 1,200.\n#### 1,200"


def test_a_gsm8k_line_without_a_final_answer_names_the_file_and_line(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(f"{json.dumps(NATALIA)}\n\n{json.dumps({'question': 'Q', 'answer': '7'})}\n")
    with pytest.raises(DataFormatError, match=rf"{path}:3: the answer has no '####"):
        read_gsm8k(path)
    path.write_text(json.dumps({"question": "Q", "answer": "so #### many"}) + "\n")
    with pytest.raises(DataFormatError, match=r":1: the final answer 'many' is not a number"):
        read_gsm8k(path)
    path.write_text(json.dumps({"question": "Q", "solution": "#### 7"}) + "\n")
    with pytest.raises(DataFormatError, match=r":1: needs 'question' and 'answer'"):
        read_gsm8k(path)


def test_a_missing_gsm8k_file_says_where_the_published_files_go(tmp_path):
    with pytest.raises(DatasetNotFoundError) as raised:
        read_gsm8k(tmp_path / "train.jsonl")
    message = str(raised.value)
    assert str(tmp_path) in message and "Missing: train.jsonl" in message
    assert "test.jsonl" in message and "grade-school-math/data" in message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1,234", "1234"),
        ("-5", "-5"),
        ("3.50", "3.5"),
        ("$18", "18"),
        ("7.", "7"),
        (" 100 ", "100"),
        ("0.0", "0"),
        ("-$1,000.25", "-1000.25"),
    ],
)
def test_normalize_number(text, expected):
    assert normalize_number(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "--5", "$"])
def test_normalize_number_refuses_non_numbers(text):
    with pytest.raises(ValueError, match="not a number"):
        normalize_number(text)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("The answer is 1,234.", "1234"),
        ("#### -5\n", "-5"),
        ("I do not know.", None),
        ("She pays $18.50 in total.", "18.5"),
        ("He reads pages 3-5, so 7 pages are left", "7"),
        ("Tom has 3 apples, then 3-5 of them", "5"),  # a hyphen after a digit is not a minus
        ("5 + 3 = 8\n#### 8\nQuestion: 2 more", "8"),  # after ####, not the last number
        ("it drops to -12 degrees", "-12"),
        ("#### lots", None),
    ],
)
def test_extract_final_number_from_model_like_outputs(text, expected):
    assert extract_final_number(text) == expected


def test_pass_at_1_compares_normalised_final_numbers():
    problems = [Problem("q", "s #### 72", "72"), Problem("q", "s", "1200"), Problem("q", "s", "3")]
    generations = ["so 72 clips.\n#### 72", "The answer is 1,200.", "#### 4"]
    np.testing.assert_array_equal(pass_at_1(generations, problems), [1, 1, 0])
    with pytest.raises(ValueError, match="2 generations for 3 problems"):
        pass_at_1(generations[:2], problems)


def test_jsonl_and_parquet_corpora_read_the_same_documents(tmp_path):
    rows = [{"text": "first doc", "id": 1}, {"text": "", "id": 2}, {"text": "second\ndoc", "id": 3}]
    write_jsonl(tmp_path / "c.jsonl", rows)
    with (tmp_path / "c.jsonl").open("a") as file:
        file.write("\n")
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    expected = ["first doc", "second\ndoc"]
    assert read_text_corpus(tmp_path / "c.jsonl") == expected
    assert read_text_corpus(tmp_path / "c.parquet") == expected


def test_a_corpus_folder_is_read_sorted_and_recursively(tmp_path):
    write_jsonl(tmp_path / "b.jsonl", [{"body": "from b"}])
    table = pa.Table.from_pylist([{"body": "from a/c 1"}, {"body": "from a/c 2"}])
    (tmp_path / "a").mkdir()
    pq.write_table(table, tmp_path / "a" / "c.parquet")
    (tmp_path / "README.txt").write_text("not a corpus file")
    texts = read_text_corpus(tmp_path, text_field="body")
    assert texts == ["from a/c 1", "from a/c 2", "from b"]


def test_a_record_without_the_text_field_names_the_file_and_its_fields(tmp_path):
    write_jsonl(tmp_path / "c.jsonl", [{"text": "ok"}, {"content": "x", "url": "u"}])
    with pytest.raises(DataFormatError, match=r"c\.jsonl:2: no field 'text'.*\['content', 'url'\]"):
        read_text_corpus(tmp_path / "c.jsonl")
    pq.write_table(pa.Table.from_pylist([{"content": "x"}]), tmp_path / "d.parquet")
    with pytest.raises(DataFormatError, match=r"d\.parquet: no field 'text'.*\['content'\]"):
        read_text_corpus(tmp_path / "d.parquet")


def test_a_missing_corpus_or_a_folder_without_corpus_files_is_dataset_not_found(tmp_path):
    with pytest.raises(DatasetNotFoundError, match="nowhere"):
        read_text_corpus(tmp_path / "nowhere")
    (tmp_path / "empty" / "sub").mkdir(parents=True)
    (tmp_path / "empty" / "sub" / "notes.txt").write_text("x")
    with pytest.raises(DatasetNotFoundError, match=r"\*\.jsonl or \*\.parquet"):
        read_text_corpus(tmp_path / "empty")


def test_pack_documents_packs_across_block_boundaries_and_drops_the_tail():
    docs = [[11, 12, 13], [21, 22], [31]]  # stream: 11 12 13 E 21 22 E 31 E, E = 0
    blocks = pack_documents(docs, block_size=4, eos_id=0)
    expected = torch.tensor([[11, 12, 13, 0], [21, 22, 0, 31]])
    assert blocks.dtype == torch.long and torch.equal(blocks, expected)
    as_arrays = [np.array(docs[0]), torch.tensor(docs[1]), docs[2]]  # tokenizer outputs vary
    assert torch.equal(pack_documents(as_arrays, block_size=4, eos_id=0), expected)


def test_pack_documents_puts_bos_before_each_document():
    blocks = pack_documents([[11, 12, 13], [21, 22], [31]], block_size=4, eos_id=0, bos_id=9)
    expected = torch.tensor([[9, 11, 12, 13], [0, 9, 21, 22], [0, 9, 31, 0]])
    assert torch.equal(blocks, expected)


def test_a_corpus_shorter_than_one_block_is_refused():
    with pytest.raises(ConfigError, match=r"has 5 tokens .* block_size=8"):
        pack_documents([[1, 2], [3]], block_size=8, eos_id=0)


def test_qwen_plain_encoding_splits_digits_and_ends_with_eos(qwen):
    problem = Problem("Tom has 1234 pens. How many?", "He has 1234.\n#### 1234", "1234")
    prompt, answer = encode_problem(qwen, problem)
    assert qwen.bos_token is None and qwen.decode(prompt) == "Tom has 1234 pens. How many?\n"
    assert answer[-1] == qwen.convert_tokens_to_ids("<|endoftext|>") == qwen.eos_token_id == 151643
    assert qwen.decode(answer[:-1]) == problem.solution
    tokens = qwen.convert_ids_to_tokens(answer)
    assert tokens[-5:-1] == ["1", "2", "3", "4"]  # one digit per token, as in Qwen2.5


def test_qwen_chat_encoding_wraps_the_question_and_ends_with_im_end(qwen):
    problem = Problem("How many is 2+3?", "2+3 = 5\n#### 5", "5")
    prompt, answer = encode_problem(qwen, problem, chat=True)
    text = qwen.decode(prompt)
    assert text.startswith("<|im_start|>system\n")
    assert text.endswith("<|im_start|>user\nHow many is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    assert prompt.count(151644) == 3  # <|im_start|> is one token: system, user, assistant
    assert answer[-1] == qwen.convert_tokens_to_ids("<|im_end|>") == 151645
    assert qwen.decode(answer[:-1]) == problem.solution


def test_a_tokenizer_with_bos_gets_exactly_one(bos_tokenizer):
    problem = Problem("how many ?", "2 + 3 = 5 #### 5", "5")
    prompt, answer = encode_problem(bos_tokenizer, problem)
    assert bos_tokenizer.convert_ids_to_tokens(prompt) == ["<s>", "how", "many", "?"]
    assert bos_tokenizer.convert_ids_to_tokens(answer)[-2:] == ["5", "</s>"]
    bos_tokenizer.chat_template = (  # a template that writes the BOS itself
        "<s> {% for message in messages %}{{ message['content'] }} {% endfor %}"
        "{% if add_generation_prompt %}=> {% endif %}"
    )
    prompt, answer = encode_problem(bos_tokenizer, problem, chat=True)
    assert bos_tokenizer.convert_ids_to_tokens(prompt) == ["<s>", "how", "many", "?", "=>"]
    assert bos_tokenizer.convert_ids_to_tokens(answer)[-1] == "</s>"  # no end-of-turn token: EOS


def test_chat_mode_without_a_template_is_refused(bos_tokenizer):
    with pytest.raises(ConfigError, match="chat template"):
        encode_problem(bos_tokenizer, Problem("how many ?", "5", "5"), chat=True)


def test_load_tokenizer_reads_a_local_folder_and_refuses_a_missing_one(bos_tokenizer, tmp_path):
    bos_tokenizer.save_pretrained(tmp_path / "tok")
    loaded = load_tokenizer(str(tmp_path / "tok"))
    assert loaded("how many ?")["input_ids"] == bos_tokenizer("how many ?")["input_ids"]
    assert loaded.bos_token == "<s>"
    with pytest.raises(UserError, match=r"nowhere does not exist.*'qwen2\.5'"):
        load_tokenizer(str(tmp_path / "nowhere"))


def test_split_feedback_is_seeded_nested_and_refuses_too_many():
    problems = [Problem(f"q{i}", "s", str(i)) for i in range(50)]
    first = split_feedback(problems, 20, seed=3)
    assert first == split_feedback(problems, 20, seed=3)
    assert first != split_feedback(problems, 20, seed=4)
    assert len({p.question for p in first}) == 20
    assert split_feedback(problems, 8, seed=3) == first[:8]
    with pytest.raises(ConfigError, match="n_feedback=51 .* 50 problems"):
        split_feedback(problems, 51, seed=3)


def test_refuse_overlap_catches_a_case_and_whitespace_variant():
    feedback = [Problem("Tom has 3 pens. How many?", "s", "3"), Problem("Ann runs.", "s", "1")]
    refuse_overlap(feedback, [Problem("Bob has 4 pens.", "s", "4")])
    evaluation = [
        Problem("Bob has 4 pens.", "s", "4"),
        Problem("tom  HAS 3 pens.\nHow many?", "s", "3"),
    ]
    with pytest.raises(
        ConfigError, match=r"1 evaluation question.*'tom  HAS 3 pens\.\\nHow many\?'"
    ):
        refuse_overlap(feedback, evaluation)


@pytest.fixture(scope="module")
def tiny_qwen2():
    """A 1-layer Qwen2 per attention implementation, built from a small config."""
    torch.manual_seed(0)
    config = dict(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return {
        impl: Qwen2ForCausalLM(Qwen2Config(**config, attn_implementation=impl))
        for impl in ("eager", "sdpa")
    }


def test_check_attention_supports_jvp_allows_only_eager(tiny_qwen2):
    check_attention_supports_jvp(tiny_qwen2["eager"])
    with pytest.raises(
        ConfigError, match=r"attn_implementation='sdpa'.*attn_implementation=\"eager\""
    ):
        check_attention_supports_jvp(tiny_qwen2["sdpa"])


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_jvp_runs_under_eager_and_not_under_cpu_sdpa(tiny_qwen2, impl):
    """The observation behind check_attention_supports_jvp, pinned for this torch version."""
    model = tiny_qwen2[impl]
    params = dict(model.named_parameters())
    tangents = {name: torch.ones_like(value) for name, value in params.items()}
    ids = torch.randint(0, 32, (2, 6), generator=torch.Generator().manual_seed(0))

    def logits(p):
        return functional_call(model, p, (ids,)).logits

    if impl == "eager":
        _, directional = jvp(logits, (params,), (tangents,))
        assert directional.shape == (2, 6, 32) and directional.abs().sum() > 0
    else:
        with pytest.raises(NotImplementedError, match="forward AD"):
            jvp(logits, (params,), (tangents,))


@pytest.mark.parametrize("k", [0, -1, 32, 40])
def test_check_top_k_refuses_k_outside_one_to_vocab(k):
    with pytest.raises(ConfigError, match=rf"top_k={k} .* vocabulary size 32"):
        check_top_k(k, vocab_size=32)
    check_top_k(31, vocab_size=32)
