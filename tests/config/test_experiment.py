"""hyperplex.config.experiment: the experiment schema, loading with overrides, the saved form, resume
reconciliation, and the decoding checks."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from hyperplex.config import ConfigError
from hyperplex.config import experiment as schema  # (a TestingConfig name here would be collected by pytest)
from hyperplex.config.experiment import (
    RESUMABLE_KEYS,
    build_experiment,
    check_beam_size,
    default_data_root,
    experiment_dict,
    load_experiment,
    resolve_data_path,
    resume_experiment,
)
from hyperplex.models.rnn_translator import RNNTranslatorConfig
from hyperplex.models.transformer import TransformerConfig

RAW = {"name": "x", "model_dir": "runs/x", "data": {"task": "translation", "src": "en", "tgt": "de"},
       "model": {"architecture": "transformer", "d_model": 16, "num_heads": 2, "d_ff": 32,
                 "linear": {"kind": "phm", "n": 2}},
       "training": {"max_steps": 10}}


def test_the_model_section_becomes_its_architectures_dataclass_once():
    cfg = build_experiment(RAW)
    assert type(cfg.model) is TransformerConfig and cfg.model.architecture == "transformer"
    assert cfg.model.linear.kind == "phm" and cfg.model.linear.n == 2
    rnn = build_experiment({**RAW, "model": {"architecture": "rnn_translator", "hidden_size": 8, "embedding_dim": 8}})
    assert type(rnn.model) is RNNTranslatorConfig


def test_compile_is_accepted_for_a_transformer():
    assert build_experiment({**RAW, "training": {"max_steps": 10, "compile": True}}).training.compile


def test_experiment_dict_is_what_config_yaml_holds_and_round_trips():
    cfg = build_experiment(RAW)
    saved = experiment_dict(cfg)
    assert list(saved["model"])[0] == "architecture" and saved["model"]["linear"] == {
        "kind": "phm", "n": 2, "rule": "learned", "rule_init": "random", "shared_rule": False, "factor_rank": None,
        "rank_rounding": "floor"}
    again = build_experiment(yaml.safe_load(yaml.safe_dump(saved)))
    assert experiment_dict(again) == saved and again == cfg


@pytest.mark.parametrize("change,message", [
    ({"model": None}, "model.architecture is required; valid for task 'translation': rnn_translator, transformer"),
    ({"model": {"architecture": "nli_encoder", "hidden_size": 8}},
     "model.architecture 'nli_encoder' cannot do task 'translation'"),
    ({"model": {**RAW["model"], "d_model": 15}}, "model.d_model=15 must be even"),
    ({"data": {"task": "translate"}}, "data.task: 'translate' is not one of 'translation'"),
    ({"model": {**RAW["model"], "linear": {"kind": "phm", "n": 3}}}, "model.d_model=16 must be a multiple of "
                                                                     "model.linear.n=3"),
    ({"model": {"architecture": "rnn_translator", "hidden_size": 8, "embedding_dim": 8},
      "training": {"max_steps": 10, "compile": True}},
     "training.compile: model.architecture 'rnn_translator' runs its LSTM one time step at a time"),
    ({"data": {"task": "pair_classification"}, "model": {"architecture": "nli_encoder", "hidden_size": 8},
      "training": {"max_steps": 10, "compile": True}},
     "training.compile: model.architecture 'nli_encoder' runs its LSTM"),
])
def test_invalid_experiments_are_refused_with_the_key(change, message):
    raw = {**RAW, **change}
    if raw["model"] is None:
        del raw["model"]
    with pytest.raises(ConfigError) as caught:
        build_experiment(raw)
    assert message in str(caught.value)


@pytest.mark.parametrize("change,message", [
    ({"lr": 0.0}, "training: lr must be > 0, got 0.0"),
    ({"eps": -1e-8}, "training: eps must be ≥ 0, got -1e-08"),
    ({"weight_decay": -0.1}, "training: weight_decay must be ≥ 0, got -0.1"),
    ({"momentum": -0.9}, "training: momentum must be ≥ 0, got -0.9"),
    ({"clip_grad_norm": -1.0}, "training: clip_grad_norm must be ≥ 0, got -1.0"),
    ({"betas": [0.9, 1.0]}, "training: betas must each be in [0, 1), got [0.9, 1.0]"),
    ({"betas": [-0.1, 0.98]}, "training: betas must each be in [0, 1), got [-0.1, 0.98]"),
])
def test_optimiser_settings_torch_would_refuse_are_refused_at_the_key(change, message):
    """Refused when the config is read, with the key, not by torch's optimiser after the data is read."""
    with pytest.raises(ConfigError) as caught:
        build_experiment({**RAW, "training": {**RAW.get("training", {}), **change}})
    assert message in str(caught.value)
    assert caught.value.key == f"training.{next(iter(change))}"
    cfg = build_experiment({**RAW, "training": {**RAW.get("training", {}), "betas": [0.0, 0.999], "eps": 0.0}})
    assert cfg.training.betas == [0.0, 0.999]


def test_load_experiment_applies_overrides_and_names_the_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(RAW))
    cfg = load_experiment(path, ["--training.lr=3e-4", "model.linear.n=4"], model_dir=str(tmp_path / "m"))
    assert cfg.training.lr == 3e-4 and cfg.model.linear.n == 4 and cfg.model_dir == str(tmp_path / "m")
    # a bad key or value given as an override is blamed on the override, with the file it was laid over
    with pytest.raises(ConfigError, match=rf"^override --training.lrr=1: unknown config key 'training.lrr'.* \(on top "
                                          rf"of {path}\)$"):
        load_experiment(path, ["--training.lrr=1"])
    with pytest.raises(ConfigError, match=r"^override --training.lr=fast: training.lr: expected float"):
        load_experiment(path, ["--training.lr=fast"])
    # a section's own check on an overridden value is the override's too, and the error keeps the key at fault
    with pytest.raises(ConfigError, match=rf"^override --training.lr=-1: training: lr must be > 0.* \(on top of "
                                          rf"{path}\)$") as caught:
        load_experiment(path, ["--training.lr=-1"])
    assert caught.value.key == "training.lr"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**RAW, "training": {**RAW.get("training", {}), "lrr": 1}}))
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if text.strip().startswith("lrr:"))
    with pytest.raises(ConfigError, match=rf"^{bad}:{line}: unknown config key 'training.lrr'"):  # the file's key
        load_experiment(bad, ["--training.lr=3e-4"])
    no_dir = tmp_path / "n.yaml"
    no_dir.write_text(yaml.safe_dump({k: v for k, v in RAW.items() if k != "model_dir"}))
    with pytest.raises(ConfigError, match="no model folder"):
        load_experiment(no_dir)


def test_resume_keeps_the_saved_run_and_takes_only_budget_keys(tmp_path):
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.yaml").write_text(yaml.safe_dump(experiment_dict(build_experiment(RAW))))
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(RAW))
    cfg, changes = resume_experiment(folder, path, ["--training.max_steps=20", "--training.log_every=5"])
    assert cfg.training.max_steps == 20 and cfg.training.log_every == 5
    assert changes == ["training.log_every: 50 → 5", "training.max_steps: 10 → 20"]
    with pytest.raises(ConfigError, match=r"^--resume: training.lr: saved 0.001, now 0.5"):
        resume_experiment(folder, path, ["--training.lr=0.5"])
    # a key the file leaves at its default is not compared, whatever the saved value
    saved = yaml.safe_load((folder / "config.yaml").read_text())
    saved["training"]["eps"] = 1e-6
    (folder / "config.yaml").write_text(yaml.safe_dump(saved))
    cfg, changes = resume_experiment(folder, path)
    assert cfg.training.eps == 1e-6 and changes == []
    assert {"training.max_steps", "training.max_epochs", "training.patience"} <= RESUMABLE_KEYS


def test_beam_checks_are_one_function_for_the_key_and_the_flag():
    with pytest.raises(ValueError, match=r"^beam_size must be ≥ 1 \(1 = greedy\), got 0$"):
        schema.TestingConfig(beam_size=0)
    with pytest.raises(ValueError, match=r"^validation_beam_size must be ≥ 1"):
        schema.TestingConfig(validation_beam_size=0)
    with pytest.raises(ValueError, match=r"^--beam-size must be ≥ 1 \(1 = greedy\), got -2$"):
        schema.TestingConfig().with_beam_size(-2)
    assert schema.TestingConfig().with_beam_size(None) == schema.TestingConfig()
    assert schema.TestingConfig().with_beam_size(3).beam_size == 3
    with pytest.raises(ValueError):
        check_beam_size(True, "x")  # a bool is not a width


def test_data_root_and_data_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HYPERPLEX_DATA", str(tmp_path))
    assert default_data_root() == str(tmp_path)
    (tmp_path / "corpus").mkdir()
    assert resolve_data_path("corpus/train", str(tmp_path)) == tmp_path / "corpus" / "train"
    assert resolve_data_path(str(tmp_path / "abs"), "/elsewhere") == tmp_path / "abs"
    assert resolve_data_path("x/y", None) == Path("x/y")


def test_a_sections_own_check_points_at_the_line_of_the_key_it_names(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({**RAW, "training": {"max_steps": 10, "lr": -1.0}}))
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if text.strip().startswith("lr:"))
    with pytest.raises(ConfigError, match=rf"^{path}:{line}: training: lr must be > 0, got -1.0$"):
        load_experiment(path)
