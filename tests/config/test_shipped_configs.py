"""Every shipped config validates and builds its model; the CLI's params verb counts its parameters
exactly (checked against the model's own parameters, built independently of the verb)."""

import inspect
from pathlib import Path

import pytest
from torch import nn

from hyperplex.config.experiment import load_experiment
from hyperplex.config.registry import ARCHITECTURES, get_architecture
from hyperplex.inference.parameters import params

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("*.yaml"))


def test_there_is_a_config_per_model_and_task():
    names = {p.stem for p in CONFIGS}
    assert len(names) >= 12
    archs = {load_experiment(p).model.architecture for p in CONFIGS}
    assert archs == {"rnn_translator", "transformer", "transformer_classifier", "nli_encoder",
                     "decomposable_attention", "quaternion_attention", "pretrained_student", "pretrained_classifier"}


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_every_architecture_has_the_one_constructor_signature(name):
    # Model(config, vocab_size, num_outputs, *, pad_index=0, ...): the tasks and the params verb build
    # every model with one call, so no caller may special-case a family.
    config_class, model_class = ARCHITECTURES[name].load()
    params = list(inspect.signature(model_class).parameters.values())
    assert [p.kind for p in params[:3]] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 3
    assert params[0].name == "config" and params[0].annotation in (config_class, config_class.__name__)
    pad = inspect.signature(model_class).parameters["pad_index"]
    assert (pad.kind, pad.default) == (inspect.Parameter.KEYWORD_ONLY, 0)
    assert all(p.kind == inspect.Parameter.KEYWORD_ONLY for p in params[3:])


def table_rows(table: str) -> dict[str, int]:
    """``{component: count}`` of a :func:`hyperplex.inference.parameters.params` table
    (``| name | 1,234 | 1.23K | share |`` rows)."""
    rows = [line.split("|") for line in table.splitlines()[3:] if line.startswith("|")]  # after title, header, rule
    return {cells[1].strip(): int(cells[2].replace(",", "")) for cells in rows}


# A pretrained student or classifier loads a real model (MiniLM): seconds to tens of seconds on 2 cores, so
# only with -m slow. (By the config's architecture: every config's comments name every architecture.)
PRETRAINED = ("pretrained_student", "pretrained_classifier")


@pytest.mark.parametrize("path", [pytest.param(p, marks=pytest.mark.slow)
                                  if load_experiment(p).model.architecture in PRETRAINED else p for p in CONFIGS],
                         ids=lambda p: p.stem)
def test_params_table_counts_the_built_model(path):
    cfg = load_experiment(path)
    assert cfg.model_dir.startswith("runs/")
    # The model the config describes, built here from the registry (not through the verb), with the
    # sizes the verb is given: a 64-word vocabulary and 5 classes (ranking: one score; seq2seq: the
    # shared 64-word vocabulary on both sides).
    arch = get_architecture(cfg.model.architecture, cfg.data.task)
    outputs = 64 if arch.family == "seq2seq" else 1 if cfg.data.task == "ranking" else 5
    model = arch.load()[1](cfg.model, 64, outputs)
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)  # shared tensors once
    embeddings = sum({id(m.weight): m.weight.numel() for m in model.modules()
                      if isinstance(m, nn.Embedding) and m.weight.requires_grad}.values())

    table = params(str(path), vocab_size=64, num_classes=5)
    assert table.splitlines()[0].startswith(f"{cfg.name}: {cfg.model.architecture} (vocabulary 64")
    rows = table_rows(table)
    assert rows["total"] == trainable
    assert sum(v for k, v in rows.items() if not k.startswith("total")) == rows["total"]  # disjoint components
    assert rows["embeddings"] == embeddings
    assert rows["total_without_embeddings"] == trainable - embeddings


def non_embedding_total(table: str) -> int:
    return table_rows(table)["total_without_embeddings"]


@pytest.mark.parametrize("kind", ["phm", "quaternion", "lowrank"])
def test_linear_switch_shrinks_transformer_about_fourfold(kind):
    # The CLI override path end to end: --model.linear.kind changes every layer's linear maps.
    path = next(p for p in CONFIGS if p.stem == "multi30k_transformer")
    dense = non_embedding_total(params(str(path), vocab_size=64))
    other = non_embedding_total(params(str(path), [f"--model.linear.kind={kind}", "--model.linear.n=4"],
                                              vocab_size=64))
    assert 0.2 < other / dense < 0.3  # weights ÷ 4; biases and norms are not divided
