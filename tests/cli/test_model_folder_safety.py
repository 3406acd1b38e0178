"""A run owns its model folder; averaging never replaces an input or a managed checkpoint; a checkpoint header's
file names stay inside the model folder. Each refusal leaves the disk as it was."""

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import disk_state as snapshot

from hyperplex import cli
from hyperplex.fileio import LOCK_NAME, FolderBusyError, folder_lock


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import write_tiny_config

    tmp = tmp_path_factory.mktemp("safety")
    config = write_tiny_config(tmp, max_steps=8, validation_every=4, keep_best=2)
    model_dir = tmp / "model"
    assert cli.main(["train", str(config), "--model-dir", str(model_dir)]) == 0
    return config, model_dir


def hold_lock(folder: Path) -> subprocess.Popen:
    """Another process holding the folder's lock (as a running `hyperplex train` does)."""
    code = ("import sys, time\nfrom hyperplex.fileio import folder_lock\n"
            "with folder_lock(sys.argv[1], 'hyperplex train other.yaml'):\n"
            "    print('held', flush=True)\n    time.sleep(120)\n")
    process = subprocess.Popen([sys.executable, "-c", code, os.fspath(folder)], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


# -- one owner per model folder ----------------------------------------------------------------------------------------
def test_a_second_run_into_a_held_folder_stops_naming_the_first_and_changes_nothing(trained, tmp_path, capsys):
    config, model_dir = trained
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    other = hold_lock(folder)
    try:
        before = snapshot(folder)
        for verb in (["train", str(config)], ["train", str(config), "--resume"]):
            assert cli.main([*verb, "--model-dir", str(folder)]) == 1
            err = capsys.readouterr().err
            assert f"is in use by another hyperplex run (pid {other.pid}, `hyperplex train other.yaml`" in err
            assert snapshot(folder) == before  # no row in metrics.csv, no checkpoint, no config.yaml touched
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    # the killed holder's lock died with it: the stale file is taken over and the resume runs
    assert cli.main(["train", str(config), "--model-dir", str(folder), "--resume", "--training.max_steps=10"]) == 0
    assert (folder / LOCK_NAME).read_text() == ""  # released: no holder recorded


def test_the_lock_is_reentrant_in_one_process_and_exclusive_across_processes(tmp_path):
    folder = tmp_path / "run"
    with folder_lock(folder, "outer"):
        with folder_lock(folder, "inner (compress calls train)"):
            assert f"pid {os.getpid()}, `outer`" in (folder / LOCK_NAME).read_text()
        code = "import sys\nfrom hyperplex.fileio import folder_lock\nwith folder_lock(sys.argv[1], 'x'): pass\n"
        result = subprocess.run([sys.executable, "-c", code, os.fspath(folder)], capture_output=True, text=True)
        assert result.returncode != 0 and "FolderBusyError" in result.stderr and f"pid {os.getpid()}" in result.stderr
    assert not folder.exists()  # created for the run, which wrote nothing: removed again


def test_a_run_refused_before_writing_leaves_no_new_folder(tmp_path):
    with pytest.raises(FolderBusyError):
        other = hold_lock(tmp_path / "held")
        try:
            with folder_lock(tmp_path / "held", "mine"):
                pass
        finally:
            other.send_signal(signal.SIGKILL)
            other.wait()
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"file: is a file, not a model folder"):
        with folder_lock(tmp_path / "file", "train"):
            pass
    assert (tmp_path / "file").read_text() == "x"


def test_model_dir_that_is_a_file_is_called_a_file(trained, tmp_path, capsys):
    config, _ = trained
    target = tmp_path / "not_a_folder"
    target.write_text("keep")
    assert cli.main(["train", str(config), "--model-dir", str(target)]) == 1
    assert "is a file, not a model folder" in capsys.readouterr().err and target.read_text() == "keep"


# -- average -----------------------------------------------------------------------------------------------------------
def test_average_refuses_to_overwrite_an_input_or_a_managed_checkpoint(trained, tmp_path, capsys):
    _, model_dir = trained
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    before = snapshot(folder)
    best = sorted(folder.glob("best-*.safetensors"))
    assert cli.main(["average", str(folder / "best.safetensors"), *map(str, best), "-o",
                     str(folder / "best.safetensors")]) == 1
    assert "best.safetensors: is also an input of this command" in capsys.readouterr().err
    assert cli.main(["average", *map(str, best), "-o", str(folder / "last.safetensors")]) == 1
    assert "last.safetensors: is a file of the model folder of `hyperplex train`" in capsys.readouterr().err
    assert snapshot(folder) == before
    assert cli.main(["average", *map(str, best), "-o", str(folder / "averaged.safetensors")]) == 0


# -- checkpoint header file names --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../outside_vocab.json", "/etc/passwd"])
def test_recorded_vocabulary_names_outside_the_folder_are_refused(trained, tmp_path, capsys, name):
    from hyperplex.train.checkpoint import load_checkpoint, save_checkpoint

    _, model_dir = trained
    folder = tmp_path / "model"
    shutil.copytree(model_dir, folder)
    checkpoint = load_checkpoint(folder / "best.safetensors")
    files = checkpoint.extra["task"]["files"]
    source = next(iter(files))
    files[source]["vocabulary"] = name
    save_checkpoint(folder / "best.safetensors", checkpoint.model_state, checkpoint.optimizer_state, checkpoint.extra)
    before = snapshot(folder)
    assert cli.main(["evaluate", str(folder)]) == 1
    err = capsys.readouterr().err
    assert f"header key extra.task.files.{source}.vocabulary" in err and name in err
    assert snapshot(folder) == before


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_checkpoint_that_is_a_fifo_is_refused_without_blocking(tmp_path):
    from hyperplex.train.checkpoint import CheckpointError, checkpoint_info, load_checkpoint

    os.mkfifo(tmp_path / "fifo.safetensors")
    for read in (load_checkpoint, checkpoint_info):
        with pytest.raises(CheckpointError, match="fifo.safetensors: not a regular file"):
            read(tmp_path / "fifo.safetensors")


# -- the lock file never leads outside the folder ----------------------------------------------------------------------
def test_a_lock_that_is_a_symbolic_link_is_refused_and_its_target_untouched(trained, tmp_path, capsys):
    config, _ = trained
    folder = tmp_path / "model"
    folder.mkdir()
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me")
    (folder / LOCK_NAME).symlink_to(victim)
    for extra in ([], ["--resume"]):  # compress takes the same lock (folder_lock) through train
        assert cli.main(["train", str(config), "--model-dir", str(folder), *extra]) == 1
        err = capsys.readouterr().err
        assert f"{folder / LOCK_NAME}: the lock file is a symbolic link, not a regular file" in err, err
        assert victim.read_text() == "keep me" and sorted(os.listdir(folder)) == [LOCK_NAME]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")
def test_a_lock_that_is_a_fifo_or_a_folder_is_named_as_such(tmp_path):
    from hyperplex.fileio import UnsafePathError

    os.mkdir(tmp_path / "a")
    os.mkfifo(tmp_path / "a" / LOCK_NAME)
    with pytest.raises(UnsafePathError, match=r"the lock file is a FIFO, not a regular file"):
        with folder_lock(tmp_path / "a", "train"):
            pass
    os.makedirs(tmp_path / "b" / LOCK_NAME)
    with pytest.raises(UnsafePathError, match=r"the lock file is a folder, not a regular file"):
        with folder_lock(tmp_path / "b", "train"):
            pass
    assert os.listdir(tmp_path / "b" / LOCK_NAME) == []


def test_training_into_a_folder_holding_another_model_is_refused(trained, tmp_path, capsys):
    config, _ = trained
    folder = tmp_path / "bert"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    before = snapshot(folder)
    assert cli.main(["train", str(config), "--model-dir", str(folder)]) == 1
    assert "holds a Hugging Face model (config.json), not one this command writes" in capsys.readouterr().err
    assert snapshot(folder) == before and sorted(os.listdir(folder)) == ["config.json", "model.safetensors"]
