"""benchmarks/bench_compress.py's layer-dropping variant and its JSON, read back by the frontier's serving
columns (speed is measured there, never asserted here)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from conftest import load_benchmark

pytest.importorskip("sentence_transformers")

from hyperplex.experiments.frontier import FrontierError, attach_serving, frontier_points, frontier_table  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_compress")


def test_spread_layers_are_the_frontier_plans(bench):
    assert bench.spread_layers(6, 4) == [0, 2, 3, 5]
    assert bench.spread_layers(6, 3) == [0, 2, 5]
    assert bench.spread_layers(6, 6) == [0, 1, 2, 3, 4, 5]
    assert bench.spread_layers(6, 1) == [0]
    with pytest.raises(ValueError, match="cannot keep 7 of 6"):
        bench.spread_layers(6, 7)
    assert bench.parse_variant("keep3") == ("keep", 3, False, False)
    with pytest.raises(Exception, match="keepK"):
        bench.parse_variant("keep0")


def test_keep_variant_and_json_feed_the_frontier(bench, teacher_folder, tmp_path):
    """keep1 of the tiny teacher's 2 layers: the parameters of one layer fewer, its folder loads as a
    SentenceTransformer; --json writes rows that attach_serving turns into the table's serving columns."""
    out = tmp_path / "serving.json"
    rows = bench.main(["--model", str(teacher_folder), "--variants", "keep1", "phm2", "--rounds", "1",
                       "--sentences", "4", "--min-features", "8", "--threads", "1", "--memory-samples", "2",
                       "--json", str(out)])
    by = {r["name"]: r for r in rows}
    for row in rows:  # the memory columns: the median of 2 fresh processes per model, each sample kept
        assert len(row["memory_samples"]) == 2
        for key in ("resident", "peak"):
            assert row[key] == statistics.median(s[key] for s in row["memory_samples"]) > 0
    from sentence_transformers import SentenceTransformer

    teacher = SentenceTransformer(str(teacher_folder), device="cpu")
    layer = teacher[0].auto_model.encoder.layer[1]
    assert by["keep1"]["params"] == by["dense"]["params"] - sum(p.numel() for p in layer.parameters())
    if Path("/proc/self/status").is_file():  # Linux: resident memory split into heap and mapped files
        for row in rows:
            assert row["resident_anon"] > 0 and row["resident_file"] > 0
            assert abs(row["resident_anon"] + row["resident_file"] - row["resident"]) <= 8 << 20  # + shmem, timing
            assert 0 < row["resident_trimmed"] <= row["resident"]  # glibc: free heap pages handed back
    saved = json.loads(out.read_text())
    assert saved["memory_samples"] == 2
    assert saved["batch_sizes"] == [1, 32] and [r["name"] for r in saved["rows"]] == ["dense", "keep1", "phm2"]
    assert saved["rows"][1]["ratio_b1"] == by["keep1"]["ratio_b1"]

    results = {"rows": [
        {"name": "teacher", "label": "Dense", "runs": [{"metrics": {"agreement": 1.0},
                                                        "size": {"held_bytes": 10e6, "file_bytes": 10e6}}]},
        {"name": "keep", "label": "Keep 1", "runs": [{"metrics": {"agreement": 0.8},
                                                      "size": {"held_bytes": 6e6, "file_bytes": 6e6}}]}]}
    points = frontier_points(results)
    sizes = attach_serving(points, saved, {"teacher": "dense", "keep": "keep1"})
    keep = next(p for p in points if p["name"] == "keep")
    assert keep["serving"]["ratio"][32] == by["keep1"]["ratio_b32"]
    assert keep["serving"]["peak_delta"] == by["keep1"]["peak"] - by["dense"]["peak"]
    table = frontier_table(points, metrics=("agreement",), serving_sizes=sizes).splitlines()
    assert table[0].count("sent/s batch") == 2 and "peak memory Δ" in table[0]
    assert f"{by['keep1']['ratio_b1']:.2f}×" in table[2]
    with pytest.raises(FrontierError, match="no variant 'keep2'"):
        attach_serving(points, saved, {"keep": "keep2"})
    with pytest.raises(FrontierError, match="no evaluated row 'phm'"):
        attach_serving(points, saved, {"phm": "phm2"})


def test_every_model_is_measured_from_a_copy_made_the_same_way(bench, tmp_path):
    """The teacher's folder is copied like the converted ones (so no model is charged for how recently its file
    was written); two variants sharing a folder (phm4 and phm4:cache) share one copy; the bytes are unchanged."""
    teacher, converted = tmp_path / "teacher", tmp_path / "root" / "phm4"
    for folder, payload in ((teacher, b"dense weights"), (converted, b"factors")):
        (folder / "sub").mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(payload)
        (folder / "sub" / "config.json").write_text("{}")
    specs = {"dense": {"folder": str(teacher)}, "phm4": {"folder": str(converted)},
             "phm4:cache": {"folder": str(converted)}}
    out = bench.same_page_cache_history(specs, str(tmp_path / "root"))
    measured = tmp_path / "root" / "measured"
    assert all(Path(spec["folder"]).parent == measured for spec in out.values())
    assert out["phm4"]["folder"] == out["phm4:cache"]["folder"] != out["dense"]["folder"]
    assert Path(out["dense"]["folder"], "model.safetensors").read_bytes() == b"dense weights"
    assert Path(out["phm4"]["folder"], "model.safetensors").read_bytes() == b"factors"
    assert Path(out["phm4"]["folder"], "sub", "config.json").read_text() == "{}"
    assert len(list(measured.iterdir())) == 2


@pytest.mark.parametrize("option", ["--rounds", "--sentences", "--memory-samples"])
def test_a_count_that_is_not_positive_is_refused_before_anything_runs(bench, option, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--variants", "phm4", option, "0"])
    assert exit_info.value.code == 2 and f"{option} must be positive, not 0" in capsys.readouterr().err
