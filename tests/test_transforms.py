"""The one calling shape of the three transforms (hyperplex/transforms.py, convert/compress.py, int8/transform.py,
adapters/config.py): typed configs, one selection vocabulary, and the deprecated old names."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import torch
from torch import nn

import hyperplex as hp
from hyperplex.layers.selection import name_matches
from hyperplex.transforms import select_layers


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.query, self.value, self.out = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 64)


class Toy(nn.Module):
    """layers.0.{query,value,out}, layers.1.{query,value,out}, classifier (64 → 8)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layers = nn.ModuleList([Block(), Block()])
        self.classifier = nn.Linear(64, 8)

    def forward(self, x):
        for block in self.layers:
            x = block.out(block.query(x) + block.value(x))[..., :32]
        return self.classifier(torch.cat([x, x], -1))


def converted(model: nn.Module) -> list[str]:
    return [name for name, m in model.named_modules() if isinstance(m, (hp.PHMLinear, hp.LowRankLinear))]


# ------------------------------------------------------------------------------------------- selection

NAMES = ["layers.0.query", "layers.0.value", "layers.0.out", "layers.1.query", "layers.1.value", "layers.1.out",
         "classifier"]


@pytest.mark.parametrize("targets,exclude,expected", [
    (None, (), NAMES),
    (["query"], (), ["layers.0.query", "layers.1.query"]),
    (["layers.1.*"], ["out"], ["layers.1.query", "layers.1.value"]),
    (["*query", "value"], ["layers.0.*"], ["layers.1.query", "layers.1.value"]),
    (None, ["classifier", "0.out"], ["layers.0.query", "layers.0.value", "layers.1.query", "layers.1.value",
                                     "layers.1.out"]),
])
def test_selection_semantics(targets, exclude, expected):
    assert select_layers(NAMES, targets, exclude, "X") == expected


def test_a_bare_pattern_matches_a_whole_name_component():
    assert name_matches("layers.0.query", "query") and not name_matches("layers.0.query_proj", "query")
    assert name_matches("layers.0.out", "0.out") and not name_matches("layers.10.out", "0.out")


@pytest.mark.parametrize("field", ["targets", "exclude"])
def test_a_pattern_that_matches_nothing_is_an_error_naming_it(field):
    with pytest.raises(ValueError, match=rf"X\.{field}: pattern 'key' matches no layer"):
        select_layers(NAMES, ["query"] if field == "exclude" else ["key"], ["key"] if field == "exclude" else (), "X")


# ------------------------------------------------------------------------------------------- configs

@pytest.mark.parametrize("config", [
    hp.PHMConfig(), hp.PHMConfig(n=4, targets=["query"], exclude=["0.query"], init="random", rule="quaternion",
                                 min_features=4, refine_steps=3, als_sweeps=1, ridge=0.5),
    hp.LowRankConfig(), hp.LowRankConfig(n=8, rank=3, targets=["*"], exclude=["classifier"]),
    hp.Int8Config(), hp.Int8Config(targets=["query"], exclude=["0.query"], phm_path="premixed"),
    hp.PHMAdapterConfig(), hp.PHMAdapterConfig(n=2, rank=4, targets=["query", "value"], exclude=["0.value"],
                                               scale=0.5, shared_rule=True, dropout=0.1,
                                               modules_to_save=["classifier"]),
])
def test_to_dict_from_dict_round_trip(config):
    data = config.to_dict()
    import json
    assert json.loads(json.dumps(data)) == data  # JSON-ready
    assert type(config).from_dict(data) == config


@pytest.mark.parametrize("make,message", [
    (lambda: hp.PHMConfig(n=0), r"PHMConfig\.n must be a positive integer, got 0"),
    (lambda: hp.PHMConfig(init="best"), r"PHMConfig\.init must be one of 'svd'"),
    (lambda: hp.PHMConfig(rule="octonion", n=4), r"PHMConfig\.rule: "),
    (lambda: hp.PHMConfig(min_features=-1), r"PHMConfig\.min_features must be an integer ≥ 0"),
    (lambda: hp.PHMConfig(ridge=-1.0), r"PHMConfig\.ridge must be None or a finite number ≥ 0"),
    (lambda: hp.PHMConfig(targets=[]), r"PHMConfig\.targets must be a non-empty list"),
    (lambda: hp.PHMConfig(exclude=[""]), r"PHMConfig\.exclude must be a list of non-empty glob patterns"),
    (lambda: hp.LowRankConfig(rank=0), r"LowRankConfig\.rank must be None or a positive integer"),
    (lambda: hp.LowRankConfig(n=True), r"LowRankConfig\.n must be a positive integer"),
    (lambda: hp.Int8Config(phm_path="fast"), r"Int8Config\.phm_path must be one of 'auto'"),
    (lambda: hp.Int8Config(targets=5), r"Int8Config\.targets must be a glob pattern or a list"),
    (lambda: hp.PHMAdapterConfig(rank=0), r"PHMAdapterConfig\.rank must be None \(full Sᵢ\) or a positive"),
    (lambda: hp.PHMAdapterConfig(exclude=[3]), r"PHMAdapterConfig\.exclude must be a list of non-empty"),
    (lambda: hp.PHMAdapterConfig.from_dict({"n": 2, "include": ["q"]}),
     r"unknown PHMAdapterConfig key\(s\) \['include'\]"),
    (lambda: hp.PHMConfig.from_dict({"n": 2, "kind": "phm"}, where="spec.json"), r"spec\.json: unknown PHMConfig key"),
    (lambda: hp.Int8Config.from_dict(["auto"]), r"Int8Config: expected a mapping"),
])
def test_validation_errors_name_the_field(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_configs_are_frozen_and_patterns_tuples():
    config = hp.PHMConfig(targets="query")
    assert config.targets == ("query",) and config.exclude == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.n = 8


# ------------------------------------------------------------------------------------------- compress

@pytest.mark.parametrize("config,kind,extra", [
    (hp.PHMConfig(n=4, targets=["query", "out"], exclude=["1.out"], min_features=8), "phm",
     {"include": ["query", "out"], "exclude": ["1.out"], "min_features": 8}),
    (hp.LowRankConfig(n=4), "lowrank", {}),
    (hp.LowRankConfig(rank=3, exclude=["classifier"]), "lowrank", {"rank": 3, "exclude": ["classifier"]}),
])
def test_compress_gives_exactly_the_model_convert_linears_gave(config, kind, extra):
    new, old = Toy(), Toy()
    report = hp.compress(new, config)
    with pytest.warns(DeprecationWarning, match=r"use hyperplex\.compress\(model, PHMConfig"):
        old_report = hp.convert.convert_linears(old, kind, config.n, **extra)
    assert [r.name for r in report.converted] == [r.name for r in old_report.converted] != []
    assert str(new) == str(old)
    new_state, old_state = new.state_dict(), old.state_dict()
    assert new_state.keys() == old_state.keys()
    assert all(torch.equal(new_state[k], old_state[k]) for k in new_state)


def test_compress_selects_with_targets_and_exclude():
    model = Toy()
    hp.compress(model, hp.PHMConfig(n=4, targets=["layers.*"], exclude=["out"]))
    assert converted(model) == ["layers.0.query", "layers.0.value", "layers.1.query", "layers.1.value"]


@pytest.mark.parametrize("config,field", [(hp.PHMConfig(targets=["key"]), "targets"),
                                          (hp.LowRankConfig(exclude=["pooler"]), "exclude")])
def test_compress_refuses_a_pattern_that_matches_nothing_and_changes_nothing(config, field):
    model, before = Toy(), Toy()
    with pytest.raises(ValueError, match=rf"{type(config).__name__}\.{field}: pattern '\w+' matches no nn\.Linear"):
        hp.compress(model, config)
    assert str(model) == str(before) and all(torch.equal(a, b) for a, b in
                                              zip(model.state_dict().values(), before.state_dict().values()))


def test_compress_refuses_another_config():
    with pytest.raises(TypeError, match="compress takes a PHMConfig or LowRankConfig, got Int8Config"):
        hp.compress(Toy(), hp.Int8Config())


# ------------------------------------------------------------------------------------------- int8

def test_quantize_selects_with_targets_and_exclude():
    model = Toy()
    hp.compress(model, hp.PHMConfig(n=4, targets=["0.query"]))
    hp.quantize(model, hp.Int8Config(targets=["layers.0.*"], exclude=["0.value"]))
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if name}
    assert kinds["layers.0.query"] == "QuantizedPHMLinear" and kinds["layers.0.out"] == "QuantizedLinear"
    assert kinds["layers.0.value"] == "Linear" and kinds["classifier"] == "Linear"


def test_quantize_refuses_a_pattern_that_matches_nothing():
    model = Toy()
    with pytest.raises(ValueError, match=r"Int8Config\.exclude: pattern 'pooler' matches no"):
        hp.quantize(model, hp.Int8Config(exclude=["pooler"]))
    assert type(model.classifier) is nn.Linear


def test_quantize_with_a_dtype_is_deprecated_and_gives_the_same_model():
    x = torch.randn(3, 32)
    new, old = Toy(), Toy()
    hp.quantize(new, hp.Int8Config(phm_path="int8"))
    with pytest.warns(DeprecationWarning, match=r"use hyperplex\.quantize\(model, Int8Config\(\.\.\.\)\)"):
        hp.quantize(old, torch.qint8, phm_path="int8")
    with torch.no_grad():
        assert torch.equal(new(x), old(x))


# ------------------------------------------------------------------------------------------- adapters

def test_adapter_targets_none_is_every_linear_layer_and_exclude_leaves_some():
    model = Toy()
    hp.add_adapter(model, "a", hp.PHMAdapterConfig(n=4, exclude=["out", "classifier"]))
    from hyperplex.adapters import adapted_layers
    assert [name for name, _ in adapted_layers(model)] == ["layers.0.query", "layers.0.value",
                                                           "layers.1.query", "layers.1.value"]


def test_adapter_exclude_that_matches_nothing_is_an_error():
    with pytest.raises(ValueError, match=r"PHMAdapterConfig\.exclude: pattern 'key' matches no nn\.Linear"):
        hp.add_adapter(Toy(), "a", hp.PHMAdapterConfig(n=4, targets=["query"], exclude=["key"]))


def test_adapter_round_trip_keeps_exclude(tmp_path):
    model = Toy()
    config = hp.PHMAdapterConfig(n=4, targets=["layers.*"], exclude=["out"])
    hp.add_adapter(model, "a", config)
    hp.save_adapter(model, "a", tmp_path / "a")
    fresh = Toy()
    hp.load_adapter(fresh, tmp_path / "a")
    from hyperplex.adapters import adapted_layers, adapter_config
    assert adapter_config(fresh, "a") == config
    assert [n for n, _ in adapted_layers(fresh)] == [n for n, _ in adapted_layers(model)] != []


# ------------------------------------------------------------------------------------------- old names

def test_old_package_names_warn_and_still_work(monkeypatch):
    import sys

    import hyperplex.convert

    # the warning is given once per process: start from a process that has not imported the old names yet
    monkeypatch.delitem(sys.modules, "hyperplex.convert.quantize", raising=False)
    monkeypatch.delitem(vars(hyperplex.convert), "quantize", raising=False)
    with pytest.warns(DeprecationWarning, match=r"hyperplex\.convert\.quantize is deprecated.*hyperplex\.quantize\("):
        from hyperplex.convert import quantize
    assert quantize is hp.quantize
    import importlib
    with pytest.warns(DeprecationWarning, match=r"hyperplex\.convert\.quantize is deprecated.*use hyperplex\.int8"):
        module = importlib.import_module("hyperplex.convert.quantize")  # the old module path
    assert module.save_quantized is hp.save_quantized
    with pytest.warns(DeprecationWarning):
        from hyperplex.convert import quantize as again  # still the function, not the module
    assert again is hp.quantize
    with pytest.warns(DeprecationWarning, match=r"use hyperplex\.metrics\.accuracy"):
        from hyperplex.train import accuracy
    from hyperplex.metrics import accuracy as new
    assert accuracy is new


def test_top_level_exports_every_config_call_and_save_load():
    for name in ("PHMConfig", "LowRankConfig", "Int8Config", "PHMAdapterConfig", "compress", "quantize", "add_adapter",
                 "save_converted", "load_converted", "save_quantized", "load_quantized", "save_adapter",
                 "load_adapter"):
        assert name in hp.__all__ and getattr(hp, name) is not None


# ------------------------------------------------------------------------------------------- YAML

def test_yaml_selection_key_include_is_refused_naming_targets():
    from pathlib import Path

    from hyperplex.config import ConfigError, load_yaml
    from hyperplex.config.experiment import build_experiment

    raw = load_yaml(Path(__file__).resolve().parents[1] / "configs" / "minilm_compress.yaml")
    assert raw["model"]["targets"] == ["*encoder.layer*"]
    assert build_experiment(copy.deepcopy(raw)).model.targets == ["*encoder.layer*"]
    raw["model"]["include"] = raw["model"].pop("targets")
    with pytest.raises(ConfigError, match=r"model\.include.* is now called 'targets'"):
        build_experiment(raw)


def test_a_saved_folder_config_with_include_is_read_as_targets():
    from hyperplex.config.experiment import upgrade_saved_config

    raw = {"model": {"architecture": "pretrained_student", "include": ["*encoder.layer*"]}}
    upgrade_saved_config(raw)
    # a folder saved before model.balance_factors existed was healed with the factors as fitted
    assert raw == {"model": {"architecture": "pretrained_student", "targets": ["*encoder.layer*"],
                             "balance_factors": False}}
    balanced = {"model": {"architecture": "pretrained_student", "balance_factors": True}}
    upgrade_saved_config(balanced)
    assert balanced == {"model": {"architecture": "pretrained_student", "balance_factors": True}}
    other = {"model": {"architecture": "transformer", "include": ["x"]}}
    upgrade_saved_config(other)
    assert other == {"model": {"architecture": "transformer", "include": ["x"]}}


def test_a_committed_record_with_include_compares_as_targets():
    """An experiment record written before the rename still matches the plan that made it (no "different
    config" refusal on --resume)."""
    from pathlib import Path

    from hyperplex.experiments.runs import saved_config

    record = Path(__file__).resolve().parents[1] / "experiments" / "records" / "minilm_frontier" / "phm4" / "seed1"
    assert "include:" in (record / "config.yaml").read_text()
    model = saved_config(record)["model"]
    assert model["targets"] == ["*encoder.layer*"] and "include" not in model


def test_resuming_a_folder_saved_with_include(tmp_path):
    """hyperplex compress --resume on a model folder whose config.yaml says model.include: read as targets."""
    from hyperplex.config.experiment import resume_experiment

    config = Path(__file__).resolve().parents[1] / "configs" / "minilm_compress.yaml"
    saved = config.read_text().replace("  targets: [", "  include: [")
    assert "include:" in saved
    (tmp_path / "config.yaml").write_text(saved)
    cfg, changed = resume_experiment(tmp_path, config)
    assert cfg.model.targets == ["*encoder.layer*"] and changed == []
