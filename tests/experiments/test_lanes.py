"""experiments/lanes/lane.sh: which models a lane hands to `hyperplex experiment`, checked with a stand-in
interpreter that records its arguments instead of training."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def lane(tmp_path: Path, *models: str, also: Path | None = None) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run lane.sh from a copy laid out like a frozen export, with a Python that only logs its command lines."""
    copy = tmp_path / "copy"
    (copy / "experiments" / "lanes").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "experiments" / "lanes" / "lane.sh", copy / "experiments" / "lanes" / "lane.sh")
    (copy / "experiments" / "tiny_converged.yaml").write_text("name: tiny_converged\n")
    calls = tmp_path / "calls.txt"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n')
    fake.chmod(0o755)
    env = {**os.environ, "HYPERPLEX_PYTHON": str(fake)}
    env.pop("HYPERPLEX_RECORDS_ALSO", None)
    if also is not None:
        env["HYPERPLEX_RECORDS_ALSO"] = str(also)
    done = subprocess.run(["bash", str(copy / "experiments" / "lanes" / "lane.sh"), "tiny_converged", *models],
                          capture_output=True, text=True, env=env, timeout=60)
    return done, calls.read_text().splitlines() if calls.exists() else []


def test_each_model_is_trained_with_resume_into_the_copys_records(tmp_path):
    done, calls = lane(tmp_path, "tm:1", "phm4:2")
    assert done.returncode == 0, done.stderr
    assert [c.split(" --rows ")[1].split(" --resume")[0] for c in calls] == ["tm --seeds 1", "phm4 --seeds 2"]
    assert all("--records experiments/records/tiny_converged" in c for c in calls)


def test_a_model_recorded_in_the_other_records_folder_is_skipped(tmp_path):
    also = tmp_path / "records"
    (also / "tiny_converged" / "tm" / "seed1").mkdir(parents=True)
    (also / "tiny_converged" / "tm" / "seed1" / "record.json").write_text("{}")
    (also / "tiny_converged" / "tm" / "seed2").mkdir(parents=True)  # a folder without record.json: not recorded
    done, calls = lane(tmp_path, "tm:1", "tm:2", also=also)
    assert done.returncode == 0, done.stderr
    assert "tm seed 1 is recorded in" in done.stdout and len(calls) == 1 and "--rows tm --seeds 2" in calls[0]


def test_a_missing_other_records_folder_and_a_bad_model_are_refused(tmp_path):
    done, calls = lane(tmp_path, "tm:1", also=tmp_path / "nowhere")
    assert done.returncode == 2 and "HYPERPLEX_RECORDS_ALSO: no folder" in done.stderr and calls == []
    done, calls = lane(tmp_path, "tm", "phm4:1")
    assert done.returncode == 1 and "'tm' is not ROW:SEED" in done.stderr and len(calls) == 1


def test_a_signal_to_the_lane_stops_its_model_and_starts_no_other(tmp_path):
    """SIGTERM (or SIGINT) to the lane reaches the model in training as SIGTERM, on which the trainer saves a
    resumable checkpoint; the lane waits for it and leaves the next model unstarted, so its command resumes."""
    import signal
    import time

    for sent, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        work = tmp_path / sent.name
        (work / "copy" / "experiments" / "lanes").mkdir(parents=True)
        shutil.copy(ROOT / "experiments" / "lanes" / "lane.sh", work / "copy" / "experiments" / "lanes")
        (work / "copy" / "experiments" / "tiny_converged.yaml").write_text("name: tiny_converged\n")
        calls, started = work / "calls.txt", work / "started"
        fake = work / "python"  # trains until SIGTERM, then "saves" and exits non-zero as an interrupted run does
        fake.write_text(f'#!/usr/bin/env bash\necho "$*" >> {calls}\n'
                        f'trap \'echo saved-on-TERM >> {calls}; exit 3\' TERM\n'
                        f'touch {started}\nfor _ in $(seq 600); do sleep 0.1; done\necho ran-out >> {calls}\n')
        fake.chmod(0o755)
        env = {**os.environ, "HYPERPLEX_PYTHON": str(fake)}
        env.pop("HYPERPLEX_RECORDS_ALSO", None)
        proc = subprocess.Popen(["bash", str(work / "copy" / "experiments" / "lanes" / "lane.sh"), "tiny_converged",
                                 "tm:1", "phm4:1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        deadline = time.monotonic() + 30
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the stand-in model never started"
        proc.send_signal(sent)
        out, err = proc.communicate(timeout=30)
        lines = calls.read_text().splitlines()
        assert proc.returncode == code, (out, err)
        assert len(lines) == 2 and "--rows tm --seeds 1" in lines[0] and lines[1] == "saved-on-TERM", lines
        assert f"stopped by SIG{sent.name[3:]} in tiny_converged tm seed 1; the same command resumes it" in err
        assert "phm4" not in out and "FAILED" not in err
