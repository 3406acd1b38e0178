"""hyperplex.experiments.markdown: one table row per plan row, cells recomputed from results.json, and the
idempotent ``<!-- plan:NAME -->`` section of a page."""

import math
import statistics

import pytest

from hyperplex.experiments.cli import main
from hyperplex.experiments.markdown import _provenance_lines, replace_section


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


def test_append_to_replaces_its_section(done):
    plan, out, doc, _ = done
    first = doc.read_text()
    assert first.startswith("# Results\n\nkept text\n")
    assert first.count("<!-- plan:tiny_plan -->") == 1 and first.count("<!-- /plan:tiny_plan -->") == 1
    doc.write_text(first + "\nafter\n")
    assert main([str(plan), "--out", str(out), "--report-only", "--append-to", str(doc)]) == 0
    second = doc.read_text()
    assert second.count("<!-- plan:tiny_plan -->") == 1 and second.startswith("# Results\n\nkept text\n")
    assert second.endswith("<!-- /plan:tiny_plan -->\n\nafter\n")
    body = "### x\n\n| a |\n"
    once = replace_section(second, "tiny_plan", body)
    assert replace_section(once, "tiny_plan", body) == once  # idempotent
    assert replace_section(once, "other", body).count("<!-- plan:") == 2


def test_replace_section_rejects_broken_markers():
    with pytest.raises(ValueError, match="broken"):
        replace_section("<!-- /plan:a -->\n<!-- plan:a -->\n", "a", "x")


def test_training_commands_differing_only_in_rows_and_seeds_are_one_line():
    def call(row, seeds):
        return f"hyperplex experiment p.yaml --rows {row} --seeds {seeds} --resume --override=--training.num_threads=1"
    results = {"command": "hyperplex experiment p.yaml --report-only", "machine": {}, "date": "d",
               "training_commands": [call("dense", "1"), call("phm4", "1"), call("dense", "2 3"),
                                     "hyperplex experiment p.yaml --rows dense --seeds 1 --out elsewhere",
                                     "hyperplex experiment p.yaml --report-only", "a 'b"]}
    trained = [line for line in _provenance_lines(results) if line.startswith("- Models trained by")]
    assert trained == [
        "- Models trained by (3 calls that differ only in ROW and K): "
        "`hyperplex experiment p.yaml --rows ROW --seeds K --resume --override=--training.num_threads=1`",
        "- Models trained by: `hyperplex experiment p.yaml --rows dense --seeds 1 --out elsewhere`",  # alone: verbatim
        "- Models trained by: `a 'b`",  # not a shell line: verbatim
    ]
