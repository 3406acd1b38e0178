"""The CLI verbs end to end on a tiny model: train, evaluate, translate (file and stdin), attention
plot, average, params, bench lookup — each needing nothing but the model folder."""

import io
import json
import sys

import pytest
import torch

from hyperplex import cli
from hyperplex.cli import runner
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
    assert "--training.lr" not in (model_dir / "config.yaml").read_text()
    assert "lr: 0.003" in (model_dir / "config.yaml").read_text()  # the resolved config, overrides applied


def test_evaluate_prints_metrics_json(trained, capsys):
    _, model_dir = trained
    assert cli.main(["evaluate", str(model_dir), "--beam-size", "2"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert set(metrics) == {"bleu", "chrf", "accuracy", "loss", "ppl", "bleu_signature", "chrf_signature"}
    assert metrics["bleu_signature"].startswith("nrefs:1|") and "tok:13a" in metrics["bleu_signature"]
    assert metrics["ppl"] == pytest.approx(torch.tensor(metrics["loss"]).exp().item(), rel=1e-3)


def test_bf16_autocast_training_runs(tmp_path):
    from conftest import write_tiny_config

    config = write_tiny_config(tmp_path, precision="bf16", max_steps=3, validation_every=3)
    assert cli.main(["train", str(config), "--model-dir", str(tmp_path / "bf16")]) == 0
    state = load_model_weights(tmp_path / "bf16" / "last.safetensors")
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in state.values())  # fp32 master weights


def test_translate_file_stdin_and_attention_plot(trained, tmp_path, capsys, monkeypatch):
    _, model_dir = trained
    src = tmp_path / "in.txt"
    src.write_text("x=1,y=2,x+y\ny=-5,x=3,y*x\n")
    out = tmp_path / "out.txt"
    png = tmp_path / "attention.png"
    assert cli.main(["translate", str(model_dir), "-i", str(src), "-o", str(out), "--plot-attention", str(png)]) == 0
    lines = out.read_text().splitlines()
    assert len(lines) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    monkeypatch.setattr(sys, "stdin", io.StringIO("x=1,y=2,x+y\ny=-5,x=3,y*x\n"))
    assert cli.main(["translate", str(model_dir)]) == 0
    assert capsys.readouterr().out.splitlines() == lines  # same model, same greedy decoding


def test_translate_matches_search_directly(trained):
    _, model_dir = trained
    cfg, task, model = runner.load_model(model_dir, read_data=False)
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


def test_params_verb_prints_breakdown(trained, capsys):
    config, _ = trained
    assert cli.main(["params", str(config), "--vocab-size", "30"]) == 0
    out = capsys.readouterr().out
    assert "| phm_rules |" in out and "| total |" in out


def test_bench_lists_available_scripts(capsys):
    assert cli.main(["bench", "nonexistent"]) == 1
    err = capsys.readouterr().err
    assert "no benchmark" in err and "phm" in err
