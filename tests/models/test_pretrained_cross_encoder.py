"""`pretrained_classifier` as a cross-encoder on sentence pairs (tasks pair_classification and ranking), on the
tiny random BERT: each pair is encoded exactly as the tokenizer encodes a pair (separators, token type ids,
cut at model.max_length longest side first), swapping its sides changes the input, pair models train through
hyperplex.train.run.train (a memorisable NLI-style set: the loss falls; ranking: one output, BCE, MAP/MRR equal a hand
computation from the scores), resume bit for bit, and adapter-only checkpoints reload with the same scores."""

from __future__ import annotations

import json
import logging
import random

import pytest
import torch
import torch.nn.functional as F
import yaml

transformers = pytest.importorskip("transformers")

from conftest import TINY_BERT_WORDS as WORDS
from conftest import assert_same_training_state

from hyperplex.cli.main import main
from hyperplex.config import ConfigError
from hyperplex.config.experiment import load_experiment
from hyperplex.config.registry import get_architecture
from hyperplex.inference.load import load_model
from hyperplex.inference.parameters import params
from hyperplex.models.pretrained_classifier import BASE_KEY, PretrainedClassifier
from hyperplex.tasks import task_class
from hyperplex.train.checkpoint import load_checkpoint
from hyperplex.train.run import train
from hyperplex.train.trainer import Trainer

LABELS = ["contradiction", "entailment"]


def sentence(rng: random.Random, low: int, high: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def nli_rows(count: int, seed: int) -> list[dict]:
    """Premise/hypothesis pairs of the tiny vocabulary, sides of very different lengths (so some are cut)."""
    rng = random.Random(seed)
    return [{"premise": sentence(rng, 2, 14), "hypothesis": sentence(rng, 1, 6), "label": LABELS[i % 2]}
            for i in range(count)]


def ranking_rows(questions: int, seed: int) -> list[dict]:
    """Four candidate answers per question, one of them correct (label 1)."""
    rng = random.Random(seed)
    rows = []
    for q in range(questions):
        question = sentence(rng, 3, 5)
        rows += [{"qid": f"q{q}", "question": question, "answer": sentence(rng, 3, 10), "label": int(k == q % 4)}
                 for k in range(4)]
    return rows


def write_jsonl(path, rows) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def write_config(folder, bert, task="pair_classification", kind="phm", steps=12, rows=None, dev_rows=None,
                 lr=1e-2, max_length=12, **adapter):
    """A pair config on the tiny BERT; ``rows`` (train) and ``dev_rows`` default to generated ones."""
    folder.mkdir(parents=True, exist_ok=True)
    if task == "ranking":
        train, dev = rows or ranking_rows(12, 1), dev_rows or ranking_rows(6, 2)
        data = {"a_field": "question", "b_field": "answer", "group_field": "qid"}
    else:
        train, dev = rows or nli_rows(48, 1), dev_rows or nli_rows(16, 2)
        data = {"labels": LABELS}
    write_jsonl(folder / "train.jsonl", train)
    write_jsonl(folder / "dev.jsonl", dev)
    raw = {"name": "tiny_cross_encoder", "seed": 3, "model_dir": str(folder / "m"),
           "data": {"task": task, "format": "jsonl", "train": str(folder / "train.jsonl"),
                    "dev": str(folder / "dev.jsonl"), **data},
           "model": {"architecture": "pretrained_classifier", "path": str(bert), "max_length": max_length,
                     "adapter": {"kind": kind, "n": 4, "targets": ["query", "value"], **adapter}},
           "training": {"lr": lr, "batch_size": 16, "max_steps": steps, "validation_every": 6, "log_every": 3,
                        "num_threads": 1, "progress_bar": False, "plots": False, "device": "cpu"}}
    path = folder / "pairs.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def train_with_trainer(path) -> Trainer:
    """Train as `hyperplex train` does and return the Trainer: its model and task are the trained ones."""
    cfg = load_experiment(path)
    trainer = Trainer(cfg, task_class(cfg.data.task), cfg.model_dir, None)
    try:
        trainer.train()
    finally:  # later runs in this process must not log into this model's train.log
        log = logging.getLogger("hyperplex")
        for handler in list(log.handlers):
            log.removeHandler(handler)
            handler.close()
    return trainer


def prepared_task(path, folder, overrides=None):
    cfg = load_experiment(path, overrides)
    task = task_class(cfg.data.task)(cfg, folder / "m", None)
    (folder / "m").mkdir(exist_ok=True)
    task.prepare(fresh=True)
    return cfg, task


# ---------------------------------------------------------------------------- encoding
@pytest.mark.parametrize("task_name", ["pair_classification", "ranking"])
def test_a_pair_is_encoded_as_the_tokenizer_encodes_a_pair(tmp_path, bert_folder, task_name):
    path = write_config(tmp_path, bert_folder, task_name)
    _, task = prepared_task(path, tmp_path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert_folder)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    a, b = ("question", "answer") if task_name == "ranking" else ("premise", "hypothesis")
    expected = [tokenizer(r[a], r[b], truncation="longest_first", max_length=12) for r in rows]
    dataset = task.train_set
    assert [list(t) for t in dataset.token_ids] == [e["input_ids"] for e in expected]
    assert [list(t) for t in dataset.token_types] == [e["token_type_ids"] for e in expected]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    cut = 0
    for row, ids, types in zip(rows, dataset.token_ids, dataset.token_types):
        first = ids.index(sep)  # [CLS] a [SEP] has type 0, b [SEP] type 1
        assert ids[0] == cls and ids[-1] == sep and ids.count(sep) == 2
        assert types == [0] * (first + 1) + [1] * (len(ids) - first - 1)
        words_a, words_b = len(row[a].split()), len(row[b].split())
        kept_a, kept_b = first - 1, len(ids) - first - 2
        assert len(ids) <= 12 and kept_a <= words_a and kept_b <= words_b
        if (kept_a, kept_b) != (words_a, words_b):  # cut to 12 in all, the longer side first: the shorter
            cut += 1                                 # side is whole, or both are cut to (nearly) equal lengths
            shorter_whole = (kept_a, words_a) if words_a <= words_b else (kept_b, words_b)
            assert len(ids) == 12 and (shorter_whole[0] == shorter_whole[1] or abs(kept_a - kept_b) <= 1)
    assert cut > 0  # the generated pairs include over-long ones
    # a batch carries the token types padded with 0 beside the ids, and the model gets them
    batch = dataset.batches(8)[0]
    assert batch["token_types"].shape == batch["tokens"].shape
    for row, i in enumerate(batch.indices):
        n = len(dataset.token_ids[i])
        assert batch["token_types"][row, :n].tolist() == dataset.token_types[i]
        assert batch["token_types"][row, n:].eq(0).all()
    if task_name == "ranking":
        assert batch["groups"].tolist() == dataset.groups[batch.indices].tolist()
    assert list((tmp_path / "m").iterdir()) == []  # no vocabulary files: the tokenizer comes from model.path


def test_swapping_a_pair_s_sides_changes_the_input_and_the_score(tmp_path, bert_folder):
    path = write_config(tmp_path, bert_folder, "pair_classification")
    rows = [{"premise": "the big cat sat on the mat", "hypothesis": "a dog runs", "label": "entailment"}]
    write_jsonl(tmp_path / "ab.jsonl", rows)
    write_jsonl(tmp_path / "ba.jsonl", [{**rows[0], "premise": rows[0]["hypothesis"],
                                         "hypothesis": rows[0]["premise"]}])
    cfg, task = prepared_task(path, tmp_path, ["--model.max_length=32"])
    torch.manual_seed(0)
    model = PretrainedClassifier(cfg.model, 0, 2).eval()
    with torch.no_grad():
        model.head.weight.normal_()  # a head that reads every feature
    batches, scores = [], []
    for name in ("ab", "ba"):
        task.use_evaluation_file(str(tmp_path / f"{name}.jsonl"))
        batches.append(task.dev_set.collate([0]))
        scores.append(task.predict(model, task.dev_set)[0])
    ab, ba = batches
    assert ab["tokens"].shape == ba["tokens"].shape  # the same tokens in all ...
    assert sorted(ab["tokens"][0].tolist()) == sorted(ba["tokens"][0].tolist())
    assert not torch.equal(ab["tokens"], ba["tokens"])  # ... in another order
    assert ab["token_types"][0].sum() == 4 and ba["token_types"][0].sum() == 8  # "a dog runs [SEP]" vs 7 + [SEP]
    assert not torch.allclose(scores[0], scores[1])


def test_a_pair_needs_room_for_both_texts(tmp_path, bert_folder, capsys):
    path = write_config(tmp_path, bert_folder, "pair_classification")
    assert main(["train", str(path), "--model.max_length=4"]) == 1
    assert "model.max_length 4 leaves no room for a text pair: the tokenizer adds 3 special tokens" in \
        capsys.readouterr().err


def test_the_registry_serves_the_pair_tasks_and_keeps_refusing_the_others():
    for task in ("classification", "pair_classification", "ranking"):
        assert get_architecture("pretrained_classifier", task).model_class == "PretrainedClassifier"
    with pytest.raises(ConfigError, match="'pretrained_classifier' cannot do task 'translation'; valid for it: "
                                          "rnn_translator, transformer$"):
        get_architecture("pretrained_classifier", "translation")
    with pytest.raises(ConfigError, match="'nli_encoder' cannot do task 'classification'; valid for it: "
                                          "transformer_classifier, pretrained_classifier$"):
        get_architecture("nli_encoder", "classification")


# ---------------------------------------------------------------------------- training
def test_a_pair_classifier_trains_through_run_train_and_memorises(tmp_path, bert_folder):
    # 16 pairs validated on themselves: a cross-encoder that trains must bring their loss well down
    rows = nli_rows(16, 5)
    path = write_config(tmp_path, bert_folder, "pair_classification", kind="full", steps=30, rows=rows,
                        dev_rows=rows, lr=3e-3, max_length=24)
    cfg, task = prepared_task(path, tmp_path)
    torch.manual_seed(cfg.seed)  # the model the run starts from (the trainer seeds, then prepares and builds)
    before = task.validate(PretrainedClassifier(cfg.model, 0, 2).eval())
    metrics = train(str(path))
    assert metrics["loss"] < 0.5 * before["loss"]
    assert metrics["accuracy"] == 100.0
    log = (tmp_path / "m" / "train.log").read_text()
    assert "both texts joined into one sequence" in log and "16 training / 16 validation examples" in log


def hand_map_mrr(scores: list[float], labels: list[int], groups: list[int]) -> tuple[float, float]:
    """MAP and MRR (%) over questions with a correct answer: answers sorted by score, highest first."""
    aps, rrs = [], []
    for g in sorted(set(groups)):
        ranked = sorted((-s, i) for i, (s, q) in enumerate(zip(scores, groups)) if q == g)
        hits = [labels[i] for _, i in ranked]
        if not any(hits):
            continue
        positions = [k + 1 for k, h in enumerate(hits) if h]
        aps.append(sum((n + 1) / p for n, p in enumerate(positions)) / len(positions))
        rrs.append(1.0 / positions[0])
    return 100 * sum(aps) / len(aps), 100 * sum(rrs) / len(rrs)


def test_ranking_scores_pairs_with_one_output_and_ranks_them_per_question(tmp_path, bert_folder, capsys):
    path = write_config(tmp_path, bert_folder, "ranking", steps=12)
    metrics = train(str(path))
    _, task, model = load_model(tmp_path / "m", "last")  # the base rebuilt, the adapter loaded
    assert task.num_outputs == 1 and model.head.out_features == 1
    scores, labels, groups = task.predict(model.eval(), task.dev_set)
    assert scores.shape == (len(task.dev_set), 1) and len(set(groups.tolist())) == 6
    expected_map, expected_mrr = hand_map_mrr(scores.reshape(-1).tolist(), labels.long().tolist(), groups.tolist())
    assert metrics["map"] == pytest.approx(expected_map) and metrics["mrr"] == pytest.approx(expected_mrr)
    assert metrics["loss"] == pytest.approx(F.binary_cross_entropy_with_logits(scores.reshape(-1), labels).item())
    # the training loss is the summed binary cross-entropy of the one score against the 0/1 label
    batch = task.dev_set.batches(8)[0]
    with torch.no_grad():
        logits = model(batch["tokens"], batch["lengths"], batch["token_types"]).reshape(-1)
        assert task.loss(model, batch).item() == pytest.approx(
            F.binary_cross_entropy_with_logits(logits, batch["labels"], reduction="sum").item())
    # and `hyperplex evaluate` gives the same numbers from the folder
    assert main(["evaluate", str(tmp_path / "m"), "--checkpoint", "last"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert shown["map"] == round(expected_map, 4) and shown["mrr"] == round(expected_mrr, 4)


def test_a_known_score_ordering_gives_the_hand_computed_map_and_mrr(tmp_path, bert_folder):
    # The task's metric on a model whose scores are fixed: question A's correct answer ranked 2nd of 3,
    # question B's two correct answers ranked 1st and 3rd of 3 (C has none and does not count).
    rows = [{"qid": q, "question": "the cat", "answer": a, "label": label} for q, a, label in [
        ("A", "red", 0), ("A", "blue", 1), ("A", "big", 0),
        ("B", "red", 1), ("B", "blue", 0), ("B", "big", 1), ("C", "red", 0), ("C", "big", 0)]]
    path = write_config(tmp_path, bert_folder, "ranking", rows=rows, dev_rows=rows)
    _, task = prepared_task(path, tmp_path)
    score = {"red": 3.0, "blue": 2.0, "big": 1.0}
    vocab = transformers.AutoTokenizer.from_pretrained(bert_folder).get_vocab()

    class Fixed(torch.nn.Module):  # scores the pair by its answer word (the last token before [SEP])
        def __init__(self):
            super().__init__()
            self.unused = torch.nn.Parameter(torch.zeros(1))  # predict() reads the device off a parameter

        def forward(self, tokens, lengths, token_types):
            last = tokens[torch.arange(len(tokens)), lengths - 2]
            return torch.tensor([[score[w] for v in last.tolist() for w in score if vocab[w] == v]]).T

    result = task.validate(Fixed())
    # A: AP = RR = 1/2; B: AP = (1/1 + 2/3) / 2 = 5/6, RR = 1
    assert result["map"] == pytest.approx(100 * (1 / 2 + 5 / 6) / 2)
    assert result["mrr"] == pytest.approx(100 * (1 / 2 + 1) / 2)


# ---------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("task_name", ["pair_classification", "ranking"])
def test_pair_resume_is_bitwise(tmp_path, bert_folder, task_name):
    whole = write_config(tmp_path / "a", bert_folder, task_name, steps=12, dropout=0.1)
    half = write_config(tmp_path / "b", bert_folder, task_name, steps=12, dropout=0.1)
    train(str(whole))
    train(str(half), ["--training.max_steps=6"])
    train(str(half), resume=True)  # the CLI path of --resume
    a = load_checkpoint(tmp_path / "a" / "m" / "last.safetensors")
    b = load_checkpoint(tmp_path / "b" / "m" / "last.safetensors")
    assert_same_training_state(a, b, 12)


@pytest.mark.parametrize("kind", ["phm", "lora"])
def test_adapter_only_pair_checkpoint_reloads_and_reproduces_the_scores(tmp_path, bert_folder, kind):
    if kind == "lora":
        pytest.importorskip("peft")
    path = write_config(tmp_path, bert_folder, "pair_classification", kind=kind)
    trainer = train_with_trainer(path)
    trained_task, trained = trainer.task, trainer.model.eval()
    saved = load_checkpoint(tmp_path / "m" / "best.safetensors").model_state
    trainable = {name for name, p in trained.named_parameters() if p.requires_grad}
    assert set(saved) == trainable | {BASE_KEY}  # adapter + head only (and the base's SHA-256)
    assert sum(saved[k].numel() for k in trainable) < 0.2 * sum(p.numel() for p in trained.parameters())
    _, task, loaded = load_model(tmp_path / "m", "last")
    want = trained_task.predict(trained, trained_task.dev_set)[0]
    got = task.predict(loaded.eval(), task.dev_set)[0]
    assert torch.equal(got, want)
    # `hyperplex params` counts a pair config like a single-text one (adapter + the 2-class head)
    table = params(str(path))
    assert f"| total | {sum(p.numel() for p in trained.parameters() if p.requires_grad):,} |" in table
