"""hyperplex.experiments.evaluation: a plan's evaluation equals ``hyperplex evaluate`` and ``parameter_breakdown``,
``eval_split`` rows score another file, and ``--evaluate-each`` fills the caches the report reads."""

import json

import pytest

from hyperplex.experiments import evaluation
from hyperplex.experiments.cli import main


def test_evaluation_equals_inference_evaluate_and_params_breakdown(done):
    from hyperplex.inference.load import load_model
    from hyperplex.inference.verbs import evaluate
    from hyperplex.models.params import parameter_breakdown

    _, out, _, results = done
    item = results["rows"][1]["runs"][1]
    expected = {k: v for k, v in evaluate(item["model_dir"], "last").items() if not k.endswith("_signature")}
    assert expected == pytest.approx(item["metrics"])
    _, _, model = load_model(item["model_dir"], "last")
    assert item["params"] == parameter_breakdown(model)


def test_a_bad_eval_override_names_its_testing_key(done):
    from hyperplex.config import ConfigError

    item = done[3]["rows"][1]["runs"][1]
    with pytest.raises(ConfigError, match=r"^unknown config key 'testing.beam_sise'; did you mean 'beam_size'") as err:
        evaluation.evaluate_model(item["model_dir"], "last", None, ["--testing.beam_sise=2"])
    assert err.value.key == "testing.beam_sise"


def test_eval_split_row_scores_a_file_like_hyperplex_evaluate(tmp_path, write_plan):
    from hyperplex.data.arithmetic import generate_arithmetic
    from hyperplex.inference.verbs import evaluate
    held_out, _ = generate_arithmetic(12, 1, seed=99)  # PREFIX.src / PREFIX.tgt, as write_arithmetic names them
    for side, column in (("src", 0), ("tgt", 1)):
        (tmp_path / f"held_out.{side}").write_text("".join(pair[column] + "\n" for pair in held_out))
    plan = write_plan(tmp_path, rows=[{"name": "phm2", "config": "tiny.yaml", "seeds": [1]},
                                       {"name": "phm2_file", "models_from": "phm2",
                                        "eval_split": str(tmp_path / "held_out")}])
    out = tmp_path / "out"
    assert main([str(plan), "--out", str(out)]) == 0
    rows = {r["name"]: r for r in json.loads((out / "results.json").read_text())["rows"]}
    expected = evaluate(str(out / "phm2" / "seed1"), checkpoint="last", split=str(tmp_path / "held_out"))
    got = rows["phm2_file"]["runs"][0]["metrics"]
    assert got["loss"] == pytest.approx(expected["loss"]) and got["accuracy"] == expected["accuracy"]
    assert got["loss"] != rows["phm2"]["runs"][0]["metrics"]["loss"]  # another split than validation
    assert f"scored on `{tmp_path / 'held_out'}`" in (out / "results.md").read_text()


def test_evaluate_each_fills_the_caches_the_report_reads(tmp_path, monkeypatch, capsys, write_plan):
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml", "seeds": [1],
                                        "overrides": ["--model.linear.kind=dense"]},
                                       {"name": "dense_beam1", "models_from": "dense",
                                        "eval_overrides": ["--testing.beam_size=1"]}])
    out = tmp_path / "out"
    assert main([str(plan), "--out", str(out), "--no-report", "--evaluate-each"]) == 0
    folder = out / "dense" / "seed1"
    caches = {p.name: json.loads(p.read_text()) for p in folder.glob("evaluation-*.json")}
    assert set(caches) == {"evaluation-dense.json", "evaluation-dense_beam1.json"}
    assert "evaluated for row 'dense_beam1'" in capsys.readouterr().err
    # the scored text sits beside each cache (not in it) and re-scores to the cached BLEU without the model
    from hyperplex.inference.load import load_model
    from hyperplex.metrics import corpus_bleu

    _, task, _ = load_model(str(folder), "last", None)
    for row in ("dense", "dense_beam1"):
        assert "hypotheses" not in caches[f"evaluation-{row}.json"]["result"]
        hypotheses = (folder / f"hypotheses-{row}.txt").read_text().splitlines()
        assert len(hypotheses) == len(task.dev_refs) == 16
        assert corpus_bleu(hypotheses, task.dev_refs).score == caches[f"evaluation-{row}.json"]["result"]["metrics"][
            "bleu"]
    calls = []
    # the report must not re-evaluate
    monkeypatch.setattr(evaluation, "evaluate_model", lambda *a, **k: calls.append(a))
    assert main([str(plan), "--out", str(out), "--report-only"]) == 0
    assert calls == []
    results = json.loads((out / "results.json").read_text())
    got = {r["name"]: r["runs"][0]["metrics"] for r in results["rows"]}
    assert got["dense"] == caches["evaluation-dense.json"]["result"]["metrics"]
    assert got["dense_beam1"] == caches["evaluation-dense_beam1.json"]["result"]["metrics"]
    # a second lane pass over the finished model keeps its caches (no re-evaluation either)
    assert main([str(plan), "--out", str(out), "--no-report", "--evaluate-each"]) == 0
    assert calls == []


def test_a_cache_that_cannot_be_written_leaves_the_old_one(done, tmp_path, monkeypatch):
    """The evaluation cache is replaced whole or not at all (hyperplex.fileio): a failed write keeps the
    old file and leaves no temporary file behind."""
    import os
    import shutil

    from hyperplex.experiments.plan import load_plan
    from hyperplex.experiments.runs import Run, run_overrides
    from hyperplex.fileio import TMP_PATTERN, WriteError

    plan_path, out, _, _ = done
    folder = tmp_path / "seed1"
    shutil.copytree(out / "dense" / "seed1", folder)
    plan = load_plan(plan_path)
    row = next(r for r in plan.rows if r.name == "dense")
    run = Run(row, 1, folder, run_overrides(plan, row, 1, []), "finished")
    cache = folder / "evaluation-dense.json"
    stale = json.loads(cache.read_text())
    stale["key"]["mtime_ns"] = 0  # another checkpoint: the evaluation is made again
    cache.write_text(json.dumps(stale))
    before = cache.read_bytes()
    monkeypatch.setattr(evaluation, "evaluate_model", lambda *a, **k: {"metrics": {"loss": 0.5}})
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(WriteError, match="evaluation-dense.json"):
        evaluation.cached_evaluation(run, row, "last", None)
    monkeypatch.setattr(os, "replace", real_replace)
    assert cache.read_bytes() == before
    assert not [p.name for p in folder.iterdir() if TMP_PATTERN.match(p.name)]  # no temporary folder left
    assert evaluation.cached_evaluation(run, row, "last", None) == {"metrics": {"loss": 0.5}}
    assert json.loads(cache.read_text())["result"] == {"metrics": {"loss": 0.5}}
