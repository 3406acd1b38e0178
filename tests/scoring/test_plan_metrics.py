"""A ``quality:`` plan (hyperplex.scoring.plan_metrics) run by ``hyperplex experiment`` on a tiny random BERT teacher
(a SentenceTransformer built from a config, no download): rows straight after conversion (``train: false``) and
healed, agreement / zero-shot WikiQA / SST-2 probe per model, parameter counts and file sizes checked against an
independent count, the n = 1 conversion scoring as the teacher, cached evaluations, and plan errors."""

from __future__ import annotations

import gzip
import json
import os
import random
import shutil
import sys
from pathlib import Path

import pytest
import yaml

pytest.importorskip("sentence_transformers")
pytest.importorskip("transformers")
pytest.importorskip("sklearn")

from conftest import TINY_BERT_WORDS as WORDS
from conftest import write_tiny_bert, write_tiny_config, write_tiny_sentence_transformer

from hyperplex.experiments import markdown as report
from hyperplex.experiments.cli import main
from hyperplex.experiments.intervals import summarize
from hyperplex.experiments.plan import PlanError, load_plan
from hyperplex.experiments.state import NOT_HEALED
from hyperplex.scoring import plan_metrics as quality_metrics

INCLUDE = "*encoder.layer*"
BUDGET = ["--training.max_steps=3", "--training.validation_every=3", "--training.max_epochs=1000",
          "--training.patience=0", "--training.plots=false"]
QUALITY = {"agreement": {"file": "agree.txt"}, "wikiqa": "wikiqa.jsonl.gz",
           "sst2_probe": {"file": "sst.tsv.gz", "train_size": 8, "test_size": 6, "split_seed": 1}}
METRICS = ["cosine", "agreement", "wikiqa_map", "wikiqa_mrr", "sst2_probe"]


def sentences(count: int, seed: int, low: int = 3, high: int = 8) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)]


def write_data(root: Path) -> None:
    """Distillation text, agreement sentences, a WikiQA file and an SST-2-like file (sentences + phrases)."""
    (root / "train.txt").write_text("\n".join(sentences(30, 1)) + "\n")
    (root / "dev.txt").write_text("\n".join(sentences(10, 2)) + "\n")
    (root / "agree.txt").write_text("\n".join(sentences(12, 3) + sentences(2, 3)) + "\n")  # 2 repeated lines
    records = []
    for qid in range(4):
        question, answers = sentences(1, 10 + qid)[0], sentences(3, 20 + qid)
        records += [{"qid": qid, "question": question, "answer": a, "label": int(i == qid % 3)}
                    for i, a in enumerate(answers)]
    with gzip.open(root / "wikiqa.jsonl.gz", "wt") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    rows = []
    for i, text in enumerate(sentences(20, 4, 6, 9)):
        label = int("good" in text.split()) if i % 3 else i % 2
        rows += [(text, label), (" ".join(text.split()[1:4]), label)]  # the sentence and one of its phrases
    with gzip.open(root / "sst.tsv.gz", "wt") as handle:
        handle.write("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(teacher folder, data root, config path) for a tiny distillation run."""
    bert = tmp_path_factory.mktemp("bert")
    write_tiny_bert(bert)
    teacher = tmp_path_factory.mktemp("teacher")
    write_tiny_sentence_transformer(teacher, bert)
    data = tmp_path_factory.mktemp("data")
    write_data(data)
    config = data / "distill.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny_compress", "seed": 1,
        "data": {"task": "distillation", "train": "train.txt", "dev": "dev.txt"},
        "model": {"architecture": "pretrained_student", "path": str(teacher), "kind": "phm", "n": 2,
                  "targets": [INCLUDE], "min_features": 8},
        "training": {"lr": 3e-3, "batch_size": 8, "max_steps": 200, "log_every": 1, "num_threads": 1,
                     "progress_bar": False, "plots": False, "device": "cpu"},
        "testing": {"batch_size": 8}}))
    return teacher, data, config


def write_plan(directory: Path, config: Path, rows=None, **keys) -> Path:
    plan = {"name": "tiny_compress", "title": "tiny compression plan", "seeds": [1, 2], "budget": BUDGET,
            "metrics": METRICS, "digits": 4, "quality": QUALITY, **keys,
            "rows": rows or [
                {"name": "teacher", "config": str(config), "overrides": ["--model.kind=none"], "train": False,
                 "seeds": [1]},
                {"name": "phm1_converted", "config": str(config), "overrides": ["--model.n=1"], "train": False,
                 "seeds": [1]},
                {"name": "phm2_converted", "config": str(config), "train": False, "seeds": [1]},
                {"name": "lowrank2_converted", "config": str(config), "overrides": ["--model.kind=lowrank"],
                 "train": False, "seeds": [1]},
                {"name": "phm2", "label": "PHM n=2, healed", "config": str(config)}]}
    path = directory / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


@pytest.fixture(scope="module")
def done(setup, tmp_path_factory):
    _, data, config = setup
    tmp = tmp_path_factory.mktemp("compress_plan")
    plan = write_plan(tmp, config)
    out = tmp / "out"
    assert main([str(plan), "--out", str(out), "--data-root", str(data)]) == 0
    return plan, out, json.loads((out / "results.json").read_text())


def by_name(results: dict) -> dict:
    return {row["name"]: row for row in results["rows"]}


def dense_counts(teacher: Path) -> tuple[int, list[tuple[int, int]]]:
    """(teacher's total parameters, (in, out) of each encoder-block nn.Linear), counted on the teacher itself."""
    import fnmatch

    from sentence_transformers import SentenceTransformer
    from torch import nn

    model = SentenceTransformer(os.fspath(teacher), device="cpu")
    total = sum(p.numel() for p in model.parameters())
    shapes = [(m.in_features, m.out_features) for name, m in model.named_modules()
              if isinstance(m, nn.Linear) and fnmatch.fnmatchcase(name, INCLUDE)]
    return total, shapes


def test_the_n1_conversion_scores_as_the_teacher(done):
    rows = by_name(done[2])
    teacher, phm1 = rows["teacher"]["runs"][0], rows["phm1_converted"]["runs"][0]
    assert teacher["metrics"]["agreement"] == pytest.approx(1.0, abs=1e-6)
    assert teacher["metrics"]["cosine"] == pytest.approx(1.0, abs=1e-6)
    for metric in METRICS:  # n = 1: H = A ⊗ S is W up to float rounding, so every metric is the teacher's
        assert phm1["metrics"][metric] == pytest.approx(teacher["metrics"][metric], abs=1e-6), metric
    assert teacher["quality_details"]["agreement"]["sentences"] == 12  # distinct lines only
    assert teacher["quality_details"]["wikiqa"]["questions"] == 4
    assert teacher["quality_details"]["sst2_probe"]["pool"] == 20  # the 20 whole sentences, not the phrases
    # the conversion changes the embeddings at n = 2 (little, on random weights: measured 0.9999)
    assert rows["phm2_converted"]["runs"][0]["metrics"]["agreement"] < 1 - 1e-5


def test_parameters_and_file_sizes_match_an_independent_count(done, setup):
    from hyperplex.layers.lowrank import matching_rank

    total, shapes = dense_counts(setup[0])
    assert len(shapes) == 12  # 2 blocks × (query, key, value, attention output, intermediate, output)
    dense = sum(d * k + k for d, k in shapes)
    phm2 = sum(d * k // 2 + 2 ** 3 + k for d, k in shapes)  # S: k·d/n, A: n³, bias k
    lowrank2 = sum(matching_rank(d, k, 2) * (d + k) + k for d, k in shapes)
    phm1 = dense  # n = 1: one S = W and the bias; the 1 × 1 rule is fixed to 1, not a parameter
    expected = {"teacher": (0, dense, total), "phm1_converted": (12, phm1, total - dense + phm1),
                "phm2_converted": (12, phm2, total - dense + phm2), "phm2": (12, phm2, total - dense + phm2),
                "lowrank2_converted": (12, lowrank2, total - dense + lowrank2)}
    rows = by_name(done[2])
    table = {line.split(" | ")[0][2:]: line.split(" | ") for line in (done[1] / "results.md").read_text().splitlines()
             if line.startswith("| ")}
    header = table["row"]
    for name, (layers, selected, whole) in expected.items():
        for item in rows[name]["runs"]:
            size = item["size"]
            assert (size["converted_layers"], size["selected_params"], item["params"]["total"]) == \
                (layers, selected, whole), name
            assert size["selected_params_dense"] == dense
            # float32 weights: 4 bytes per parameter plus the safetensors header (names, shapes)
            assert 4 * whole <= size["file_bytes"] <= 4 * whole + 32_000, name
        cells = table[rows[name]["label"]]
        assert cells[header.index("params")] == report.format_count(whole)
        assert cells[header.index("converted layers")] == str(layers)
        assert cells[header.index("params of those layers")] == report.format_count(selected)
        assert cells[header.index("file size")] == report.format_bytes(rows[name]["runs"][0]["size"]["file_bytes"])


def test_unhealed_rows_are_saved_untrained_and_healed_rows_trained(done):
    from hyperplex.train.checkpoint import checkpoint_info

    _, out, results = done
    rows = by_name(results)
    state = checkpoint_info(out / "phm2_converted" / "seed1" / "last.safetensors")["extra"]["trainer"]
    assert (state["step"], state["finished"], state["stop_reason"]) == (0, True, NOT_HEALED)
    saved = yaml.safe_load((out / "phm2_converted" / "seed1" / "config.yaml").read_text())
    assert saved["training"]["max_steps"] == 200  # the config's own: no budget for a model that is not trained
    healed = checkpoint_info(out / "phm2" / "seed2" / "last.safetensors")["extra"]["trainer"]
    assert (healed["step"], healed["stop_reason"]) == (3, "max_steps")
    assert rows["phm2_converted"]["train"] is False and "train" not in rows["phm2"]
    assert rows["phm2_converted"]["runs"][0]["train_seconds"] is None
    # healing moved the student: its agreement differs from the unhealed start (same seed-1 conversion)
    start = rows["phm2_converted"]["runs"][0]["metrics"]["agreement"]
    assert all(r["metrics"]["agreement"] != start for r in rows["phm2"]["runs"])
    text = (out / "results.md").read_text()
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert table[0] == ("| row | n | cosine | agreement | wikiqa_map | wikiqa_mrr | sst2_probe | params | "
                        "params w/o emb. "
                        "| converted layers | params of those layers | file size | weights in memory | training time |")
    for row in rows.values():  # float models: 4 bytes per parameter, plus a few buffers (position ids)
        for run in row["runs"]:
            params = run["params"]["total"]
            assert 4 * params <= run["size"]["held_bytes"] <= 4 * params + 32_000
    assert [line.split(" | ")[0][2:] for line in table[1:]] == \
        ["teacher", "phm1_converted", "phm2_converted", "lowrank2_converted", "PHM n=2, healed"]
    assert table[1].split(" | ")[-1] == "– |" and table[-1].split(" | ")[1] == "2"
    values = [r["metrics"]["sst2_probe"] for r in rows["phm2"]["runs"]]
    summary = summarize(values)
    assert rows["phm2"]["summary"]["sst2_probe"] == summary
    assert "**not healed**" in text and "`agreement`: mean cosine" in text and "whole sentences only" in text


def test_evaluations_are_cached_and_invalidated(done, setup, monkeypatch):
    plan, out, _ = done
    calls = []
    real = quality_metrics.evaluate_quality
    monkeypatch.setattr(quality_metrics, "evaluate_quality",
                        lambda task, model, quality, root: calls.append(model) or real(task, model, quality, root))
    args = [str(plan), "--out", str(out), "--data-root", str(setup[1]), "--report-only"]
    assert main(args) == 0 and calls == []  # every model's evaluation-<row>.json is reused
    cache = out / "phm2" / "seed1" / "evaluation-phm2.json"
    assert json.loads(cache.read_text())["key"]["quality"]["sst2_probe"]["carve"] == "sentences"  # defaults filled
    os.utime(out / "phm2" / "seed1" / "last.safetensors")  # a newer checkpoint: that model only
    assert main(args) == 0 and len(calls) == 1
    raw = yaml.safe_load(plan.read_text())  # other quality settings: every model again
    raw["quality"]["sst2_probe"]["split_seed"] = 2
    changed = plan.parent / "changed" / "plan.yaml"
    changed.parent.mkdir(exist_ok=True)
    changed.write_text(yaml.safe_dump(raw))
    assert main([str(changed), *args[1:]]) == 0 and len(calls) == 1 + 6
    assert json.loads(cache.read_text())["key"]["quality"]["sst2_probe"]["split_seed"] == 2


@pytest.mark.parametrize("change, message", [
    ({"quality": {"wikiqa": {"fle": "x"}}}, "quality.wikiqa.fle is not a key"),
    ({"quality": {"sts": "x"}}, "quality.sts is not a quality metric"),
    ({"quality": {"sst2_probe": {"file": "x", "carve": "phrases"}}}, "carve must be sentences or random"),
    ({"quality": {"agreement": {"file": "x", "limit": -1}}}, "quality.agreement.limit must be an integer ≥ 0"),
    ({"quality": {"agreement": "agree.txt"}}, "metric 'wikiqa_map' needs quality.wikiqa"),
    ({"rows": [{"name": "a", "config": "CONFIG", "train": "no"}]}, "train: expected bool"),
    ({"rows": [{"name": "a", "config": "CONFIG"}, {"name": "b", "models_from": "a", "train": False}]},
     "train: false applies to a row with a config"),
])
def test_plan_errors_name_the_key(setup, tmp_path, change, message):
    config = setup[2]
    if "rows" in change:
        change = {"rows": [{k: (str(config) if v == "CONFIG" else v) for k, v in r.items()} for r in change["rows"]]}
    path = write_plan(tmp_path, config, **change)
    with pytest.raises(PlanError, match=message):
        load_plan(path)
    assert main([str(path), "--out", str(tmp_path / "out")]) == 1
    assert not (tmp_path / "out").exists()


def test_validation_refuses_missing_files_other_tasks_and_a_changed_train(setup, done, tmp_path, capsys):
    _, data, config = setup
    missing = write_plan(tmp_path, config, quality={**QUALITY, "agreement": {"file": "nowhere.txt"}})
    assert main([str(missing), "--out", str(tmp_path / "out"), "--data-root", str(data)]) == 1
    assert "quality.agreement.file" in capsys.readouterr().err and not (tmp_path / "out").exists()
    tiny = write_tiny_config(tmp_path)  # a translation config: quality metrics do not apply
    other = write_plan(tmp_path, config, metrics=["loss", "agreement"], quality={"agreement": "agree.txt"},
                       rows=[{"name": "a", "config": str(tiny)}])
    assert main([str(other), "--out", str(tmp_path / "out"), "--data-root", str(data)]) == 1
    assert "quality: applies to data.task distillation models" in capsys.readouterr().err
    # a finished untrained folder under a row that now trains (and the reverse) is refused, not silently reused
    out = done[1]
    copy = tmp_path / "copy"
    shutil.copytree(out / "phm2_converted", copy / "phm2_converted")
    flipped = write_plan(tmp_path, config, rows=[{"name": "phm2_converted", "config": str(config), "seeds": [1]}])
    assert main([str(flipped), "--out", str(copy), "--data-root", str(data), "--dry-run"]) == 1
    err = capsys.readouterr().err
    assert "holds a not trained (train: false) model but row 'phm2_converted' says train: true" in err


def test_bench_compress_counts_match_the_models(setup, capsys):
    """benchmarks/bench_compress.py on the tiny teacher: its parameter and file-size columns (speed is printed,
    never asserted)."""
    import importlib.util

    bench_path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_compress.py"
    spec = importlib.util.spec_from_file_location("bench_compress", bench_path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    spec.loader.exec_module(bench)
    total, shapes = dense_counts(setup[0])
    dense = sum(d * k + k for d, k in shapes)
    phm2 = sum(d * k // 2 + 2 ** 3 + k for d, k in shapes)
    rows = bench.main(["--model", str(setup[0]), "--variants", "phm2", "lowrank2", "--rounds", "1",
                       "--sentences", "4", "--min-features", "8", "--threads", "1"])
    assert [r["name"] for r in rows] == ["dense", "phm2", "lowrank2"]
    assert rows[0]["params"] == total and rows[0]["selected_params"] == dense and rows[0]["ratio_b1"] == 1.0
    assert rows[1]["params"] == total - dense + phm2 and rows[1]["selected_params"] == phm2
    assert all(4 * r["params"] <= r["file_bytes"] <= 4 * r["params"] + 32_000 for r in rows)
    assert "| dense |" in capsys.readouterr().out


def test_int8_rows_score_the_quantized_form_with_its_bytes(setup, tmp_path):
    """``models_from`` rows with ``--testing.quantize=int8`` score the same models in int8: agreement close to the
    float model's, fewer bytes held and written; a compress run with testing.quantize int8 writes an int8 student."""
    from hyperplex.int8 import is_quantized, load_quantized
    from hyperplex.train.run import compress

    _, data, config = setup
    rows = [{"name": "teacher", "config": str(config), "overrides": ["--model.kind=none"], "train": False,
             "seeds": [1]},
            {"name": "teacher_int8", "models_from": "teacher", "eval_overrides": ["--testing.quantize=int8"]},
            {"name": "phm2_converted", "config": str(config), "train": False, "seeds": [1]},
            {"name": "phm2_int8", "models_from": "phm2_converted", "eval_overrides": ["--testing.quantize=int8"]}]
    plan = write_plan(tmp_path, config, rows=rows)
    out = tmp_path / "out"
    assert main([str(plan), "--out", str(out), "--data-root", str(data)]) == 0
    got = {name: row["runs"][0] for name, row in by_name(json.loads((out / "results.json").read_text())).items()}
    for float_row, int8_row in (("teacher", "teacher_int8"), ("phm2_converted", "phm2_int8")):
        f, q = got[float_row], got[int8_row]
        assert "quantized" not in f["size"] and q["size"]["quantized"] == "int8"
        assert q["size"]["held_bytes"] < f["size"]["held_bytes"] and q["size"]["file_bytes"] < f["size"]["file_bytes"]
        assert abs(q["metrics"]["agreement"] - f["metrics"]["agreement"]) < 0.05
    assert got["teacher"]["metrics"]["agreement"] == pytest.approx(1.0)
    assert got["teacher_int8"]["metrics"]["agreement"] < 1.0  # int8 changes the function a little
    assert "weights in memory" in (out / "results.md").read_text()
    # compress with testing.quantize: int8 writes the student in int8
    model_dir = tmp_path / "compress"
    compress(str(config), ["--training.max_steps=2", "--training.validation_every=2", "--testing.quantize=int8"],
                    str(model_dir), str(data))
    student = load_quantized(model_dir / "student")
    assert is_quantized(student)
