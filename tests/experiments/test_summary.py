"""hyperplex.experiments.summary (PHM vs low-rank vs dense across plans) and hyperplex.experiments.plot (the
stability figure) on synthetic results.json dicts: roles read from the plan data, interval verdicts that
flip when the intervals separate, Welch p-values equal to scipy's, missing and broken files, the
``<!-- summary -->`` section, and the plotted values of the sweep figure."""

import json
import math
import statistics
from pathlib import Path

import pytest

from hyperplex.experiments import summary
from hyperplex.experiments.intervals import summarize, t_quantile_975

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch):
    """Rows name their configs relative to the repository root, where plans run."""
    monkeypatch.chdir(REPO)


CONFIG = "configs/agreement_transformer.yaml"  # linear.kind: dense in the file (no override needed)


def PHM(n):
    return ["--model.linear.kind=phm", f"--model.linear.n={n}"]


def LOWRANK(n):
    return ["--model.linear.kind=lowrank", f"--model.linear.n={n}", "--model.linear.rank_rounding=nearest"]


def _row(name, values, overrides=(), label=None, match_params="", models_from="", eval_split="", params=(1000, 100),
         metric="accuracy", config=CONFIG):
    runs = [{"seed": s, "status": "finished", "metrics": {metric: v},
             "params": {"total": params[0], "total_without_embeddings": params[1]}}
            for s, v in enumerate(values, 1)]
    return {"name": name, "label": label or name, "config": config, "overrides": list(overrides),
            "eval_overrides": [], "eval_split": eval_split, "models_from": models_from, "seeds": [1, 2, 3],
            "match_params": match_params, "runs": runs,
            "summary": {metric: summarize(values)}}


def _results(rows, name="agreement", metric="accuracy"):
    return {"plan": {"name": name, "title": f"{name} plan", "metrics": [metric], "digits": 2},
            "date": "2026-11-23T17:44:00", "rows": rows}


def _agreement(phm4=(88.5, 88.7, 88.9), lowrank4=(88.4, 88.6, 88.8), metric="accuracy"):
    rows = [_row("transformer", [88.1, 88.7, 89.3], metric=metric, params=(1332610, 396034)),
            _row("phm2", [88.0, 88.5, 89.0], PHM(2), metric=metric),
            _row("phm4", phm4, PHM(4), metric=metric, params=(1038207, 101631)),
            _row("phm8", [88.0, 88.4, 89.0], PHM(8), metric=metric),
            _row("quaternion", [88.2, 88.9, 89.6], ["--model.linear.kind=quaternion",
                                                   "--model.attention_type=hamilton"], metric=metric),
            _row("lowrank4", lowrank4, LOWRANK(4), match_params="phm4", metric=metric, params=(1038727, 102151)),
            _row("lowrank8", [88.2, 88.5, 88.9], LOWRANK(8), match_params="phm8", metric=metric)]
    # the one-attractor test: the models of three rows scored on another file (phm8's left out)
    for base in ("transformer", "phm4", "lowrank4"):
        rows.append(_row(f"{base}_att", [63.0, 63.5, 64.0], next(r for r in rows if r["name"] == base)["overrides"],
                         models_from=base, eval_split="linzen/test.1.gz", metric=metric))
    return _results(rows, metric=metric)


# ---------------------------------------------------------------------------- roles
def test_pairs_come_from_match_params_and_the_dense_row_of_the_same_config():
    pairs = [(c.group, c.phm["name"], c.other["name"], c.other_role, c.relation)
             for c in summary.comparisons(_agreement())]
    assert pairs == [("", "phm4", "lowrank4", "low-rank", "matched"), ("", "phm4", "transformer", "dense", "dense"),
                     ("", "phm8", "lowrank8", "low-rank", "matched"), ("", "phm8", "transformer", "dense", "dense"),
                     # models_from rows pair as their models do; phm8 has no row there, so neither of its pairs
                     ("on `linzen/test.1.gz`", "phm4_att", "lowrank4_att", "low-rank", "matched"),
                     ("on `linzen/test.1.gz`", "phm4_att", "transformer_att", "dense", "dense")]


def test_linear_kind_from_overrides_then_config_file():
    assert summary.linear_setting(_row("a", [1.0], PHM(8))) == ("phm", 8)
    assert summary.linear_setting(_row("b", [1.0])) == ("dense", 4)  # configs/agreement_transformer.yaml
    assert summary.linear_setting(_row("c", [1.0], ["--model.linear.kind=lowrank"])) == ("lowrank", 4)
    assert summary.linear_setting(_row("d", [1.0], config="configs/no_such.yaml")) == (None, None)


def test_dense_counterpart_shares_the_other_overrides():
    """As in multi30k_lstm.yaml: several dense rows differ in attention; the PHM row pairs with its own."""

    def att(a, f):
        return [f"--model.attention={a}", f"--model.input_feeding={f}"]

    rows = [_row("global_dot", [30.0, 31.0, 32.0], att("dot", "false")),
            _row("local_p", [33.0, 34.0, 35.0], att("local-p", "true")),
            _row("local_p_phm4", [32.0, 33.0, 34.0], att("local-p", "true") + PHM(4)),
            _row("local_p_phm2", [32.0, 33.0, 34.0], att("local-p", "true") + PHM(2)),
            _row("local_p_lowrank4", [31.0, 32.0, 33.0], att("local-p", "true") + LOWRANK(4),
                 match_params="local_p_phm4")]
    pairs = [(c.phm["name"], c.other["name"]) for c in summary.comparisons(_results(rows, "lstm", "bleu"))]
    assert pairs == [("local_p_phm4", "local_p_lowrank4"), ("local_p_phm4", "local_p")]  # phm2: not matched


def test_without_match_params_phm_n4_and_n8_against_dense():
    rows = [_row("lstm", [80.0, 81.0, 82.0], ["--model.linear.kind=dense"]),
            _row("phm2", [80.0, 81.0, 82.0], PHM(2)), _row("phm4", [80.0, 81.0, 82.0], PHM(4)),
            _row("phm8", [80.0, 81.0, 82.0], PHM(8))]
    pairs = [(c.phm["name"], c.other["name"]) for c in summary.comparisons(_results(rows))]
    assert pairs == [("phm4", "lstm"), ("phm8", "lstm")]


def test_a_plan_without_phm_rows_says_so():
    rows = [_row("transformer", [50.0, 51.0, 52.0]),
            _row("quaternion", [49.0, 50.0, 51.0], ["--model.linear.kind=quaternion"])]
    assert summary.plan_lines(_results(rows, "arithmetic")) == \
        ["| **arithmetic** | accuracy | no PHM row with a matched or dense row | | | | | |"]


# ---------------------------------------------------------------------------- verdicts and values
def _line(results, phm, other):
    lines = summary.plan_lines(results)
    return next(x for x in lines if f"| {phm}: " in x and f"| {other}: " in x and "**agreement** |" in x)


def test_cells_hold_mean_std_interval_n_and_params():
    values = [88.5, 88.7, 88.9]
    mean, std = statistics.mean(values), statistics.stdev(values)
    half = t_quantile_975(2) * std / math.sqrt(3)
    line = _line(_agreement(phm4=values), "phm4", "lowrank4")
    assert f"phm4: {mean:.2f} ± {std:.2f} [{mean - half:.2f}, {mean + half:.2f}] (n=3; 1.04M params, " \
           "101.63K w/o emb.)" in line
    assert "| vs low-rank (matched params) |" in line
    assert f"| {mean - statistics.mean([88.4, 88.6, 88.8]):+.2f} |" in line  # Δ = PHM − other = +0.10


@pytest.mark.parametrize("lowrank4,expected", [
    ((88.4, 88.6, 88.8), "within the spread"),   # intervals overlap
    ((80.0, 80.2, 80.4), "PHM ahead"),           # separated below
    ((95.0, 95.2, 95.4), "low-rank ahead"),      # separated above
])
def test_verdict_flips_when_the_intervals_separate(lowrank4, expected):
    line = _line(_agreement(lowrank4=lowrank4), "phm4", "lowrank4")
    assert line.endswith(f"| {expected} |")


def test_verdict_uses_the_interval_edges_exactly():
    a = summarize([10.0, 11.0, 12.0])
    _, hi = a["ci95"]
    touching = {"n": 3, "mean": hi + 1.0, "std": 1.0, "ci95": [hi, hi + 2.0]}
    apart = {"n": 3, "mean": hi + 1.0, "std": 1.0, "ci95": [hi + 1e-9, hi + 2.0]}
    assert summary.verdict(a, touching, "low-rank") == "within the spread"
    assert summary.verdict(a, apart, "low-rank") == "low-rank ahead"
    assert summary.verdict(a, apart, "low-rank", minimised=True) == "PHM ahead"  # loss: lower is better


def test_a_seed_that_is_not_finite_gives_no_verdict():
    """NaN fails every comparison, so the overlap test would call the other side ahead."""
    nan = summarize([float("nan"), 30.0, 31.0])
    assert summary.verdict(nan, summarize([30.0, 31.0, 32.0]), "dense") == "not finite"
    assert summary.verdict(summarize([30.0, 31.0, 32.0]), nan, "dense", minimised=True) == "not finite"


def test_minimised_metric_turns_the_verdict_around():
    results = _agreement(phm4=(1.0, 1.1, 1.2), lowrank4=(2.0, 2.1, 2.2), metric="loss")
    assert _line(results, "phm4", "lowrank4").endswith("| PHM ahead |")  # lower loss


def test_welch_p_is_scipys():
    scipy_stats = pytest.importorskip("scipy.stats")
    a, b = [88.5, 88.7, 88.9], [88.0, 88.6, 89.5]
    expected = scipy_stats.ttest_ind(a, b, equal_var=False).pvalue
    assert summary.welch_p(a, b) == pytest.approx(expected, rel=1e-12)
    assert f"| {expected:.2g} |" in _line(_agreement(phm4=a, lowrank4=b), "phm4", "lowrank4")
    assert summary.welch_p([1.0], b) is None and summary.welch_p([1.0, 1.0], [2.0, 2.0]) is None


def test_rows_with_fewer_than_two_seeds_are_shown_without_a_verdict():
    results = _agreement(lowrank4=(88.4,))
    line = _line(results, "phm4", "lowrank4")
    assert "lowrank4: 88.40 (n=1;" in line and line.endswith("| – | n=1: no interval |")
    results["rows"][5]["runs"] = [{"seed": 1, "status": "new"}]
    line = _line(results, "phm4", "lowrank4")
    assert "lowrank4: not finished" in line and line.endswith("| – | – | not finished |")


# ---------------------------------------------------------------------------- files and the CLI
def test_missing_plan_is_listed_not_fatal(tmp_path, capsys):
    good = tmp_path / "agreement.json"
    good.write_text(json.dumps(_agreement()))
    missing = tmp_path / "snli" / "results.json"
    assert summary.main([str(good), str(missing)]) == 0
    captured = capsys.readouterr()
    assert (captured.out.startswith("<!-- summary -->\n### Summary")
            and captured.out.rstrip().endswith("<!-- /summary -->"))
    assert f"Not in the summary yet (no results.json): `{missing}`." in captured.out
    assert "2026-11-23" not in captured.out  # the date of a report is in its record, not on the page
    assert f"{missing}: no such file" in captured.err


@pytest.mark.parametrize("content,message", [("{not json", "not a readable JSON file"),
                                             (json.dumps({"rows": []}), "an object with `plan` and `rows`"),
                                             (json.dumps({"plan": {"name": "x", "metrics": ["bleu"]},
                                                          "rows": [{"name": "a", "label": "a"}]}),
                                              "rows[0] has no `runs`"),
                                             (json.dumps({"plan": {"name": "x", "metrics": ["bleu"]},
                                                          "rows": [{"name": "a", "label": "a", "runs": [],
                                                                    "model_of": "b"}]}),
                                              "rows[0] has `model_of`, which is now called `models_from`")])
def test_broken_results_json_is_one_error_and_nothing_is_written(tmp_path, capsys, content, message):
    bad = tmp_path / "results.json"
    bad.write_text(content)
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\nintro\n")
    assert summary.main([str(bad), "--write", str(doc)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}: ") and message in err
    assert doc.read_text() == "# Results\n\nintro\n"


def test_write_inserts_after_the_first_paragraph_then_replaces(tmp_path):
    doc = tmp_path / "results.md"
    doc.write_text("# Results\n\nEvery number here\nwas measured.\n\n## How these runs were made\n\ntext\n")
    summary.write_summary(doc, "first body\n")
    assert doc.read_text() == ("# Results\n\nEvery number here\nwas measured.\n\n<!-- summary -->\nfirst body\n"
                               "<!-- /summary -->\n\n## How these runs were made\n\ntext\n")
    summary.write_summary(doc, "second body\n")
    once = doc.read_text()
    assert "first body" not in once and once.count("<!-- summary -->") == 1 and "second body" in once
    summary.write_summary(doc, "second body\n")
    assert doc.read_text() == once  # idempotent
    assert summary.replace_summary("", "x") == "<!-- summary -->\nx\n<!-- /summary -->\n"
    with pytest.raises(summary.SummaryError, match="markers are broken"):
        summary.replace_summary("<!-- /summary -->\n<!-- summary -->\n", "x")


def test_pretrained_rows_take_their_kind_from_model_kind_or_the_adapter():
    # compressed students (model.kind; the teacher is kind none = dense) and fine-tuned classifiers (model.adapter)
    student = "configs/minilm_compress.yaml"  # kind: phm, n: 4 in the file
    assert summary.linear_setting(_row("s", [1.0], config=student)) == ("phm", 4)
    assert summary.linear_setting(_row("t", [1.0], ["--model.kind=none"], config=student)) == ("dense", 4)
    assert summary.linear_setting(_row("l", [1.0], ["--model.kind=lowrank", "--model.n=8"], config=student)) == \
        ("lowrank", 8)
    adapter = "configs/sst2_minilm_adapter.yaml"  # adapter kind phm, n 4 in the file
    assert summary.linear_setting(_row("a", [1.0], config=adapter)) == ("phm", 4)
    assert summary.linear_setting(_row("b", [1.0], ["--model.adapter.kind=lora"], config=adapter)) == ("lora", 4)
    teacher = dict(_row("teacher", [1.0], ["--model.kind=none"], config=student), train=False)
    converted = dict(_row("phm4_converted", [0.2], ["--model.kind=phm", "--model.n=4"], config=student), train=False)
    converted_lr = dict(_row("lowrank4_converted", [0.4], ["--model.kind=lowrank", "--model.n=4"], config=student,
                             match_params="phm4_converted"), train=False)
    healed = _row("phm4", [0.8, 0.81, 0.82], ["--model.kind=phm", "--model.n=4"], config=student)
    healed_lr = _row("lowrank4", [0.9, 0.91, 0.92], ["--model.kind=lowrank", "--model.n=4"], config=student,
                     match_params="phm4")
    pairs = summary.comparisons(_results([teacher, converted, converted_lr, healed, healed_lr], metric="accuracy"))
    got = [(c.phm["name"], c.other["name"], c.other_role) for c in pairs]
    # conversions and healed students meet their low-rank matches; neither is compared with the teacher
    assert got == [("phm4_converted", "lowrank4_converted", "low-rank"), ("phm4", "lowrank4", "low-rank")]
    assert summary.verdict(summarize([0.8, 0.81, 0.82]), summarize([0.9, 0.91, 0.92]),
                           "low-rank") == "low-rank ahead"
    lora = _row("lora", [1.0], ["--model.adapter.kind=lora"], config=adapter, match_params="phm4")
    lokr = _row("lokr", [1.0], ["--model.adapter.kind=lokr"], config=adapter, match_params="phm4")
    pairs = summary.comparisons(_results([_row("phm4", [1.0], config=adapter), lora, lokr]))
    assert [(c.other["name"], c.other_role) for c in pairs] == [("lora", "LoRA"), ("lokr", "LoKr")]
