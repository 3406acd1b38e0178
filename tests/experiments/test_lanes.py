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
        # SIGINT deliverable in the lane even where this test runs as a background job (which ignores SIGINT, and
        # bash cannot trap a signal ignored on entry): the lane is then as a user's foreground command is
        proc = subprocess.Popen(["bash", str(work / "copy" / "experiments" / "lanes" / "lane.sh"), "tiny_converged",
                                 "tm:1", "phm4:1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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


def collect(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run collect.sh from a checkout laid out like this one (a plan file, a records folder) on a lane's copy."""
    checkout = tmp_path / "checkout"
    (checkout / "experiments" / "lanes").mkdir(parents=True, exist_ok=True)
    (checkout / "experiments" / "records").mkdir(exist_ok=True)
    shutil.copy(ROOT / "experiments" / "lanes" / "collect.sh", checkout / "experiments" / "lanes" / "collect.sh")
    (checkout / "experiments" / "tiny_converged.yaml").write_text("name: tiny_converged\n")
    return subprocess.run(["bash", str(checkout / "experiments" / "lanes" / "collect.sh"), *args],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60)


def finished(copy: Path, row: str, seed: int, record: str = '{"status": "finished"}') -> Path:
    model = copy / "experiments" / "records" / "tiny_converged" / row / f"seed{seed}"
    model.mkdir(parents=True)
    (model / "record.json").write_text(record)
    (model / "train.log").write_text(f"{row} {seed}\n")
    return model


def test_collect_copies_finished_models_and_never_writes_over_a_record(tmp_path):
    copy = tmp_path / "copy"
    finished(copy, "tm", 1)
    finished(copy, "phm4", 1, '{"status": "finished", "seed": 1}')
    (copy / "experiments" / "records" / "tiny_converged" / "tm" / "seed2").mkdir()  # unfinished: no record.json
    records = tmp_path / "checkout" / "experiments" / "records" / "tiny_converged"
    (records / "phm4" / "seed1").mkdir(parents=True)
    (records / "phm4" / "seed1" / "record.json").write_text('{"status": "finished", "seed": "other"}')
    done = collect(tmp_path, "copy", "tiny_converged")
    assert done.returncode == 1, done.stderr  # the differing record is named, and left as it was
    assert (records / "tm" / "seed1" / "train.log").read_text() == "tm 1\n"
    assert not (records / "tm" / "seed2").exists()
    assert "phm4/seed1 is in" in done.stderr and "differs" in done.stderr
    assert (records / "phm4" / "seed1" / "record.json").read_text() == '{"status": "finished", "seed": "other"}'
    again = collect(tmp_path, "copy", "tiny_converged")
    assert again.returncode == 1 and "0 model(s) copied" in again.stdout


def test_collect_into_a_staging_folder_leaves_the_records_alone(tmp_path):
    copy = tmp_path / "copy"
    finished(copy, "tm", 3)
    staging = tmp_path / "checkout" / "experiments" / "retrain"
    staging.mkdir(parents=True)
    done = collect(tmp_path, "--into", "checkout/experiments/retrain", "copy", "tiny_converged")
    assert done.returncode == 0, done.stderr
    assert (staging / "tiny_converged" / "tm" / "seed3" / "record.json").is_file()
    assert list((tmp_path / "checkout" / "experiments" / "records").iterdir()) == []
    missing = collect(tmp_path, "--into", "nowhere", "copy", "tiny_converged")
    assert missing.returncode == 2 and "--into: no folder nowhere" in missing.stderr
    assert collect(tmp_path, "copy", "no_such_plan").returncode == 2
