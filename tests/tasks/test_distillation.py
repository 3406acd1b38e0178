"""Distillation (tasks/distillation.py, models/pretrained_student.py) and `hyperplex compress`: a tiny random BERT
SentenceTransformer (built from a config, no download) is the teacher; values checked: an unconverted
student is the teacher, healing raises the dev cosine, resume is bitwise, the saved student reloads."""

from __future__ import annotations

import logging

import pytest
import torch
import yaml

pytest.importorskip("sentence_transformers")
transformers = pytest.importorskip("transformers")

from conftest import prepared_task, tiny_sentences, write_distill_config

from hyperplex.cli.main import main
from hyperplex.config.experiment import load_experiment
from hyperplex.data.readers import DataError
from hyperplex.inference.load import load_model
from hyperplex.inference.parameters import params
from hyperplex.tasks import build_task
from hyperplex.train.checkpoint import load_model_weights
from hyperplex.train.run import train

sentences = tiny_sentences  # 3–8 words from the tiny BERT's vocabulary; teacher_folder: tests/conftest.py


write_config, prepared = write_distill_config, prepared_task


def test_an_unconverted_student_is_its_teacher(tmp_path, teacher_folder):
    _, task = prepared(write_config(tmp_path, teacher_folder, kind="none"))
    model = task.build_model().eval()
    assert not any(k.startswith("teacher") for k in model.state_dict())  # the frozen teacher is the task's
    student, teacher = task.embed_dev(model)
    assert torch.equal(student, teacher)  # the same weights and inputs: bitwise the teacher's embeddings
    metrics = task.validate(model)
    assert metrics["cosine"] == pytest.approx(1.0, abs=1e-6) and metrics["loss"] == pytest.approx(0.0, abs=1e-6)
    batch = task.train_batches(1)[0]
    with torch.no_grad():
        assert batch.num_tokens == len(batch) == 8 and float(task.loss(model, batch)) == pytest.approx(0.0, abs=1e-5)


def test_mse_loss_is_the_squared_distance(tmp_path, teacher_folder):
    _, task = prepared(write_config(tmp_path, teacher_folder, extra={"model.distill_loss": "mse"}))
    model = task.build_model().eval()
    batch = task.train_batches(1)[0]
    with torch.no_grad():
        s, t = model(**batch.tensors), task._teacher(batch, torch.device("cpu"))
        # for unit vectors ‖s − t‖² = 2 − 2 cos (up to the rounding of the norms, ~1e-7 per sentence)
        assert float(task.loss(model, batch)) == pytest.approx(float((2 - 2 * (s * t).sum(-1)).sum()), abs=1e-5)
        assert float(task.loss(model, batch)) > 1e-4  # not trivially zero: the student is PHM-converted


def test_batches_are_seeded_shuffles_of_the_training_sentences(tmp_path, teacher_folder):
    _, task = prepared(write_config(tmp_path, teacher_folder))
    first, again, second = task.train_batches(1), task.train_batches(1), task.train_batches(2)
    order = [i for b in first for i in b.indices]
    assert sorted(order) == list(range(30)) and order != list(range(30))
    assert order == [i for b in again for i in b.indices] and order != [i for b in second for i in b.indices]
    assert all(torch.equal(a["input_ids"], b["input_ids"]) for a, b in zip(first, again))


def test_healing_raises_the_dev_cosine_and_resume_is_bitwise(tmp_path, teacher_folder):
    (tmp_path / "a").mkdir()
    # random PHM layers (biases and the rest of BERT kept): far enough from the teacher to have room to heal
    path = write_config(tmp_path / "a", teacher_folder, steps=80, extra={"model.init": "random"})
    _, task = prepared(path)
    start = task.validate(task.build_model().eval())["cosine"]
    assert start < 0.99
    metrics = train(str(path))
    assert metrics["cosine"] > start + 0.05, (start, metrics)  # measured: 0.854 → 0.993
    # the same run stopped half-way and resumed gives the same weights, bit for bit
    (tmp_path / "b").mkdir()
    half = write_config(tmp_path / "b", teacher_folder, steps=80, extra={"model.init": "random"})
    train(str(half), ["--training.max_steps=40"])
    train(str(half), resume=True)
    whole = load_model_weights(tmp_path / "a" / "m" / "last.safetensors")
    resumed = load_model_weights(tmp_path / "b" / "m" / "last.safetensors")
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)


@pytest.mark.parametrize("init", ["svd", "activation"])  # activation: reloading rebuilds without calibrating
def test_compress_writes_a_student_that_load_converted_reloads(tmp_path, teacher_folder, init):
    from hyperplex.convert import load_converted

    path = write_config(tmp_path, teacher_folder, steps=20, extra={"model.init": init})
    assert main(["compress", str(path)]) == 0
    student = load_converted(tmp_path / "m" / "student")
    _, task, model = load_model(tmp_path / "m", "best", read_data=False)
    batch = task._batch(sentences(5, 9), list(range(5)))
    with torch.no_grad():
        expected = model(**batch.tensors)
        got = torch.nn.functional.normalize(student(dict(batch.tensors))["sentence_embedding"], dim=-1)
    assert torch.equal(got, expected)
    assert any(type(m).__name__ == "PHMLinear" for m in student.modules())


@pytest.mark.parametrize("kind", ["phm", "lowrank"])
def test_the_log_records_the_conversions_weight_error(tmp_path, teacher_folder, caplog, kind):
    """The conversion's mean relative weight error ‖W − H‖_F / ‖W‖_F over the converted layers is in the log
    (a record's train.log keeps what conversion lost before healing), equal to the error of the built layers."""
    import re

    _, task = prepared(write_config(tmp_path, teacher_folder, kind=kind, extra={"model.balance_factors": False}))
    with caplog.at_level(logging.INFO, logger="hyperplex"):
        model = task.build_model()
    teacher = dict(task.teacher.named_modules())
    weights = {name: (teacher[name].weight, m.dense_weight()) for name, m in model.encoder.named_modules()
               if hasattr(m, "dense_weight")}
    errors = [float(torch.linalg.norm(w - h) / torch.linalg.norm(w)) for w, h in weights.values()]
    found = re.search(r"conversion: converted (\d+) of \d+ layers: .*, mean relative error ([0-9.]+)", caplog.text)
    assert found, caplog.text
    assert int(found[1]) == len(errors) > 0
    assert float(found[2]) == pytest.approx(sum(errors) / len(errors), abs=1e-4)
    assert 0 < float(found[2]) < 1  # a real fit: neither exact nor worse than H = 0
    # a student rebuilt to load a checkpoint into is not converted for training: nothing to record
    task.weights_from_checkpoint = True
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="hyperplex"):
        task.build_model()
    assert "conversion:" not in caplog.text


def test_bad_inputs_are_refused_with_the_file_or_key(tmp_path, teacher_folder, capsys):
    path = write_config(tmp_path, teacher_folder)
    (tmp_path / "train.txt").write_text("")
    with pytest.raises(DataError, match=r"train\.txt: empty corpus"):
        prepared(path)
    # a config of another task is refused by compress before anything is written
    other = write_config(tmp_path, teacher_folder, task="classification")
    text = yaml.safe_load(other.read_text())
    text["model"] = {"architecture": "transformer_classifier", "d_model": 8, "num_heads": 1, "d_ff": 8}
    other.write_text(yaml.safe_dump(text))
    assert main(["compress", str(other)]) == 1
    assert "compress needs a config with data.task: distillation (this one has 'classification')" in \
        capsys.readouterr().err
    assert not (tmp_path / "m").exists()
    # a path that is not a model folder
    bad = write_config(tmp_path, tmp_path / "train.txt")
    cfg = load_experiment(bad)
    with pytest.raises(ValueError, match="model.path: .*train.txt is not a folder"):
        build_task(cfg, cfg.model_dir, None).prepare(fresh=True)
    cfg = load_experiment(write_config(tmp_path, tmp_path))
    with pytest.raises(ValueError, match="is not a model folder .*neither modules.json nor config.json"):
        build_task(cfg, cfg.model_dir, None).prepare(fresh=True)


def test_params_counts_an_activation_student_without_calibration_data(tmp_path, teacher_folder):
    # `hyperplex params` (and the plan's parameter-match check) reads no data: an init: activation student is
    # counted from its structure, which is the SVD student's; the counts must also differ from the teacher's
    svd = params(str(write_config(tmp_path, teacher_folder, extra={"model.init": "svd"})))
    act = params(str(write_config(tmp_path, teacher_folder, extra={"model.init": "activation"})))
    dense = params(str(write_config(tmp_path, teacher_folder, kind="none")))
    assert act == svd and act != dense
