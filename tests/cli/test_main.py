"""The CLI verbs end to end on a tiny model (hyperplex.cli.main): train, evaluate, translate (file and stdin),
attention plot, average, params, no bench verb — each needing nothing but the model folder. Each verb's output
is checked against the same computation done directly through the Python API."""

import io
import json
import sys

import pytest
import torch
from conftest import without_compiler

from hyperplex import cli
from hyperplex.config import load_yaml
from hyperplex.inference.load import load_model
from hyperplex.train.checkpoint import load_model_weights


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import write_tiny_config

    tmp = tmp_path_factory.mktemp("runner")
    config = write_tiny_config(tmp, max_steps=24, validation_every=8, keep_best=3, plots=True)
    model_dir = tmp / "model"
    assert cli.main(["train", str(config), "--model-dir", str(model_dir), "--training.lr=0.003"]) == 0
    return config, model_dir


def test_model_folder_has_everything(trained):
    _, model_dir = trained
    for name in ("config.yaml", "train.log", "metrics.csv", "last.safetensors", "best.safetensors",
                 "checkpoints.json", "src.json", "src_vocab.json", "curves.png", "phm_rules.png"):
        assert (model_dir / name).is_file(), name
    assert any((model_dir / "tensorboard").iterdir())
    saved = load_yaml(model_dir / "config.yaml")  # the resolved config: overrides applied, not recorded as flags
    assert saved["training"]["lr"] == 0.003 and saved["training"]["max_steps"] == 24
    assert "--training.lr" not in (model_dir / "config.yaml").read_text()


def test_evaluate_prints_the_metrics_of_the_loaded_model(trained, capsys):
    _, model_dir = trained
    assert cli.main(["evaluate", str(model_dir), "--beam-size", "2"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    _, task, model = load_model(model_dir)  # the same model scored directly, same beam
    expected = task.validate(model, beam_size=2)
    assert set(expected) == {"bleu", "chrf", "accuracy", "loss", "ppl"}
    assert {k: v for k, v in metrics.items() if not k.endswith("_signature")} == \
        {k: round(v, 4) for k, v in expected.items()}  # the CLI prints 4 decimals
    assert {k.removesuffix("_signature"): v for k, v in metrics.items() if k.endswith("_signature")} == \
        task.signatures and set(task.signatures) == {"bleu", "chrf"}
    assert metrics["ppl"] == pytest.approx(torch.tensor(metrics["loss"]).exp().item(), rel=1e-3)


def test_translate_file_stdin_and_attention_plot(trained, tmp_path, capsys, monkeypatch):
    _, model_dir = trained
    src = tmp_path / "in.txt"
    src.write_text("x=1,y=2,x+y\ny=-5,x=3,y*x\n")
    out = tmp_path / "out.txt"
    png = tmp_path / "attention.png"
    assert cli.main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--plot-attention", str(png)]) == 0
    lines = out.read_text().splitlines()
    _, task, model = load_model(model_dir, read_data=False)  # the same model, the config's decoding
    assert lines == task.translate(model, src.read_text().splitlines())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("x=1,y=2,x+y\ny=-5,x=3,y*x\n"))
    assert cli.main(["translate", str(model_dir)]) == 0
    assert capsys.readouterr().out.splitlines() == lines  # same model, same greedy decoding


def test_average_of_best_checkpoints_is_the_mean(trained, tmp_path, capsys):
    _, model_dir = trained
    best = sorted(model_dir.glob("best-*.safetensors"))
    assert len(best) >= 2
    out = tmp_path / "avg.safetensors"
    assert cli.main(["average", *map(str, best), "-o", str(out)]) == 0
    avg = load_model_weights(out)
    states = [load_model_weights(p) for p in best]
    for key, value in avg.items():
        torch.testing.assert_close(value, sum(s[key] for s in states) / len(states))
    # the averaged weights load into the model and decode
    assert cli.main(["translate", str(model_dir), "--checkpoint", str(out), "-i", str(_one_line(tmp_path))]) == 0


def _one_line(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("x=2,y=2,x*y\n")
    return path


def test_params_verb_counts_the_model(trained, capsys):
    from hyperplex.config.registry import get_architecture

    config, model_dir = trained
    assert cli.main(["params", str(config), "--vocab-size", "30"]) == 0
    out = capsys.readouterr().out
    rows = {cells[1].strip(): int(cells[2].replace(",", "")) for cells in
            (line.split("|") for line in out.splitlines()[3:] if line.startswith("| "))}
    cfg, _, trained_model = load_model(model_dir, read_data=False)
    model = get_architecture(cfg.model.architecture).load()[1](cfg.model, 30, 30)  # the config's model, vocab 30
    assert rows["total"] == sum(p.numel() for p in model.parameters())
    # the learned PHM rules A_i do not depend on the vocabulary: the trained model has the same ones
    assert rows["phm_rules"] == sum(p.numel() for n, p in trained_model.named_parameters() if n.endswith("phm_rule"))
    assert rows["phm_rules"] > 0


def test_benchmarks_are_scripts_not_a_verb(capsys):
    """Benchmarks live in a source checkout's benchmarks/ and run as scripts; the installed command has no
    verb that would look for them."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", "phm"])
    assert exit_info.value.code == 2 and "invalid choice: 'bench'" in capsys.readouterr().err


def test_native_verb_builds_checks_and_installs_the_kernel(capsys, monkeypatch, kernel_cache):
    from hyperplex.layers import native

    assert cli.main(["native"]) == 0
    out = capsys.readouterr().out
    assert f"native PHM kernel: {kernel_cache / kernel_cache.name}.so" in out
    worst = max(r["error"] for r in native.self_check())  # the same seeded layers: the same figure
    assert f"6 shapes (n = 2, 3, 4, 8, 16, 16): largest error {worst:.1e} of the largest output" in out
    assert f"installed ({kernel_cache / native.INSTALL_MARKER})" in out and "HYPERPLEX_NATIVE=0 turns it off" in out
    assert native.native_kernels_enabled()  # HYPERPLEX_NATIVE unset (the fixture): the installed build
    monkeypatch.setenv(native.ENV_VAR, "0")
    assert cli.main(["native"]) == 0
    assert "note: HYPERPLEX_NATIVE=0 in this environment keeps it off here" in capsys.readouterr().out
    assert cli.main(["native", "--uninstall"]) == 0
    assert capsys.readouterr().out.startswith(f"removed {kernel_cache / native.INSTALL_MARKER}: PHM layers stay")
    monkeypatch.delenv(native.ENV_VAR)
    assert not native.native_kernels_enabled() and (kernel_cache / f"{kernel_cache.name}.so").is_file()
    assert cli.main(["native", "--uninstall"]) == 0
    assert "was not installed for this CPU, source and torch: nothing to remove" in capsys.readouterr().out


def test_native_verb_without_a_compiler_is_one_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    without_compiler(monkeypatch)  # nothing built here before either
    assert cli.main(["native"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hyperplex native: error: hyperplex's native PHM kernel needs c++ and ninja") and \
        err.count("\n") == 1


def test_params_of_a_huge_vocabulary_counts_without_allocating(tmp_path, capsys):
    """The model is built on the meta device: 10**12 embedding rows are counted, not allocated."""
    from conftest import write_tiny_config

    config = write_tiny_config(tmp_path)
    assert cli.main(["params", str(config), "--vocab-size", str(10 ** 12)]) == 0
    out = capsys.readouterr().out
    assert "vocabulary 1000000000000" in out and "| embeddings | 32,000,000,000,000 |" in out
    assert cli.main(["params", str(config), "--vocab-size", "100"]) == 0
    assert "| embeddings | 3,200 |" in capsys.readouterr().out  # the same rule at an ordinary size


def test_version_names_hyperplex_torch_and_the_build(capsys):
    import hyperplex

    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    out = capsys.readouterr().out.strip()
    build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU build"
    assert out == f"hyperplex {hyperplex.__version__} (torch {torch.__version__}, {build})"


def test_a_verbs_own_option_named_like_a_config_key_reaches_the_verb(monkeypatch, tmp_path):
    """``demo --seed`` is demo's option, not a config override (``--seed`` is also a top-level config key, which
    the verbs that take overrides read as one)."""
    import hyperplex.experiments.demo as demo

    seen = {}
    monkeypatch.setattr(demo, "run_demo", lambda out, quick, seed, threads: seen.update(seed=seed, quick=quick))
    assert cli.main(["demo", "--seed", "3", "--quick", "--out", str(tmp_path)]) == 0
    assert seen == {"seed": 3, "quick": True}
    assert cli.main(["demo", "--seed=5", "--out", str(tmp_path)]) == 0 and seen["seed"] == 5


def test_global_debug_before_the_verb_is_parsed_like_after_it(monkeypatch, tmp_path, capsys):
    """``hyperplex --debug experiment PLAN`` is the experiment verb, which records its command line."""
    import hyperplex.experiments.cli as experiments_cli

    seen = []
    monkeypatch.setattr(experiments_cli, "run", lambda args, command: seen.append(command) or 0)
    assert cli.main(["--debug", "experiment", str(tmp_path / "plan.yaml"), "--dry-run"]) == 0
    assert seen == [f"hyperplex --debug experiment {tmp_path / 'plan.yaml'} --dry-run"]


def test_report_only_and_no_report_together_are_a_usage_error(capsys):
    """Together they would train nothing and report nothing, and exit 0 as if they had done something."""
    with pytest.raises(SystemExit) as stop:
        cli.main(["experiment", "experiments/arithmetic.yaml", "--report-only", "--no-report"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
