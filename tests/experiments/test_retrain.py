"""experiments/retrain/lanes.sh: its two chains train every model of each re-trained plan exactly once, from the
frozen copy its table names, and it refuses to start without an interpreter or a data folder."""

from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import yaml

from hyperplex.experiments.plan import load_plan

ROOT = Path(__file__).resolve().parents[2]
LANES = ROOT / "experiments" / "retrain" / "lanes.sh"


def lanes(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(LANES), *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **env})


def trained_models(plan: str) -> Counter:
    """Every model the plan trains, as ``ROW:SEED``: its rows as the plan expands them (a sweep row is one row per
    value, named as its records are), less the rows that reuse another's models."""
    path = ROOT / "experiments" / f"{plan}.yaml"
    seeds = yaml.safe_load(path.read_text())["seeds"]
    rows = [row.name for row in load_plan(path).rows if not row.models_from]
    return Counter(f"{row}:{seed}" for row in rows for seed in seeds)


def test_the_chains_train_every_model_of_each_plan_once_from_the_copy_the_table_names():
    done = lanes("list")
    assert done.returncode == 0, done.stderr
    listed: dict[str, Counter] = {}
    commits: dict[str, set[str]] = {}
    for line in done.stdout.splitlines():
        chain, commit, plan, model = line.split()
        assert chain in {"a", "b"}
        listed.setdefault(plan, Counter())[model] += 1
        commits.setdefault(plan, set()).add(commit)
    table = (ROOT / "experiments" / "retrain" / "README.md").read_text()
    named = dict(re.findall(r"^\| `([a-z0-9_]+)` \| ([0-9a-f]{7}) \|", table, flags=re.M))
    assert set(listed) == set(named)
    for plan, models in listed.items():
        assert models == trained_models(plan), plan
        assert commits[plan] == {named[plan]}, plan


def test_start_refuses_without_an_interpreter_or_data(tmp_path):
    done = lanes("start", HYPERPLEX_PYTHON=str(tmp_path / "nopython"), LANES=str(tmp_path / "lanes"))
    assert done.returncode == 2 and "no interpreter" in done.stderr
    done = lanes("start", HYPERPLEX_PYTHON="/bin/sh", HYPERPLEX_DATA=str(tmp_path / "nodata"),
                 LANES=str(tmp_path / "lanes"))
    assert done.returncode == 2 and "no data folder" in done.stderr
    assert not (tmp_path / "lanes").exists()
    assert lanes("sideways").returncode == 2
