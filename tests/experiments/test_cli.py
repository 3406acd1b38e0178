"""``hyperplex experiment PLAN``: the verb validates a plan, lists its runs, and records itself as the command of
the report."""

import json
import shutil

from hyperplex.cli.main import main as hyperplex_main


def test_the_verb_validates_and_lists_the_runs(tmp_path, capsys, write_plan):
    plan = write_plan(tmp_path)
    assert hyperplex_main(["experiment", str(plan), "--dry-run", "--out", str(tmp_path / "out"),
                           "--override=--training.max_steps=2", "--rows", "dense", "--seeds", "1"]) == 0
    output = capsys.readouterr().out
    assert "1 model(s) selected" in output and "--training.max_steps=2 --seed=1" in output
    assert not (tmp_path / "out").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text(plan.read_text().replace("title:", "titel:"))
    assert hyperplex_main(["experiment", str(bad), "--dry-run"]) == 1
    line = next(i for i, text in enumerate(bad.read_text().splitlines(), 1) if text.startswith("titel:"))
    assert f"{bad}:{line}: unknown config key 'titel'; did you mean 'title'?" in capsys.readouterr().err


def test_the_report_records_the_command_that_was_typed(done, tmp_path):
    plan, out, _, _ = done
    copy = tmp_path / "out"
    shutil.copytree(out, copy)
    (copy / "results.json").unlink()  # a fresh report, not the saved one repeated
    assert hyperplex_main(["experiment", str(plan), "--out", str(copy), "--report-only"]) == 0
    command = json.loads((copy / "results.json").read_text())["command"]
    assert command == f"hyperplex experiment {plan} --out {copy} --report-only"

