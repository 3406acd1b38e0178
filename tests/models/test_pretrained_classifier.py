"""models/pretrained_classifier.py through the one trainer (`pretrained_classifier` on a tiny random BERT): the
frozen base stays bit-identical and only adapter + head change; checkpoints hold only those (+ the base's
SHA-256), reload onto a freshly loaded base with the same outputs, refuse another base, and resume
bit for bit; `full` saves everything; the task encodes with the encoder's own tokenizer; train.log and
`hyperplex params` show the matched counts."""

from __future__ import annotations

import json
import random

import pytest
import torch
import yaml

transformers = pytest.importorskip("transformers")

from conftest import TINY_BERT_WORDS as WORDS
from conftest import assert_same_training_state, write_tiny_bert

from hyperplex.cli.main import main
from hyperplex.config.experiment import load_experiment
from hyperplex.inference.load import load_model
from hyperplex.inference.parameters import params
from hyperplex.models.pretrained_classifier import BASE_KEY, PretrainedClassifier
from hyperplex.tasks import task_class
from hyperplex.train import run
from hyperplex.train.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_into,
    load_model_weights,
)
from hyperplex.train.trainer import Trainer


def tsv(count: int, seed: int) -> str:
    """Sentences of the tiny vocabulary; label 1 when "good" occurs (learnable)."""
    rng = random.Random(seed)
    rows = ["sentence\tlabel"]
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(3, 9))]
        rows.append(" ".join(words) + f"\t{int('good' in words)}")
    return "\n".join(rows) + "\n"


def write_config(folder, bert, kind="phm", steps=12, **adapter):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.tsv").write_text(tsv(96, 1))
    (folder / "dev.tsv").write_text(tsv(32, 2))
    raw = {"name": "tiny_finetune", "seed": 3, "model_dir": str(folder / "m"),
           "data": {"task": "classification", "format": "tsv", "train": str(folder / "train.tsv"),
                    "dev": str(folder / "dev.tsv"), "labels": ["0", "1"]},
           "model": {"architecture": "pretrained_classifier", "path": str(bert), "max_length": 12,
                     "adapter": {"kind": kind, "n": 4, "targets": ["query", "value"], **adapter}},
           "training": {"lr": 1e-2, "batch_size": 16, "max_steps": steps, "validation_every": 6, "log_every": 3,
                        "num_threads": 1, "progress_bar": False, "plots": False, "device": "cpu"}}
    path = folder / "finetune.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def train(path, overrides=None):
    """Train through the Trainer (as `hyperplex train` does) and return it: its model is the trained one."""
    cfg = load_experiment(path, overrides)
    trainer = Trainer(cfg, task_class(cfg.data.task), cfg.model_dir, None)
    try:
        trainer.train()
    finally:
        import logging

        for handler in list(logging.getLogger("hyperplex").handlers):
            logging.getLogger("hyperplex").removeHandler(handler)
            handler.close()
    return trainer


def fresh_model(path, **adapter):
    cfg = load_experiment(path)
    for key, value in adapter.items():
        setattr(cfg.model.adapter, key, value)
    torch.manual_seed(0)
    return PretrainedClassifier(cfg.model, 0, 2)


@pytest.mark.parametrize("kind", ["phm", "lora", "lokr", "none"])
def test_only_adapter_and_head_change_and_checkpoints_hold_only_them(tmp_path, bert_folder, kind):
    if kind in ("lora", "lokr"):
        pytest.importorskip("peft")
    path = write_config(tmp_path, bert_folder, kind)
    trainer = train(path)
    trained, initial = trainer.model, fresh_model(path)
    # fresh_model's seed differs from the run's, but the frozen base is the same loaded weights
    before = dict(initial.named_parameters())
    trainable = {name for name, p in trained.named_parameters() if p.requires_grad}
    for name, param in trained.named_parameters():
        if name not in trainable:
            assert torch.equal(param, before[name]), name  # the frozen base: bit-identical after training
    assert any(name.startswith("head.") for name in trainable)
    torch.manual_seed(3)  # the run's seed: the adapter/head the run started from
    run_start = PretrainedClassifier(load_experiment(path).model, 25, 2)
    start = dict(run_start.named_parameters())
    changed = {name for name in trainable if not torch.equal(dict(trained.named_parameters())[name], start[name])}
    assert "head.weight" in changed and (kind == "none" or len(changed) > 2)
    # the checkpoint holds exactly the trainable tensors and the base's signature
    last = load_checkpoint(tmp_path / "m" / "last.safetensors")
    assert set(last.model_state) == trainable | {BASE_KEY}
    assert bytes(last.model_state[BASE_KEY].tolist()).hex() == trained.base_sha256
    saved = sum(t.numel() for k, t in last.model_state.items() if k != BASE_KEY)
    total = sum(p.numel() for p in trained.parameters())
    assert saved == sum(trained.get_parameter(k).numel() for k in trainable) and saved < 0.1 * total
    log = (tmp_path / "m" / "train.log").read_text()
    assert "fine-tuning: " in log and f"trainable {saved:,} of {total:,}" in log


@pytest.mark.parametrize("kind", ["phm", "lora", "full"])
def test_a_saved_run_reloads_onto_a_fresh_base_and_evaluate_agrees(tmp_path, bert_folder, kind, capsys):
    if kind == "lora":
        pytest.importorskip("peft")
    path = write_config(tmp_path, bert_folder, kind)
    trainer = train(path)
    trained = trainer.model.eval()
    _, task, loaded = load_model(tmp_path / "m", "last")  # base rebuilt from model.path, adapter loaded
    batch = task.dev_set.batches(32)[0]
    with torch.no_grad():
        assert torch.equal(loaded(batch["tokens"], batch["lengths"]), trained(batch["tokens"], batch["lengths"]))
    assert main(["evaluate", str(tmp_path / "m"), "--checkpoint", "last"]) == 0
    shown = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    with torch.no_grad():
        expected = task.validate(trained)
    assert shown["accuracy"] == round(expected["accuracy"], 4) and shown["loss"] == round(expected["loss"], 4)
    keys = set(load_model_weights(tmp_path / "m" / "last.safetensors"))
    if kind == "full":  # full fine-tuning saves everything
        assert keys == set(trained.state_dict()) and BASE_KEY not in keys


def model_bytes(path) -> int:
    """Bytes of the model tensors a checkpoint holds (its header, RNG and optimizer state aside)."""
    return sum(t.numel() * t.element_size() for t in load_model_weights(path).values())


def test_adapter_checkpoint_is_much_smaller_than_the_model(tmp_path, bert_folder):
    adapter = train(write_config(tmp_path / "a", bert_folder, "phm", rank=1))
    full = train(write_config(tmp_path / "f", bert_folder, "full"))
    small, big = (model_bytes(tmp_path / "a" / "m" / "best.safetensors"),
                  model_bytes(tmp_path / "f" / "m" / "best.safetensors"))
    trainable = 4 * sum(p.numel() for p in adapter.model.parameters() if p.requires_grad)
    assert big == sum(t.numel() * t.element_size() for t in full.model.state_dict().values())  # full: everything
    assert small == trainable + 32  # the adapter + head in float32 and the 32-byte SHA-256 of the base
    assert small < big / 30
    # with the optimizer state (Adam's two moments per trained value) the resumable file stays small too
    last_small = (tmp_path / "a" / "m" / "last.safetensors").stat().st_size
    assert last_small < (tmp_path / "f" / "m" / "last.safetensors").stat().st_size / 4


def test_a_checkpoint_refuses_another_base(tmp_path, bert_folder):
    path = write_config(tmp_path, bert_folder, "phm")
    train(path)
    other = tmp_path / "other_bert"
    other.mkdir()
    write_tiny_bert(other)
    with torch.no_grad():  # the same architecture and shapes, one weight different
        model = transformers.AutoModel.from_pretrained(other)
        model.encoder.layer[0].attention.self.query.weight[0, 0] += 1.0
        model.save_pretrained(other)
    cfg = load_experiment(path, [f"--model.path={other}"])
    different = PretrainedClassifier(cfg.model, 0, 2)
    last = tmp_path / "m" / "last.safetensors"
    with pytest.raises(CheckpointError, match=r"last\.safetensors: an adapter-only checkpoint trained on another "
                                              r"base model: .*model\.path"):
        load_into(different, load_model_weights(last), last)
    same = fresh_model(path)
    load_into(same, load_model_weights(last), last)  # the right base loads


@pytest.mark.parametrize("kind", ["phm", "lora"])
def test_resume_is_bitwise(tmp_path, bert_folder, kind):
    if kind == "lora":
        pytest.importorskip("peft")
    whole = write_config(tmp_path / "a", bert_folder, kind, steps=12, dropout=0.1)
    half = write_config(tmp_path / "b", bert_folder, kind, steps=12, dropout=0.1)
    train(whole)
    train(half, ["--training.max_steps=6"])
    run.train(str(half), resume=True)  # the CLI path of --resume
    a = load_checkpoint(tmp_path / "a" / "m" / "last.safetensors")
    b = load_checkpoint(tmp_path / "b" / "m" / "last.safetensors")
    assert_same_training_state(a, b, 12)


def test_the_task_encodes_with_the_encoder_s_own_tokenizer(tmp_path, bert_folder):
    path = write_config(tmp_path, bert_folder, "none")
    cfg = load_experiment(path, ["--model.max_length=8"])
    task = task_class("classification")(cfg, tmp_path / "m", None)
    (tmp_path / "m").mkdir()
    task.prepare(fresh=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(bert_folder)
    texts = [line.split("\t")[0] for line in tsv(96, 1).splitlines()[1:]]
    assert [list(t) for t in task.train_set.token_ids] == [tokenizer(t, truncation=True, max_length=8)["input_ids"]
                                                           for t in texts]
    assert max(len(t) for t in task.train_set.token_ids) == 8  # cut at model.max_length, [SEP] kept
    assert max(len(t.split()) for t in texts) + 2 > 8  # some texts were cut
    assert all(t[0] == tokenizer.cls_token_id and t[-1] == tokenizer.sep_token_id for t in task.train_set.token_ids)
    assert list((tmp_path / "m").iterdir()) == []  # no vocabulary files: rebuilt from model.path
    assert task.metadata()["tokenizer"] == "model" and task.metadata()["vocab_size"] == len(tokenizer)


def test_params_shows_the_matched_counts(tmp_path, bert_folder):
    pytest.importorskip("peft")
    path = write_config(tmp_path, bert_folder, "phm")
    phm = params(str(path))
    lora = params(str(path), ["--model.adapter.kind=lora"])
    assert "fine-tuning: PHM n=4, full Sᵢ adapter on 4 layers" in phm and "1,280 adapter parameters" in phm
    # 4 layers of 32 × 32: PHM n=4 has 4·(32·32/4 + 64) = 1,280; LoRA r=5 has 4·5·64 = 1,280
    assert "peft LoRA r=5 (alpha 5) on 4 layers" in lora
    assert "matched to the PHM n=4, full Sᵢ adapter on the same layers: 1,280 (+0.00%" in lora
    assert "| total | 1,346 |" in lora  # 1,280 + the head's 2·32 + 2


def test_bad_config_names_the_key(tmp_path, bert_folder, capsys):
    path = write_config(tmp_path, bert_folder, "phm")
    assert main(["train", str(path), "--model.adapter.kind=lorra"]) == 1
    assert "model.adapter.kind: 'lorra' is not one of" in capsys.readouterr().err
    assert main(["train", str(path), "--model.adapter.targets=[nothing]"]) == 1
    assert "model.adapter.targets: pattern 'nothing' matches no nn.Linear/Conv1D module" in capsys.readouterr().err
    assert main(["train", str(path), "--model.adapter.n=5"]) == 1
    assert "model.adapter.n=5 must divide in and out features of every target layer" in capsys.readouterr().err
    assert main(["train", str(path), "--model.max_length=64"]) == 1
    assert "model.max_length 64 exceeds the encoder's 32 positions" in capsys.readouterr().err
    assert not (tmp_path / "m" / "last.safetensors").exists()
