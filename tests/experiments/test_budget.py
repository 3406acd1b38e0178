"""hyperplex.experiments.budget: sentences seen from the records (last step × batch size), the dev trajectory,
mean ± std over seeds, rows not yet recorded, and one clear error for each malformed input."""

from __future__ import annotations

import json
import statistics

import pytest

from hyperplex.experiments.budget import BudgetError, budget_points, budget_table, main, parse_curve


def _record(folder, batch: int, dev: list[tuple[int, float]], last_step: int) -> None:
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"training:\n  batch_size: {batch}\n")
    lines = ["step,epoch,split,name,value"]
    for step, value in dev:
        lines += [f"{step},1,train,loss,0.5", f"{step},1,dev,cosine,{value}", f"{step},1,dev,loss,{1 - value}"]
    lines.append(f"{last_step},1,train,loss,0.4")
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture
def plan(tmp_path):
    """phm4 (2 seeds, 125 steps × 32), phm4_40k (1 seed, 1,250 steps, validations at 250 … 1,250), phm4_400k not
    yet run; results.json beside the records, as `experiment --records` writes them."""
    root = tmp_path / "records"
    _record(root / "phm4" / "seed1", 32, [(125, 0.58)], 125)
    _record(root / "phm4" / "seed2", 32, [(125, 0.60)], 125)
    _record(root / "phm4_40k" / "seed1", 32, [(250, 0.66), (500, 0.72), (1250, 0.80)], 1250)

    def run(seed, row, agreement, seconds):
        return {"seed": seed, "record": str(root / row / f"seed{seed}"), "train_seconds": seconds,
                "metrics": {"agreement": agreement, "wikiqa_map": agreement - 0.05}}

    results = {"rows": [
        {"name": "phm4", "label": "PHM", "runs": [run(1, "phm4", 0.61, 900), run(2, "phm4", 0.63, 1000)]},
        {"name": "phm4_40k", "label": "PHM 40k", "runs": [run(1, "phm4_40k", 0.75, 9000)]},
        {"name": "phm4_400k", "label": "PHM 400k", "runs": [{"seed": 1, "record": None, "metrics": None}]}]}
    path = root / "results.json"
    path.write_text(json.dumps(results))
    return path, results


def test_points_from_records(plan):
    path, results = plan
    points, missing = budget_points(results, [("PHM", ["phm4", "phm4_40k", "phm4_400k"])], path,
                                    metrics=("agreement", "wikiqa_map"))
    assert missing == ["phm4_400k"]
    small, large = points
    assert (small["sentences"], large["sentences"]) == (4000, 40000)
    assert small["seeds"] == 2 and small["hours"] == pytest.approx(950 / 3600)
    assert small["mean"]["agreement"] == pytest.approx(0.62)
    assert small["std"]["agreement"] == pytest.approx(statistics.stdev([0.61, 0.63]))
    assert small["dev"][0] == pytest.approx(0.59) and large["dev"] == (0.80, None)
    assert large["trajectories"] == [[(8000, 0.66), (16000, 0.72), (40000, 0.80)]]
    table = budget_table(points, missing, metrics=("agreement", "wikiqa_map")).splitlines()
    assert table[2] == "| PHM | phm4 | 4,000 | 2 | 0.26 | 0.590 ± 0.014 | 0.620 ± 0.014 | 0.570 ± 0.014 |"
    assert table[3].startswith("| PHM | phm4_40k | 40,000 | 1 | 2.50 | 0.800 | 0.750 | 0.700 |")
    assert table[-1] == "Not yet recorded: `phm4_400k`."


def test_records_found_beside_results_when_the_recorded_path_moved(plan, tmp_path):
    path, results = plan
    for row in results["rows"]:
        for run in row["runs"]:
            run["record"] = "elsewhere/" + row["name"]
    points, _ = budget_points(results, [("PHM", ["phm4_40k"])], path, metrics=("agreement",))
    assert points[0]["sentences"] == 40000


def test_curve_syntax():
    assert parse_curve("PHM n=4=phm4,phm4_40k") == ("PHM n=4", ["phm4", "phm4_40k"])
    for bad in ("phm4,phm4_40k", "=phm4", "PHM=", "PHM=phm4,phm4"):
        with pytest.raises(BudgetError, match="--curve"):
            parse_curve(bad)


def test_bad_inputs_name_what_is_wrong(plan):
    path, results = plan
    with pytest.raises(BudgetError, match="no row 'phm8' in the plan"):
        budget_points(results, [("PHM", ["phm4", "phm8"])], path)
    record = path.parent / "phm4_40k" / "seed1"
    (record / "metrics.csv").write_text("step,epoch,split,name,value\n25,1,train,loss,0.5\nx,1,dev,cosine,0.6\n")
    with pytest.raises(BudgetError, match=r"metrics.csv, line 3: expected step,epoch"):
        budget_points(results, [("PHM", ["phm4_40k"])], path)
    (record / "config.yaml").write_text("training: {lr: 0.1}\n")
    with pytest.raises(BudgetError, match=r"config.yaml: no training.batch_size"):
        budget_points(results, [("PHM", ["phm4_40k"])], path)
    _record(path.parent / "phm4" / "seed3", 32, [(250, 0.7)], 250)
    results["rows"][0]["runs"].append({"seed": 3, "record": str(path.parent / "phm4" / "seed3"),
                                       "metrics": {"agreement": 0.7}})
    with pytest.raises(BudgetError, match=r"seeds saw different numbers of sentences \[4000, 4000, 8000\]"):
        budget_points(results, [("PHM", ["phm4"])], path)


def test_cli_writes_table_and_figure(plan, tmp_path, capsys):
    path, _ = plan
    table, figure = tmp_path / "budget.md", tmp_path / "budget.png"
    assert main([str(path), "--curve", "PHM=phm4,phm4_40k,phm4_400k", "--metrics", "agreement",
                 "--table", str(table), "--figure", str(figure)]) == 0
    assert "| PHM | phm4_40k | 40,000 |" in table.read_text()
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main([str(path), "--curve", "PHM=phm9"]) == 1
    assert "no row 'phm9'" in capsys.readouterr().err


def test_log_axis_labels_only_decades_and_their_twos_and_fives(plan):
    """The minor ticks of the sentences axis are labelled at 2× and 5× a power of ten only (every minor label
    overlapped its neighbours before)."""
    from hyperplex.experiments.budget import budget_figure

    path, results = plan
    points, _ = budget_points(results, [("PHM", ["phm4", "phm4_40k"])], path, metrics=("agreement", "wikiqa_map"))
    figure = budget_figure(points, metrics=("agreement", "wikiqa_map"))
    minor = figure.axes[1].xaxis.get_minor_formatter()
    assert [minor(v, 0) for v in (2000, 3000, 5000, 7000, 20000, 40000, 500000)] == \
        ["2k", "", "5k", "", "20k", "", "500k"]
    assert figure.axes[1].xaxis.get_major_formatter()(10000, 0) == "10k"
