"""The data side of the distillation task: the training file is streamed (an index of line offsets and
batches tokenised on demand), and training sentences equal to dev or evaluation sentences after
tokenizer-style normalisation are dropped and counted, or refused under data.leak_check: error."""

from __future__ import annotations

import gzip
import json
import logging
import random

import pytest
import torch
import yaml

pytest.importorskip("sentence_transformers")
pytest.importorskip("transformers")

from conftest import tiny_sentences

from hyperplex.config.experiment import load_experiment
from hyperplex.data.lines import LazyBatches, LineIndex
from hyperplex.data.readers import DataError
from hyperplex.tasks import build_task

sentences = tiny_sentences  # 3–8 words from the tiny BERT's vocabulary; teacher_folder: tests/conftest.py


def task_for(tmp_path, teacher, train: list[str], dev: list[str] | None, bucket: bool = False, **data):
    train_file = tmp_path / "train.txt.gz"
    train_file.write_bytes(gzip.compress(("\n".join(train) + "\n").encode()))
    raw_data = {"task": "distillation", "train": str(train_file), **data}
    if dev is not None:
        (tmp_path / "dev.txt").write_text("\n".join(dev) + "\n")
        raw_data["dev"] = str(tmp_path / "dev.txt")
    raw = {"name": "stream", "seed": 3, "model_dir": str(tmp_path / "m"), "data": raw_data,
           "model": {"architecture": "pretrained_student", "path": str(teacher), "kind": "none"},
           "training": {"batch_size": 4, "max_steps": 5, "num_threads": 1, "progress_bar": False, "plots": False,
                        "device": "cpu", "bucket": bucket}}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(raw))
    cfg = load_experiment(path)
    return build_task(cfg, cfg.model_dir, None, logging.getLogger("test_distillation_data"))


def test_the_corpus_is_streamed_and_batches_are_the_eager_ones(tmp_path, teacher_folder):
    """training.bucket false: the shuffled order cut into consecutive batches."""
    train = sentences(30, 1)
    task = task_for(tmp_path, teacher_folder, train, sentences(5, 2))
    task.prepare(fresh=True)
    assert isinstance(task.train_set, LineIndex) and list(task.train_set) == train
    batches = task.train_batches(1)
    assert isinstance(batches, LazyBatches) and len(batches) == 8 and task.train_batches(1) is batches
    # the order of the eager implementation: positions shuffled by Random(seed * 1_000_003 + epoch)
    order = list(range(30))
    random.Random(3 * 1_000_003 + 1).shuffle(order)
    eager = [task._batch([train[i] for i in order[k:k + 4]], order[k:k + 4]) for k in range(0, 30, 4)]
    for lazy, expected in zip(batches[0:8], eager):
        assert lazy.indices == expected.indices and torch.equal(lazy["input_ids"], expected["input_ids"])
    assert [b.num_tokens for b in batches[:]] == [4] * 7 + [2]
    assert [i for b in task.train_batches(2) for i in b.indices] != order  # another epoch, another order


def test_bucketed_batches_hold_similar_lengths(tmp_path, teacher_folder):
    """training.bucket (the default): every sentence once per epoch, in make_batches' length-sorted pools
    (bytes of the line), the batch order shuffled; less padding than the same sentences unbucketed."""
    from hyperplex.data.batching import make_batches

    train = sentences(30, 1, low=1, high=12)
    task = task_for(tmp_path, teacher_folder, train, sentences(5, 2), bucket=True)
    task.prepare(fresh=True)
    batches = task.train_batches(1)
    assert list(task.train_set.byte_lengths()) == [len(s.encode()) for s in train]
    expected = make_batches([len(s.encode()) for s in train], 4, shuffle=True, seed=3, epoch=1)
    assert [b.indices for b in batches[:]] == expected
    assert sorted(i for b in batches[:] for i in b.indices) == list(range(30))
    # one pool holds the whole epoch here: the batches, in length order, partition the sorted sentences
    ordered = sorted(batches[:], key=lambda b: min(len(train[i].encode()) for i in b.indices))
    spans = [(min(len(train[i].encode()) for i in b.indices), max(len(train[i].encode()) for i in b.indices))
             for b in ordered]
    assert all(high <= low_next for (_, high), (low_next, _) in zip(spans, spans[1:]))
    padded = sum(b["input_ids"].numel() for b in batches[:])
    (tmp_path / "plain").mkdir()
    unbucketed = task_for(tmp_path / "plain", teacher_folder, train, sentences(5, 2))
    unbucketed.prepare(fresh=True)
    assert padded < sum(b["input_ids"].numel() for b in unbucketed.train_batches(1)[:])
    assert [b.indices for b in task.train_batches(2)] != expected  # another epoch, another order


def test_dev_sentences_are_dropped_after_normalising(tmp_path, teacher_folder, caplog):
    dev = ["the cat sat on the mat", "a dog runs"]
    train = ["THE cat  sat on the MAT", "the cat sat on the mat .", "a big dog", "  A Dog   Runs ", "red film"]
    task = task_for(tmp_path, teacher_folder, train, dev)
    with caplog.at_level(logging.INFO, logger="test_distillation_data"):
        task.prepare(fresh=True)
    # the upper-cased and the space-doubled copies go; a copy with a full stop is another sentence
    assert list(task.train_set) == ["the cat sat on the mat .", "a big dog", "red film"]
    assert "dropped 2 training sentence(s) equal to a dev or evaluation sentence" in caplog.text
    assert "2 of data.dev" in caplog.text


def test_exclude_files_and_a_carved_dev_split(tmp_path, teacher_folder, caplog):
    wikiqa = tmp_path / "eval.jsonl"
    wikiqa.write_text(json.dumps({"qid": 1, "question": "Is the film good ?", "answer": "a very bad film",
                                  "label": 1}) + "\n")
    sst = tmp_path / "eval.tsv"
    sst.write_text("sentence\tlabel\nsmall red cat \t1\n")
    train = sentences(20, 5) + ["is the film good?", "A very bad film", "Small red CAT"]
    task = task_for(tmp_path, teacher_folder, train, None, dev_fraction=0.2, exclude=[str(wikiqa), str(sst)])
    with caplog.at_level(logging.INFO, logger="test_distillation_data"):
        task.prepare(fresh=True)
    kept = list(task.train_set)
    assert not {"is the film good?", "A very bad film", "Small red CAT"} & set(kept)
    assert len(task.dev_set) == 5 and not set(task.dev_set) & set(kept)
    # the carve comes first: an evaluation sentence carved into dev is not in train to be dropped
    from_wikiqa = len({"is the film good?", "A very bad film"} - set(task.dev_set))
    from_sst = len({"Small red CAT"} - set(task.dev_set))
    assert from_wikiqa + from_sst >= 1 and len(kept) == 23 - 5 - from_wikiqa - from_sst
    assert (f"{from_wikiqa} of data.exclude {wikiqa}" in caplog.text) == bool(from_wikiqa)
    assert (f"{from_sst} of data.exclude {sst}" in caplog.text) == bool(from_sst)


def test_strict_leak_check_names_the_file_and_line(tmp_path, teacher_folder):
    train = ["a good film", "the dog is fast", "The  DOG is fast", "red mat"]
    task = task_for(tmp_path, teacher_folder, train, ["the dog is FAST"], leak_check="error")
    with pytest.raises(DataError, match=r"train\.txt\.gz, line 2: 'the dog is fast' is an evaluation sentence "
                                        r"\(it occurs in data\.dev .*dev\.txt"):
        task.prepare(fresh=True)
    clean = task_for(tmp_path, teacher_folder, ["a good film", "red mat"], ["the dog is fast"], leak_check="error")
    clean.prepare(fresh=True)
    assert list(clean.train_set) == ["a good film", "red mat"]


def test_an_all_held_out_corpus_and_a_missing_exclude_file(tmp_path, teacher_folder):
    task = task_for(tmp_path, teacher_folder, ["a dog runs", "A DOG RUNS"], ["a dog runs"])
    with pytest.raises(DataError, match="every sentence of .*train.txt.gz is a dev or evaluation sentence"):
        task.prepare(fresh=True)
    task = task_for(tmp_path, teacher_folder, ["a dog runs"], ["red mat"], exclude=["missing.jsonl"])
    with pytest.raises(DataError, match=r"data\.exclude\[0\]: file not found: missing\.jsonl"):
        task.prepare(fresh=True)


def test_compress_refuses_a_leaking_corpus_before_training(tmp_path, teacher_folder, capsys):
    from hyperplex.cli.main import main

    task_for(tmp_path, teacher_folder, ["a good film", "Red  MAT", "the dog is fast"], ["red mat"],
             leak_check="error")
    assert main(["compress", str(tmp_path / "c.yaml")]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "train.txt.gz, line 2: 'Red  MAT' is an evaluation sentence" in err[0]
    assert not (tmp_path / "m").exists()  # the folder the run created is gone again, its log and lock included


def test_max_train_examples_is_a_seeded_subset_in_file_order(tmp_path, teacher_folder):
    train = sentences(40, 7)
    task = task_for(tmp_path, teacher_folder, train, ["red mat"], max_train_examples=10)
    task.prepare(fresh=True)
    kept = list(task.train_set)
    chosen = sorted(random.Random(3 + 7919).sample(range(40), 10))  # tasks.common.subset with seed 3
    assert kept == [train[i] for i in chosen] and len(task.train_batches(1)) == 3
