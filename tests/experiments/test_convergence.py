"""hyperplex.experiments.convergence: a model's course from its record, Welch gaps, the section's table."""

import json
import math

import pytest

from hyperplex.experiments.convergence import (
    PAPER_TABLE2,
    PAPER_TABLE4,
    best_by,
    convergence_figure,
    convergence_section,
    mean_best_curve,
    paired_gap,
    row_courses,
    training_course,
    welch_gap,
)


def _record(folder, bleus, final=None, diverged=False, every=250):
    """A record folder with dev BLEU at every ``every`` steps and a trainer's final log line."""
    folder.mkdir(parents=True)
    lines = ["step,epoch,split,name,value"]
    for i, bleu in enumerate(bleus, 1):
        lines += [f"{i * every},{i},train,loss,{5 - i * 0.1}", f"{i * every},{i},dev,bleu,{bleu}",
                  f"{i * every},{i},dev,loss,{4 - i * 0.1}"]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")
    log = ["2026-01-01 00:00:00 INFO step 50 epoch 1: loss 9.1"]
    if final:
        log.append(f"2026-01-01 01:00:00 INFO {final}")
    (folder / "train.log").write_text("\n".join(log) + "\n")
    if diverged:
        (folder / "diverged.json").write_text("{}")
    return folder


def test_the_course_reads_best_step_and_why_training_stopped(tmp_path):
    patience = _record(tmp_path / "a", [10.0, 20.0, 25.0, 24.0, 25.0, 23.0],
                       "finished at step 1500 (epoch 6): early stopping: bleu did not improve for "
                       "training.patience=3 validations; best bleu 25.0")
    course = training_course(patience)
    # the first validation reaching the best value is the kept checkpoint (a tie later does not replace it)
    curve = [(250, 10.0), (500, 20.0), (750, 25.0), (1000, 24.0), (1250, 25.0), (1500, 23.0)]
    assert course == {"best": 25.0, "best_step": 750, "best_epoch": 3, "last_step": 1500, "stop": "early stopping",
                      "trained_on": [], "curve": curve}
    capped = _record(tmp_path / "b", [1.0, 2.0], "finished at step 500 (epoch 2): reached training.max_steps=500")
    assert training_course(capped)["stop"] == "step cap"
    epochs = _record(tmp_path / "c", [1.0], "finished at step 250 (epoch 1): reached training.max_epochs=1")
    assert training_course(epochs)["stop"] == "epoch cap"
    assert training_course(_record(tmp_path / "d", [3.0, float("nan")], diverged=True))["stop"] == "diverged"
    running = training_course(_record(tmp_path / "e", [3.0, 4.0]))
    assert running["stop"] == "unfinished" and running["best"] == 4.0 and running["last_step"] == 500
    assert training_course(tmp_path / "missing") == {"best": None, "best_step": None, "best_epoch": None,
                                                     "last_step": 0, "stop": "unfinished", "trained_on": [],
                                                     "curve": []}
    # epochs to best: the epochs of data before the best step, from the first budget line's steps per epoch (a
    # resumed run logs its own; the metrics' epoch column named the next epoch after an epoch-closing step)
    budget = "2026-01-01 00:00:00 INFO budget: training.max_steps=40,000 ends the run ({} steps per epoch, ≈ 1 epochs)"
    with (patience / "train.log").open("a") as log:
        log.write(budget.format(300) + "\n" + budget.format(301) + "\n")
    assert training_course(patience)["best_epoch"] == 750 / 300
    # where it trained: every segment's device and torch, once each, in order (a GPU session resumed on a CPU)
    segments = [{"machine": {"device": d, "torch": "2.13.0"}} for d in ("cuda (NVIDIA H100)", "cpu", "cpu")]
    (patience / "experiment.json").write_text(json.dumps({"segments": segments}))
    assert training_course(patience)["trained_on"] == ["cuda (NVIDIA H100), torch 2.13.0", "cpu, torch 2.13.0"]


def test_welch_gap_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    a, b = [30.1, 31.4, 29.8], [27.0, 28.9, 26.2, 27.7]
    gap = welch_gap(a, b)
    reference = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert gap["diff"] == pytest.approx(sum(a) / 3 - sum(b) / 4)
    assert gap["ci95"] == pytest.approx([reference.low, reference.high], rel=1e-9)
    assert welch_gap([1.0], [2.0, 3.0]) == {"diff": -1.5, "ci95": None, "n_a": 1, "n_b": 2}
    assert welch_gap([2.0, 2.0], [1.0, 1.0])["ci95"] == [1.0, 1.0]


def test_paired_gap_matches_scipy_over_the_common_seeds():
    stats = pytest.importorskip("scipy.stats")
    a, b = {1: 30.1, 2: 31.4, 3: 29.8, 4: 30.0}, {1: 27.0, 2: 28.9, 3: 26.2, 5: 27.7}
    gap = paired_gap(a, b)
    reference = stats.ttest_rel([30.1, 31.4, 29.8], [27.0, 28.9, 26.2]).confidence_interval(0.95)
    assert gap["n"] == 3 and gap["diff"] == pytest.approx((3.1 + 2.5 + 3.6) / 3)
    assert gap["ci95"] == pytest.approx([reference.low, reference.high], rel=1e-9)
    assert paired_gap({1: 2.0}, {1: 1.5}) == {"diff": 0.5, "ci95": None, "n": 1}
    assert paired_gap({1: 2.0}, {2: 1.5}) == {"diff": None, "ci95": None, "n": 0}
    # a shift shared by both rows' seed k (the same batches) cancels in the pairs, not in Welch's interval
    shared = {1: -1.0, 2: 0.0, 3: 1.0}
    left, right = {k: 30 + v for k, v in shared.items()}, {k: 29 + v + 0.01 * k for k, v in shared.items()}
    assert paired_gap(left, right)["ci95"][0] > 0 > welch_gap(list(left.values()), list(right.values()))["ci95"][0]


def _results(tmp_path):
    records = tmp_path / "records"
    runs = {}
    for name, bleus in {"tm": [30.0, 31.0, 32.0], "phm4": [29.0, 30.5, 31.0]}.items():
        runs[name] = []
        for seed, best in enumerate(bleus, 1):
            _record(records / name / f"seed{seed}", [best - 5, best, best - 1],
                    f"finished at step 750 (epoch 3): early stopping: bleu did not improve; best bleu {best}")
            runs[name].append({"seed": seed, "model_dir": str(tmp_path / "gone"), "status": "finished",
                               "metrics": {"bleu": best + 0.5}, "params": {"total": 5_000_000},
                               "train_seconds": 600.0})
    runs["phm4"].append({"seed": 4, "model_dir": str(tmp_path / "gone"), "status": "failed"})
    return records, {"rows": [
        {"name": "tm", "label": "Transformer", "seeds": [1, 2, 3], "runs": runs["tm"]},
        {"name": "phm4", "label": "PHM-Tm n=4", "seeds": [1, 2, 3, 4], "runs": runs["phm4"]},
        {"name": "phm4_beam1", "label": "beam 1", "models_from": "phm4", "runs": runs["phm4"]}]}


def test_the_section_reports_each_row_and_the_gap_beside_the_papers(tmp_path):
    records, results = _results(tmp_path)
    rows = row_courses(results, records)
    assert [r["name"] for r in rows] == ["tm", "phm4"]  # a models_from row is not a trained row
    assert rows[1]["values"] == [29.5, 31.0, 31.5] and rows[1]["planned"] == 4  # the beam score, not the dev BLEU
    assert [c["best_step"] for c in rows[0]["courses"]] == [500, 500, 500]
    results["rows"].append({"name": "phm8", "label": "PHM-Tm n=8", "seeds": [1], "runs": [{"seed": 1}]})
    text = convergence_section(json.loads(json.dumps(results)), records, [("phm4", "tm", "PHM-Tm n=4"),
                                                                            ("phm8", "tm", "PHM-Tm n=8")])
    assert "| PHM-Tm n=8 |" not in text and "No finished model yet: PHM-Tm n=8." in text  # listed, not a row of dashes
    assert "| PHM-Tm n=8 − Transformer |" not in text
    assert "| PHM-Tm n=4 | 3/4 | 30.67 [" in text and "| early stopping 3 | 5.00M | 10 min |" in text
    gap = welch_gap([29.5, 31.0, 31.5], [30.5, 31.5, 32.5])
    paired = paired_gap({1: 29.5, 2: 31.0, 3: 31.5}, {1: 30.5, 2: 31.5, 3: 32.5})
    assert (f"| PHM-Tm n=4 − Transformer | {gap['diff']:+.2f} [{gap['ci95'][0]:+.2f}, {gap['ci95'][1]:+.2f}] | "
            f"{paired['diff']:+.2f} [{paired['ci95'][0]:+.2f}, {paired['ci95'][1]:+.2f}] (3) |") in text
    diffs = [x - y for x, y in zip(PAPER_TABLE2["PHM-Tm n=4"], PAPER_TABLE2["Transformer"])]
    assert f"{min(diffs):+.2f} … {max(diffs):+.2f} (mean {math.fsum(diffs) / 7:+.2f})" in text


def test_a_diverged_seed_is_counted_and_named_not_dropped_unsaid(tmp_path):
    """A seed whose loss became NaN has no score: it stays out of the mean and the gaps, and the table says so (its
    stop, its seed and step); a row whose every seed diverged is a row of the table, not 'no finished model'."""
    records, results = _results(tmp_path)
    results["rows"][1]["runs"][2] = {"seed": 3, "model_dir": str(tmp_path / "gone"), "status": "diverged",
                                     "stability": {"nan_step": 1234, "diverged": True}}
    results["rows"].append({"name": "phm16", "label": "PHM-Tm n=16", "seeds": [1], "runs": [
        {"seed": 1, "model_dir": str(tmp_path / "gone"), "status": "diverged", "stability": {"nan_step": None}}]})
    rows = {r["name"]: r for r in row_courses(results, records)}
    assert rows["phm4"]["values"] == [29.5, 31.0] and rows["phm4"]["diverged"] == 1
    text = convergence_section(results, records, [("phm4", "tm", "PHM-Tm n=4"), ("phm16", "tm", "")])
    assert "| PHM-Tm n=4 | 2/4 | 30.25 [" in text and "| diverged 1, early stopping 2 |" in text
    assert "| PHM-Tm n=16 | 0/1 | – | – | – | diverged 1 |" in text and "No finished model yet" not in text
    assert "Diverged (a non-finite loss or validation metric; no score, so not in the mean or the gaps, and not " \
           "retrained): PHM-Tm n=4 seed 3 (step 1234); PHM-Tm n=16 seed 1." in text
    gap = welch_gap([29.5, 31.0], [30.5, 31.5, 32.5])
    assert f"| PHM-Tm n=4 − Transformer | {gap['diff']:+.2f} [" in text and "| PHM-Tm n=16 − Transformer |" not in text


def test_a_finished_seed_whose_score_is_not_finite_is_counted_as_diverged(tmp_path):
    """A run recorded finished with a NaN score (a divergence the trainer did not catch) is not averaged in, which
    would make the row's mean and every gap NaN: it is listed with the diverged seeds."""
    records, results = _results(tmp_path)
    results["rows"][1]["runs"][1]["metrics"]["bleu"] = float("nan")
    rows = {r["name"]: r for r in row_courses(results, records)}
    assert rows["phm4"]["values"] == [29.5, 31.5] and rows["phm4"]["by_seed"] == {1: 29.5, 3: 31.5}
    assert rows["phm4"]["diverged"] == 1 and rows["phm4"]["diverged_at"] == [(2, None)]
    text = convergence_section(results, records, [("phm4", "tm", "PHM-Tm n=4")])
    assert "| PHM-Tm n=4 | 2/4 | 30.50 [" in text and "PHM-Tm n=4 seed 2." in text and "nan" not in text.lower()
    gap = welch_gap([29.5, 31.5], [30.5, 31.5, 32.5])
    assert f"| PHM-Tm n=4 − Transformer | {gap['diff']:+.2f} [{gap['ci95'][0]:+.2f}, {gap['ci95'][1]:+.2f}] |" in text


def test_the_papers_column_appears_only_when_a_gap_quotes_the_paper(tmp_path):
    records, results = _results(tmp_path)
    gap = welch_gap([29.5, 31.0, 31.5], [30.5, 31.5, 32.5])
    paired = paired_gap({1: 29.5, 2: 31.0, 3: 31.5}, {1: 30.5, 2: 31.5, 3: 32.5})
    ours = (f"| PHM-Tm n=4 − Transformer | {gap['diff']:+.2f} [{gap['ci95'][0]:+.2f}, {gap['ci95'][1]:+.2f}] | "
            f"{paired['diff']:+.2f} [{paired['ci95'][0]:+.2f}, {paired['ci95'][1]:+.2f}] (3) |")
    plain = convergence_section(json.loads(json.dumps(results)), records, [("phm4", "tm", "")])
    assert "Table 2" not in plain and ours + "\n" in plain  # a style-transfer plan quotes no translation table
    assert ("| gap | ours: difference of mean bleu [95% Welch interval] | ours: mean of the per-seed differences "
            "[95% interval] (seeds) |\n|---|---:|---:|\n") in plain
    quoted = convergence_section(json.loads(json.dumps(results)), records, [("phm4", "tm", ""),
                                                                              ("phm4", "tm", "PHM-Tm n=4")])
    assert "the paper's Table 2" in quoted and ours + " – |" in quoted  # the unquoted gap gets a dash there


def test_a_style_transfer_section_quotes_the_papers_table_4_gap(tmp_path, capsys):
    from hyperplex.cli import main

    records, results = _results(tmp_path)
    text = convergence_section(json.loads(json.dumps(results)), records, [("phm4", "tm", "PHM-Tm n=4")],
                               paper_table=4)
    quoted = PAPER_TABLE4["PHM-Tm n=4"][0] - PAPER_TABLE4["Transformer"][0]  # one corpus: the gap, no range
    assert "the paper's Table 4, same gap" in text and "Table 2" not in text
    assert text.split("| PHM-Tm n=4 − Transformer |")[1].split("\n")[0].endswith(f" {quoted:+.2f} |")
    with pytest.raises(ValueError, match="paper tables quoted are"):
        convergence_section(results, records, [], paper_table=3)
    results["plan"] = {"name": "tiny_converged"}
    (records / "results.json").write_text(json.dumps(results))
    argv = ["report", "convergence", str(records / "results.json"), "--compare", "phm4:tm:PHM-Tm† n=4"]
    assert main(argv) == 0  # Table 2 (the default) has the hidden-doubled row
    capsys.readouterr()
    assert main([*argv, "--paper-table", "4"]) == 1  # Table 4 has not: named, with the table's rows
    err = capsys.readouterr().err
    assert "the paper's Table 4 has no row 'PHM-Tm† n=4'" in err and "PHM-Tm n=8" in err


def test_a_gap_between_two_variants_quotes_the_papers_same_pair(tmp_path, capsys):
    """ROW:BASE:PAPER:PAPER_BASE quotes the paper's PAPER − PAPER_BASE (e.g. learned rule against the fixed
    Hamilton one), not PAPER − Transformer."""
    from hyperplex.cli import main

    records, results = _results(tmp_path)
    text = convergence_section(json.loads(json.dumps(results)), records,
                               [("phm4", "tm", "PHM-Tm n=4", "Quaternion Tm"), ("phm4", "tm", "PHM-Tm n=4")])
    pair = [x - y for x, y in zip(PAPER_TABLE2["PHM-Tm n=4"], PAPER_TABLE2["Quaternion Tm"])]
    to_tm = [x - y for x, y in zip(PAPER_TABLE2["PHM-Tm n=4"], PAPER_TABLE2["Transformer"])]
    first, second = [line for line in text.splitlines() if line.startswith("| PHM-Tm n=4 − Transformer |")]
    assert first.endswith(f" {min(pair):+.2f} … {max(pair):+.2f} (mean {math.fsum(pair) / 7:+.2f}) |")
    assert second.endswith(f" {min(to_tm):+.2f} … {max(to_tm):+.2f} (mean {math.fsum(to_tm) / 7:+.2f}) |")
    results["plan"] = {"name": "tiny_converged"}
    (records / "results.json").write_text(json.dumps(results))
    source = str(records / "results.json")
    assert main(["report", "convergence", source, "--compare", "phm4:tm:PHM-Tm n=4:Quaternion Tm"]) == 0
    assert first in capsys.readouterr().out
    assert main(["report", "convergence", source, "--compare", "phm4:tm:PHM-Tm n=4:LSTM"]) == 1
    assert "the paper's Table 2 has no row 'LSTM'" in capsys.readouterr().err
    assert main(["report", "convergence", source, "--compare", "phm4:tm::Quaternion Tm"]) == 1  # a base needs a row
    assert "expected ROW:BASE, ROW:BASE:PAPER or ROW:BASE:PAPER:PAPER_BASE" in capsys.readouterr().err


def test_the_report_verb_prints_and_writes_the_section_and_names_a_bad_row(tmp_path, capsys):
    from hyperplex.cli import main

    records, results = _results(tmp_path)
    results["plan"] = {"name": "tiny_converged"}
    (records / "results.json").write_text(json.dumps(results))
    page = tmp_path / "page.md"
    page.write_text("# Results\n\nkept\n")
    argv = ["report", "convergence", str(records / "results.json"), "--compare", "phm4:tm:PHM-Tm n=4"]
    assert main([*argv, "--append-to", str(page)]) == 0
    printed = capsys.readouterr().out
    assert "| PHM-Tm n=4 − Transformer |" in printed
    text = page.read_text()
    assert text.startswith("# Results\n\nkept\n") and "<!-- plan:tiny_converged.convergence -->" in text
    assert printed.strip() in text
    assert main([*argv, "--append-to", str(page)]) == 0 and page.read_text() == text  # idempotent
    before = page.read_bytes()
    assert main(["report", "convergence", str(records / "results.json"), "--compare", "phm5:tm",
                 "--append-to", str(page)]) == 1
    assert "no row 'phm5' in the plan" in capsys.readouterr().err and page.read_bytes() == before


def test_the_report_verb_never_writes_over_the_results_it_reads(tmp_path, capsys):
    from hyperplex.cli import main

    records, results = _results(tmp_path)
    results["plan"] = {"name": "tiny_converged"}
    source = records / "results.json"
    source.write_text(json.dumps(results))
    before = source.read_bytes()
    assert main(["report", "convergence", str(source), "--append-to", str(source)]) == 1
    assert source.read_bytes() == before and "--append-to" in capsys.readouterr().err


def test_best_by_a_step_is_the_running_best_and_stays_after_a_model_stopped(tmp_path):
    course = training_course(_record(tmp_path / "a", [10.0, 20.0, 18.0, float("nan"), 19.0]))
    assert [best_by(course, s) for s in (100, 250, 499, 500, 1000, 1250, 10_000)] == [None, 10.0, 10.0, 20.0, 20.0,
                                                                                        20.0, 20.0]


def test_the_section_tabulates_the_rows_and_gaps_by_step(tmp_path, capsys):
    from hyperplex.cli import main

    records, results = _results(tmp_path)  # dev BLEU best−5, best, best−1 at steps 250, 500, 750
    text = convergence_section(results, records, [("phm4", "tm", "")], at_steps=[500, 250, 100])
    assert "| model | by step 100 | by step 250 | by step 500 |" in text
    assert "| Transformer | – | 26.00 | 31.00 |" in text and "| PHM-Tm n=4 | – | 25.17 | 30.17 |" in text
    at_250 = welch_gap([24.0, 25.5, 26.0], [25.0, 26.0, 27.0])
    assert (f"| PHM-Tm n=4 − Transformer | – | {at_250['diff']:+.2f} [{at_250['ci95'][0]:+.2f}, "
            f"{at_250['ci95'][1]:+.2f}] |") in text
    assert "by step" not in convergence_section(results, records, [("phm4", "tm", "")])
    results["plan"] = {"name": "tiny_converged"}
    (records / "results.json").write_text(json.dumps(results))
    assert main(["report", "convergence", str(records / "results.json"), "--at-steps", "0"]) == 1
    assert "--at-steps: steps are positive, got 0" in capsys.readouterr().err


def test_the_mean_curve_starts_where_every_model_has_validated_and_keeps_a_stopped_models_best(tmp_path):
    a = training_course(_record(tmp_path / "a", [10.0, 20.0, 18.0, 22.0]))  # steps 250 … 1000
    b = training_course(_record(tmp_path / "b", [12.0, 16.0], every=500))  # steps 500, 1000
    c = training_course(_record(tmp_path / "c", [30.0], every=500))  # stopped after step 500
    assert mean_best_curve([a, b]) == [(500, 16.0), (750, 16.0), (1000, 19.0)]
    assert mean_best_curve([a, c]) == [(500, 25.0), (750, 25.0), (1000, 26.0)]
    assert mean_best_curve([]) == []


def test_the_figure_draws_each_rows_mean_its_seeds_and_their_best_checkpoints(tmp_path):
    records, results = _results(tmp_path)  # dev BLEU best−5, best, best−1 at steps 250, 500, 750
    results["plan"] = {"name": "tiny_converged"}
    fig = convergence_figure(results, records)
    lines = {line.get_gid(): line for line in fig.axes[0].get_lines()}
    assert set(lines) == {"mean:tm", "mean:phm4", *(f"seed:{r}:{k}" for r in ("tm", "phm4") for k in range(3))}
    assert list(lines["mean:tm"].get_xdata()) == [250, 500, 750]
    assert list(lines["mean:tm"].get_ydata()) == pytest.approx([26.0, 31.0, 31.0])
    assert list(lines["seed:phm4:1"].get_ydata()) == [25.5, 30.5, 29.5]
    best = {c.get_gid(): c.get_offsets().tolist() for c in fig.axes[0].collections}
    assert best["best:phm4"] == [[500, 29.0], [500, 30.5], [500, 31.0]]
    assert lines["mean:tm"].get_label() == "Transformer (3 seeds)"
    results["rows"][0]["runs"] = results["rows"][0]["runs"][:1]  # a row with its first seed only
    one = convergence_figure(results, records, rows=["tm"])
    labels = {line.get_gid(): line.get_label() for line in one.axes[0].get_lines()}
    assert labels["mean:tm"] == "Transformer (1 seed)"
    only = convergence_figure(results, records, rows=["phm4"])
    assert {line.get_gid() for line in only.axes[0].get_lines()} == {"mean:phm4", "seed:phm4:0", "seed:phm4:1",
                                                                      "seed:phm4:2"}
    with pytest.raises(ValueError, match="no finished model in row.s. phm8"):
        convergence_figure(results, records, rows=["phm4", "phm8"])


def test_the_report_verb_writes_the_figure_and_nothing_on_a_bad_row(tmp_path, capsys):
    from hyperplex.cli import main

    records, results = _results(tmp_path)
    results["plan"] = {"name": "tiny_converged"}
    (records / "results.json").write_text(json.dumps(results))
    png, page = tmp_path / "figures" / "tiny.png", tmp_path / "page.md"
    page.write_text("# Results\n")
    argv = ["report", "convergence", str(records / "results.json"), "--append-to", str(page), "--figure", str(png)]
    assert main([*argv, "--figure-rows", "tm", "nope"]) == 1
    assert "no finished model in row(s) nope" in capsys.readouterr().err
    assert not png.exists() and page.read_text() == "# Results\n"  # nothing written
    assert main(argv) == 0 and png.read_bytes().startswith(b"\x89PNG")
    assert main(["report", "convergence", str(records / "results.json"), "--figure",
                 str(records / "results.json")]) == 1  # never over the results it reads


def test_a_row_trained_on_two_kinds_of_device_reports_its_time_per_kind(tmp_path):
    """Seeds from a GPU session and from a CPU lane: one mean of minutes and hours would describe neither."""
    records, results = _results(tmp_path)
    machines = {1: ["cuda (NVIDIA H200)"], 2: ["cpu"], 3: ["cuda (NVIDIA H200)", "cpu"]}  # seed 3 resumed on a CPU
    for run in results["rows"][1]["runs"][:3]:
        segments = [{"machine": {"device": d, "torch": "2.13.0"}} for d in machines[run["seed"]]]
        (records / "phm4" / f"seed{run['seed']}" / "experiment.json").write_text(json.dumps({"segments": segments}))
        run["train_seconds"] = {1: 360.0, 2: 36000.0, 3: 7200.0}[run["seed"]]
    rows = {r["name"]: r for r in row_courses(results, records)}
    assert rows["phm4"]["seconds_by_device"] == {"cuda": [360.0], "cpu": [36000.0], "cuda+cpu": [7200.0]}
    text = convergence_section(json.loads(json.dumps(results)), records, [])
    line = next(x for x in text.splitlines() if x.startswith("| PHM-Tm n=4 |"))
    assert "| 6 min on cuda (1); 600 min on cpu (1); 120 min on cuda+cpu (1) |" in line
    assert line.endswith("| cuda (NVIDIA H200), torch 2.13.0; cpu, torch 2.13.0 |")
    # a row on one kind of device keeps its one mean (the Transformer's records name no machine)
    assert "| early stopping 3 | 5.00M | 10 min | – |" in next(x for x in text.splitlines()
                                                               if x.startswith("| Transformer |"))
