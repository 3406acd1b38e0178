"""hyperplex.config.registry (and the linear-kind registry of nn/linear.py): lookups, their errors, and the
promise of the design — a new linear kind or a new task is one module plus one registration, after which
the config accepts it, the reference documents it and the trainer runs it."""

from __future__ import annotations

import math

import pytest
import torch
import yaml
from torch import nn

from hyperplex.config import ConfigError
from hyperplex.config.experiment import build_experiment, load_experiment
from hyperplex.config.reference import config_reference
from hyperplex.config.registry import (
    ARCHITECTURES,
    TASKS,
    TaskEntry,
    get_architecture,
    get_task,
    register_task,
)
from hyperplex.data.datasets import Batch
from hyperplex.nn.linear import LINEAR_KINDS, LinearKind, LinearSpec, make_linear, register_linear_kind
from hyperplex.train.task import Task


# ---------------------------------------------------------------------------- lookups
def test_every_architecture_loads_a_config_and_a_model_class():
    for name, arch in ARCHITECTURES.items():
        config_class, model_class = arch.load()
        assert issubclass(model_class, nn.Module)
        assert "architecture" in {f for f in config_class.__dataclass_fields__}, name


def test_every_task_loads_a_task_class_that_trains_some_architecture():
    for name, entry in TASKS.items():
        assert issubclass(entry.load(), Task)
        assert any(a.family in entry.families for a in ARCHITECTURES.values()), name


@pytest.mark.parametrize("call,message", [
    (lambda: get_architecture(None, "translation"), "model.architecture is required; valid for task 'translation': "
                                                    "rnn_translator, transformer"),
    (lambda: get_architecture("transfomer"), "unknown architecture 'transfomer' (did you mean 'transformer'?)"),
    (lambda: get_architecture("nli_encoder", "translation"),
     "model.architecture 'nli_encoder' cannot do task 'translation'; valid for it: rnn_translator, transformer"),
    (lambda: get_task("ranknig"), "data.task: unknown task 'ranknig' (did you mean 'ranking'?)"),
])
def test_lookup_errors_name_the_key_and_the_valid_names(call, message):
    with pytest.raises(ConfigError) as caught:
        call()
    assert message in str(caught.value)


# ---------------------------------------------------------------------------- a new linear kind
def test_a_new_linear_kind_is_one_builder_and_one_registration(tmp_path):
    class Doubled(nn.Linear):  # a toy kind: a dense map whose output is doubled
        def forward(self, x):
            return 2 * super().forward(x)

    register_linear_kind("doubled", LinearKind(lambda d, k, spec, bias, f: Doubled(d, k, bias=bias, **f)))
    try:
        layer = make_linear(8, 4, LinearSpec("doubled"))
        x = torch.randn(3, 8)
        assert torch.allclose(layer(x), 2 * nn.functional.linear(x, layer.weight, layer.bias))
        cfg = {"model_dir": str(tmp_path), "data": {"task": "translation", "src": "en", "tgt": "de"},
               "model": {"architecture": "transformer", "d_model": 16, "num_heads": 2, "d_ff": 32,
                         "linear": {"kind": "doubled"}}, "training": {"max_steps": 1}}
        experiment = build_experiment(cfg)
        _, model_class = ARCHITECTURES["transformer"].load()
        model = model_class(experiment.model, 20, 20)
        assert sum(isinstance(m, Doubled) for m in model.modules()) > 0
        assert "'doubled'" in config_reference()  # the reference lists the new choice
    finally:
        del LINEAR_KINDS["doubled"]
    with pytest.raises(ConfigError, match="model.linear.kind: 'doubled' is not one of"):
        build_experiment(cfg)


# ---------------------------------------------------------------------------- a new task
class CountingTask(Task):
    """A toy task (this module + one registration): classify a random vector by the sign of its sum."""

    name = "counting"
    metrics = ("accuracy", "loss")

    def prepare(self, fresh: bool) -> None:
        generator = torch.Generator().manual_seed(self.cfg.data.split_seed)
        self.x = torch.randn(64, 8, generator=generator)
        self.y = (self.x.sum(1) > 0).long()

    def train_batches(self, epoch: int) -> list:
        return [Batch({"x": self.x[i:i + 16], "y": self.y[i:i + 16]}, list(range(i, i + 16)), 16)
                for i in range(0, 64, 16)]

    def build_model(self) -> nn.Module:
        return nn.Linear(8, 2)

    def loss(self, model: nn.Module, batch) -> torch.Tensor:
        return nn.functional.cross_entropy(model(batch["x"]), batch["y"], reduction="sum")

    @torch.no_grad()
    def validate(self, model: nn.Module) -> dict[str, float]:
        logits = model(self.x)
        return {"accuracy": float((logits.argmax(1) == self.y).float().mean()),
                "loss": float(nn.functional.cross_entropy(logits, self.y))}


def test_a_new_task_is_one_module_and_one_registration(tmp_path):
    from hyperplex.train.run import train

    register_task("counting", TaskEntry(__name__, "CountingTask", ("classifier",), "sign of a sum"))
    try:
        config = tmp_path / "counting.yaml"
        config.write_text(yaml.safe_dump({
            "name": "toy", "seed": 1, "data": {"task": "counting"},
            "model": {"architecture": "transformer_classifier", "d_model": 8, "num_heads": 1, "d_ff": 8},
            "training": {"lr": 0.1, "max_steps": 40, "validation_every": 20, "log_every": 10, "num_threads": 1,
                         "progress_bar": False, "plots": False, "device": "cpu"}}))
        assert load_experiment(config, model_dir=str(tmp_path / "m")).data.task == "counting"
        metrics = train(str(config), model_dir=str(tmp_path / "m"))
        assert metrics["accuracy"] >= 0.9 and math.isfinite(metrics["loss"])  # the sign of a sum is linear
    finally:
        del TASKS["counting"]
