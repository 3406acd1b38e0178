"""Intermediate-layer distillation (tasks/distillation.py: hidden-state MSE and attention KL, student layer
↔ mapped teacher layer) with layer dropping and block-wise fitting, on the tiny random 2-layer BERT teacher
(built from a config, no download). Values checked: zero loss for the teacher's copy, padding changes no
sentence's loss, the loss is the documented sum, and `hyperplex compress` writes a reloadable student."""

from __future__ import annotations

import functools

import pytest
import torch

pytest.importorskip("sentence_transformers")
pytest.importorskip("transformers")

from conftest import prepared_task, tiny_sentences, write_distill_config

from hyperplex.cli.main import main
from hyperplex.models.pretrained_student import record_internals, transformer_layers
from hyperplex.tasks.distillation import attention_loss, distill_loss, hidden_state_loss

sentences = tiny_sentences  # 3–8 words from the tiny BERT's vocabulary; teacher_folder: tests/conftest.py


write_config = functools.partial(write_distill_config, steps=20)
prepared = prepared_task

LAYERED = {"model.distill_hidden": 2.0, "model.distill_attention": 0.5}


def internals(encoder, batch, attention=True):
    with torch.no_grad(), record_internals(encoder, attention=attention) as rec:
        from hyperplex.models.pretrained_student import embed
        out = embed(encoder, batch.tensors)
        return out, rec.hidden, rec.attention_log_probs(batch["attention_mask"])


def test_the_teachers_copy_has_zero_layer_losses(tmp_path, teacher_folder):
    _, task = prepared(write_config(tmp_path, teacher_folder, kind="none", extra=LAYERED))
    model = task.build_model().eval()
    batch = task.train_batches(1)[0]
    with torch.no_grad():
        assert float(task.loss(model, batch)) == pytest.approx(0.0, abs=1e-5)


def test_the_layered_loss_is_the_documented_sum(tmp_path, teacher_folder):
    _, task = prepared(write_config(tmp_path, teacher_folder, extra=LAYERED))
    model = task.build_model().eval()
    batch = task.train_batches(1)[0]
    mask = batch["attention_mask"]
    assert model.layer_map == [0, 1]
    s_out, s_hidden, s_att = internals(model.encoder, batch)
    t_out, t_hidden, t_att = internals(task.teacher, batch)
    hidden, attention = hidden_state_loss(s_hidden, t_hidden, mask), attention_loss(s_att, t_att, mask)
    assert torch.all(hidden > 1e-4) and torch.all(attention > 1e-6)  # a PHM student differs in every layer
    # by hand, sentence by sentence: MSE over real tokens and features, KL over real keys per head and query
    for b in range(len(batch)):
        real = int(mask[b].sum())
        mse = sum(float((s[b, :real] - t[b, :real]).square().mean()) for s, t in zip(s_hidden, t_hidden)) / 2
        kl = sum(float((t[b, :, :real, :real].exp() * (t[b, :, :real, :real] - s[b, :, :real, :real])).sum(-1).mean())
                 for s, t in zip(s_att, t_att)) / 2
        assert float(hidden[b]) == pytest.approx(mse, rel=1e-4) and float(attention[b]) == pytest.approx(kl, rel=1e-3)
    expected = (distill_loss(s_out, t_out, "cosine") + 2.0 * hidden + 0.5 * attention).sum()
    with torch.no_grad():
        assert float(task.loss(model, batch)) == pytest.approx(float(expected), rel=1e-5)
    # gradients reach the converted layers through the layer losses too
    model.train()
    task.loss(model, batch).backward()
    layers = transformer_layers(model.encoder)
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layers[0].parameters() if p.requires_grad)


def test_padding_changes_no_sentences_layer_losses(tmp_path, teacher_folder):
    _, task = prepared(write_config(tmp_path, teacher_folder, extra=LAYERED))
    model = task.build_model().eval()
    short, long = "the cat sat", "the big red dog is very good and fast on the mat"
    alone = task._batch([short], [0])
    padded = task._batch([short, long], [0, 1])
    assert padded["attention_mask"][0].sum() < padded["attention_mask"].shape[1]  # the short one is padded
    values = []
    for batch in (alone, padded):
        s_out, s_hidden, s_att = internals(model.encoder, batch)
        t_out, t_hidden, t_att = internals(task.teacher, batch)
        mask = batch["attention_mask"]
        values.append((float(hidden_state_loss(s_hidden, t_hidden, mask)[0]),
                       float(attention_loss(s_att, t_att, mask)[0])))
    assert values[1] == pytest.approx(values[0], rel=1e-3, abs=1e-8)


def test_compress_with_dropped_layers_layer_losses_and_blockwise_fitting(tmp_path, teacher_folder):
    from hyperplex.convert import load_converted
    from hyperplex.inference.load import load_model

    path = write_config(tmp_path, teacher_folder, steps=6, extra={**LAYERED, "model.keep_layers": [1],
                                                                   "model.blockwise_steps": 5})
    assert main(["compress", str(path)]) == 0
    log = (tmp_path / "m" / "train.log").read_text()
    assert "blockwise: layer 0 fitted to teacher layer 1" in log
    assert "+ 2.0 × hidden-state MSE + 0.5 × attention KL; student layer ↔ teacher layer: 0↔1" in log
    student = load_converted(tmp_path / "m" / "student")
    assert len(transformer_layers(student)) == 1
    _, task, model = load_model(tmp_path / "m", "best", read_data=False)
    batch = task._batch(sentences(5, 9), list(range(5)))
    with torch.no_grad():
        expected = model(**batch.tensors)
        got = torch.nn.functional.normalize(student(dict(batch.tensors))["sentence_embedding"], dim=-1)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("extra, message", [
    ({"model.keep_layers": [0, 1], "model.layer_map": [0, 2], "model.distill_hidden": 1.0},
     r"model\.layer_map: the teacher has 2 transformer layers \(indices 0–1\); \[2\] out of range"),
    ({"model.layer_map": [1], "model.distill_hidden": 1.0}, r"model\.layer_map: the student has 2 transformer layers"),
    ({"model.keep_layers": [0, 2]}, r"model\.keep_layers: the teacher has 2 transformer layers"),
])
def test_a_layer_map_or_keep_list_that_does_not_fit_is_one_error_and_writes_nothing(tmp_path, teacher_folder, capsys,
                                                                                     extra, message):
    import re

    path = write_config(tmp_path, teacher_folder, extra=extra)
    assert main(["compress", str(path)]) != 0
    err = capsys.readouterr().err
    assert re.search(message, err), err
    assert not (tmp_path / "m").exists()


def test_a_resumed_or_evaluated_student_is_not_fitted_again(tmp_path, teacher_folder, monkeypatch):
    """Blockwise fitting and a calibrated start happen once, when the run starts: a resumed run and ``evaluate`` on
    the dev split (which reads the training data) build the student's layers without them, since the checkpoint
    replaces their result, and the resumed run still ends bit-identical to the whole one."""
    from hyperplex.inference.verbs import evaluate
    from hyperplex.models import pretrained_student
    from hyperplex.train.checkpoint import load_model_weights
    from hyperplex.train.run import train

    extra = {**LAYERED, "model.keep_layers": [1], "model.blockwise_steps": 3, "model.init": "activation"}
    for name in ("whole", "half"):
        (tmp_path / name).mkdir()
    whole = write_config(tmp_path / "whole", teacher_folder, steps=8, extra=extra)
    half = write_config(tmp_path / "half", teacher_folder, steps=8, extra=extra)
    train(str(whole))
    train(str(half), ["--training.max_steps=4"])
    fits = []
    real = pretrained_student.fit_blocks
    monkeypatch.setattr(pretrained_student, "fit_blocks", lambda *a, **k: fits.append(1) or real(*a, **k))
    train(str(half), resume=True)
    evaluate(tmp_path / "half" / "m", "best", split="dev")
    assert fits == []
    a, b = (load_model_weights(p / "m" / "last.safetensors") for p in (tmp_path / "whole", tmp_path / "half"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    resumed_log = (tmp_path / "half" / "m" / "train.log").read_text().split("resumed from")[1]
    assert "blockwise: layer" not in resumed_log
