"""Plans for the experiment tests: a tiny generated-arithmetic config with 2 rows × 2 seeds of 4 steps each."""

import json
from pathlib import Path

import pytest
import yaml
from conftest import write_tiny_config


def _write_plan(directory: Path, rows=None, name="tiny_plan") -> Path:
    write_tiny_config(directory, progress_bar=False)
    plan = {"name": name, "title": "tiny plan: 4 steps", "seeds": [1, 2], "metrics": ["loss", "accuracy"],
            "budget": ["--training.max_steps=4", "--training.validation_every=4", "--training.plots=false"],
            "rows": rows or [{"name": "phm2", "label": "PHM n=2", "config": "tiny.yaml"},
                             {"name": "dense", "config": "tiny.yaml", "overrides": ["--model.linear.kind=dense"]}]}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(plan, allow_unicode=True))
    return path


def _sweep_plan(directory: Path, values=(0.001, 0.003), seeds=(1,)) -> Path:
    return _write_plan(directory, name="sweep_plan", rows=[
        {"name": "phm2", "label": "PHM n=2", "config": "tiny.yaml", "seeds": list(seeds),
         "sweep": {"key": "training.lr", "values": list(values)}},
        {"name": "dense", "config": "tiny.yaml", "overrides": ["--model.linear.kind=dense"], "seeds": list(seeds)}])


@pytest.fixture
def write_plan():
    """``write_plan(directory, rows=None, name="tiny_plan") -> plan path`` (the tiny config written beside it)."""
    return _write_plan


@pytest.fixture
def sweep_plan():
    """``sweep_plan(directory, values=(0.001, 0.003), seeds=(1,))``: a PHM row sweeping training.lr, and a dense row."""
    return _sweep_plan


@pytest.fixture(scope="session")
def done(tmp_path_factory):
    """(plan, out, results page, results.json) of the tiny plan trained once with ``--append-to``."""
    from hyperplex.experiments.cli import main

    tmp = tmp_path_factory.mktemp("plan")
    plan = _write_plan(tmp)
    out = tmp / "out"
    doc = tmp / "results_doc.md"
    doc.write_text("# Results\n\nkept text\n")
    assert main([str(plan), "--out", str(out), "--append-to", str(doc)]) == 0
    return plan, out, doc, json.loads((out / "results.json").read_text())
