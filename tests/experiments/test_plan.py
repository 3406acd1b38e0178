"""hyperplex.experiments.plan: the plan schema (unknown keys and wrong types name the key and the file), row
references, sweeps expanded into one row per value."""

import pytest
import yaml
from conftest import write_tiny_config

from hyperplex.experiments.plan import PlanError, load_plan
from hyperplex.experiments.runs import run_overrides, validate


def test_plan_errors_name_the_problem(tmp_path):
    write_tiny_config(tmp_path)
    cases = [({"rows": [{"name": "a", "config": "nowhere.yaml"}]}, "nowhere.yaml"),
             ({"rows": [{"name": "a", "config": "tiny.yaml", "seed": [1]}]}, "did you mean 'seeds'"),
             ({"rows": [{"name": "a", "models_from": "b"}]}, "models_from 'b'"),
             ({"metrics": ["bleuu"], "rows": [{"name": "a", "config": "tiny.yaml"}]}, "metrics"),
             ({"rows": [{"name": "a", "config": "tiny.yaml", "eval_overrides": ["--training.lr=1"]}]}, "testing")]
    for extra, message in cases:
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump({"title": "t", "metrics": ["loss"], **extra}))
        with pytest.raises(PlanError, match=message):
            load_plan(path)
    path.write_text(yaml.safe_dump({"title": "t", "metrics": ["map"], "rows": [{"name": "a", "config": "tiny.yaml"}]}))
    with pytest.raises(PlanError, match="do not exist for task 'translation'"):
        validate(load_plan(path), None, None, tmp_path / "out", [], False)


def test_sweep_row_expands_to_one_row_per_value(tmp_path, sweep_plan):
    plan = load_plan(sweep_plan(tmp_path, values=[0.0005, 1e-05, 0.015], seeds=[1, 2]))
    assert [r.name for r in plan.rows] == ["phm2_lr0.0005", "phm2_lr1e-05", "phm2_lr0.015", "dense"]
    first = plan.rows[0]
    assert (first.label, first.sweep_of, first.sweep_key, first.sweep_value) == ("PHM n=2, lr 0.0005", "phm2",
                                                                                 "training.lr", 0.0005)
    assert first.seeds == [1, 2] and first.overrides == ["--training.lr=0.0005"]
    # the swept value comes after the budget and the row's overrides, so it wins
    assert run_overrides(plan, plan.rows[1], 2, [])[-2:] == ["--training.lr=1e-05", "--seed=2"]
    # --rows accepts the sweep's name for all of its rows
    to_train, _, resolved = validate(plan, ["phm2"], None, tmp_path / "out", [], False)
    assert sorted({r.row.name for r in to_train}) == ["phm2_lr0.0005", "phm2_lr0.015", "phm2_lr1e-05"]
    assert [resolved[n].training.lr for n in ("phm2_lr0.0005", "phm2_lr1e-05", "phm2_lr0.015")] == [5e-4, 1e-5, 0.015]


@pytest.mark.parametrize("sweep,message", [({"key": "training.lr", "values": [0.001]}, "≥ 2 distinct"),
                                           ({"key": "lr", "values": [0.1, 0.2]}, "dotted config key"),
                                           ({"key": "training.lr"}, "mapping"),
                                           ({"key": "training.lr", "values": [0.1, 0.1]}, "distinct")])
def test_bad_sweeps_are_plan_errors(tmp_path, sweep, message, write_plan):
    path = write_plan(tmp_path, rows=[{"name": "a", "config": "tiny.yaml", "sweep": sweep}])
    with pytest.raises(PlanError, match=message):
        load_plan(path)


def test_plan_keys_are_checked_like_every_config(tmp_path):
    """Unknown keys and wrong types are errors that name the plan file and the dotted key."""
    import re

    write_tiny_config(tmp_path)
    path = tmp_path / "p.yaml"
    row = {"name": "a", "config": "tiny.yaml"}
    cases = [({"budjet": []}, "unknown config key 'budjet'; did you mean 'budget'?"),
             ({"digits": "two"}, "digits: expected int, got str 'two'"),
             ({"checkpoint": "first"}, "checkpoint: 'first' is not one of 'last', 'best'"),
             ({"rows": [{**row, "train": "no"}]}, "rows[0].train: expected bool | null, got 'no'"),
             ({"rows": [{**row, "heal": False}]}, "config key 'rows[0].heal' is now called 'train'"),
             ({"rows": [row, {"name": "b", "model_of": "a"}]}, "config key 'rows[1].model_of' is now called "
                                                             "'models_from'"),
             ({"rows": [{**row, "sweep": {"key": "training.lr", "valus": [1, 2]}}]},
              "unknown config key 'rows[0].sweep.valus'; did you mean 'values'?"),
             # a report's command lines carry the overrides: each must be what `hyperplex train` takes
             ({"rows": [{**row, "overrides": ["model.linear.n=4"]}]},
              "rows[0]: row 'a': overrides: 'model.linear.n=4' is not of the form --section.key=value"),
             ({"budget": ["--training.max_steps"]}, "budget: '--training.max_steps' is not of the form"),
             ({"rows": [row, {"name": "b", "models_from": "a", "eval_overrides": ["testing.beam_size=1"]}]},
              "rows[1]: row 'b': eval_overrides: 'testing.beam_size=1' is not of the form")]
    for extra, message in cases:
        path.write_text(yaml.safe_dump({"title": "t", "metrics": ["loss"], "rows": [row], **extra}))
        with pytest.raises(PlanError, match=rf"{re.escape(str(path))}:\d+: {re.escape(message)}"):  # the key's line
            load_plan(path)
    path.write_text(yaml.safe_dump({"title": "t", "metrics": ["loss"], "rows": [row], "digits": 3}))
    plan = load_plan(path)
    assert ((plan.name, plan.digits, plan.checkpoint, plan.rows[0].seeds, plan.rows[0].label)
            == ("p", 3, "last", [1], "a"))


def test_the_plan_reference_is_generated_from_the_schema():
    """experiments/README.md lists the plan keys as the schema renders them (it cannot drift from the code)."""
    from pathlib import Path

    from hyperplex.config import reference_markdown
    from hyperplex.experiments.plan import PlanFile, RowSpec, SweepSpec

    readme = (Path(__file__).resolve().parents[2] / "experiments" / "README.md").read_text(encoding="utf-8")
    for schema, keys in ((PlanFile, ("title", "rows", "metrics", "budget", "checkpoint", "quality")),
                         (RowSpec, ("name", "config", "models_from", "eval_split", "sweep", "match_params", "train")),
                         (SweepSpec, ("key", "values"))):
        text = reference_markdown(schema)
        assert all(f"| `{key}` |" in text for key in keys), schema
        assert text in readme, f"experiments/README.md: the table of {schema.__name__} differs from the schema"


@pytest.mark.parametrize("row,name", [("..", None), (".", None), ("a", ".."), ("a", ".")])
def test_row_and_plan_names_that_lead_out_of_the_output_folder_are_refused(tmp_path, row, name):
    """`..` matches the folder-name letters but would train into OUT/../seed1 (and records into RECORDS/..)."""
    write_tiny_config(tmp_path)
    path = tmp_path / "p.yaml"
    spec = {"title": "t", "metrics": ["loss"], "rows": [{"name": row, "config": "tiny.yaml"}]}
    if name is not None:
        spec["name"] = name
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(PlanError, match=r"folder-safe.*not '\.' or '\.\.'"):
        load_plan(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml", "tiny.yaml"]  # nothing trained or written
