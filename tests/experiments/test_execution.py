"""hyperplex.experiments.execution and the plan loop: finished models are skipped, a diverged sweep model is a
result (recorded, not retried), a signal stops the whole plan and --resume continues it."""

import json

from hyperplex.experiments.cli import main
from hyperplex.experiments.state import DIVERGED_FILE


def test_sweep_records_divergence_and_plots(tmp_path, monkeypatch, capsys, sweep_plan):
    from hyperplex.train import run
    from hyperplex.train.trainer import DivergedError

    real_train = run.train

    def train(config, overrides, model_dir, data_root, resume=False):
        if "--training.lr=0.003" in overrides:  # this rate "diverges": the trainer's NaN error
            raise DivergedError("loss became nan at step 5 (epoch 1, batch 5); training stopped")
        return real_train(config, overrides, model_dir, data_root, resume=resume)

    monkeypatch.setattr(run, "train", train)
    plan, out = sweep_plan(tmp_path), tmp_path / "out"
    assert main([str(plan), "--out", str(out)]) == 0  # a diverged sweep run is a result, not a failure
    marker = json.loads((out / "phm2_lr0.003" / "seed1" / DIVERGED_FILE).read_text())
    assert marker["step"] == 5 and "nan" in marker["message"]
    results = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in results["rows"]}
    assert rows["phm2_lr0.003"]["runs"][0]["status"] == "diverged"
    assert rows["phm2_lr0.003"]["runs"][0]["stability"]["diverged"] is True
    ok = rows["phm2_lr0.001"]["runs"][0]["stability"]
    assert ok["nan_step"] is None and ok["grad_norm_median"] > 0 and ok["grad_norm_max"] >= ok["grad_norm_median"]
    assert "stability" not in rows["dense"]["runs"][0]  # not a sweep row
    text = (out / "results.md").read_text()
    assert "Sweep over `training.lr`" in text and "| PHM n=2 | " in text and "0/1" not in text
    assert "(0), 1/1 diverged" in text and "diverged (non-finite loss at step 5)" in text
    png = out / "sweep-training.lr.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    records = tmp_path / "records"  # the records' results.md names the plot too: it is written beside it
    assert main([str(plan), "--out", str(out), "--report-only", "--records", str(records)]) == 0
    assert (records / "sweep-training.lr.png").read_bytes() == png.read_bytes()
    # a diverged model is not trained again
    assert main([str(plan), "--out", str(out), "--rows", "phm2"]) == 0
    assert "diverged already, skipped" in capsys.readouterr().err


def test_a_model_of_any_row_whose_loss_becomes_nan_is_recorded_as_diverged(tmp_path, monkeypatch, capsys,
                                                                           write_plan):
    """Not only in a sweep: a NaN loss (the trainer's own check, DivergedError) is recorded in diverged.json, the
    plan goes on with its other models and exits 0, the report names the seed, and a rerun does not retrain it."""
    from hyperplex.tasks.translation import TranslationTask
    from hyperplex.train import run

    real_train, real_loss, calls = run.train, TranslationTask.loss, []

    def train(config, overrides, model_dir, data_root, resume=False):
        calls.append(model_dir)
        return real_train(config, overrides, model_dir, data_root, resume=resume)

    def loss(self, model, batch):
        value = real_loss(self, model, batch)
        return value * float("nan") if len(calls) == 2 else value  # the second model's every step

    monkeypatch.setattr(run, "train", train)
    monkeypatch.setattr(TranslationTask, "loss", loss)
    plan, out = write_plan(tmp_path, rows=[{"name": "dense", "label": "Dense", "config": "tiny.yaml",
                                            "overrides": ["--model.linear.kind=dense"]}]), tmp_path / "out"
    assert main([str(plan), "--out", str(out)]) == 0
    assert "diverged (a non-finite loss or validation metric): recorded in" in capsys.readouterr().err
    marker = json.loads((out / "dense" / "seed2" / DIVERGED_FILE).read_text())
    assert marker["step"] == 1 and "loss became nan" in marker["message"]
    runs = json.loads((out / "results.json").read_text())["rows"][0]["runs"]
    assert [r["status"] for r in runs] == ["finished", "diverged"] and runs[1]["stability"]["nan_step"] == 1
    assert "diverged (non-finite loss at step 1)" in (out / "results.md").read_text()
    assert main([str(plan), "--out", str(out)]) == 0 and len(calls) == 2  # not trained again
    assert "diverged already, skipped" in capsys.readouterr().err


def test_another_training_error_is_a_failure_not_a_divergence(tmp_path, monkeypatch, capsys, write_plan):
    """A training error that is not a NaN (here torch.compile's) is no result of the row's settings: the model is
    not marked diverged, the plan exits 1 naming it, and a rerun trains it again."""
    from hyperplex.train import run
    from hyperplex.train.trainer import TrainingError

    def train(config, overrides, model_dir, data_root, resume=False):
        raise TrainingError("training.compile: torch.compile failed at step 1 (InductorError)")

    monkeypatch.setattr(run, "train", train)
    plan, out = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml", "seeds": [1]}]), tmp_path / "out"
    assert main([str(plan), "--out", str(out)]) == 1
    assert "training failed: TrainingError: training.compile" in capsys.readouterr().err
    assert not (out / "dense" / "seed1" / DIVERGED_FILE).exists()


def test_an_interrupt_stops_the_whole_plan(tmp_path, monkeypatch, capsys, write_plan):
    """Ctrl-C / SIGTERM during one model (the trainer saved it and raised TrainingInterrupted) ends the
    plan with 128 + signal; the next model is not started, and --resume continues where it stopped."""
    import signal

    from hyperplex.train import run
    from hyperplex.train.interrupts import TrainingInterrupted

    real_train, started = run.train, []

    def train(config, overrides, model_dir, data_root, resume=False):
        started.append(model_dir)
        if len(started) == 1:
            raise TrainingInterrupted("interrupted by SIGTERM at step 2", signal.SIGTERM, saved=True)
        return real_train(config, overrides, model_dir, data_root, resume=resume)

    monkeypatch.setattr(run, "train", train)
    plan, out = write_plan(tmp_path), tmp_path / "out"
    assert main([str(plan), "--out", str(out), "--no-report"]) == 128 + signal.SIGTERM
    assert len(started) == 1
    assert "plan stopped" in capsys.readouterr().err
    assert main([str(plan), "--out", str(out), "--no-report", "--resume"]) == 0
    assert len(started) == 1 + 4  # the interrupted model again, then the other three


def test_finished_models_are_skipped(done, capsys):
    plan, out, _, _ = done
    last = out / "dense" / "seed1" / "last.safetensors"
    before = last.stat().st_mtime_ns
    segments = len(json.loads((out / "dense" / "seed1" / "experiment.json").read_text())["segments"])
    assert main([str(plan), "--out", str(out), "--rows", "dense"]) == 0
    assert "finished already, skipped" in capsys.readouterr().err
    assert last.stat().st_mtime_ns == before
    assert len(json.loads((out / "dense" / "seed1" / "experiment.json").read_text())["segments"]) == segments


def test_an_untrained_adapter_row_saves_what_training_would_start_from(tmp_path):
    """A ``train: false`` row goes through the trainer's own start (seeding, data, model) and checkpoint contents:
    for an adapter model, only the trainable tensors and the base's signature, as a trained run saves."""
    import random

    import pytest
    import torch
    import yaml

    pytest.importorskip("transformers")
    from conftest import TINY_BERT_WORDS as WORDS
    from conftest import write_tiny_bert

    from hyperplex.config.experiment import load_experiment
    from hyperplex.experiments.state import NOT_HEALED
    from hyperplex.inference.load import load_model
    from hyperplex.models.pretrained_classifier import BASE_KEY, PretrainedClassifier
    from hyperplex.train.checkpoint import checkpoint_info, load_checkpoint

    bert = tmp_path / "bert"
    bert.mkdir()
    write_tiny_bert(bert)
    rng = random.Random(1)
    for split, count in (("train", 48), ("dev", 16)):
        rows = [" ".join(rng.choice(WORDS) for _ in range(5)) for _ in range(count)]
        (tmp_path / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{r}\t{int('good' in r)}\n"
                                                                             for r in rows))
    config = tmp_path / "finetune.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny_finetune", "data": {"task": "classification", "format": "tsv", "train": "train.tsv",
                                          "dev": "dev.tsv", "labels": ["0", "1"]},
        "model": {"architecture": "pretrained_classifier", "path": str(bert), "max_length": 12,
                  "adapter": {"kind": "phm", "n": 4, "targets": ["query", "value"]}},
        "training": {"batch_size": 16, "max_steps": 10, "num_threads": 1, "progress_bar": False, "plots": False,
                     "device": "cpu"}}))
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"title": "t", "metrics": ["accuracy"], "seeds": [3],
                                    "rows": [{"name": "phm4", "config": str(config), "train": False}]}))
    out = tmp_path / "out"
    assert main([str(plan), "--out", str(out), "--data-root", str(tmp_path), "--no-report"]) == 0
    last = out / "phm4" / "seed3" / "last.safetensors"
    state = checkpoint_info(last)["extra"]["trainer"]
    assert (state["step"], state["finished"], state["stop_reason"]) == (0, True, NOT_HEALED)
    cfg = load_experiment(config, ["--seed=3"], str(out / "phm4" / "seed3"))
    torch.manual_seed(3)  # the run's seed: the adapter and head training would start from
    start = PretrainedClassifier(cfg.model, 25, 2)
    trainable = {name for name, p in start.named_parameters() if p.requires_grad}
    saved = load_checkpoint(last).model_state
    assert set(saved) == trainable | {BASE_KEY}  # no frozen base in the file
    for name in trainable:
        assert torch.equal(saved[name], start.get_parameter(name)), name
    _, _, model = load_model(out / "phm4" / "seed3", "last", str(tmp_path))
    assert all(torch.equal(p, start.get_parameter(n)) for n, p in model.named_parameters())
