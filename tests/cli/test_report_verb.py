"""``hyperplex report summary|frontier|budget|sweep`` and ``hyperplex config-reference`` (hyperplex/cli/report_verb.py),
called in process on the committed records: each verb gives what its module gives."""

from __future__ import annotations

from pathlib import Path

import pytest

from hyperplex.cli import main
from hyperplex.config.reference import config_reference
from hyperplex.experiments import budget, frontier, summary

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "experiments" / "records"


def test_report_summary_prints_the_section_naming_the_verb(capsys):
    results = [str(RECORDS / "sst2" / "results.json"), str(RECORDS / "agreement" / "results.json")]
    assert main(["report", "summary", *results]) == 0
    out = capsys.readouterr().out
    assert out.startswith(summary.START) and out.rstrip().endswith(summary.END)
    rendered = summary.render([(p, summary.load_results(p)) for p in results], "hyperplex report summary")
    assert out == f"{summary.START}\n{rendered.rstrip()}\n{summary.END}\n"
    assert "hyperplex report summary" in out


def test_report_summary_write_replaces_the_section(tmp_path, capsys):
    page = tmp_path / "results.md"
    page.write_text(f"# Results\n\n{summary.START}\nSTALE-LINE\n{summary.END}\n\nafter\n")
    assert main(["report", "summary", str(RECORDS / "sst2" / "results.json"), "--write", str(page)]) == 0
    text = page.read_text()
    assert "STALE-LINE" not in text and text.startswith("# Results") and text.endswith("after\n") and "| " in text


def test_report_sweep_writes_a_png(tmp_path, capsys):
    out = tmp_path / "stability.png"
    assert main(["report", "sweep", str(RECORDS / "stability" / "results.json"), str(out)]) == 0
    assert out.read_bytes()[:4] == b"\x89PNG" and f"wrote {out}" in capsys.readouterr().out


def test_report_frontier_table_is_the_modules(tmp_path, capsys):
    table = tmp_path / "frontier.md"
    results = RECORDS / "minilm_frontier" / "results.json"
    assert main(["report", "frontier", str(results), "--table", str(table)]) == 0
    assert main(["report", "frontier", str(results)]) == 0
    printed = capsys.readouterr().out
    assert table.read_text().strip() and table.read_text().strip() in printed
    assert frontier.main([str(results), "--table", str(tmp_path / "again.md")]) == 0
    assert (tmp_path / "again.md").read_text() == table.read_text()


def test_report_budget_table_and_errors(tmp_path, capsys):
    results = RECORDS / "minilm_frontier" / "results.json"
    curve = "PHM n=4=phm4,phm4_40k,phm4_400k"
    table = tmp_path / "budget.md"
    assert main(["report", "budget", str(results), "--curve", curve, "--table", str(table)]) == 0
    assert budget.main([str(results), "--curve", curve, "--table", str(tmp_path / "b.md")]) == 0
    assert (tmp_path / "b.md").read_text() == table.read_text() != ""
    assert main(["report", "budget", str(tmp_path / "missing.json"), "--curve", curve]) == 1
    assert "hyperplex report budget" in capsys.readouterr().err


def test_report_needs_a_kind(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["report"])
    assert exit_info.value.code == 2 and "summary,frontier,budget,sweep" in capsys.readouterr().err


def test_config_reference_prints_the_reference(capsys):
    assert main(["config-reference"]) == 0
    assert capsys.readouterr().out == config_reference()
    assert main(["config-reference", "--check"]) == 2
    assert "--check needs --annotate" in capsys.readouterr().err


def test_config_reference_annotate_check(tmp_path, capsys):
    config = tmp_path / "c.yaml"
    config.write_text((ROOT / "configs" / "sst2_transformer.yaml").read_text())
    assert main(["config-reference", "--annotate", "--check", str(config)]) == 0
    config.write_text(config.read_text().replace("#: ", "#:  ", 1))
    assert main(["config-reference", "--annotate", "--check", str(config)]) == 1
    assert "hyperplex config-reference --annotate" in capsys.readouterr().err
    assert main(["config-reference", "--annotate", str(config)]) == 0
    assert main(["config-reference", "--annotate", "--check", str(config)]) == 0
