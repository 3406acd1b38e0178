"""hyperplex.experiments.plot: the stability figure of a sweep plan, read back from its artists (the plotted
means, spreads, diverged seeds and spikes), its command line and the report's copy of it."""

import json
import statistics

import pytest

from hyperplex.experiments import markdown as report
from hyperplex.experiments import plot as plot_sweep
from hyperplex.experiments.intervals import summarize

CONFIG = "configs/agreement_transformer.yaml"
LRS = [0.0005, 0.0015, 0.005, 0.015]
#: (model, lr) → per-seed (accuracy or None when the loss became NaN, diverged, spikes)
SWEEP = {("dense", 0.0005): [(80.0, False, 0), (82.0, False, 0), (81.0, False, 1)],
         ("dense", 0.0015): [(85.0, False, 0), (86.0, False, 0), (84.0, False, 0)],
         ("dense", 0.005): [(70.0, True, 2), (83.0, False, 0), (None, True, 3)],
         ("dense", 0.015): [(None, True, 4), (None, True, 1), (None, True, 2)],
         ("phm4", 0.0005): [(79.0, False, 0), (80.0, False, 0), (81.0, False, 0)],
         ("phm4", 0.0015): [(84.0, False, 0), (85.0, False, 0), (86.0, False, 0)],
         ("phm4", 0.005): [(84.5, False, 0), (85.5, False, 1), (83.0, False, 0)],
         ("phm4", 0.015): [(60.0, True, 5), (75.0, False, 0), (74.0, False, 0)]}


def _row(name, values):
    runs = [{"seed": s, "status": "finished", "metrics": {"accuracy": v}} for s, v in enumerate(values, 1)]
    return {"name": name, "label": name, "config": CONFIG, "overrides": [], "match_params": "", "runs": runs,
            "summary": {"accuracy": summarize(values)}}


def _unswept():
    return {"plan": {"name": "agreement", "title": "no sweep", "metrics": ["accuracy"]},
            "rows": [_row("a", [1.0, 2.0])]}


def _sweep_results():
    rows = []
    for (model, lr), seeds in SWEEP.items():
        runs = []
        for seed, (acc, diverged, spikes) in enumerate(seeds, 1):
            run = {"seed": seed, "status": "finished" if acc is not None else "diverged",
                   "stability": {"diverged": diverged, "spikes": spikes, "nan_step": None if acc else 7}}
            if acc is not None:
                run["metrics"] = {"accuracy": acc, "loss": 0.5}
            runs.append(run)
        label = {"dense": "Transformer", "phm4": "PHM n=4"}[model]
        rows.append({"name": f"{model}_lr{lr:g}", "label": f"{label}, lr {lr:g}", "sweep_of": model,
                     "sweep_key": "training.lr", "sweep_value": lr, "runs": runs, "overrides": [],
                     "config": CONFIG, "match_params": "",
                     "summary": {"accuracy": summarize([r["metrics"]["accuracy"] for r in runs
                                                                if r.get("metrics")])}})
    rows.append(_row("unswept", [1.0, 2.0]))  # not part of the figure
    return {"plan": {"name": "stability", "title": "stability plan", "metrics": ["accuracy", "loss"]}, "rows": rows}


def _artists(fig, prefix):
    return {a.get_gid().split(":", 1)[1]: a for ax in fig.axes for a in ax.get_children()
            if a.get_gid() and a.get_gid().startswith(prefix + ":")}


def test_sweep_figure_lines_are_the_seed_means():
    fig = plot_sweep.sweep_figure(_sweep_results())
    means = _artists(fig, "mean")
    assert set(means) == {"dense", "phm4"}
    assert means["dense"].get_label() == "Transformer" and means["phm4"].get_label() == "PHM n=4"
    for model, line in means.items():
        scored = [(lr, [s[0] for s in SWEEP[model, lr] if s[0] is not None]) for lr in LRS]
        scored = [(lr, v) for lr, v in scored if v]  # dense at 0.015: every seed NaN, no point
        assert list(line.get_xdata()) == [lr for lr, _ in scored]
        assert list(line.get_ydata()) == pytest.approx([statistics.mean(v) for _, v in scored])
        # the band spans the lowest to the highest seed at each value
        band = {tuple(p) for p in _artists(fig, "spread")[model].get_paths()[0].vertices}
        for lr, v in scored:
            assert (lr, min(v)) in band and (lr, max(v)) in band
    assert fig.axes[0].get_xscale() == "log"


def test_sweep_figure_marks_every_diverged_seed_and_sums_spikes():
    fig = plot_sweep.sweep_figure(_sweep_results())
    crosses = _artists(fig, "diverged")
    assert len(crosses["dense"].get_xdata()) == 2 + 3
    assert len(crosses["phm4"].get_xdata()) == 1
    assert crosses["dense"].get_marker() == "x" and crosses["dense"].get_linestyle() == "None"
    # side by side around their learning rate (log axis: a factor), never on another rate
    xs = sorted(crosses["dense"].get_xdata())
    assert xs[:3] == pytest.approx([0.005 * 10 ** -0.03, 0.005 * 10 ** 0.03, 0.015 * 10 ** -0.06])
    spikes = _artists(fig, "spikes")
    assert list(spikes["dense"].get_ydata()) == [1, 0, 5, 7] and list(spikes["phm4"].get_ydata()) == [0, 0, 1, 5]
    assert len(fig.axes) == 2
    assert len(plot_sweep.sweep_figure(_sweep_results(), spikes=False).axes) == 1


def test_sweep_figure_without_diverged_seeds_keeps_its_layout():
    """No crosses to draw (the stability plan's real outcome): no empty marker line, and the constrained
    layout still gives the metric panel most of the figure (an empty unclipped line once collapsed it)."""
    results = _sweep_results()
    for row in results["rows"]:
        for run in row["runs"]:
            if "stability" in run:
                run["stability"]["diverged"] = False
    fig = plot_sweep.sweep_figure(results)
    fig.canvas.draw()
    assert _artists(fig, "diverged") == {}
    top, bottom = (ax.get_position() for ax in fig.axes)
    assert top.height > 0.45 and bottom.height > 0.15 and top.y0 > bottom.y1


def test_sweep_figure_other_metric_and_errors():
    fig = plot_sweep.sweep_figure(_sweep_results(), metric="loss")
    assert list(_artists(fig, "mean")["phm4"].get_ydata()) == [0.5] * 4
    with pytest.raises(plot_sweep.SweepPlotError, match="not one of the plan's metrics"):
        plot_sweep.sweep_figure(_sweep_results(), metric="bleu")
    with pytest.raises(plot_sweep.SweepPlotError, match="no sweep rows"):
        plot_sweep.sweep_figure(_unswept())
    with pytest.raises(plot_sweep.SweepPlotError, match="no rows sweep 'training.warmup'"):
        plot_sweep.sweep_figure(_sweep_results(), key="training.warmup")


def test_plot_sweep_cli_and_report_write_pngs(tmp_path, capsys):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_sweep_results()))
    out = tmp_path / "figures" / "stability.png"
    assert plot_sweep.main([str(results), str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_sweep(_sweep_results(), "training.lr", tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(_unswept()))
    assert plot_sweep.main([str(broken), str(tmp_path / "x.png")]) == 2
    assert "no sweep rows" in capsys.readouterr().err and not (tmp_path / "x.png").exists()
