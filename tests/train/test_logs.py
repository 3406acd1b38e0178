"""metrics.csv and TensorBoard after a resume: each holds every step once, the resumed step's values included."""

import csv

import pytest

from hyperplex.train.logs import MetricsWriter


def test_a_resume_keeps_the_resumed_steps_values_and_drops_the_later_ones(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = MetricsWriter(tmp_path, None)
    for step in (5, 10, 15):  # a run killed after step 15, resumed from its checkpoint of step 10
        first.write(step, 1, "dev", {"loss": 1.0 / step})
    first.close()
    again = MetricsWriter(tmp_path, 10)
    for step in (15, 20):
        again.write(step, 2, "dev", {"loss": 2.0 / step})
    again.close()
    with open(tmp_path / "metrics.csv", newline="") as f:
        rows = [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f)]
    assert rows == [(5, 0.2), (10, 0.1), (15, pytest.approx(2 / 15, rel=1e-5)), (20, 0.1)]
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    scalars = [(e.step, e.value) for e in events.Scalars("dev/loss")]
    assert scalars == [(5, pytest.approx(0.2)), (10, pytest.approx(0.1)), (15, pytest.approx(2 / 15)),
                       (20, pytest.approx(0.1))]
