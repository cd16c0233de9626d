"""RWKU: loading its real layouts, the forget corpus (provided or generated), the unlearning run
through the CLI and the evaluation on every probe level, on tiny fixtures in RWKU's format."""

import json
from pathlib import Path

import pytest
import torch

from atwu.cli import train
from atwu.core import answer_logprobs, retain_nll
from atwu.data import DataFormatError, collate, encode_qa, set_prompt_format, train_tokenizer
from atwu.evaluate import rwku_scores
from atwu.model import build_causal_lm, load_pretrained
from atwu.rwku import (
    FORGET_LEVELS,
    NEIGHBOR_LEVELS,
    answer_prompts,
    corpus_items,
    generate_corpus,
    list_targets,
    load_rwku_target,
    provided_corpus,
)
from papers_cli.testing import user_error_message
from papers_data import DatasetNotFoundError

PROJECT = Path(__file__).resolve().parents[1]

# name -> (facts as (fill-in query, question, answer), neighbor (query, answer))
TARGETS = {
    "Ada Quill": (
        [("Ada Quill was born in ___.", "Where was Ada Quill born?", "Lisbon"),
         ("Ada Quill wrote the novel ___.", "Which novel did Ada Quill write?", "Glass Tide"),
         ("Ada Quill won the ___ prize.", "Which prize did Ada Quill win?", "Orwell")],
        [("The capital of Peru is ___.", "Lima"), ("Glass is made from ___.", "sand")],
    ),
    "Bram Holt, Duke of Kent": (
        [("Bram Holt was born in ___.", "Where was Bram Holt born?", "Dover"),
         ("Bram Holt married ___.", "Whom did Bram Holt marry?", "Ruth Vale")],
        [("The capital of Chile is ___.", "Santiago")],
    ),
    "Zoë Marr": (
        [("Zoë Marr plays the ___.", "Which instrument does Zoë Marr play?", "cello")],
        [],
    ),
}  # fmt: skip


def _probes(name: str, level: int, int_levels: bool) -> list[dict]:
    facts, neighbors = TARGETS[name]
    kinds = ("affirmative suffix", "incontext learning", "role playing")
    out = []
    for k, (blank, question, answer) in enumerate(facts):
        query = {1: blank, 2: question}.get(level)
        if level == 3:
            query = question if kinds[k % 3] != "incontext learning" else f"Q: {question}"
        out.append({"query": query, "answer": answer, "level": level if int_levels else str(level),
                    "type": kinds[k % 3] if level == 3 else "", "subject": name})  # fmt: skip
    return out


def _neighbors(name: str, level: int) -> list[dict]:
    return [
        {"query": q, "answer": a, "level": str(level), "type": "", "subject": name}
        for q, a in TARGETS[name][1]
    ]


def _texts(name: str) -> list[str]:
    return [f"{name} was born in {f[2]}." if "born" in f[0] else f"{name}: {f[2]}."
            for f in TARGETS[name][0]]  # fmt: skip


def write_rwku(root: Path) -> Path:
    """RWKU's per-target layout as on the hub (Target/<k>_<Name>/), with its awkward cases:
    a comma and an accent in folder names, a JSON Lines file, integer levels, a list answer, a
    target without neighbor probes or provided corpus, files this project does not read."""
    for index, name in enumerate(TARGETS, start=1):
        folder = root / "Target" / f"{index}_{name.replace(' ', '_')}"
        folder.mkdir(parents=True)
        for level in (1, 2, 3):
            records = _probes(name, level, int_levels=index == 2)
            path = folder / f"forget_level{level}.json"
            if level == 2 and index == 1:  # JSON Lines
                path.write_text("\n".join(json.dumps(r) for r in records) + "\n")
            else:
                path.write_text(json.dumps(records, indent=4))
        if TARGETS[name][1]:
            for level in (1, 2):
                (folder / f"neighbor_level{level}.json").write_text(
                    json.dumps(_neighbors(name, level))
                )
        (folder / "intro.json").write_text(json.dumps([{"target": name, "intro": f"{name}."}]))
        if index < 3:
            texts = _texts(name)
            (folder / "positive.json").write_text(json.dumps(
                [{"id": f"{name} {k}", "text": t, "subject": name, "intro": ""}
                 for k, t in enumerate(texts)]))  # fmt: skip
            (folder / "passage.json").write_text(json.dumps([{"text": " ".join(texts)}]))
        (folder / "forget_mia.json").write_text("[]")  # present in RWKU, not read here
    # a list of aliases as the answer of one probe
    first = root / "Target" / "1_Ada_Quill" / "forget_level1.json"
    records = json.loads(first.read_text())
    records[0]["answer"] = ["Lisbon", "Lisboa"]
    first.write_text(json.dumps(records))
    return root


def write_rwku_all(root: Path) -> Path:
    """The hub's All/ folder: every target's records in one file per set."""
    (root / "All").mkdir(parents=True)
    for level in (1, 2, 3):
        records = [r for name in TARGETS for r in _probes(name, level, int_levels=False)]
        (root / "All" / f"forget_level{level}.json").write_text(json.dumps(records))
    for level in (1, 2):
        records = [r for name in TARGETS for r in _neighbors(name, level)]
        (root / "All" / f"neighbor_level{level}.json").write_text(json.dumps(records))
    (root / "All" / "positive.json").write_text(json.dumps(
        [{"id": "x", "text": t, "subject": name, "intro": ""}
         for name in TARGETS for t in _texts(name)]))  # fmt: skip
    return root


def test_rwku_targets_load_from_every_layout(tmp_path):
    root = write_rwku(tmp_path / "rwku")
    assert list_targets(str(root)) == ["Ada Quill", "Bram Holt, Duke of Kent", "Zoë Marr"]
    # by name, by folder, by folder without its index; from the dataset root or Target/
    for key, where in (("Ada Quill", root), ("1_Ada_Quill", root), ("ada_quill", root / "Target")):
        target = load_rwku_target(str(where), key)
        assert target.name == "Ada Quill"
        assert set(target.probes) == {*FORGET_LEVELS, *NEIGHBOR_LEVELS}
        assert [len(target.probes[n]) for n in FORGET_LEVELS] == [3, 3, 3]
    assert target.probes["forget_level1"][0].answer == "Lisbon"  # the first alias
    assert target.probes["forget_level2"][1].answer == "Glass Tide"  # JSON Lines
    assert target.texts["positive"] == _texts("Ada Quill")
    # RWKU's instructions: blank / brief answer / adversarial kinds
    assert target.probes["forget_level1"][0].question.startswith("Please complete the blank")
    level3 = [it.question for it in target.probes["forget_level3"]]
    assert not level3[0].endswith("\n")  # affirmative suffix: no trailing newline
    assert "\nQ: Which novel" in level3[1] and "Question:" not in level3[1]  # in-context
    duke = load_rwku_target(str(root), "Bram Holt, Duke of Kent")  # comma; integer levels
    assert duke.name == "Bram Holt, Duke of Kent" and len(duke.probes["forget_level1"]) == 2
    zoe = load_rwku_target(str(root), "Zoe Marr")  # accent folded; no neighbors, no corpus
    assert zoe.name == "Zoë Marr" and set(zoe.probes) == set(FORGET_LEVELS)
    with pytest.raises(DatasetNotFoundError, match="positive.json"):
        provided_corpus(zoe, "positive", 4, seed=0)
    # the All/ files, filtered by subject
    flat = load_rwku_target(str(write_rwku_all(tmp_path / "flat")), "bram holt, duke of kent")
    assert flat.name == "Bram Holt, Duke of Kent"  # the records' spelling
    assert [it.answer for it in flat.probes["forget_level2"]] == ["Dover", "Ruth Vale"]
    assert flat.texts["positive"] == _texts("Bram Holt, Duke of Kent")
    assert list_targets(str(tmp_path / "flat")) == list(TARGETS)


def test_bad_rwku_input_is_a_clear_error(tmp_path):
    root = write_rwku(tmp_path / "rwku")
    with pytest.raises(DatasetNotFoundError, match="1_Ada_Quill"):
        load_rwku_target(str(root), "Nobody")
    with pytest.raises(DatasetNotFoundError, match="forget_level1.json"):
        load_rwku_target(str(tmp_path / "missing"), "Ada Quill")
    ada = root / "Target" / "1_Ada_Quill"
    (ada / "forget_level3.json").unlink()
    with pytest.raises(DatasetNotFoundError, match="forget_level3.json"):
        load_rwku_target(str(root), "Ada Quill")
    duke = root / "Target" / "2_Bram_Holt,_Duke_of_Kent"
    (duke / "forget_level1.json").write_text(json.dumps([{"query": "q", "level": "1"}]))
    with pytest.raises(DataFormatError, match="'query'/'answer'"):
        load_rwku_target(str(root), "Bram Holt, Duke of Kent")
    (duke / "forget_level1.json").write_text(json.dumps([{"query": "q", "answer": "a",
                                                          "level": "2"}]))  # fmt: skip
    with pytest.raises(DataFormatError, match="level"):
        load_rwku_target(str(root), "Bram Holt, Duke of Kent")
    (duke / "forget_level1.json").write_text(json.dumps(_probes("Bram Holt, Duke of Kent", 1, 0)))
    (duke / "positive.json").write_text(json.dumps([{"id": "0", "response": "x"}]))
    with pytest.raises(DataFormatError, match="'text'"):
        load_rwku_target(str(root), "Bram Holt, Duke of Kent")


# ------------------------------------------------------------------ a tiny "original model"


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """RWKU's fixture and a tiny Llama that knows its targets: trained on the probes' answers
    (as a model that read about the targets) and the provided texts; saved as a local
    checkpoint folder with its tokenizer."""
    torch.set_num_threads(1)
    base = tmp_path_factory.mktemp("rwku")
    root = write_rwku(base / "data")
    targets = [load_rwku_target(str(root), name) for name in TARGETS]
    items = [it for t in targets for probes in t.probes.values() for it in probes]
    texts = [s for t in targets for v in t.texts.values() for s in v]
    # it also read texts about the targets, after the prompt the corpus generation asks
    items += [it for t in targets for it in corpus_items(t.name, t.texts.get("positive", []))]
    tokenizer = train_tokenizer(
        [it.question for it in items] + [it.answer for it in items] + texts, 400
    )
    set_prompt_format(tokenizer, "plain")
    torch.manual_seed(0)
    model = build_causal_lm(
        len(tokenizer), 48, 1, 2, 96, 256, tokenizer.pad_token_id, tokenizer.eos_token_id
    )
    batch = collate(
        [encode_qa(tokenizer, it.question, it.answer, max_length=128) for it in items],
        tokenizer.pad_token_id,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(150):
        logp, mask = answer_logprobs(model(batch["input_ids"], batch["attention_mask"]).logits,
                                     batch["labels"])  # fmt: skip
        loss = retain_nll(logp, mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(base / "ckpt")
    tokenizer.save_pretrained(base / "ckpt")
    return {"root": root, "ckpt": base / "ckpt", "tokenizer": tokenizer, "targets": targets}


def test_the_original_model_knows_the_target_and_every_level_is_scored(original):
    model = load_pretrained(str(original["ckpt"])).eval()
    target = original["targets"][0]
    means, per_probe = rwku_scores(model, original["tokenizer"], target.probes, 30)
    assert set(means) == {*FORGET_LEVELS, *NEIGHBOR_LEVELS}
    assert all(len(per_probe[n]) == len(target.probes[n]) for n in means)
    assert means["forget_level2"] > 0.6 and means["forget_level1"] > 0.6  # it memorised them


def test_generated_corpus_is_seeded_and_deterministic(original):
    model = load_pretrained(str(original["ckpt"])).eval()
    tokenizer = original["tokenizer"]
    state = torch.random.get_rng_state()
    first = generate_corpus(model, tokenizer, "Ada Quill", 5, 12, seed=3, batch_size=2)
    assert torch.equal(state, torch.random.get_rng_state())  # the caller's RNG is untouched
    again = generate_corpus(model, tokenizer, "Ada Quill", 5, 12, seed=3, batch_size=2)
    other = generate_corpus(model, tokenizer, "Ada Quill", 5, 12, seed=4, batch_size=2)
    assert first == again and first != other
    assert len(first) == 5 and len(set(first)) > 1  # sampled, not greedy
    assert all(len(tokenizer(t)["input_ids"]) <= 14 for t in first)
    prompts = answer_prompts(tokenizer, original["targets"][0].probes["forget_level2"])
    assert tokenizer.decode(prompts[0]).endswith("\nAnswer:")


def rwku_args(original, tmp_path, *extra):
    return [
        "--config", str(PROJECT / "configs" / "rwku.yaml"),
        "--trainer.accelerator=cpu", "--trainer.devices=1", "--trainer.strategy=auto",
        "--trainer.precision=32-true", "--trainer.max_steps=6", "--trainer.val_check_interval=6",
        "--trainer.logger=false", "--trainer.enable_checkpointing=false",
        f"--trainer.default_root_dir={tmp_path}",
        f"--model.pretrained={original['ckpt']}", f"--data.tokenizer_path={original['ckpt']}",
        f"--data.root={original['root']}", "--data.target_id=Ada Quill",
        "--data.prompt_format=plain", "--data.max_length=64", "--data.corpus_size=4",
        "--data.corpus_new_tokens=24", "--data.forget_batch_size=4",
        "--data.retain_batch_size=4", "--data.num_retain_targets=2", "--model.lr=0.01",
        "--model.burnin_steps=2", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("method", "corpus"),
    [
        ("atwu", "generate"),
        pytest.param("npo", "positive", marks=pytest.mark.slow),  # a few seconds each: slow lane
        pytest.param("atwu_uniform", "passage", marks=pytest.mark.slow),
    ],
)
def test_rwku_unlearning_through_the_cli_lowers_forget_recall(original, tmp_path, method, corpus):
    before, _ = rwku_scores(
        load_pretrained(str(original["ckpt"])).eval(),
        original["tokenizer"],
        original["targets"][0].probes,
        30,
    )
    cli = train(
        rwku_args(original, tmp_path, f"--model.method={method}", f"--data.corpus={corpus}")
    )
    metrics = cli.trainer.callback_metrics
    names = [f"val/{n}_rouge" for n in (*FORGET_LEVELS, *NEIGHBOR_LEVELS)]
    assert all(name in metrics for name in names), sorted(metrics)
    data = cli.datamodule
    assert len(data.data.forget) == (
        4 if corpus == "generate" else len(data.corpus_texts["forget"])
    )
    if corpus == "generate":  # the corpus the loaded model wrote, about the target
        assert all(it.question.endswith("Ada Quill.") for it in data.data.forget)
    else:
        assert data.corpus_texts["forget"][0].startswith("Ada Quill")
    # retain: the other targets' corpora (Zoë Marr ships none, so only the duke for provided)
    assert {it.subject for it in data.data.retain} <= {"Bram Holt, Duke of Kent", "Zoë Marr"}
    reloaded = load_pretrained(str(original["ckpt"]))
    moved = sum((a - b).abs().sum() for a, b in zip(
        cli.model.model.parameters(), reloaded.parameters(), strict=True))  # fmt: skip
    assert moved > 0
    forget = [metrics[f"val/{n}_rouge"].item() for n in FORGET_LEVELS]
    assert sum(forget) < sum(before[n] for n in FORGET_LEVELS)


def test_rwku_bad_configuration_is_one_error_paragraph(original, tmp_path, capsys):
    message = user_error_message(
        train, rwku_args(original, tmp_path, f"--data.root={tmp_path / 'nowhere'}"), capsys
    )
    assert "forget_level1.json" in message and "jinzhuoran/RWKU" in message
    message = user_error_message(
        train, rwku_args(original, tmp_path, "--data.target_id=Nobody"), capsys
    )
    assert "Nobody" in message and "1_Ada_Quill" in message
    message = user_error_message(
        train, rwku_args(original, tmp_path, "--model.finetune_steps=3"), capsys
    )
    assert "finetune_steps=0" in message
