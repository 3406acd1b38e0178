"""hyperplex.experiments.results: a report that repeats the saved one leaves it byte for byte as it was (so a
page regenerated from committed records does not change), and a report that measures something new is written."""

import json
import shutil

from hyperplex.experiments.cli import main
from hyperplex.experiments.results import keep_report_provenance


def test_a_report_regenerated_from_records_is_byte_identical(tmp_path, write_plan):
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml", "seeds": [1],
                                       "overrides": ["--model.linear.kind=dense"]}])
    out, records, page = tmp_path / "out", tmp_path / "records", tmp_path / "results_page.md"
    args = [str(plan), "--out", str(out), "--records", str(records), "--report-only", "--append-to", str(page)]
    assert main([str(plan), "--out", str(out), "--records", str(records), "--no-report"]) == 0
    assert main(args) == 0  # evaluated and reported from the model folder
    saved = {p: p.read_bytes() for p in (records / "results.json", records / "results.md", page, out / "results.md")}
    shutil.rmtree(out / "dense")  # the machine that trained it is gone; the record remains
    assert main(args) == 0
    assert {p: p.read_bytes() for p in saved} == saved
    # a changed number is a new report: new date, the record named as its source
    cache = records / "dense" / "seed1" / "evaluation-dense.json"
    evaluation = json.loads(cache.read_text())
    evaluation["result"]["metrics"]["loss"] += 1.0
    cache.write_text(json.dumps(evaluation))
    assert main(args) == 0
    results = json.loads((records / "results.json").read_text())
    assert results["rows"][0]["runs"][0]["metrics"]["loss"] == evaluation["result"]["metrics"]["loss"]
    assert results["recorded"] == [str(records / "dense" / "seed1")]
    assert "1 model(s) reported from their records" in (records / "results.md").read_text()
    assert "1 model(s) reported from their records" not in page.read_text()


def test_the_page_links_to_the_records_for_commands_machines_and_dates(tmp_path, write_plan):
    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml", "seeds": [1],
                                       "overrides": ["--model.linear.kind=dense"]}])
    out, records, page = tmp_path / "out", tmp_path / "records", tmp_path / "docs" / "results.md"
    assert main([str(plan), "--out", str(out), "--records", str(records), "--append-to", str(page)]) == 0
    results = json.loads((records / "results.json").read_text())
    full, shown = (records / "results.md").read_text(), page.read_text()
    for text in (results["date"], "Training machine:", "Report written on:", "Command (from the repository root)"):
        assert text in full and text not in shown, text
    assert "- Commands, machines and dates: [../records/results.md](../records/results.md)" in shown
    # apart from the provenance, the page shows what the full report shows: the table and the rows
    assert shown.split("| row |", 1)[1] == full.split("| row |", 1)[1]
    assert (out / "results.md").read_text() == full  # the run's own report keeps its provenance


def test_only_the_report_provenance_is_kept(tmp_path):
    run = {"seed": 1, "status": "finished", "metrics": {"loss": 1.0}}
    old = {"plan": {"name": "p"}, "command": "c", "date": "2026-01-01T00:00:00", "machine": {"cpus": 2},
           "rows": [{"name": "a", "runs": [run]}], "recorded": []}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(old))
    new = {**old, "date": "2026-02-02T00:00:00", "machine": {"cpus": 64}, "recorded": ["r/a/seed1"],
           "rows": [{"name": "a", "runs": [{**run, "record": "r/a/seed1"}]}]}
    assert keep_report_provenance(new, path) == old  # same command, models and numbers: the saved report
    for changed in ({**new, "command": "other"},
                    {**new, "rows": [{"name": "a", "runs": [{**run, "metrics": {"loss": 1.5}}]}]}):
        assert keep_report_provenance(changed, path) is changed
    assert keep_report_provenance(new, tmp_path / "absent.json") is new
    path.write_text("{broken")
    assert keep_report_provenance(new, path) is new


def test_a_disk_that_fills_while_reporting_leaves_every_report_as_it_was(tmp_path, write_plan, monkeypatch, capsys):
    import errno
    import pathlib

    plan = write_plan(tmp_path, rows=[{"name": "dense", "config": "tiny.yaml", "seeds": [1],
                                       "overrides": ["--model.linear.kind=dense"]}])
    out, records, page = tmp_path / "out", tmp_path / "records", tmp_path / "results_page.md"
    args = [str(plan), "--out", str(out), "--records", str(records), "--report-only", "--append-to", str(page)]
    assert main([str(plan), "--out", str(out), "--records", str(records), "--no-report"]) == 0
    assert main(args) == 0
    files = (out / "results.json", out / "results.md", records / "results.json", records / "results.md", page)
    before = {p: p.read_bytes() for p in files}
    cache = records / "dense" / "seed1" / "evaluation-dense.json"  # a new number: every report would change
    evaluation = json.loads(cache.read_text())
    evaluation["result"]["metrics"]["loss"] += 1.0
    cache.write_text(json.dumps(evaluation))
    real = pathlib.Path.write_text

    def full_disk(self, *a, **k):
        if self.name == page.name:  # the last file of the set
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    monkeypatch.setattr(pathlib.Path, "write_text", full_disk)
    try:
        main(args)
    except OSError:
        pass
    monkeypatch.undo()
    assert {p: p.read_bytes() for p in files} == before  # no new json beside an old page
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]  # no half-written file left behind
