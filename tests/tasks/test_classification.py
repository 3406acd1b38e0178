"""Each classification task overfits a tiny generated dataset through the real trainer (train = dev),
so data reading, label mapping, batching, loss and metrics are exercised end to end."""

import gzip
import json
import random

import pytest
import yaml

from hyperplex.inference.verbs import evaluate
from hyperplex.train.run import train

WORDS = "the a cat dog bird runs sits sees big small red blue".split()


def train_and_evaluate(tmp_path, data: dict, model: dict, steps: int = 60, lr: float = 5e-3,
                       log_every: int = 1000) -> dict:
    cfg = {"name": "toy", "seed": 1, "data": {"tokenizer": "word", **data}, "model": model,
           "training": {"lr": lr, "batch_size": 16, "max_steps": steps, "max_epochs": 1000, "validation_every": steps,
                        "num_threads": 1, "progress_bar": False, "plots": False, "log_every": log_every},
           "testing": {"batch_size": 64}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    train(str(path), model_dir=str(tmp_path / "model"))
    return evaluate(str(tmp_path / "model"))


TINY_TRANSFORMER = {"architecture": "transformer_classifier", "d_model": 16, "num_heads": 2, "d_ff": 32,
                    "encoder_layers": 1, "decoder_layers": 0, "dropout": 0.0}


def write_sentiment_tsv(tmp_path) -> dict:
    """32 generated sentences, the label carried by one word; train = dev. Returns the data section."""
    rng = random.Random(0)
    rows = []
    for i in range(32):
        label = i % 2
        words = rng.sample(WORDS, 3) + ["good" if label else "bad"]
        rng.shuffle(words)
        rows.append(f"{' '.join(words)}\t{label}")
    (tmp_path / "train.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    return {"task": "classification", "format": "tsv", "train": str(tmp_path / "train.tsv"),
            "dev": str(tmp_path / "train.tsv"), "labels": ["0", "1"]}


@pytest.mark.parametrize("linear", [{"kind": "dense"}, {"kind": "phm", "n": 4}, {"kind": "quaternion"}])
def test_sentiment_tsv_overfits(tmp_path, linear):
    metrics = train_and_evaluate(tmp_path, write_sentiment_tsv(tmp_path), {**TINY_TRANSFORMER, "linear": linear})
    assert metrics["accuracy"] == 100.0


def test_throughput_log_counts_examples_not_tokens(tmp_path):
    # the loss normaliser of a classification batch is its number of examples: the log must say so
    train_and_evaluate(tmp_path, write_sentiment_tsv(tmp_path), TINY_TRANSFORMER, steps=4, log_every=2)
    lines = [line for line in (tmp_path / "model" / "train.log").read_text().splitlines() if ": loss " in line]
    assert len(lines) == 2 and all(line.endswith(" examples/s") for line in lines), lines


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
    flipped = [("VBZ" if line.startswith("VBP") else "VBP") + line[3:] for line in lines[:4]]
    (tmp_path / "flipped.txt").write_text("\n".join(flipped) + "\n")
    other = evaluate(str(tmp_path / "model"), split=str(tmp_path / "flipped.txt"))
    assert other["accuracy"] == 0.0
    with pytest.raises(ValueError, match="flipped2.txt, line 1: .*'VBX'"):
        (tmp_path / "flipped2.txt").write_text("VBX\tthe dog\n")
        evaluate(str(tmp_path / "model"), split=str(tmp_path / "flipped2.txt"))


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


# ---------------------------------------------------------------------------- carving the validation split
def _carving_task(tmp_path, lines, seed, split_seed=None, carve="random", fraction=0.25, model_dir="m", **extra):
    """A classification task over ``lines`` whose labels are the line numbers, so the labels of its
    validation set say which lines were carved."""
    from hyperplex.config.experiment import build_experiment
    from hyperplex.tasks import build_task

    path = tmp_path / "lines.tsv"
    path.write_text("sentence\tlabel\n" + "".join(f"{t}\t{i}\n" for i, t in enumerate(lines)))
    data = {"task": "classification", "format": "tsv", "train": str(path), "dev_fraction": fraction,
            "labels": [str(i) for i in range(len(lines))], "carve": carve, **extra}
    if split_seed is not None:
        data["split_seed"] = split_seed
    cfg = build_experiment({"seed": seed, "model_dir": str(tmp_path / model_dir), "data": data,
                            "model": {**TINY_TRANSFORMER, "linear": {"kind": "dense"}}, "training": {"max_steps": 1}})
    (tmp_path / model_dir).mkdir(exist_ok=True)
    return build_task(cfg, tmp_path / model_dir, None)


def _lines_of(dataset) -> list[int]:
    return sorted(int(i) for i in dataset.labels.tolist())


LINES = [f"the cat {w} sees" for w in WORDS] * 3  # 36 lines, carve 25% = 9


def test_split_seed_fixes_the_carve_whatever_the_model_seed(tmp_path):
    from hyperplex.tasks.common import carve_random

    dev = {}
    for seed, split_seed in ((1, None), (2, None), (3, 1), (2, 2)):
        task = _carving_task(tmp_path, LINES, seed, split_seed, model_dir=f"m{seed}_{split_seed}")
        task.prepare(fresh=True)
        dev[seed, split_seed] = _lines_of(task.dev_set)
        assert len(task.dev_set) == 9 and len(task.train_set) == 27
        assert sorted(_lines_of(task.train_set) + dev[seed, split_seed]) == list(range(36))
    # default split_seed = 1: model seeds 1, 2 and 3 share one split ...
    assert dev[1, None] == dev[2, None] == dev[3, 1]
    # ... bit-identical to carving with seed 1 (carve_random), as a config without data.split_seed carves
    assert dev[1, None] == sorted(carve_random(list(range(36)), 0.25, 1)[1])
    assert dev[2, 2] != dev[1, None]  # and another split_seed gives another split


def test_folder_saved_before_split_seed_keeps_its_seed_carve(tmp_path):
    from hyperplex.tasks.common import carve_random

    first = _carving_task(tmp_path, LINES, seed=2, split_seed=2)
    first.prepare(fresh=True)  # writes the vocabulary into the folder
    (tmp_path / "m" / "config.yaml").write_text(yaml.safe_dump({"seed": 2, "data": {"dev_fraction": 0.25}}))
    old = _carving_task(tmp_path, LINES, seed=2)  # split_seed defaults to 1, but the folder predates it
    old.prepare(fresh=False)
    assert _lines_of(old.dev_set) == sorted(carve_random(list(range(36)), 0.25, 2)[1]) == _lines_of(first.dev_set)
    (tmp_path / "m" / "config.yaml").write_text(yaml.safe_dump({"seed": 2, "data": {"split_seed": 1}}))
    new = _carving_task(tmp_path, LINES, seed=2)
    new.prepare(fresh=False)
    assert _lines_of(new.dev_set) == sorted(carve_random(list(range(36)), 0.25, 1)[1])


def test_carve_grouped_keeps_every_copy_of_a_text_and_every_hypothesis_of_a_premise_on_one_side(tmp_path):
    """``data.carve: grouped`` holds out whole groups of examples sharing their first text (25% of the 12 texts here,
    each 3 times: 9 lines); ``random`` puts copies of a validation text into training. For a pair task the group is
    the premise: every hypothesis of a held-out premise is held out with it."""
    from hyperplex.config.experiment import build_experiment
    from hyperplex.tasks import build_task

    grouped = _carving_task(tmp_path, LINES, seed=1, split_seed=2, carve="grouped", model_dir="g")
    grouped.prepare(fresh=True)
    dev, train = _lines_of(grouped.dev_set), _lines_of(grouped.train_set)
    assert len(dev) == 9 and sorted(dev + train) == list(range(36))
    assert not {LINES[i] for i in dev} & {LINES[i] for i in train}
    again = _carving_task(tmp_path, LINES, seed=7, split_seed=2, carve="grouped", model_dir="g2")
    again.prepare(fresh=True)
    assert _lines_of(again.dev_set) == dev  # the split_seed's split, whatever the model seed
    shared = _carving_task(tmp_path, LINES, seed=1, split_seed=2, carve="random", model_dir="r")
    shared.prepare(fresh=True)
    assert {LINES[i] for i in _lines_of(shared.dev_set)} & {LINES[i] for i in _lines_of(shared.train_set)}

    records = [{"premise": f"premise {p}", "hypothesis": f"hypothesis {p} {h}", "label": label}
               for p in range(8) for h, label in enumerate(["entailment", "neutral", "contradiction"])]
    path = tmp_path / "nli.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = build_experiment({"seed": 1, "model_dir": str(tmp_path / "nli"), "training": {"max_steps": 1},
                            "data": {"task": "pair_classification", "format": "jsonl", "train": str(path),
                                     "dev_fraction": 0.25, "carve": "grouped",
                                     "labels": ["entailment", "neutral", "contradiction"]},
                            "model": {"architecture": "decomposable_attention", "embedding_dim": 8,
                                      "hidden_size": 8, "dropout": 0.0}})
    (tmp_path / "nli").mkdir()
    task = build_task(cfg, tmp_path / "nli", None)
    train, held = task._carve([{**task._record(r), "label": r["label"]} for r in records], 1)
    assert len(held) == 6 and len(train) == 18  # 2 of the 8 premises, with their 3 hypotheses each
    assert not {r["a"] for r in held} & {r["a"] for r in train}


def test_carve_sentences_through_the_task(tmp_path, caplog):
    import logging

    from hyperplex.data.phrases import carve_sentences

    texts = ["When are bears bears and", "bears bears", "bears", "a fine film", "fine film", "film", "bear",
             "it is dull", "when are bears bears and", "is dull"]
    task = _carving_task(tmp_path, texts, seed=5, split_seed=3, carve="sentences", fraction=0.25, lowercase=True)
    with caplog.at_level(logging.INFO, logger="hyperplex"):
        task.prepare(fresh=True)
    expected = carve_sentences([t.lower() for t in texts], 0.25, 3)  # lowercased: lines 0 and 8 are one sentence
    assert _lines_of(task.dev_set) == expected.dev and _lines_of(task.train_set) == expected.train
    counts = task.metadata()["carve"]
    assert counts == {"texts": 10, "sentences": 4, "validation": 1, "dropped_from_training": expected.dropped,
                      "training": len(expected.train)}
    assert f"{expected.dropped} texts dropped from training" in caplog.text and "split_seed 3" in caplog.text
