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


def _write_run(folder, lines, segments):
    """``train.log`` of ``(datetime, message)`` lines as the trainer writes them, and ``experiment.json``."""
    folder.mkdir(exist_ok=True)
    (folder / "train.log").write_text("".join(f"{t:%Y-%m-%d %H:%M:%S} INFO {m}\n" for t, m in lines))
    (folder / "experiment.json").write_text(json.dumps({"segments": segments}))


def test_a_killed_segment_counts_only_its_own_lines_not_the_resumed_ones_stamped_before_their_start(tmp_path):
    """As the audit's repro: a segment killed with SIGKILL after ~6 s (its lines span 5 s from its start's second),
    30 s down, then a resume whose first lines carry the second its segment started in, before that segment's
    start (stamps are whole seconds). Counted by stamp alone, the killed segment ran until those lines (37 s)."""
    import datetime as dt

    from hyperplex.train.logs import RUN_START

    t0 = dt.datetime(2026, 3, 4, 12, 0, 0, 600000)  # the killed segment's start
    t1 = t0 + dt.timedelta(seconds=36.7)  # the resumed segment's start: 12:00:37.3
    second = dt.timedelta(seconds=1)
    killed = [(t0, f"{RUN_START}: pid 10, new run in m"), (t0 + second, "budget: ..."),
              *[(t0 + k * second, f"step {k}: loss 1.0") for k in (2, 3, 4, 5)]]
    resumed = [(t1, f"{RUN_START}: pid 11, resuming in m"), (t1, "resumed from m/last.safetensors at step 20"),
               (t1 + second, "step 30: loss 0.5"), (t1 + 2 * second, "finished at step 40")]
    segments = [{"start": t0.timestamp(), "seconds": None},  # killed: no length recorded
                {"start": t1.timestamp(), "seconds": 2.5, "resume": True}]
    _write_run(tmp_path / "marked", killed + resumed, segments)
    # 12:00:05 (its last own line) − 12:00:00 (its start's second) + the resumed segment's measured 2.5 s
    assert training_time(tmp_path / "marked") == (7.5, "train.log")
    # a log written before the trainer marked its starts: the lines are placed one by one, to the same result
    unmarked = [(t, m) for t, m in killed + resumed if not m.startswith(RUN_START)]
    _write_run(tmp_path / "unmarked", unmarked, segments)
    assert training_time(tmp_path / "unmarked") == (7.5, "train.log")


def test_a_killed_resume_is_timed_from_its_own_start_and_lines(tmp_path):
    """Two killed segments hours apart: each is its start's second to its own last line; neither counts the gap."""
    import datetime as dt

    from hyperplex.train.logs import RUN_START

    t0 = dt.datetime(2026, 3, 4, 22, 0, 0, 900000)
    t1 = dt.datetime(2026, 3, 5, 7, 30, 10, 200000)  # next morning
    lines = [(t0, f"{RUN_START}: pid 10, new run in m"), (t0 + dt.timedelta(seconds=40), "step 100: loss 1.0"),
             (t1, f"{RUN_START}: pid 11, resuming in m"), (t1 + dt.timedelta(seconds=12), "step 130: loss 0.9")]
    segments = [{"start": t0.timestamp(), "seconds": None}, {"start": t1.timestamp(), "seconds": None}]
    _write_run(tmp_path, lines, segments)
    assert training_time(tmp_path) == (40.0 + 12.0, "train.log")  # 22:00:40 − 22:00:00, 07:30:22 − 07:30:10


def test_without_segments_each_trainer_process_counts_first_to_last_line(tmp_path):
    """A folder trained and resumed by hand (no experiment.json): the log's parts, not the time between them."""
    import datetime as dt

    from hyperplex.train.logs import RUN_START

    t0, t1 = dt.datetime(2026, 3, 4, 12, 0, 0), dt.datetime(2026, 3, 4, 15, 0, 0)
    lines = [(t0, f"{RUN_START}: pid 10, new run in m"), (t0 + dt.timedelta(seconds=20), "step 10"),
             (t1, f"{RUN_START}: pid 11, resuming in m"), (t1 + dt.timedelta(seconds=7), "finished")]
    _write_run(tmp_path, lines, [])
    (tmp_path / "experiment.json").unlink()
    assert training_time(tmp_path) == (27.0, "train.log")
