"""hyperplex.experiments.timing: training time from measured segments and train.log time stamps."""

import json

from hyperplex.experiments.timing import training_time


def test_training_time_estimated_from_log_for_a_killed_segment(tmp_path):
    import datetime as dt

    start = dt.datetime(2026, 1, 2, 3, 4, 5)
    (tmp_path / "train.log").write_text("2026-01-02 03:04:05 INFO a\n2026-01-02 03:05:35 INFO b\n"
                                        "2026-01-02 04:00:00 INFO resumed\n")
    segments = [{"start": start.timestamp(), "seconds": None},  # killed: 90 s until its last log line
                {"start": (start + dt.timedelta(minutes=55)).timestamp(), "seconds": 10.0}]
    (tmp_path / "experiment.json").write_text(json.dumps({"segments": segments}))
    assert training_time(tmp_path) == (100.0, "train.log")
