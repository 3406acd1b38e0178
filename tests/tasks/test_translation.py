"""The translation task end to end through the real trainer: a tiny character-level Transformer
memorises generated arithmetic expressions (003 §4.4 format) to exact-match accuracy 100%."""

import pytest
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
