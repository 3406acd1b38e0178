"""Every shipped config validates and builds its model; the CLI's params verb prints its table."""

from pathlib import Path

import pytest

from hyperplex.cli import runner
from hyperplex.config.experiment import load_experiment

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_there_is_a_config_per_model_and_task():
    names = {p.stem for p in CONFIGS}
    assert len(names) >= 12
    archs = {load_experiment(p).model["architecture"] for p in CONFIGS}
    assert archs == {"rnn_translator", "transformer", "transformer_classifier", "nli_encoder",
                     "decomposable_attention", "quaternion_attention"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_config_validates_and_builds(path):
    cfg = load_experiment(path)
    assert cfg.model_dir.startswith("runs/")
    table = runner.params(str(path), vocab_size=64)
    assert "total" in table


def non_embedding_total(table: str) -> int:
    row = next(line for line in table.splitlines() if line.startswith("| total_without_embeddings |"))
    return int(row.split("|")[2].replace(",", ""))


@pytest.mark.parametrize("kind", ["phm", "quaternion", "lowrank"])
def test_linear_switch_shrinks_transformer_about_fourfold(kind):
    # The CLI override path end to end: --model.linear.kind changes every layer's linear maps.
    path = next(p for p in CONFIGS if p.stem == "multi30k_transformer")
    dense = non_embedding_total(runner.params(str(path), vocab_size=64))
    other = non_embedding_total(runner.params(str(path), [f"--model.linear.kind={kind}", "--model.linear.n=4"],
                                              vocab_size=64))
    assert 0.2 < other / dense < 0.3  # weights ÷ 4; biases and norms are not divided
