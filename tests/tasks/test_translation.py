"""The translation task: end to end through the real trainer (a tiny character-level Transformer memorises
generated arithmetic expressions, 003 §4.4 format, to exact-match accuracy 100%), <unk> replacement and how
validation scores lower-cased data."""

import pytest
import torch
import yaml

from hyperplex.data.arithmetic import evaluate_arithmetic_input, generate_arithmetic
from hyperplex.inference import verbs as inference
from hyperplex.train import run


@pytest.mark.parametrize("linear", [{"kind": "dense"}, {"kind": "quaternion"}])
def test_char_level_arithmetic_overfits_to_exact_match(tmp_path, linear):
    train, _ = generate_arithmetic(12, 1, seed=3)
    assert all(str(evaluate_arithmetic_input(x)) == y for x, y in train)  # the targets are the true answers
    for side, column in (("src", 0), ("tgt", 1)):
        (tmp_path / f"toy.{side}").write_text("".join(pair[column] + "\n" for pair in train))
    cfg = {"name": "toy", "seed": 1,
           "data": {"task": "translation", "format": "parallel", "train": str(tmp_path / "toy"),
                    "dev": str(tmp_path / "toy"), "src": "src", "tgt": "tgt", "tokenizer": "char"},
           "model": {"architecture": "transformer", "d_model": 32, "num_heads": 2, "d_ff": 64, "encoder_layers": 1,
                     "decoder_layers": 1, "dropout": 0.0, "tie_embeddings": False, "linear": linear},
           "training": {"lr": 3e-3, "schedule": "constant", "batch_size": 12, "batch_type": "sentence",
                        "max_steps": 300, "max_epochs": 1000, "validation_every": 300, "num_threads": 1,
                        "progress_bar": False, "plots": False, "log_every": 1000},
           "testing": {"beam_size": 1, "max_output_length": 16}}
    path = tmp_path / "toy.yaml"
    path.write_text(yaml.safe_dump(cfg))
    run.train(str(path), model_dir=str(tmp_path / "model"))
    metrics = inference.evaluate(str(tmp_path / "model"))
    assert metrics["accuracy"] == 100.0
    assert metrics["chrf"] == pytest.approx(100.0)  # (BLEU is 0 on one-word targets: no 4-grams)


def _word_task(tmp_path, lowercase=False, dev=("a zebra is walking\nthe giraffe is eating\n",
                                               "Ein Zebra geht\ndie Giraffe isst\n")):
    """A tiny word-level LSTM translation task (parallel files in ``tmp_path``) and its untrained model."""
    import logging

    from hyperplex.config.experiment import build_experiment
    from hyperplex.tasks import build_task

    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "train.en").write_text("a man is walking\na dog is running\nthe woman is eating\n" * 4)
    (tmp_path / "train.de").write_text("ein mann geht\nein hund rennt\ndie frau isst\n" * 4)
    (tmp_path / "dev.en").write_text(dev[0])
    (tmp_path / "dev.de").write_text(dev[1])
    cfg = build_experiment({
        "seed": 1, "model_dir": str(tmp_path / "m"),
        "data": {"task": "translation", "format": "parallel", "train": str(tmp_path / "train"),
                 "dev": str(tmp_path / "dev"), "src": "en", "tgt": "de", "tokenizer": "word", "lowercase": lowercase},
        "model": {"architecture": "rnn_translator", "embedding_dim": 8, "hidden_size": 8, "encoder_layers": 1,
                  "decoder_layers": 1, "attention": "dot", "dropout": 0.0},
        "training": {"max_steps": 1}, "testing": {"beam_size": 1, "replace_unk": True, "max_output_length": 4}})
    (tmp_path / "m").mkdir()
    task = build_task(cfg, tmp_path / "m", None, logging.getLogger("test"))
    task.prepare(fresh=True)
    return task, task.build_model().eval()


def test_unk_replacement_copies_a_source_word_never_its_end_of_sentence(tmp_path):
    """Every output an <unk> whose attention peaks on the source's </s> column: the copy is the most attended of
    the source's words (the first, at these weights), not the text "</s>"."""
    task, model = _word_task(tmp_path)
    bias = torch.zeros(len(task.tgt_vocab))
    bias[task.tgt_vocab.token_to_id("<unk>")] = 50.0
    model.output_layer.register_forward_hook(lambda module, inputs, output: output + bias)
    lengths = {}
    encode = model.encode

    def remember_lengths(src, src_lengths):
        lengths["value"] = src_lengths
        return encode(src, src_lengths)

    def on_end_of_sentence(module, inputs, output):
        context, weights = output
        weights = torch.zeros_like(weights)
        weights[torch.arange(weights.shape[0]), lengths["value"] - 1] = 1.0  # the </s> column
        return context, weights

    model.encode = remember_lengths
    model.attention.register_forward_hook(on_end_of_sentence)
    hypotheses = task.translate_ids(model, task.dev_set.src_ids, beam_size=1, src_tokens=task.dev_src_tokens)
    assert hypotheses == ["a a a a", "the the the the"]


def test_lower_cased_data_is_scored_case_insensitively_and_its_signature_says_so(tmp_path):
    cased, model = _word_task(tmp_path / "a")
    lower, _ = _word_task(tmp_path / "b", lowercase=True)
    cased.validate(model)
    lower.validate(model)
    assert "case:mixed" in cased.signatures["bleu"] and "case:mixed" in cased.signatures["chrf"]
    assert "case:lc" in lower.signatures["bleu"] and "case:lc" in lower.signatures["chrf"]


def test_an_evaluation_split_with_an_empty_side_is_refused_naming_the_lines(tmp_path):
    """Dropping the pair would score fewer lines than the files hold (and misalign the saved hypotheses)."""
    from hyperplex.data.readers import DataError

    with pytest.raises(DataError, match=r"pairs of .*dev: pair\(s\) 2, 3 \(line numbers\) have an empty source or "
                                        r"reference"):
        _word_task(tmp_path, dev=("a zebra is walking\n\nthe giraffe\n", "Ein Zebra geht\ndie Giraffe\n\n"))
