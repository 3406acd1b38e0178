"""Hostile inputs for ``hyperplex train`` / ``params`` / ``evaluate``: budgets that must hold, resume with
changed settings, Ctrl-C and SIGTERM, config files that lie, corrupted model folders and data files. Every case runs
through the real CLI and checks the exit code and the message; a refused command changes nothing on disk.
"""

from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from test_cli_robustness import (  # noqa: F401 - fixtures are used by name
    TRAINING,
    cls_config,
    cls_model,
    copy_model,
    fail,
    mt_config,
    mt_model,
    no_checkpoint,
    snapshot,
    world,
    write_config,
)

from hyperplex.cli import main
from hyperplex.config import merge
from hyperplex.train.checkpoint import load_checkpoint, load_model_weights


def train_ok(capsys, *argv) -> str:
    """Run ``hyperplex train ARGV`` in-process, expect exit 0, return stderr."""
    code = main(["train", *[str(a) for a in argv]])
    out, err = capsys.readouterr()
    assert code == 0, err
    return err


def log_of(folder: Path) -> str:
    return (folder / "train.log").read_text(encoding="utf-8")


def last_step(folder: Path) -> int:
    return load_checkpoint(folder / "last.safetensors").extra["trainer"]["step"]


def one_batch_config(world, tmp_path, name="cfg.yaml", **training) -> Path:
    """The tiny translation config with every pair in one batch (one optimiser step per epoch)."""
    return write_config(tmp_path / name, mt_config(world.data, training={**TRAINING, "batch_size": 64,
                                                                          "validation_every": 0, **training}))


# ---------------------------------------------------------------------------- budgets
def test_max_steps_is_not_capped_by_a_default_max_epochs(world, tmp_path, capsys):
    """Was: max_epochs defaulted to 10 and silently ended a 20-step run after 10 one-step epochs."""
    cfg = one_batch_config(world, tmp_path, max_steps=14, validation_every=7)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "m")
    assert last_step(tmp_path / "m") == 14
    log = log_of(tmp_path / "m")
    assert "budget: training.max_steps=14 ends the run (1 steps per epoch" in log
    assert re.search(r"finished at step 14 \(epoch 14\): reached training.max_steps=14", log), log


def test_both_limits_say_which_one_ends_the_run(world, tmp_path, capsys):
    cfg = one_batch_config(world, tmp_path, max_steps=20, max_epochs=3)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "m")
    log = log_of(tmp_path / "m")
    assert "budget: training.max_epochs=3 ends the run at ≈ step 3 (1 steps per epoch), BEFORE " \
           "training.max_steps=20" in log
    assert "finished at step 3 (epoch 3): completed training.max_epochs=3 epochs" in log
    assert last_step(tmp_path / "m") == 3


def test_a_validation_at_an_epochs_end_is_named_for_that_epoch(world, tmp_path, capsys):
    """Was: the epoch counter moved on before the end-of-epoch validation was logged, so the validation
    after epoch 1 read "epoch 2" in the log and in metrics.csv (and "epochs to best" was one too many)."""
    cfg = one_batch_config(world, tmp_path, max_steps=0, max_epochs=3, log_every=1)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "m")
    log = log_of(tmp_path / "m")
    assert [int(e) for e in re.findall(r"validation at step \d+ \(epoch (\d+)\)", log)] == [1, 2, 3], log
    with open(tmp_path / "m" / "metrics.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["name"] == "loss"]
    assert {(r["split"], int(r["step"]), int(r["epoch"])) for r in rows} == \
        {(split, k, k) for split in ("train", "dev") for k in (1, 2, 3)}


def test_no_limit_at_all_is_refused_at_load(world, tmp_path, capsys):
    cfg = one_batch_config(world, tmp_path, max_steps=0, max_epochs=0)
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert "max_steps and max_epochs are both 0" in msg and "training" in msg
    assert not (tmp_path / "m").exists()


# ---------------------------------------------------------------------------- overrides on resume
def test_resume_with_a_larger_max_steps_extends_a_finished_run_exactly(world, tmp_path, capsys):
    """2 steps, then --resume --training.max_steps=4, ends bit-identical to one 4-step run."""
    cfg = one_batch_config(world, tmp_path, max_steps=2, validation_every=2)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a")
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a", "--resume", "--training.max_steps=4")
    train_ok(capsys, cfg, "--model-dir", tmp_path / "b", "--training.max_steps=4")
    assert last_step(tmp_path / "a") == 4
    log = log_of(tmp_path / "a")
    assert "resume: training.max_steps: 2 → 4" in log and "the new budget continues it" in log
    assert yaml.safe_load((tmp_path / "a" / "config.yaml").read_text())["training"]["max_steps"] == 4
    a, b = (load_model_weights(tmp_path / "a" / "last.safetensors"),
            load_model_weights(tmp_path / "b" / "last.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resume_of_a_finished_run_without_a_new_budget_says_how_to_extend(world, tmp_path, capsys):
    cfg = one_batch_config(world, tmp_path, max_steps=2)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a")
    before = snapshot(tmp_path / "a")
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a", "--resume")
    log = log_of(tmp_path / "a")
    assert "already finished (reached training.max_steps=2 at step 2); nothing to do" in log
    assert "--training.max_steps=N with N > 2" in log
    after = snapshot(tmp_path / "a")
    assert {k: v for k, v in after.items() if k != "train.log"} == {k: v for k, v in before.items() if k != "train.log"}


@pytest.mark.parametrize("change,key", [(["--training.lr=0.1"], "training.lr"),
                                        (["--model.d_model=32"], "model.d_model"),
                                        (["--data.vocab_size=50"], "data.vocab_size")])
def test_resume_refuses_changes_to_what_the_run_computes(world, tmp_path, capsys, change, key):
    cfg = one_batch_config(world, tmp_path, max_steps=2)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a")
    before = snapshot(tmp_path / "a")
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "a", "--resume", *change)
    assert msg.startswith(f"--resume: {key}: saved "), msg
    assert "Train into a new --model-dir" in msg and "training.max_steps" in msg
    assert snapshot(tmp_path / "a") == before


def test_resume_refuses_an_edited_config_file(world, tmp_path, capsys):
    """The YAML given with --resume is compared too: an edit of a non-budget key is named, not ignored."""
    cfg = one_batch_config(world, tmp_path, max_steps=2)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a")
    edited = write_config(tmp_path / "edited.yaml", merge(yaml.safe_load(cfg.read_text()),
                                                          {"model": {"num_heads": 4}, "training": {"max_steps": 3}}))
    msg = fail(capsys, "train", edited, "--model-dir", tmp_path / "a", "--resume")
    assert msg.startswith("--resume: model.num_heads: saved 2, now 4"), msg


# ---------------------------------------------------------------------------- signals
ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "src")}


def _command(cfg: Path, folder: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "hyperplex", "train", str(cfg), "--model-dir", str(folder), *extra]


def _start(cfg: Path, folder: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(_command(cfg, folder, *extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=ENV)


def _wait_for_step(folder: Path, process: subprocess.Popen, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = folder / "train.log"
        if log.exists() and re.search(rf"^.*step {step} epoch", log.read_text(encoding="utf-8"), re.M):
            return
        if process.poll() is not None:
            raise AssertionError(f"training ended early: {process.communicate()}")
        time.sleep(0.05)
    process.kill()
    raise AssertionError("training did not reach the step in time")


@pytest.mark.parametrize("sig,code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_saves_a_resumable_checkpoint_and_resume_matches_an_uninterrupted_run(world, tmp_path, sig, code):
    """Ctrl-C / SIGTERM mid-run: a resumable last checkpoint at the step boundary, a line in train.log, exit
    130/143; resumed to step K+5 it equals an uninterrupted (K+5)-step run bit for bit, including the
    training-loss lines of metrics.csv (the log window survives the resume)."""
    cfg = write_config(tmp_path / "cfg.yaml", mt_config(world.data, training={
        **TRAINING, "batch_size": 8, "max_steps": 100000, "validation_every": 100000, "log_every": 3}))
    process = _start(cfg, tmp_path / "a")
    _wait_for_step(tmp_path / "a", process, 3)
    process.send_signal(sig)
    _, err = process.communicate(timeout=120)
    assert process.returncode == code, err
    k = last_step(tmp_path / "a")
    name = signal.Signals(sig).name
    assert f"interrupted by {name} at step {k} " in log_of(tmp_path / "a")
    assert f"hyperplex train: interrupted by {name} at step {k}" in err and "--resume" in err
    assert k >= 3
    for folder, extra in ((tmp_path / "a", ["--resume", f"--training.max_steps={k + 5}"]),
                          (tmp_path / "b", [f"--training.max_steps={k + 5}"])):
        done = subprocess.run(_command(cfg, folder, *extra), capture_output=True, text=True, env=ENV)
        assert done.returncode == 0, done.stderr
    a, b = (load_model_weights(tmp_path / "a" / "last.safetensors"),
            load_model_weights(tmp_path / "b" / "last.safetensors"))
    assert all(torch.equal(a[key], b[key]) for key in a)

    def train_losses(folder):
        rows = (folder / "metrics.csv").read_text().splitlines()[1:]
        return [r for r in rows if ",train,loss," in r]
    assert train_losses(tmp_path / "a") == train_losses(tmp_path / "b")


def test_a_second_signal_stops_at_once_without_saving():
    from hyperplex.train.interrupts import InterruptFlag, TrainingInterrupted

    flag = InterruptFlag()
    flag._handle(signal.SIGINT, None)
    assert flag.signal_number == signal.SIGINT
    with pytest.raises(TrainingInterrupted) as caught:
        flag._handle(signal.SIGINT, None)
    assert caught.value.saved is False and caught.value.signal_number == signal.SIGINT
    assert "stopped at once without saving" in str(caught.value)


# ---------------------------------------------------------------------------- items 7 and 8: what the user is told
def test_duplicate_yaml_key_names_both_lines(world, tmp_path, capsys):
    cfg = one_batch_config(world, tmp_path)
    text = cfg.read_text().replace("training:\n", "training:\n  lr: 0.5\n", 1)
    cfg.write_text(text)
    first = text.splitlines().index("  lr: 0.5") + 1
    second = [i + 1 for i, line in enumerate(text.splitlines()) if line.startswith("  lr: ")][1]
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert msg.startswith(f"{cfg}:{second}: key 'lr' is given twice in the same section (first at line {first})"), msg
    assert not (tmp_path / "m").exists()


def test_a_folder_given_as_the_config(tmp_path, capsys):
    msg = fail(capsys, "train", tmp_path, "--model-dir", tmp_path / "m")
    assert msg == f"{tmp_path} is a folder, not a config file (give the YAML file, e.g. configs/x.yaml)"


def test_an_empty_config_file(tmp_path, capsys):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    msg = fail(capsys, "train", tmp_path / "empty.yaml", "--model-dir", tmp_path / "m")
    assert msg.startswith(f"{tmp_path / 'empty.yaml'} is empty"), msg


def test_heads_that_do_not_divide_d_model_are_named(world, tmp_path, capsys):
    cfg = one_batch_config(world, tmp_path)
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m", "--model.num_heads=3")
    assert msg.endswith("model.d_model=16 must be a multiple of model.num_heads = 3"), msg


@pytest.mark.parametrize("override,expected", [
    ("--training.num_threads=-1", "num_threads must be ≥ 0, got -1"),
    ("--training.lr=.nan", "training.lr: expected a finite float, got nan"),
    ("--training.lr=nan", "training.lr: expected float, got str 'nan'"),
    ("--training.lr=.inf", "training.lr: expected a finite float, got inf"),
    ("--training.batch_size=1.5", "training.batch_size: expected int, got float 1.5"),
    ("--training.device=cuda:0", "CUDA is not available"),
    ("--training.device=mps", "unknown device 'mps' (expected auto, cpu, cuda or cuda:N)"),
    ("--training.device=meta", "unknown device 'meta' (expected auto, cpu, cuda or cuda:N)"),
])
def test_bad_training_values_are_refused_before_anything_is_written(world, tmp_path, capsys, override, expected):
    if "cuda" in override and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    cfg = one_batch_config(world, tmp_path)
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m", override)
    assert expected in msg, msg
    assert not (tmp_path / "m").exists() or not any((tmp_path / "m").iterdir())


@pytest.mark.parametrize("flag,value", [("--vocab-size", "0"), ("--vocab-size", "-5"), ("--tgt-vocab-size", "0"),
                                        ("--num-classes", "1")])
def test_params_refuses_sizes_that_cannot_be(world, capsys, flag, value):
    msg = fail(capsys, "params", world.mt_yaml, flag, value)
    assert msg.startswith(f"{flag} must be ≥ "), msg


def test_checkpoint_of_another_size_names_the_tensors_and_its_config(mt_model, tmp_path, capsys):
    folder = copy_model(mt_model, tmp_path)
    config = yaml.safe_load((folder / "config.yaml").read_text())
    config["model"]["d_model"] = 32
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    msg = fail(capsys, "evaluate", folder, "--checkpoint", "last")
    assert f"{folder / 'last.safetensors'} does not fit the model built from {folder / 'config.yaml'}" in msg
    assert "tensor(s) differ in shape (" in msg and "checkpoint (" in msg and "vs model (" in msg
    assert 'the checkpoint was saved with model: {"architecture": "transformer", "d_model": 16' in msg


# ---------------------------------------------------------------------------- new hostile inputs
def test_yaml_indented_with_a_tab_names_the_line(world, tmp_path, capsys):
    cfg = one_batch_config(world, tmp_path)
    lines = cfg.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("  lr:"))
    lines[i] = "\t" + lines[i].lstrip()
    cfg.write_text("\n".join(lines) + "\n")
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert msg.startswith(f"malformed YAML at {cfg}:{i + 1}:"), msg


def test_config_that_is_not_utf8(world, tmp_path, capsys):
    cfg = one_batch_config(world, tmp_path)
    cfg.write_bytes(cfg.read_text().encode("utf-16"))
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert msg.startswith(f"{cfg}: not UTF-8 text"), msg


def test_config_whose_top_level_is_a_list(tmp_path, capsys):
    (tmp_path / "list.yaml").write_text("- data\n- model\n")
    msg = fail(capsys, "train", tmp_path / "list.yaml", "--model-dir", tmp_path / "m")
    assert "expected a mapping of config sections at the top level, got list" in msg


def test_jsonl_line_that_is_not_json_names_file_and_line(world, tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text('{"sentence": "good film", "label": "pos"}\n{"sentence": "bad film", "label": "neg"\n')
    cfg = write_config(tmp_path / "cfg.yaml", merge(cls_config(world.data), {
        "data": {"format": "jsonl", "train": str(path), "dev": str(path)}}))
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert msg.startswith(f"{path}, line 2: invalid JSON"), msg
    no_checkpoint(tmp_path / "m")


def test_jsonl_line_that_is_an_array_names_file_and_line(world, tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text('{"sentence": "good film", "label": "pos"}\n["bad film", "neg"]\n')
    cfg = write_config(tmp_path / "cfg.yaml", merge(cls_config(world.data), {
        "data": {"format": "jsonl", "train": str(path), "dev": str(path)}}))
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert msg.startswith(f"{path}, line 2: expected a JSON object, found list"), msg


def test_tsv_with_crlf_and_a_byte_order_mark_trains_with_clean_labels(world, tmp_path, capsys):
    """A Windows-saved tsv (BOM + CRLF) is the same data: labels must not keep a '\\r' nor the header a BOM."""
    text = (world.data / "train.tsv").read_text()
    (tmp_path / "train.tsv").write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    cfg = write_config(tmp_path / "cfg.yaml", merge(cls_config(world.data), {
        "data": {"train": str(tmp_path / "train.tsv")}}))
    train_ok(capsys, cfg, "--model-dir", tmp_path / "m")
    assert load_checkpoint(tmp_path / "m" / "last.safetensors").extra["task"]["labels"] == ["neg", "pos"]


def test_agreement_line_with_an_unknown_verb_tag_names_file_and_line(world, tmp_path, capsys):
    path = tmp_path / "agr.txt"
    path.write_text("VBZ\tthe dog\nVBP\tthe dogs\nVBD\tthe cat\n")
    cfg = write_config(tmp_path / "cfg.yaml", merge(cls_config(world.data), {"data": {"format": "agreement",
                                                                           "train": str(path), "dev": str(path)}}))
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert msg.startswith(f"{path}, line 3: unknown label 'VBD'"), msg


def test_training_file_that_is_a_folder(world, tmp_path, capsys):
    (tmp_path / "train.tsv").mkdir()
    cfg = write_config(tmp_path / "cfg.yaml", merge(cls_config(world.data), {
        "data": {"train": str(tmp_path / "train.tsv")}}))
    msg = fail(capsys, "train", cfg, "--model-dir", tmp_path / "m")
    assert str(tmp_path / "train.tsv") in msg, msg
    no_checkpoint(tmp_path / "m")


def test_truncated_vocabulary_file_names_the_file(mt_model, tmp_path, capsys):
    folder = copy_model(mt_model, tmp_path)
    vocab = sorted(p for p in folder.iterdir() if p.suffix == ".json" and "vocab" in p.name)[0]
    vocab.write_text(vocab.read_text()[: len(vocab.read_text()) // 2])
    msg = fail(capsys, "evaluate", folder, "--checkpoint", "last")
    assert str(vocab) in msg, msg


def test_empty_checkpoint_file_names_the_file(mt_model, tmp_path, capsys):
    folder = copy_model(mt_model, tmp_path)
    (folder / "last.safetensors").write_bytes(b"")
    msg = fail(capsys, "evaluate", folder, "--checkpoint", "last")
    assert str(folder / "last.safetensors") in msg, msg


def test_resume_after_a_kill_during_a_checkpoint_write(world, tmp_path, capsys):
    """A kill inside atomic_write leaves a private temporary folder beside last.safetensors: resume must not
    trip over it (nor read it), and the folder is cleaned up."""
    cfg = one_batch_config(world, tmp_path, max_steps=2)
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a")
    leftover = tmp_path / "a" / ".last.safetensors.tmp-4242-0123abcd"
    leftover.mkdir()
    (leftover / "last.safetensors").write_bytes(b"half a checkpoint")
    train_ok(capsys, cfg, "--model-dir", tmp_path / "a", "--resume", "--training.max_steps=3")
    assert last_step(tmp_path / "a") == 3 and not leftover.exists()


def test_odd_unicode_in_the_data_is_kept_whole(world, tmp_path, capsys):
    """Combining marks, RTL text, emoji with a zero-width joiner and U+2028 inside sentences: the files stay
    aligned (U+2028 is not a line break in a data file) and training runs."""
    en = ["cafe\u0301 w1", "\u05e9\u05dc\u05d5\u05dd w2", "\U0001F469\u200d\U0001F4BB w3", "a\u2028b w4"] * 4
    de = ["v1 cafe\u0301", "v2 \u05e9\u05dc\u05d5\u05dd", "v3 \U0001F469\u200d\U0001F4BB", "v4 a\u2028b"] * 4
    for split in ("train", "dev"):
        (tmp_path / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
        (tmp_path / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
    cfg = write_config(tmp_path / "cfg.yaml", merge(mt_config(world.data), {"data": {"train": str(tmp_path / "train"),
                                                                          "dev": str(tmp_path / "dev")}}))
    train_ok(capsys, cfg, "--model-dir", tmp_path / "m")
    vocabulary = set()
    for path in (tmp_path / "m").glob("*vocab*.json"):
        vocabulary |= set(json.loads(path.read_text(encoding="utf-8"))["tokens"])
    assert {"cafe\u0301", "\U0001F469\u200d\U0001F4BB", "\u05e9\u05dc\u05d5\u05dd", "a", "b"} <= vocabulary
    assert "\u0301" not in vocabulary and "\u200d" not in vocabulary  # no mark or joiner split off as a token
