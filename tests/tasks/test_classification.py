"""Each classification task overfits a tiny generated dataset through the real trainer (train = dev),
so data reading, label mapping, batching, loss and metrics are exercised end to end."""

import gzip
import json
import random

import pytest
import yaml

from hyperplex import runner

WORDS = "the a cat dog bird runs sits sees big small red blue".split()


def train_and_evaluate(tmp_path, data: dict, model: dict, steps: int = 60, lr: float = 5e-3) -> dict:
    cfg = {"name": "toy", "seed": 1, "data": {"tokenizer": "word", **data}, "model": model,
           "training": {"lr": lr, "batch_size": 16, "max_steps": steps, "max_epochs": 1000, "validation_every": steps,
                        "num_threads": 1, "progress_bar": False, "plots": False, "log_every": 1000},
           "testing": {"batch_size": 64}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    runner.train(str(path), model_dir=str(tmp_path / "model"))
    return runner.evaluate(str(tmp_path / "model"))


TINY_TRANSFORMER = {"architecture": "transformer_classifier", "d_model": 16, "num_heads": 2, "d_ff": 32,
                    "encoder_layers": 1, "decoder_layers": 0, "dropout": 0.0}


@pytest.mark.parametrize("linear", [{"kind": "dense"}, {"kind": "phm", "n": 4}, {"kind": "quaternion"}])
def test_sentiment_tsv_overfits(tmp_path, linear):
    rng = random.Random(0)
    rows = []
    for i in range(32):
        label = i % 2
        words = rng.sample(WORDS, 3) + ["good" if label else "bad"]
        rng.shuffle(words)
        rows.append(f"{' '.join(words)}\t{label}")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    data = {"task": "classification", "format": "tsv", "train": str(tmp_path / "train.tsv"),
            "dev": str(tmp_path / "train.tsv"), "labels": ["0", "1"]}
    metrics = train_and_evaluate(tmp_path, data, {**TINY_TRANSFORMER, "linear": linear})
    assert metrics["accuracy"] == 100.0


def test_agreement_overfits(tmp_path):
    rng = random.Random(1)
    lines = []
    for _ in range(32):
        plural = rng.random() < 0.5
        subject = rng.choice(["dog", "cat", "bird"]) + ("s" if plural else "")
        lines.append(f"{'VBP' if plural else 'VBZ'}\tthe {rng.choice(['big', 'small'])} {subject} near the "
                     f"{rng.choice(['tree', 'trees', 'house'])}")
    with gzip.open(tmp_path / "numpred.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    data = {"task": "classification", "format": "agreement", "train": str(tmp_path / "numpred.gz"),
            "dev": str(tmp_path / "numpred.gz"), "labels": ["VBZ", "VBP"]}
    metrics = train_and_evaluate(tmp_path, data, {**TINY_TRANSFORMER, "linear": {"kind": "phm", "n": 2}})
    assert metrics["accuracy"] == 100.0
    # Another file in the same format (e.g. numpred.test.1, one attractor each) scores through --split FILE:
    # here the first 4 lines with their labels flipped, so the overfitted model gets exactly 0%.
    flipped = [("VBZ" if l.startswith("VBP") else "VBP") + l[3:] for l in lines[:4]]
    (tmp_path / "flipped.txt").write_text("\n".join(flipped) + "\n")
    other = runner.evaluate(str(tmp_path / "model"), split=str(tmp_path / "flipped.txt"))
    assert other["accuracy"] == 0.0
    with pytest.raises(ValueError, match="flipped2.txt, line 1: .*'VBX'"):
        (tmp_path / "flipped2.txt").write_text("VBX\tthe dog\n")
        runner.evaluate(str(tmp_path / "model"), split=str(tmp_path / "flipped2.txt"))


def nli_records(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    records = []
    for i in range(n):
        premise = rng.sample(WORDS, 4)
        kind = ["entailment", "neutral", "contradiction"][i % 3]
        if kind == "entailment":
            hypothesis = list(premise)
        elif kind == "neutral":
            hypothesis = premise[:2] + ["maybe", "perhaps"]
        else:
            hypothesis = ["no", "never", "nothing", "none"]
        records.append({"premise": " ".join(premise), "hypothesis": " ".join(hypothesis), "label": kind})
    return records


@pytest.mark.parametrize("model", [
    {"architecture": "decomposable_attention", "embedding_dim": 16, "hidden_size": 16, "dropout": 0.0},
    {"architecture": "quaternion_attention", "embedding_dim": 16, "hidden_size": 16, "dropout": 0.0},
    {"architecture": "nli_encoder", "embedding_dim": 16, "hidden_size": 16, "mlp_dim": 16, "dropout": 0.0,
     "linear": {"kind": "phm", "n": 2}},
], ids=lambda m: m["architecture"])
def test_nli_jsonl_overfits(tmp_path, model):
    path = tmp_path / "nli.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in nli_records(30, 2)))
    data = {"task": "pair_classification", "format": "jsonl", "train": str(path), "dev": str(path),
            "labels": ["entailment", "neutral", "contradiction"]}
    metrics = train_and_evaluate(tmp_path, data, model)
    assert metrics["accuracy"] == 100.0


def test_ranking_overfits_to_perfect_map_and_mrr(tmp_path):
    rng = random.Random(3)
    records = []
    for q in range(10):
        topic = WORDS[q]
        answers = [[topic] + rng.sample(WORDS, 2)] + [rng.sample([w for w in WORDS if w != topic], 3) for _ in range(3)]
        rng.shuffle(answers)
        for answer in answers:
            records.append({"qid": f"q{q}", "question": f"what about {topic}", "answer": " ".join(answer),
                            "label": int(topic in answer)})
    path = tmp_path / "qa.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    data = {"task": "ranking", "format": "jsonl", "train": str(path), "dev": str(path), "a_field": "question",
            "b_field": "answer"}
    model = {"architecture": "decomposable_attention", "embedding_dim": 16, "hidden_size": 16, "dropout": 0.0}
    metrics = train_and_evaluate(tmp_path, data, model, steps=80)
    assert metrics["map"] == 100.0 and metrics["mrr"] == 100.0
