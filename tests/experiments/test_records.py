"""hyperplex.experiments.records: a plan reported from records when its model folders are gone, and records that
do not churn when a plan is reported again."""

import json

import pytest

from hyperplex.experiments import cli
from hyperplex.experiments.cli import main


def test_records_let_a_plan_be_reported_without_its_model_folders(tmp_path, monkeypatch, capsys, write_plan):
    # a plan trained in one place (lane 1: seed 1), recorded, its folders lost; seed 2 trained elsewhere later:
    # the report combines the record and the folder, nothing is retrained or re-evaluated
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]},
                                       {"name": "dense_beam1", "models_from": "dense",
                                        "eval_overrides": ["--testing.beam_size=1"]}])
    out, records = tmp_path / "out", tmp_path / "records"
    assert main([str(plan), "--out", str(out), "--seeds", "1", "--no-report", "--evaluate-each",
                     "--records", str(records)]) == 0
    record = records / "dense" / "seed1"
    info = json.loads((record / "record.json").read_text())
    assert info["status"] == "finished" and info["healed"] is True
    assert {"config.yaml", "experiment.json", "train.log", "evaluation-dense.json", "evaluation-dense_beam1.json",
            "hypotheses-dense.txt", "hypotheses-dense_beam1.txt"} <= set(info["files"])
    assert not list(record.glob("*.safetensors"))
    scored = (out / "dense" / "seed1" / "hypotheses-dense.txt").read_bytes()
    assert (record / "hypotheses-dense.txt").read_bytes() == scored
    evaluated = json.loads((out / "dense" / "seed1" / "evaluation-dense.json").read_text())["result"]
    import shutil
    shutil.rmtree(out / "dense" / "seed1")  # the machine that trained seed 1 is gone
    trained = []
    real_train = cli.train_run
    monkeypatch.setattr(cli, "train_run", lambda r, *a: (trained.append(r.seed), real_train(r, *a)))
    assert main([str(plan), "--out", str(out), "--records", str(records)]) == 0
    assert trained == [2]  # seed 1 is recorded: skipped, not retrained
    assert "recorded in" in capsys.readouterr().err
    results = json.loads((out / "results.json").read_text())
    runs = {r["seed"]: r for r in results["rows"][0]["runs"]}
    assert runs[1]["record"] == str(record) and runs[1]["metrics"] == evaluated["metrics"]
    assert runs[1]["train_seconds"] is not None and "record" not in runs[2]
    assert results["rows"][0]["summary"]["loss"]["n"] == 2 and results["recorded"] == [str(record)]
    assert "1 model(s) reported from their records" in (out / "results.md").read_text()
    assert (records / "dense" / "seed2" / "record.json").is_file()  # the report recorded seed 2 as well
    assert json.loads((records / "results.json").read_text()) == results  # the plan's results beside its records
    # a record whose evaluation was made with other settings is not reused: the error says why
    cache = record / "evaluation-dense_beam1.json"
    saved = json.loads(cache.read_text())
    saved["key"]["eval_overrides"] = ["--testing.beam_size=3"]
    cache.write_text(json.dumps(saved))
    assert main([str(plan), "--out", str(out), "--report-only", "--records", str(records)]) == 1  # a failed model
    beam1 = json.loads((out / "results.json").read_text())["rows"][1]["runs"][0]
    assert "holds no evaluation for row 'dense_beam1'" in beam1["error"]
    # a record of another config is refused like a folder of another config
    config = (record / "config.yaml").read_text()
    (record / "config.yaml").write_text(config.replace("kind: dense", "kind: phm"))
    assert main([str(plan), "--out", str(out), "--report-only", "--records", str(records)]) == 1
    err = capsys.readouterr().err
    assert "holds a run with a different config" in err and "delete the record or use another --records" in err


def test_a_second_report_leaves_an_unchanged_record_as_it_is(tmp_path, write_plan):
    # committed records must not churn each time a plan is re-reported; a changed evaluation is re-recorded
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    out, records = tmp_path / "out", tmp_path / "records"
    assert main([str(plan), "--out", str(out), "--seeds", "1", "--evaluate-each", "--no-report",
                     "--records", str(records)]) == 0
    record = records / "dense" / "seed1"
    info = json.loads((record / "record.json").read_text())
    info["written"] = "2000-01-01T00:00:00"  # a date no rewrite would give
    (record / "record.json").write_text(json.dumps(info, indent=1) + "\n")
    before = {p.name: p.read_bytes() for p in record.iterdir()}
    assert main([str(plan), "--out", str(out), "--seeds", "1", "--report-only", "--records", str(records)]) == 0
    assert {p.name: p.read_bytes() for p in record.iterdir()} == before
    # the folder's evaluation changes (e.g. re-evaluated with a fixed metric): the record follows it
    cache = out / "dense" / "seed1" / "evaluation-dense.json"
    saved = json.loads(cache.read_text())
    saved["result"]["metrics"]["loss"] += 1.0
    cache.write_text(json.dumps(saved))
    assert main([str(plan), "--out", str(out), "--seeds", "1", "--report-only", "--records", str(records)]) == 0
    assert json.loads((record / "evaluation-dense.json").read_text()) == saved
    assert json.loads((record / "record.json").read_text())["written"] != "2000-01-01T00:00:00"


def test_a_records_folder_of_another_plan_is_refused_and_left_as_it_was(tmp_path, capsys, write_plan):
    # rows of the same name in two plans would otherwise mix their records and overwrite results.json
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    out, records = tmp_path / "out", tmp_path / "records"
    assert main([str(plan), "--out", str(out), "--seeds", "1", "--no-report", "--evaluate-each",
                 "--records", str(records)]) == 0
    assert json.loads((records / "plan.json").read_text()) == {"plan": "tiny_plan"}
    (tmp_path / "other").mkdir()
    other = write_plan(tmp_path / "other", rows=[{"name": "dense", "config": "tiny.yaml",
                                                   "overrides": ["--model.linear.kind=dense"]}], name="other_plan")
    before = {p.relative_to(records): p.read_bytes() for p in records.rglob("*") if p.is_file()}
    for extra in ([], ["--report-only"]):
        assert main([str(other), "--out", str(tmp_path / "out2"), "--records", str(records), *extra]) == 1
        err = capsys.readouterr().err
        assert "holds the records of plan 'tiny_plan'" in err and "experiments/records/other_plan" in err
    assert {p.relative_to(records): p.read_bytes() for p in records.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "out2").exists()  # nothing trained
    # a results.json naming another plan is refused the same way (folders written before plan.json existed)
    (records / "plan.json").unlink()
    (records / "results.json").write_text(json.dumps({"plan": {"name": "tiny_plan"}}))
    assert main([str(other), "--out", str(tmp_path / "out2"), "--records", str(records), "--report-only"]) == 1
    assert "(" + str(records / "results.json") + ")" in capsys.readouterr().err


def test_a_records_folder_of_rows_this_plan_lacks_is_refused_without_results_json(tmp_path, capsys, write_plan):
    """An older records folder carries neither results.json nor plan.json: its row folders still say whose it is."""
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    records = tmp_path / "records"
    for row in ("transformer", "quaternion"):
        (records / row / "seed1").mkdir(parents=True)
        (records / row / "seed1" / "record.json").write_text("{}")
    (records / "NOTES.md").write_text("notes")
    before = {p.relative_to(records): p.read_bytes() for p in records.rglob("*") if p.is_file()}
    assert main([str(plan), "--out", str(tmp_path / "out"), "--records", str(records), "--report-only"]) == 1
    assert "holds records of rows that" in capsys.readouterr().err
    assert {p.relative_to(records): p.read_bytes() for p in records.rglob("*") if p.is_file()} == before


def test_a_folder_it_cannot_write_is_refused_before_anything_trains(tmp_path, capsys, write_plan, monkeypatch):
    import os

    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if os.fspath(path) == str(locked)
                        else real_access(path, mode, **kw))  # as a read-only mount answers, even to root
    out = tmp_path / "out"
    assert main([str(plan), "--out", str(out), "--records", str(locked / "records")]) == 1
    err = capsys.readouterr().err
    assert f"--records {locked / 'records'}: cannot write there ({locked}, where it would be made)" in err
    assert not out.exists() and list(locked.iterdir()) == []
    assert main([str(plan), "--out", str(locked / "out")]) == 1
    assert f"--out {locked / 'out'}: cannot write there" in capsys.readouterr().err


def test_a_failed_evaluation_is_a_failed_plan_not_a_quiet_gap(tmp_path, capsys, write_plan, monkeypatch):
    from hyperplex.experiments import results

    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    out = tmp_path / "out"
    assert main([str(plan), "--out", str(out), "--seeds", "1", "--no-report"]) == 0

    def broken(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(results, "cached_evaluation", broken)
    assert main([str(plan), "--out", str(out), "--seeds", "1", "--report-only"]) == 1
    err = capsys.readouterr().err
    assert "dense seed 1: evaluation failed: OSError: [Errno 30] Read-only file system" in err
    report = json.loads((out / "results.json").read_text())
    assert report["rows"][0]["runs"][0]["error"].startswith("evaluation failed: OSError")


def test_training_on_cuda_without_a_gpu_is_refused_before_anything_trains(tmp_path, capsys, write_plan, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    out = tmp_path / "out"
    for extra in ([], ["--dry-run"]):
        assert main([str(plan), "--out", str(out), "--override=--training.device=cuda", *extra]) == 1
        assert "ask for training.device=cuda but this machine has no CUDA device" in capsys.readouterr().err
    assert not out.exists()
    # reporting GPU-trained models on a CPU is fine: nothing would train
    assert main([str(plan), "--out", str(out), "--override=--training.device=cuda", "--report-only"]) == 0


@pytest.mark.parametrize("device", ["mps", "meta", "tpu"])
def test_a_device_the_trainer_does_not_know_is_refused_before_anything_trains(tmp_path, capsys, write_plan, device):
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    out, records = tmp_path / "out", tmp_path / "records"
    assert main([str(plan), "--out", str(out), "--records", str(records),
                 f"--override=--training.device={device}"]) == 1
    assert f"row 'dense': training.device: unknown device {device!r}" in capsys.readouterr().err
    assert not out.exists() and not records.exists()
