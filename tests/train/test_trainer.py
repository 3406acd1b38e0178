"""The training loop: exact resume after SIGKILL, DDP ≡ one process, early stopping, NaN handling, bf16 autocast
with fp32 master weights."""

import csv
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import SUBPROCESS_ENV as ENV
from conftest import torchrun, write_tiny_config

from hyperplex.inference.load import load_model
from hyperplex.train.checkpoint import load_checkpoint, load_model_weights
from hyperplex.train.run import train


def train_losses(model_dir: Path) -> list[float]:
    with open(model_dir / "metrics.csv") as f:
        return [float(r["value"]) for r in csv.DictReader(f) if r["split"] == "train" and r["name"] == "loss"]


def without_dropout(config: Path) -> Path:
    """``config`` rewritten with dropout 0: runs whose dropout masks would differ (one process against two,
    compiled against eager) then compute the same thing."""
    cfg = yaml.safe_load(config.read_text())
    cfg["model"]["dropout"] = 0.0
    config.write_text(yaml.safe_dump(cfg))
    return config


def poison_loss(monkeypatch, task_class, at_call: int, factor: float) -> None:
    """Make ``task_class.loss`` return its loss times ``factor`` (NaN, inf) at its ``at_call``-th call only."""
    original, calls = task_class.loss, [0]

    def poisoned(self, model, batch):
        calls[0] += 1
        loss = original(self, model, batch)
        return loss * factor if calls[0] == at_call else loss

    monkeypatch.setattr(task_class, "loss", poisoned)


def test_resume_after_sigkill_matches_uninterrupted_run(tmp_path):
    config = write_tiny_config(tmp_path, checkpoint_every=3, max_steps=30, validation_every=10)
    straight = tmp_path / "straight"
    train(str(config), model_dir=str(straight))
    killed = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "hyperplex", "train", str(config), "--model-dir", str(killed)],
                            env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    last = killed / "last.safetensors"
    deadline = time.time() + 120
    while not last.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = load_checkpoint(last).extra["trainer"]
    assert not state["finished"] and 0 < state["step"] < 30, "the kill must land mid-run"
    train(str(config), model_dir=str(killed), resume=True)
    a = load_model_weights(straight / "last.safetensors")
    b = load_model_weights(killed / "last.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key  # bitwise
    assert load_checkpoint(killed / "last.safetensors").extra["trainer"]["step"] == 30
    # metrics.csv of the resumed run holds each step once, as the uninterrupted run's does
    assert train_losses(killed) == train_losses(straight)


def test_last_at_validation_false_writes_last_only_when_the_run_stops(tmp_path, monkeypatch):
    """``training.last_at_validation=false`` (converge.sh's GPU calls, whose base-shape state is ~600 MB): no
    ``last`` at the validations of steps 4 and 8, one at the end (finished, so a later --resume knows), and one at a
    SIGTERM; the run stopped by the signal resumes and ends with the uninterrupted run's weights, bitwise."""
    from hyperplex.train.checkpoint import CheckpointManager
    from hyperplex.train.trainer import Trainer

    config = write_tiny_config(tmp_path, max_steps=12, validation_every=4, last_at_validation=False)
    written: list[tuple[str, int, bool]] = []
    original = CheckpointManager.save_last

    def spy(self, model_state, optimizer_state=None, extra=None, rng=True):
        written.append((Path(self.last_path).parent.name, extra["trainer"]["step"], extra["trainer"]["finished"]))
        return original(self, model_state, optimizer_state, extra, rng)

    monkeypatch.setattr(CheckpointManager, "save_last", spy)
    train(str(config), model_dir=str(tmp_path / "straight"))
    assert written == [("straight", 12, True)]
    best = sorted(p.name for p in (tmp_path / "straight").glob("best-*.safetensors"))
    assert best, "the best checkpoint is still written at the validation that finds it"

    step = Trainer._step

    def interrupt_at_six(self, loop, group, num_batches, state, throughput):
        done = step(self, loop, group, num_batches, state, throughput)
        if state.step == 6 and not self.resume:
            loop.interrupts.signal_number = signal.SIGTERM  # as the handler records a SIGTERM
        return done

    monkeypatch.setattr(Trainer, "_step", interrupt_at_six)
    written.clear()
    from hyperplex.train.interrupts import TrainingInterrupted

    with pytest.raises(TrainingInterrupted):
        train(str(config), model_dir=str(tmp_path / "stopped"))
    assert written == [("stopped", 6, False)]
    train(str(config), model_dir=str(tmp_path / "stopped"), resume=True)
    assert written[-1] == ("stopped", 12, True)
    a = load_model_weights(tmp_path / "straight" / "last.safetensors")
    b = load_model_weights(tmp_path / "stopped" / "last.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def dev_values(model_dir: Path, name: str) -> list[tuple[int, float]]:
    with open(model_dir / "metrics.csv") as f:
        return [(int(r["step"]), float(r["value"])) for r in csv.DictReader(f) if r["split"] == "dev"
                and r["name"] == name]


class Killed(BaseException):
    """A SIGKILL's stand-in: nothing after it runs, no handler saves anything."""


def killed_after(at: int):
    """``Trainer._step`` (as it is when called) that raises :class:`Killed` once step ``at`` is done."""
    from hyperplex.train.trainer import Trainer

    step = Trainer._step

    def patched(self, loop, group, num_batches, state, throughput):
        done = step(self, loop, group, num_batches, state, throughput)
        if state.step == at:
            raise Killed
        return done

    return patched


def best_by_far_at(at: int):
    """``Trainer._record_validation`` that records a validation loss of 1e-3 at step ``at``: the best by far."""
    from hyperplex.train.trainer import Trainer

    record = Trainer._record_validation

    def patched(self, model, optimizer, state, manager, metrics, values):
        values = {**values, "loss": 1e-3} if state.step == at else values
        record(self, model, optimizer, state, manager, metrics, values)

    return patched


@pytest.mark.parametrize("last_at_validation", [True, False])
def test_the_best_checkpoint_agrees_with_the_run_after_a_kill_that_lost_steps(tmp_path, monkeypatch,
                                                                              last_at_validation):
    """A kill after an improving validation at step 20 (made the best by far) that loses it: with
    ``last_at_validation`` true, between that validation's two checkpoint writes; false (converge.sh's GPU runs:
    ``last`` only at a stop), after step 21, with ``last`` at step 8. The resumed run deletes the best files of the
    steps it trains anew, so ``best.safetensors`` is the best validation that ``metrics.csv`` holds and the trainer's
    best value is its metric (before: a lost step's file stayed the best, or ``last`` held a best that no file had).
    The resumed run follows another course (other random draws after the restore, as on another device); with
    ``last_at_validation`` false it stops at step 16, so it never validates step 20 again."""
    import hyperplex.train.trainer as trainer_module
    from hyperplex.train.checkpoint import CheckpointManager
    from hyperplex.train.interrupts import TrainingInterrupted
    from hyperplex.train.trainer import Trainer

    config = write_tiny_config(tmp_path, max_steps=28, validation_every=4, last_at_validation=last_at_validation,
                               keep_best=1, early_stopping_metric="loss", lr=1e-2, patience=100)
    model_dir = tmp_path / "run"
    step, kill_after_21 = Trainer._step, killed_after(21)
    save_last, save_if_best = CheckpointManager.save_last, CheckpointManager.save_if_best
    writes_at_20: list[str] = []

    def spied_last(self, model_state, optimizer_state=None, extra=None, rng=True):
        if extra["trainer"]["step"] == 20:
            writes_at_20.append("last")
            if len(writes_at_20) == 2:
                raise Killed
        return save_last(self, model_state, optimizer_state, extra, rng)

    def spied_best(self, metric_value, at, *args, **kwargs):
        if at == 20:
            writes_at_20.append("best")
            if len(writes_at_20) == 2:
                raise Killed
        return save_if_best(self, metric_value, at, *args, **kwargs)

    def sigterm_at_8(self, loop, group, num_batches, state, throughput):
        done = step(self, loop, group, num_batches, state, throughput)
        if state.step == 8:
            loop.interrupts.signal_number = signal.SIGTERM
        return done

    monkeypatch.setattr(Trainer, "_record_validation", best_by_far_at(20))
    monkeypatch.setattr(CheckpointManager, "save_last", spied_last)
    monkeypatch.setattr(CheckpointManager, "save_if_best", spied_best)
    if not last_at_validation:
        monkeypatch.setattr(Trainer, "_step", sigterm_at_8)
        with pytest.raises(TrainingInterrupted):
            train(str(config), model_dir=str(model_dir))
        monkeypatch.setattr(Trainer, "_step", kill_after_21)
    with pytest.raises(Killed):
        train(str(config), model_dir=str(model_dir), resume=not last_at_validation)
    resumed_from = load_checkpoint(model_dir / "last.safetensors").extra["trainer"]["step"]
    assert resumed_from == (16 if last_at_validation else 8)
    assert writes_at_20[0] == "best" and any(e["step"] == 20 for e in json.loads(
        (model_dir / "checkpoints.json").read_text())["best"]), "step 20's best file is there before the resume"

    monkeypatch.undo()
    restore = trainer_module.restore_rng

    def other_course(rng_state):
        restore(rng_state)
        torch.manual_seed(1234)

    monkeypatch.setattr(trainer_module, "restore_rng", other_course)
    train(str(config), [] if last_at_validation else ["--training.max_steps=16"], model_dir=str(model_dir),
          resume=True)
    best_step, best_loss = min(dev_values(model_dir, "loss"), key=lambda row: (row[1], row[0]))
    best = load_checkpoint(model_dir / "best.safetensors").extra["trainer"]
    assert best["step"] == best_step and best["best_metric"] == pytest.approx(best_loss, rel=1e-5)
    final = load_checkpoint(model_dir / "last.safetensors").extra["trainer"]
    assert final["step"] == (28 if last_at_validation else 16) and final["best_metric"] == best["best_metric"]
    assert "deleted the best checkpoints of steps 20, written after step" in (model_dir / "train.log").read_text()


def test_a_fresh_run_in_a_folder_a_killed_run_left_without_last_ignores_its_best_files(tmp_path, monkeypatch):
    """converge.sh's trainer killed before it ever wrote ``last`` (``last_at_validation`` false) leaves best files and
    logs but nothing to resume, so the next call trains that folder from step 0: the killed run's best file (step 9,
    made the best by far; the new run validates at 4, 8 and 12) is deleted, not kept as the new run's best, and
    metrics.csv holds the new run's rows only."""
    from hyperplex.train.trainer import Trainer

    config = write_tiny_config(tmp_path, max_steps=12, validation_every=4, last_at_validation=False, keep_best=1,
                               early_stopping_metric="loss", patience=100)
    model_dir = tmp_path / "run"
    monkeypatch.setattr(Trainer, "_record_validation", best_by_far_at(9))
    monkeypatch.setattr(Trainer, "_step", killed_after(10))
    with pytest.raises(Killed):
        train(str(config), ["--training.validation_every=3"], model_dir=str(model_dir))
    assert not (model_dir / "last.safetensors").exists() and (model_dir / "best-9.safetensors").exists()
    monkeypatch.undo()
    train(str(config), model_dir=str(model_dir))
    assert [s for s, _ in dev_values(model_dir, "loss")] == [4, 8, 12]
    best_step, best_loss = min(dev_values(model_dir, "loss"), key=lambda row: (row[1], row[0]))
    best = load_checkpoint(model_dir / "best.safetensors").extra["trainer"]
    assert best["step"] == best_step and best["best_metric"] == pytest.approx(best_loss, rel=1e-5)
    assert "deleted the best checkpoints of steps 9, written after step 0" in (model_dir / "train.log").read_text()


def test_ddp_two_processes_match_one_process(tmp_path):
    config = without_dropout(write_tiny_config(tmp_path, max_steps=8, validation_every=8, batch_size=16))
    one = tmp_path / "one"
    train(str(config), model_dir=str(one))
    two = tmp_path / "two"
    proc = torchrun("-m", "hyperplex", "train", config, "--model-dir", two)
    assert proc.returncode == 0, f"torchrun exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    l1, l2 = train_losses(one), train_losses(two)
    assert len(l1) == len(l2) == 8
    assert l1 == pytest.approx(l2, rel=1e-5, abs=1e-6)
    a, b = load_model_weights(one / "last.safetensors"), load_model_weights(two / "last.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_nan_loss_stops_with_message_and_keeps_last_good_checkpoint(tmp_path, monkeypatch):
    from hyperplex.tasks.translation import TranslationTask
    from hyperplex.train.trainer import TrainingError

    config = write_tiny_config(tmp_path, max_steps=20, validation_every=5)
    poison_loss(monkeypatch, TranslationTask, at_call=8, factor=float("nan"))
    model_dir = tmp_path / "nan"
    with pytest.raises(TrainingError, match=r"loss became nan at step 8 .*last good checkpoint .* is intact"):
        train(str(config), model_dir=str(model_dir))
    ckpt = load_checkpoint(model_dir / "last.safetensors")
    assert ckpt.extra["trainer"]["step"] == 5
    assert all(torch.isfinite(t).all() for t in ckpt.model_state.values())


def test_nan_loss_in_an_accumulated_step_names_its_batch_and_updates_nothing(tmp_path, monkeypatch):
    # 256 pairs / 16 = 16 batches an epoch; accum_steps=2: the 4th batch is the 2nd of step 2, whose first batch
    # was finite: the step's update must not happen (the loss is read after the backward passes, before the update)
    from hyperplex.tasks.translation import TranslationTask
    from hyperplex.train.trainer import TrainingError

    config = write_tiny_config(tmp_path, batch_size=16, accum_steps=2, max_steps=10, validation_every=1)
    poison_loss(monkeypatch, TranslationTask, at_call=4, factor=float("inf"))
    model_dir = tmp_path / "inf"
    with pytest.raises(TrainingError, match=r"loss became inf at step 2 \(epoch 1, batch 4\); .* \(step ≤ 1\)"):
        train(str(config), model_dir=str(model_dir))
    assert load_checkpoint(model_dir / "last.safetensors").extra["trainer"]["step"] == 1


@pytest.mark.integration
def test_ddp_nan_on_one_process_stops_every_process_at_the_same_step(tmp_path):
    config = write_tiny_config(tmp_path, max_steps=8, validation_every=2, batch_size=16)
    script = tmp_path / "poisoned_train.py"
    script.write_text(
        "import os, sys\n"
        "from hyperplex.tasks.translation import TranslationTask\n"
        "from hyperplex.train.run import train\n"
        "from hyperplex.train.trainer import TrainingError\n"
        "original, calls = TranslationTask.loss, [0]\n"
        "def poisoned(self, model, batch):\n"
        "    calls[0] += 1\n"
        "    loss = original(self, model, batch)\n"
        "    return loss * float('nan') if calls[0] == 3 and os.environ['RANK'] == '1' else loss\n"
        "TranslationTask.loss = poisoned\n"
        "try:\n"
        "    train(sys.argv[1], model_dir=sys.argv[2])\n"
        "except TrainingError as error:\n"
        "    print(f'rank {os.environ[\"RANK\"]}: {error}', flush=True)\n"
        "    sys.exit(3)\n")
    proc = torchrun(script, config, tmp_path / "ddp")
    assert proc.returncode != 0, proc.stdout[-2000:]
    out = proc.stdout
    assert "rank 1: loss became nan at step 3 (epoch 1, batch 3)" in out, out[-4000:] + proc.stderr[-4000:]
    assert "rank 0: loss became nan on another process at step 3 (epoch 1, the step's batches from 3)" in out, \
        out[-4000:] + proc.stderr[-4000:]
    assert load_checkpoint(tmp_path / "ddp" / "last.safetensors").extra["trainer"]["step"] == 2


def test_ddp_sigterm_on_one_process_stops_every_process_at_the_same_step_and_resumes(tmp_path):
    # the signal travels in the step's loss all-reduce: rank 1 gets it during step 3's forward pass, both ranks
    # save and stop at the end of step 3, and the resumed pair ends where one uninterrupted process ends
    config = without_dropout(write_tiny_config(tmp_path, max_steps=8, validation_every=4, batch_size=16))
    script = tmp_path / "signalled_train.py"
    script.write_text(
        "import os, signal, sys\n"
        "from hyperplex.tasks.translation import TranslationTask\n"
        "from hyperplex.train.interrupts import TrainingInterrupted\n"
        "from hyperplex.train.run import train\n"
        "original, calls = TranslationTask.loss, [0]\n"
        "def signalled(self, model, batch):\n"
        "    calls[0] += 1\n"
        "    if calls[0] == 3 and os.environ['RANK'] == '1' and len(sys.argv) == 3:\n"
        "        os.kill(os.getpid(), signal.SIGTERM)\n"
        "    return original(self, model, batch)\n"
        "TranslationTask.loss = signalled\n"
        "try:\n"
        "    train(sys.argv[1], model_dir=sys.argv[2], resume=len(sys.argv) > 3)\n"
        "except TrainingInterrupted as stopped:\n"
        "    print(f'rank {os.environ[\"RANK\"]}: {stopped}', flush=True)\n"
        "    sys.exit(128 + stopped.signal_number)\n")
    two = tmp_path / "two"
    proc = torchrun(script, config, two)
    out = proc.stdout + proc.stderr[-4000:]
    assert proc.returncode != 0, out
    for rank in (0, 1):
        assert f"rank {rank}: interrupted by SIGTERM at step 3 (epoch 1)" in proc.stdout, out
    state = load_checkpoint(two / "last.safetensors").extra["trainer"]
    assert state["step"] == 3 and not state["finished"]
    resumed = torchrun(script, config, two, "resume")
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-4000:]
    one = tmp_path / "one"
    train(str(config), model_dir=str(one))
    assert train_losses(two) == pytest.approx(train_losses(one), rel=1e-5, abs=1e-6)
    a, b = load_model_weights(one / "last.safetensors"), load_model_weights(two / "last.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)


def test_compiled_training_follows_the_eager_run_and_saves_the_same_checkpoint(tmp_path):
    config = without_dropout(write_tiny_config(tmp_path, max_steps=6, validation_every=6))
    train(str(config), model_dir=str(tmp_path / "eager"))
    train(str(config), model_dir=str(tmp_path / "compiled"), overrides=["--training.compile=true"])
    assert train_losses(tmp_path / "compiled") == pytest.approx(train_losses(tmp_path / "eager"), rel=1e-4)
    a = load_model_weights(tmp_path / "eager" / "last.safetensors")
    b = load_model_weights(tmp_path / "compiled" / "last.safetensors")
    assert a.keys() == b.keys()  # the compiled wrapper's `_orig_mod.` never reaches a checkpoint
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5)
    assert load_model(tmp_path / "compiled") is not None


def test_a_compile_failure_is_one_clear_error_before_any_update(tmp_path, monkeypatch):
    from hyperplex.train.trainer import TrainingError

    def broken_backend(graph, example_inputs):
        raise RuntimeError("no compiler here")

    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, backend=broken_backend))
    config = write_tiny_config(tmp_path, max_steps=4, validation_every=2)
    with pytest.raises(TrainingError, match=r"training.compile: torch.compile failed at step 1 .*no compiler here"
                                            r".*--training.compile=false"):
        train(str(config), model_dir=str(tmp_path / "m"), overrides=["--training.compile=true"])
    assert not (tmp_path / "m" / "last.safetensors").exists()


def test_a_compile_failure_after_updates_saves_that_step_and_the_run_goes_on_eagerly(tmp_path, monkeypatch):
    """A compiled run that fails at step 3 (a recompilation or a generated kernel, here raised by hand as dynamo's
    own error) after two updates, with ``last_at_validation=false`` so nothing else saved it: the error names the
    step and the checkpoint of step 2, and ``--resume --training.compile=false`` ends with the weights of an
    uninterrupted run, bitwise (the compiled passes stand in for eager ones here, so both runs compute alike)."""
    from torch._dynamo.exc import TorchRuntimeError

    from hyperplex.train.trainer import Trainer, TrainingError

    config = write_tiny_config(tmp_path, max_steps=6, validation_every=6, last_at_validation=False)
    train(str(config), model_dir=str(tmp_path / "straight"))
    monkeypatch.setattr(torch, "compile", lambda model, **kw: model)
    step = Trainer._optimizer_step

    def failing_third(self, group, count, loop, state):
        if state.step == 2 and self.tcfg.compile:
            raise TorchRuntimeError("a generated kernel failed")
        return step(self, group, count, loop, state)

    monkeypatch.setattr(Trainer, "_optimizer_step", failing_third)
    folder = tmp_path / "failed"
    with pytest.raises(TrainingError, match=r"torch.compile failed at step 3 \(TorchRuntimeError: a generated kernel "
                                            r"failed\); saved a resumable checkpoint of step 2 .*--resume "
                                            r"--training.compile=false"):
        train(str(config), model_dir=str(folder), overrides=["--training.compile=true"])
    assert load_checkpoint(folder / "last.safetensors").extra["trainer"]["step"] == 2
    train(str(config), model_dir=str(folder), overrides=["--training.compile=false"], resume=True)
    a = load_model_weights(tmp_path / "straight" / "last.safetensors")
    b = load_model_weights(folder / "last.safetensors")
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_early_stopping_with_patience(tmp_path):
    # lr tiny → no improvement of exact-match accuracy (stays 0): stop after `patience` validations
    config = write_tiny_config(tmp_path, lr=1e-9, max_steps=100, validation_every=2, patience=2)
    model_dir = tmp_path / "early"
    train(str(config), model_dir=str(model_dir))
    state = load_checkpoint(model_dir / "last.safetensors").extra["trainer"]
    assert state["finished"] and state["step"] == 6  # validations at 2 (best), 4, 6 (two without improvement)


def test_throughput_log_counts_target_tokens_for_translation(tmp_path):
    # the classification twin (examples/s) is in tests/tasks/test_classification.py
    config = write_tiny_config(tmp_path, max_steps=2, validation_every=2)
    train(str(config), model_dir=str(tmp_path / "m"))
    lines = [line for line in (tmp_path / "m" / "train.log").read_text().splitlines() if ": loss " in line]
    assert len(lines) == 2 and all(line.endswith(" tokens/s") for line in lines), lines


def test_accumulation_equals_large_batch(tmp_path):
    big = write_tiny_config(tmp_path, batch_size=32, max_steps=4, validation_every=4, accum_steps=1, shuffle=False,
                      bucket=False)
    cfg = yaml.safe_load(big.read_text())
    cfg["model"]["dropout"] = 0.0
    big.write_text(yaml.safe_dump(cfg))
    train(str(big), model_dir=str(tmp_path / "big"))
    cfg["training"].update(batch_size=16, accum_steps=2)
    small = tmp_path / "small.yaml"
    small.write_text(yaml.safe_dump(cfg))
    train(str(small), model_dir=str(tmp_path / "small"))
    a = load_model_weights(tmp_path / "big" / "last.safetensors")
    b = load_model_weights(tmp_path / "small" / "last.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)


def test_a_step_forming_h_together_trains_what_each_layer_forming_its_own_trains(tmp_path, monkeypatch):
    """The trainer's CUDA form of a step (each group of same-shaped PHM layers forms H in one batched product,
    held through the backward pass; layers.training_step_weights), forced here on the CPU, gives the per-layer
    run's losses and weights, with gradient accumulation."""
    import hyperplex.train.trainer as trainer_module
    from hyperplex.layers import shared_weights

    config = without_dropout(write_tiny_config(tmp_path, batch_size=16, max_steps=4, validation_every=4,
                                               accum_steps=2, shuffle=False, bucket=False))
    train(str(config), model_dir=str(tmp_path / "own"))
    formed = []

    def together(model):
        formed.append(1)
        return shared_weights(model, 0, always=True, together=True)

    monkeypatch.setattr(trainer_module, "training_step_weights", together)
    train(str(config), model_dir=str(tmp_path / "together"))
    assert len(formed) == 8  # 4 steps × 2 accumulated batches
    own = train_losses(tmp_path / "own")
    assert own and train_losses(tmp_path / "together") == pytest.approx(own, rel=1e-5)
    a = load_model_weights(tmp_path / "own" / "last.safetensors")
    b = load_model_weights(tmp_path / "together" / "last.safetensors")
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-6)


def test_refuses_to_overwrite_a_trained_model(tmp_path):
    config = write_tiny_config(tmp_path, max_steps=2, validation_every=2)
    train(str(config), model_dir=str(tmp_path / "m"))
    before = (tmp_path / "m" / "last.safetensors").read_bytes()
    with pytest.raises(FileExistsError, match="already holds a trained model"):
        train(str(config), model_dir=str(tmp_path / "m"))
    assert (tmp_path / "m" / "last.safetensors").read_bytes() == before


def _metric_series(model_dir: Path, split: str, name: str) -> list[float]:
    with open(model_dir / "metrics.csv", newline="") as f:
        return [float(row["value"]) for row in csv.DictReader(f) if row["split"] == split and row["name"] == name]


def test_bf16_autocast_training_learns_with_fp32_master_weights(tmp_path):
    steps, lr = 12, 3e-3
    config = write_tiny_config(tmp_path, precision="bf16", max_steps=steps, validation_every=6, lr=lr)
    model_dir = tmp_path / "bf16"
    train(str(config), model_dir=str(model_dir))
    train_loss, dev_loss = _metric_series(model_dir, "train", "loss"), _metric_series(model_dir, "dev", "loss")
    assert len(train_loss) == steps and len(dev_loss) == 2
    assert all(torch.isfinite(torch.tensor(train_loss + dev_loss)))
    assert sum(train_loss[-3:]) < sum(train_loss[:3])  # it learns under autocast
    assert dev_loss[1] < dev_loss[0]

    # The initial weights: the trainer seeds torch with cfg.seed and then builds the model, so doing
    # the same here rebuilds them (the bound below fails if it does not).
    cfg, task, _ = load_model(model_dir, checkpoint="last", read_data=False)
    torch.manual_seed(cfg.seed)
    initial = task.build_model().state_dict()
    state = load_model_weights(model_dir / "last.safetensors")
    assert set(state) == set(initial)
    for name, weights in state.items():
        assert weights.dtype == torch.float32, name  # fp32 master weights, autocast only in the forward
        change = (weights - initial[name]).abs().max().item()
        # every tensor trained; Adam moves a weight by about lr per step at most
        assert 0 < change <= 2 * steps * lr, (name, change)
        # and the stored values are not bf16 values widened to fp32 (they keep fp32 precision)
        assert not torch.equal(weights, weights.bfloat16().float()), name


def _rewrite_writer(path, written_by):
    """Re-save ``last`` with another ``written_by`` (as if another version or device had written it)."""
    from hyperplex.train.checkpoint import load_checkpoint, save_checkpoint

    ckpt = load_checkpoint(path)
    extra = dict(ckpt.extra, written_by=written_by)
    save_checkpoint(path, ckpt.model_state, ckpt.optimizer_state, extra)


def test_bf16_on_a_cpu_without_fast_bf16_trains_and_the_log_says_fp32_is_faster(tmp_path, tiny_config, monkeypatch):
    from hyperplex.cli import main
    from hyperplex.train import process

    monkeypatch.setattr(process, "cpu_has_fast_bf16", lambda: False)
    config, model_dir = tiny_config(max_steps=2, validation_every=2, precision="bf16"), tmp_path / "m"
    assert main(["train", str(config), "--model-dir", str(model_dir)]) == 0
    warnings = [line for line in (model_dir / "train.log").read_text().splitlines() if " WARNING " in line]
    assert any("training.precision is bf16 but this CPU has no fast bf16 kernels" in line for line in warnings)
    monkeypatch.setattr(process, "cpu_has_fast_bf16", lambda: True)
    config, model_dir = tiny_config(max_steps=2, validation_every=2, precision="bf16"), tmp_path / "fast"
    assert main(["train", str(config), "--model-dir", str(model_dir)]) == 0
    assert "no fast bf16" not in (model_dir / "train.log").read_text()


def test_a_checkpoint_from_another_device_or_version_resumes_and_says_so(tmp_path, tiny_config):
    from hyperplex.cli import main
    from hyperplex.train.checkpoint import load_checkpoint

    config, model_dir = tiny_config(max_steps=6, validation_every=6), tmp_path / "m"
    assert main(["train", str(config), "--model-dir", str(model_dir)]) == 0
    written = load_checkpoint(model_dir / "last.safetensors").extra["written_by"]
    assert written["device"] == "cpu" and written["torch"] == torch.__version__
    _rewrite_writer(model_dir / "last.safetensors", {**written, "device": "cuda", "hyperplex": "0.0.1"})
    assert main(["train", str(config), "--model-dir", str(model_dir), "--resume", "--training.max_steps=8"]) == 0
    log = (model_dir / "train.log").read_text()
    assert "resume: the checkpoint was written with device 'cuda', this run has 'cpu'" in log
    assert "resume: the checkpoint was written with hyperplex '0.0.1'" in log
    assert load_checkpoint(model_dir / "last.safetensors").extra["trainer"]["step"] == 8


def test_a_checkpoint_that_no_longer_fits_the_code_names_the_version_that_wrote_it(tmp_path, tiny_config):
    from hyperplex.cli import main
    from hyperplex.train.checkpoint import load_checkpoint, save_checkpoint

    config, model_dir = tiny_config(max_steps=6, validation_every=6), tmp_path / "m"
    assert main(["train", str(config), "--model-dir", str(model_dir)]) == 0
    last = model_dir / "last.safetensors"
    ckpt = load_checkpoint(last)
    state = {("renamed." + k if i == 0 else k): v for i, (k, v) in enumerate(ckpt.model_state.items())}
    save_checkpoint(last, state, ckpt.optimizer_state, dict(ckpt.extra, written_by={"hyperplex": "0.0.1"}))
    before = last.read_bytes()
    assert main(["train", str(config), "--model-dir", str(model_dir), "--resume", "--training.max_steps=8"]) == 1
    assert last.read_bytes() == before  # nothing written over the checkpoint that could not be resumed


def _folder_state(model_dir: Path) -> dict[str, tuple[bytes, int | None]]:
    """Every file of a model folder but ``train.log``: its bytes and modification time (the lock file's time
    left out: every run takes the lock, and it holds nothing between runs)."""
    from hyperplex.fileio import LOCK_NAME

    return {str(p.relative_to(model_dir)): (p.read_bytes(), None if p.name == LOCK_NAME else p.stat().st_mtime_ns)
            for p in sorted(model_dir.rglob("*")) if p.is_file() and p.name != "train.log"}


def _last_log_line(model_dir: Path) -> str:
    return (model_dir / "train.log").read_text().splitlines()[-1]


@pytest.mark.parametrize("first,again,stopped,advice", [
    # a lower max_steps: the run stopped at 3, the limit it reached was its own 3, not the 2 asked for now
    ({"max_steps": 3, "validation_every": 3}, ["--training.max_steps=2"],
     "reached training.max_steps=3 at step 3", "raise training.max_steps, e.g. --training.max_steps=N with N > 3"),
    # early stopping: a larger max_steps changes nothing, the setting to change is patience
    ({"lr": 1e-9, "max_steps": 100, "validation_every": 2, "patience": 2}, ["--training.max_steps=20"],
     "early stopping: accuracy did not improve for training.patience=2 validations at step 6",
     "raise training.patience, e.g. --training.patience=N with N > 2"),
    ({"max_steps": 0, "max_epochs": 1, "validation_every": 0}, [],
     "completed training.max_epochs=1 epochs at step 8", "raise training.max_epochs, e.g. --training.max_epochs=N "
                                                        "with N > 1"),
])
def test_a_resume_that_trains_nothing_leaves_the_folder_and_names_the_limit_that_stopped_the_run(
        tmp_path, first, again, stopped, advice):
    """Was: such a resume wrote its changed budget into config.yaml (a plan then took the trained model for another
    config's), and its message named the new limit as the one reached and always advised raising max_steps."""
    config, model_dir = write_tiny_config(tmp_path, **first), tmp_path / "m"
    train(str(config), model_dir=str(model_dir))
    before = _folder_state(model_dir)
    saved = yaml.safe_load((model_dir / "config.yaml").read_text())["training"]
    assert train(str(model_dir / "config.yaml"), again, model_dir=str(model_dir), resume=True) == {}
    assert _folder_state(model_dir) == before
    assert yaml.safe_load((model_dir / "config.yaml").read_text())["training"] == saved
    line = _last_log_line(model_dir)
    assert f"that run had already finished ({stopped}); nothing to do. To train on, {advice}" in line, line
    assert line.endswith("The model folder is left as it was")


def test_a_raised_budget_continues_a_finished_run_and_says_where_it_had_stopped(tmp_path, capsys):
    config, model_dir = write_tiny_config(tmp_path, max_steps=3, validation_every=3), tmp_path / "m"
    train(str(config), model_dir=str(model_dir))
    train(str(config), ["--training.max_steps=5"], model_dir=str(model_dir), resume=True)
    lines = (model_dir / "train.log").read_text().splitlines()
    assert any(line.endswith("that run had finished (reached training.max_steps=3 at step 3); the new budget "
                             "continues it with training.max_steps=5") for line in lines)
    assert load_checkpoint(model_dir / "last.safetensors").extra["trainer"]["step"] == 5
    assert yaml.safe_load((model_dir / "config.yaml").read_text())["training"]["max_steps"] == 5
    # each trainer process opens its part of the log with a start line (what experiments.timing splits at)
    from hyperplex.train.logs import RUN_START

    starts = [i for i, line in enumerate(lines) if f" INFO {RUN_START}: " in line]
    resumed = next(i for i, line in enumerate(lines) if "resumed from" in line)
    first_end = next(i for i, line in enumerate(lines) if "finished at step 3" in line)
    assert starts == [0, first_end + 1] and starts[1] < resumed
    assert "new run in" in lines[0] and "resuming in" in lines[starts[1]]
    assert RUN_START not in capsys.readouterr().err  # the log file's marker, not the terminal's


def test_an_interrupted_run_past_a_lowered_limit_is_refused_not_trained_a_step_more(tmp_path, monkeypatch):
    from hyperplex.train.checkpoint import CheckpointError
    from hyperplex.train.trainer import Trainer

    config, model_dir = write_tiny_config(tmp_path, max_steps=8, validation_every=2), tmp_path / "m"
    monkeypatch.setattr(Trainer, "_step", killed_after(5))  # its last checkpoint: the validation at step 4
    with pytest.raises(Killed):
        train(str(config), model_dir=str(model_dir))
    monkeypatch.undo()
    assert load_checkpoint(model_dir / "last.safetensors").extra["trainer"]["step"] == 4
    before = _folder_state(model_dir)
    with pytest.raises(CheckpointError, match=r"the interrupted run is at step 4, already past training.max_steps=3: "
                                              r"resume it with a limit of 4 or more, or with its own \(8\)"):
        train(str(config), ["--training.max_steps=3"], model_dir=str(model_dir), resume=True)
    assert _folder_state(model_dir) == before
    train(str(config), ["--training.max_steps=4"], model_dir=str(model_dir), resume=True)  # at the limit: it ends
    state = load_checkpoint(model_dir / "last.safetensors").extra["trainer"]
    assert state["step"] == 4 and state["finished"] and state["stop_reason"] == "max_steps"
    assert "finished at step 4" in (model_dir / "train.log").read_text()


def test_a_checkpoint_whose_trainer_state_has_an_unknown_field_is_refused_by_name(tmp_path):
    """Was: a bare ``TypeError: TrainState.__init__() got an unexpected keyword argument``, naming no file."""
    from hyperplex.train.checkpoint import CheckpointError, save_checkpoint

    config, model_dir = write_tiny_config(tmp_path, max_steps=2, validation_every=2), tmp_path / "m"
    train(str(config), model_dir=str(model_dir))
    last = model_dir / "last.safetensors"
    ckpt = load_checkpoint(last)
    extra = dict(ckpt.extra, written_by={**ckpt.extra["written_by"], "hyperplex": "0.3.0"},
                 trainer={**ckpt.extra["trainer"], "new_field": 1, "other_field": "x"})
    save_checkpoint(last, ckpt.model_state, ckpt.optimizer_state, extra)
    before = _folder_state(model_dir)
    with pytest.raises(CheckpointError) as caught:
        train(str(config), ["--training.max_steps=4"], model_dir=str(model_dir), resume=True)
    message = str(caught.value)
    assert message.startswith(f"{last}: its trainer state has fields 'new_field', 'other_field' that hyperplex ")
    assert "the checkpoint was written with hyperplex 0.3.0" in message
    assert _folder_state(model_dir) == before  # the checkpoint, and config.yaml with max_steps 2, untouched
