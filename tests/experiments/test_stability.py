"""hyperplex.experiments.stability: divergence and gradient-norm spikes read from metrics.csv, and the logged
window mean / max of the gradient norm they are read from."""

import json

import pytest
from conftest import write_tiny_config

from hyperplex.experiments.stability import stability
from hyperplex.experiments.state import DIVERGED_FILE, folder_status


def test_stability_read_from_metrics_csv(tmp_path):
    rows = ["step,epoch,split,name,value"]
    for step, (loss, mean, peak) in enumerate([(2.0, 1.0, 1.5), (1.5, 1.2, 15.0), (2.5, 0.8, float("nan")),
                                               (2.4, 1.1, 2.0)], 1):
        rows += [f"{step},1,train,loss,{loss}", f"{step},1,train,grad_norm,{mean}",
                 f"{step},1,train,grad_norm_max,{peak}"]
    (tmp_path / "metrics.csv").write_text("\n".join(rows) + "\n")
    s = stability(tmp_path)
    assert s == {"nan_step": None, "loss_first": 2.0, "loss_last": 2.4, "loss_above_start": True, "diverged": True,
                 "grad_norm_median": 1.05, "grad_norm_max": 15.0,
                 "spikes": 2}  # 15 > 10 × 1.05, and the NaN window
    first = rows[:1] + rows[7:10] + rows[1:7] + rows[10:]  # the NaN window first: the same largest finite norm
    (tmp_path / "metrics.csv").write_text("\n".join(first) + "\n")
    assert stability(tmp_path)["grad_norm_max"] == 15.0 and stability(tmp_path)["spikes"] == 2
    (tmp_path / DIVERGED_FILE).write_text(json.dumps({"step": 7, "message": "loss became nan at step 7"}))
    assert stability(tmp_path)["nan_step"] == 7 and folder_status(tmp_path) == "diverged"


def test_grad_norm_window_mean_and_max_in_metrics_csv(tmp_path):
    """With log_every=2 the logged window mean / max equal the mean / max of the two per-step norms that
    the same (deterministic) run logs with log_every=1."""
    import csv

    from hyperplex.train.run import train

    logged = {}
    for every in (1, 2):
        config = write_tiny_config(tmp_path, log_every=every, max_steps=4, validation_every=4, deterministic=True)
        train(str(config), model_dir=str(tmp_path / f"log{every}"))
        with open(tmp_path / f"log{every}" / "metrics.csv") as f:
            logged[every] = {(int(r["step"]), r["name"]): float(r["value"]) for r in csv.DictReader(f)
                             if r["split"] == "train"}
    per_step = [logged[1][s, "grad_norm"] for s in range(1, 5)]
    assert all(logged[1][s, "grad_norm_max"] == logged[1][s, "grad_norm"] > 0 for s in range(1, 5))
    for end in (2, 4):
        pair = per_step[end - 2:end]
        assert logged[2][end, "grad_norm"] == pytest.approx(sum(pair) / 2, rel=1e-4)  # metrics.csv keeps 6 digits
        assert logged[2][end, "grad_norm_max"] == pytest.approx(max(pair), rel=1e-4)
