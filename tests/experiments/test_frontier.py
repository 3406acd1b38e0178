"""hyperplex.experiments.frontier on a synthetic results.json: retention against the teacher row, the Pareto
front (fewer bytes and more retention), the table's cells, the figure and the CLI's errors."""

from __future__ import annotations

import json

import pytest

from hyperplex.experiments.frontier import (
    FrontierError,
    frontier_figure,
    frontier_points,
    frontier_table,
    main,
    pareto_front,
)


def run(held: float, file: float, **metrics) -> dict:
    return {"metrics": metrics, "size": {"held_bytes": held, "file_bytes": file}}


def results() -> dict:
    return {"rows": [
        {"name": "teacher", "label": "Dense", "runs": [run(100e6, 100e6, wikiqa_map=0.70, agreement=1.0)]},
        {"name": "int8", "label": "int8", "runs": [run(59e6, 59e6, wikiqa_map=0.69, agreement=0.96)]},
        {"name": "phm", "label": "PHM", "runs": [run(59e6, 59e6, wikiqa_map=0.50, agreement=0.30)]},
        {"name": "lowrank", "label": "Low-rank", "runs": [run(58e6, 58e6, wikiqa_map=0.56, agreement=0.40),
                                                          run(58e6, 58e6, wikiqa_map=0.60, agreement=0.50)]},
        {"name": "keep3", "label": "Keep 3", "runs": [run(70e6, 70e6, wikiqa_map=0.66, agreement=0.61)]},
        {"name": "pending", "label": "Not evaluated", "runs": [{"seed": 1, "status": "running"}]},
    ]}


def test_retention_and_the_front():
    points = frontier_points(results())
    by = {p["name"]: p for p in points}
    assert "pending" not in by and len(points) == 5
    assert by["int8"]["retention"]["wikiqa_map"] == pytest.approx(0.69 / 0.70)
    assert by["lowrank"]["mean"]["wikiqa_map"] == pytest.approx(0.58)
    assert by["lowrank"]["std"]["wikiqa_map"] == pytest.approx(0.02 * 2 ** 0.5)
    # int8 dominates PHM (same bytes, more) and keep3 (fewer bytes, more); low-rank holds the fewest bytes
    assert pareto_front(points, "wikiqa_map") == ["lowrank", "int8", "teacher"]
    assert pareto_front(points, "agreement") == ["lowrank", "int8", "teacher"]
    table = frontier_table(points, metrics=("agreement", "wikiqa_map"))
    lines = table.splitlines()
    assert [line.split(" | ")[0][2:] for line in lines[2:]] == ["Low-rank", "int8", "PHM", "Keep 3", "Dense"]
    assert "0.580 ± 0.028 (83%)" in lines[2] and lines[2].endswith("| agreement, wikiqa_map |")
    assert lines[4].endswith("| – |")  # PHM: on no front
    assert frontier_figure(points, metrics=("agreement", "wikiqa_map")).axes[0].get_xscale() == "log"


def test_errors_name_what_is_missing(tmp_path, capsys):
    bad = results()
    bad["rows"] = bad["rows"][1:]
    with pytest.raises(FrontierError, match="no row named 'teacher'"):
        frontier_points(bad)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(bad))
    assert main([str(path)]) == 1
    assert "no row named 'teacher'" in capsys.readouterr().err
    path.write_text(json.dumps(results()))
    assert main([str(path), "--figure", str(tmp_path / "f.png"), "--table", str(tmp_path / "t.md")]) == 0
    assert (tmp_path / "f.png").read_bytes()[:4] == b"\x89PNG"
    assert (tmp_path / "t.md").read_text().startswith("| row | n | weights in memory |")


def test_serving_columns_from_the_cli(tmp_path, capsys):
    """--serving adds each mapped row's speed ratios and peak-memory difference; bad pairs are errors."""
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results()))
    serving = tmp_path / "serving.json"
    serving.write_text(json.dumps({"batch_sizes": [1, 32], "rows": [
        {"name": "dense", "ratio_b1": 1.0, "ratio_b32": 1.0, "peak": 500e6},
        {"name": "int8", "ratio_b1": 2.25, "ratio_b32": 1.5, "peak": 470e6}]}))
    table = tmp_path / "t.md"
    assert main([str(path), "--serving", str(serving), "--serving-row", "int8=int8", "--serving-row", "teacher=dense",
                 "--table", str(table)]) == 0
    lines = {line.split(" | ")[0][2:]: line for line in table.read_text().splitlines()[2:]}
    assert "| 2.25× | 1.50× | -30 MB |" in lines["int8"] and "| 1.00× | 1.00× | +0 MB |" in lines["Dense"]
    assert "| – | – | – |" in lines["PHM"]
    assert main([str(path), "--serving-row", "int8=int8"]) == 2
    assert "needs --serving" in capsys.readouterr().err
    assert main([str(path), "--serving", str(serving), "--serving-row", "int8"]) == 1
    assert "expected ROW=VARIANT" in capsys.readouterr().err
    assert main([str(path), "--serving", str(serving), "--serving-row", "int8=phm4"]) == 1
    assert "no variant 'phm4'" in capsys.readouterr().err
