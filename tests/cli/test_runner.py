"""The CLI verbs end to end on a tiny model: train, evaluate, translate (file and stdin), attention
plot, average, params, bench lookup — each needing nothing but the model folder. Each verb's output
is checked against the same computation done directly through the Python API."""

import csv
import io
import json
import sys
from pathlib import Path

import pytest
import torch

from hyperplex import cli
from hyperplex.config import load_yaml
from hyperplex.train.checkpoint import load_model_weights
from hyperplex.train.load import load_model


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


def _metric_series(model_dir: Path, split: str, name: str) -> list[float]:
    with open(model_dir / "metrics.csv", newline="") as f:
        return [float(row["value"]) for row in csv.DictReader(f) if row["split"] == split and row["name"] == name]


def test_bf16_autocast_training_learns_with_fp32_master_weights(tmp_path):
    from conftest import write_tiny_config

    steps, lr = 12, 3e-3
    config = write_tiny_config(tmp_path, precision="bf16", max_steps=steps, validation_every=6, lr=lr)
    model_dir = tmp_path / "bf16"
    assert cli.main(["train", str(config), "--model-dir", str(model_dir)]) == 0
    train_loss, dev_loss = _metric_series(model_dir, "train", "loss"), _metric_series(model_dir, "dev", "loss")
    assert len(train_loss) == steps and len(dev_loss) == 2
    assert all(torch.isfinite(torch.tensor(train_loss + dev_loss)))
    assert sum(train_loss[-3:]) < sum(train_loss[:3])  # it learns under autocast
    assert dev_loss[1] < dev_loss[0]

    # The initial weights: the trainer seeds torch with cfg.seed and then builds the model, so doing
    # the same here rebuilds them (the bound below fails if it does not).
    cfg, task, _ = load_model(model_dir, checkpoint="last", read_data=False)
    torch.manual_seed(cfg.seed)
    initial = task.build_model().state_dict()
    state = load_model_weights(model_dir / "last.safetensors")
    assert set(state) == set(initial)
    for name, weights in state.items():
        assert weights.dtype == torch.float32, name  # fp32 master weights, autocast only in the forward
        change = (weights - initial[name]).abs().max().item()
        # every tensor trained; Adam moves a weight by about lr per step at most
        assert 0 < change <= 2 * steps * lr, (name, change)
        # and the stored values are not bf16 values widened to fp32 (they keep fp32 precision)
        assert not torch.equal(weights, weights.bfloat16().float()), name


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


def test_translate_matches_search_directly(trained):
    _, model_dir = trained
    cfg, task, model = load_model(model_dir, read_data=False)
    from hyperplex.models.search import greedy_search

    line = "x=7,y=1,x-y"
    ids = task.src_vocab.encode(task.src_tok.tokenize(line), add_eos=True)
    hyp = greedy_search(model, torch.tensor([ids]), torch.tensor([len(ids)]), cfg.testing.max_output_length)[0][0]
    expected = task.tgt_tok.detokenize(task.tgt_vocab.decode(hyp.tokens))
    assert task.translate(model, [line], beam_size=1) == [expected]


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