import csv

import numpy as np
import pytest
import torch
from torch import nn

from hyperplex.layers import PHMLinear
from hyperplex.train.plots import plot_attention, plot_metrics, plot_phm_rules, read_metrics_csv

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def is_png(path):
    with open(path, "rb") as f:
        return f.read(8) == PNG_MAGIC


def write_metrics(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "epoch", "split", "name", "value"])
        w.writerows(rows)


def test_plot_metrics(tmp_path):
    rows = [(s, 1, "train", "lr", 1e-3) for s in (10, 20, 30)]
    rows += [(s, 1, "train", "loss", 3.0 - 0.1 * s / 10) for s in (10, 20, 30)]
    rows += [(20, 1, "dev", "loss", 2.9), (20, 1, "dev", "bleu", 1.5),
             (30, 2, "dev", "loss", 2.7), (30, 2, "dev", "bleu", 2.5)]
    write_metrics(tmp_path / "metrics.csv", rows)
    series = read_metrics_csv(tmp_path / "metrics.csv")
    assert series[("loss", "dev")] == ([20, 30], [2.9, 2.7])
    names = plot_metrics(tmp_path / "metrics.csv", tmp_path / "curves.png")
    assert names == ["loss", "lr", "bleu"]  # loss first, then order of appearance
    assert is_png(tmp_path / "curves.png")


def test_plot_metrics_empty_and_bad(tmp_path):
    write_metrics(tmp_path / "empty.csv", [])
    assert plot_metrics(tmp_path / "empty.csv", tmp_path / "none.png") == []
    assert not (tmp_path / "none.png").exists()
    (tmp_path / "bad.csv").write_text("step,value\n1,2\n")
    with pytest.raises(ValueError, match="bad.csv: missing column\\(s\\) epoch, split, name"):
        plot_metrics(tmp_path / "bad.csv", tmp_path / "x.png")
    write_metrics(tmp_path / "nan.csv", [(1, 1, "train", "loss", "oops")])
    with pytest.raises(ValueError, match="nan.csv, line 2"):
        plot_metrics(tmp_path / "nan.csv", tmp_path / "x.png")
    with pytest.raises(ValueError, match="no such metrics file"):
        plot_metrics(tmp_path / "missing.csv", tmp_path / "x.png")


def test_plot_attention(tmp_path):
    weights = torch.softmax(torch.randn(3, 4), dim=-1)  # (T, S)
    out = plot_attention(weights, ["a", "b", "c", "</s>"], ["x", "y", "</s>"], tmp_path / "att.png", title="demo")
    assert out.endswith("att.png") and is_png(out)
    assert is_png(plot_attention(np.eye(2), ["a", "b"], ["c", "d"], tmp_path / "eye.png"))
    with pytest.raises(ValueError, match=r"shape \(3, 4\), expected .* = \(4, 3\)"):
        plot_attention(weights, ["a", "b", "c"], ["x", "y", "z", "w"], tmp_path / "bad.png")


class Mixed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = PHMLinear(8, 8, 2)
        self.b = nn.Sequential(PHMLinear(8, 8, 4, rule="quaternion"), nn.Linear(8, 8), PHMLinear(8, 8, 1))
        self.c = PHMLinear(8, 16, 8)


def test_plot_phm_rules(tmp_path):
    assert plot_phm_rules(Mixed(), tmp_path / "rules.png") == 3  # n = 1 and nn.Linear are skipped
    assert is_png(tmp_path / "rules.png") and not (tmp_path / "rules-2.png").exists()


def test_plot_phm_rules_paginates(tmp_path):
    model = nn.Sequential(*[PHMLinear(4, 4, 2) for _ in range(5)])
    assert plot_phm_rules(model, tmp_path / "rules.png", layers_per_page=2) == 5
    assert [is_png(tmp_path / f) for f in ("rules.png", "rules-2.png", "rules-3.png")] == [True] * 3
    assert not (tmp_path / "rules-4.png").exists()


def test_plot_phm_rules_no_layers(tmp_path):
    assert plot_phm_rules(nn.Sequential(nn.Linear(4, 4), PHMLinear(4, 4, 1)), tmp_path / "rules.png") == 0
    assert not (tmp_path / "rules.png").exists()
    assert plot_phm_rules(PHMLinear(4, 4, 2), tmp_path / "one.png") == 1  # the model itself is a PHM layer
