"""One training loop for every task and model.

Adam/AdamW/SGD with stateless schedules (exact resume), gradient accumulation and clipping,
bf16/fp16 autocast, validation every N steps, early stopping, best-k checkpoints, logs to
``train.log`` / ``metrics.csv`` / TensorBoard, a tqdm bar, and data-parallel training with
``torchrun`` (DDP). Resuming restores the parameters, optimiser, data position and every RNG, so a
run killed at any instant and resumed from ``last.safetensors`` ends where an uninterrupted run ends.
"""

from __future__ import annotations

import contextlib
import gc
import math
import os
import random
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from hyperplex.config import dump_yaml
from hyperplex.config.experiment import ExperimentConfig, experiment_dict
from hyperplex.fileio import atomic_write_text
from hyperplex.layers import training_step_weights
from hyperplex.train.checkpoint import (
    LAST,
    CheckpointError,
    CheckpointManager,
    load_checkpoint,
    load_into,
    model_state,
    restore_rng,
)
from hyperplex.train.interrupts import InterruptFlag, TrainingInterrupted
from hyperplex.train.logs import RUN_START, MetricsWriter, setup_logger
from hyperplex.train.optim import Schedule, apply_lr, build_optimizer, build_schedule
from hyperplex.train.process import check_writable, distributed, resolve_device, slow_precision_warning
from hyperplex.train.task import Task, metric_mode


class TrainingError(RuntimeError):
    """Training cannot go on (e.g. the loss became NaN); the message says where and what was kept."""


class DivergedError(TrainingError):
    """The training loss or a validation metric became NaN/inf: an outcome of the run's settings (a plan records
    it as ``diverged``), unlike the other training errors."""


@dataclass
class TrainState:
    """Everything besides tensors that an exact resume needs (stored in the checkpoint)."""

    step: int = 0  # optimiser steps done
    epoch: int = 1  # current epoch (1-based)
    batch_index: int = 0  # next batch of the current epoch
    best_metric: float | None = None
    bad_validations: int = 0  # validations since the last improvement
    finished: bool = False
    stop_reason: str = ""  # what ended the run: max_steps, max_epochs or patience
    # The open training-loss log window, so the first line logged after a resume averages over the
    # same log_every steps as an uninterrupted run does.
    window_loss: float = 0.0
    window_tokens: int = 0
    # Pre-clipping global gradient norm over the same window (sum and max), logged as grad_norm /
    # grad_norm_max in metrics.csv: spikes show training instability.
    window_grad_norm: float = 0.0
    window_grad_norm_max: float = 0.0

    @property
    def step_epoch(self) -> int:
        """The epoch (1-based) that the last step taken belongs to: what logs and ``metrics.csv`` name.
        ``epoch`` has already moved on after the step that closed an epoch (a checkpoint there resumes at the
        next epoch's start), so a validation at the end of epoch 1 is "epoch 1", not 2."""
        return self.epoch - 1 if self.batch_index == 0 and self.step > 0 else self.epoch


class _Throughput:
    """What this process trained since the last log line (target tokens or examples) and since when: the
    speed in the log and the progress bar counts this process's own time only."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count, self.start = 0, time.perf_counter()

    def rate(self) -> float:
        return self.count / max(time.perf_counter() - self.start, 1e-9)


@dataclass
class _Loop:
    """What the steps of one training run share besides its :class:`TrainState`."""

    model: nn.Module  # what checkpoints hold
    train_model: nn.Module  # the model, or its DDP wrapper: what the forward pass runs
    optimizer: torch.optim.Optimizer
    schedule: Schedule
    scaler: torch.amp.GradScaler | None  # fp16 only
    manager: CheckpointManager | None  # rank 0 only
    metrics: MetricsWriter | None  # rank 0 only
    bar: Any | None  # a tqdm bar, or None
    interrupts: InterruptFlag  # SIGINT/SIGTERM seen (and, under DDP, agreed on by every process)


class Trainer:
    """Train ``task``'s model as ``cfg`` says, writing everything into ``model_dir``."""

    def __init__(self, cfg: ExperimentConfig, task_factory, model_dir: str | Path, data_root: str | None,
                 resume: bool = False, resume_changes: list[str] | None = None) -> None:
        self.cfg, self.tcfg = cfg, cfg.training
        self.model_dir = Path(model_dir)
        self.resume = resume
        self.resume_changes = list(resume_changes or [])  # "key: old → new" lines, logged after resuming
        self._scaler: torch.amp.GradScaler | None = None  # fp16 only; set by train()
        self.rank, self.world = distributed()
        # Checks that need no files come first, so a refused start creates and touches nothing.
        last = self.model_dir / LAST
        if resume and not last.exists():
            raise FileNotFoundError(f"--resume: no checkpoint {last} to resume from")
        if not resume and last.exists():
            raise FileExistsError(f"{self.model_dir} already holds a trained model ({LAST}); pass --resume to "
                                  f"continue it, or choose another --model-dir (nothing was overwritten)")
        self.device = resolve_device(self.tcfg.device, self.rank)
        if self.tcfg.precision == "fp16" and self.device.type != "cuda":
            raise ValueError("training.precision fp16 needs a CUDA device; use bf16 or fp32 on CPU")
        if self.rank == 0:
            check_writable(self.model_dir)
        self.log = setup_logger(self.model_dir, self.rank)
        self.log.info(f"{RUN_START}: pid {os.getpid()}, {'resuming' if resume else 'new run'} in {self.model_dir}")
        if (slow := slow_precision_warning(self.tcfg.precision, self.device)) is not None:
            self.log.warning(slow)
        # 0 = hyperplex.threads' rule for this model's width and batch rows (one thread for small models)
        from hyperplex.threads import TOKENS_PER_SENTENCE, model_width, set_threads

        rows = self.tcfg.batch_size * (1 if self.tcfg.batch_type == "token" else TOKENS_PER_SENTENCE)
        set_threads(self.tcfg.num_threads, max(1, rows // self.world), model_width(cfg.model))
        if self.tcfg.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=True)
        self.task: Task = task_factory(cfg, self.model_dir, data_root, self.log)
        metric = self.tcfg.early_stopping_metric or self.task.metrics[0]
        if metric not in self.task.metrics:
            raise ValueError(f"training.early_stopping_metric {metric!r} is not reported by task "
                             f"{self.task.name!r}; choose one of {', '.join(self.task.metrics)}")
        self.metric, self.mode = metric, metric_mode(metric)

    # ------------------------------------------------------------------ helpers
    def _seed(self) -> None:
        seed = self.cfg.seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def _autocast(self):
        if self.tcfg.precision == "fp32":
            return contextlib.nullcontext()
        dtype = torch.bfloat16 if self.tcfg.precision == "bf16" else torch.float16
        return torch.autocast(device_type=self.device.type, dtype=dtype)

    def _improved(self, value: float, best: float | None) -> bool:
        if best is None:
            return True
        return value < best if self.mode == "min" else value > best

    def _extra(self, state: TrainState) -> dict:
        extra = {"trainer": asdict(state), "config": experiment_dict(self.cfg), "task": self.task.metadata(),
                 "format": "hyperplex-checkpoint-1", "written_by": self._writer()}
        if self._scaler is not None:
            extra["grad_scaler"] = self._scaler.state_dict()
        return extra

    def _checkpoints(self, start: int, state: TrainState) -> CheckpointManager:
        """The folder's checkpoint manager, without the best files of steps after ``start`` (``last``'s step on a
        resume, 0 for a fresh run)."""
        manager = CheckpointManager(self.model_dir, keep_best=self.tcfg.keep_best, metric_mode=self.mode,
                                    metric_name=self.metric, resume_step=start)
        if manager.dropped_steps:
            self.log.info(f"deleted the best checkpoints of steps {', '.join(map(str, manager.dropped_steps))}, "
                          f"written after step {start} by a run that stopped before it saved {LAST}"
                          f"{' again' if self.resume else ''}; this run trains those steps anew")
        if self.resume and state.best_metric is not None and manager.best_metric != state.best_metric:
            self.log.warning(f"resume: {LAST} holds best {self.metric} {state.best_metric}, the best checkpoint "
                             f"kept is {manager.best_metric} (a folder written before best files were saved "
                             f"ahead of {LAST}); early stopping goes on from {LAST}'s")
        return manager

    def _writer(self) -> dict:
        """What wrote a checkpoint — hyperplex and torch versions, device kind — compared on resume."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("hyperplex")
        except PackageNotFoundError:  # run from a source tree that was never installed
            ours = "unknown"
        return {"hyperplex": ours, "torch": torch.__version__, "device": self.device.type}

    def _resume_notes(self, saved: dict | None) -> list[str]:
        """Lines saying how the run that wrote ``last`` differs from this one (another device or version):
        resuming is allowed — tensors are moved, the model must still fit — and the log keeps the trace."""
        if not isinstance(saved, dict):
            return ["the checkpoint does not say which hyperplex, torch or device wrote it"]
        now = self._writer()
        return [f"the checkpoint was written with {key} {saved.get(key)!r}, this run has {now[key]!r}"
                for key in now if saved.get(key) != now[key]]

    def _initial_model(self, fresh: bool) -> nn.Module:
        """Seed Python, NumPy and torch with ``seed``, prepare the task's data (``fresh``: vocabularies and
        splits built anew, not read from the folder) and build the model: the start of every run."""
        self._seed()
        self.task.prepare(fresh=fresh)
        self.task.weights_from_checkpoint = not fresh  # a resumed run loads `last` into it next
        return self.task.build_model()

    def save_untrained(self, stop_reason: str) -> Path:
        """Save the model exactly as :meth:`train` would start it, without training: ``config.yaml`` and a
        ``last`` checkpoint at step 0 whose trainer state is finished with ``stop_reason``, holding what a
        trained checkpoint holds (:func:`~hyperplex.train.checkpoint.model_state`, no optimiser state), so
        it loads and evaluates like a trained model. Returns the checkpoint's path."""
        model = self._initial_model(fresh=True)
        path = self.model_dir / LAST
        if self.rank == 0:
            atomic_write_text(self.model_dir / "config.yaml", dump_yaml(experiment_dict(self.cfg)))
            manager = CheckpointManager(self.model_dir, keep_best=self.tcfg.keep_best, metric_mode=self.mode,
                                        metric_name=self.metric)
            manager.save_last(model_state(model), None, self._extra(TrainState(finished=True, stop_reason=stop_reason)))
            self.log.info(f"{stop_reason}: the model as built (seed {self.cfg.seed}) saved to {path} without training")
        return path

    # ------------------------------------------------------------------ main loop
    def train(self) -> dict:
        """Run (or resume) training; returns the final validation metrics."""
        tcfg = self.tcfg
        model = self._initial_model(fresh=not self.resume).to(self.device)
        self.model = model
        # fused on CUDA: a small model's step there is bound by kernel launches, and the default (foreach) update
        # launches several kernels per operation; the CPU keeps torch's default, which the CPU lanes' models used
        optimizer = build_optimizer(model.parameters(), tcfg.optimizer, tcfg.lr, betas=tuple(tcfg.betas),
                                    eps=tcfg.eps, weight_decay=tcfg.weight_decay, momentum=tcfg.momentum,
                                    fused=self.device.type == "cuda")
        schedule = self._schedule()
        # fp16's loss scale is state too: a resume goes on with the scale it stopped at, not the initial one
        self._scaler = torch.amp.GradScaler("cuda") if tcfg.precision == "fp16" else None
        if self.resume:
            state, stopped_at = self._restore(model, optimizer)
            if state.finished and not self._reopen_finished(state, stopped_at):
                return {}  # the folder stays as it was: its config.yaml still describes its checkpoints
            t = self.tcfg
            past = {"max_steps": (state.step, t.max_steps), "max_epochs": (state.epoch - 1, t.max_epochs)}
            for key, (done, limit) in past.items():
                if not state.finished and limit and done > limit:
                    # an interrupted run already past a lowered limit: training on (one step) or calling it
                    # finished under a limit its checkpoints did not stop at would both misdescribe the folder
                    at = f"step {done}" if key == "max_steps" else f"{done} epochs"
                    raise CheckpointError(f"{self.model_dir}: the interrupted run is at {at}, already past "
                                          f"training.{key}={limit}: resume it with a limit of {done} or more, or "
                                          f"with its own ({stopped_at[key]}); the folder was left as it is")
        else:
            state = TrainState()
        # written only once this run trains: a resume that trains nothing keeps the config its checkpoints were
        # trained with, which a plan compares against its own
        if self.rank == 0 and (not self.resume or self.resume_changes):
            atomic_write_text(self.model_dir / "config.yaml", dump_yaml(experiment_dict(self.cfg)))
        # a fresh run starts at step 0: the best files and logs of a run killed in this folder before its first
        # `last` (a GPU call's trainer, killed with last_at_validation=false) are not this run's
        start = state.step if self.resume else 0
        manager = self._checkpoints(start, state) if self.rank == 0 else None
        total_steps = self._log_start(model, state)
        train_model: nn.Module = model
        if self.world > 1:
            train_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        if tcfg.compile:  # after the DDP wrapper, as PyTorch's DDP guide does; checkpoints keep `model`'s names
            # dynamic: batches of a token budget differ in rows and lengths, so one graph for every shape instead of
            # a first graph for the first shape and a second, dynamic one as soon as the next batch differs
            train_model = cast(nn.Module, torch.compile(train_model, dynamic=True))
        metrics = MetricsWriter(self.model_dir, start) if self.rank == 0 else None
        loop = _Loop(model, train_model, optimizer, schedule, self._scaler, manager, metrics,
                     self._progress_bar(total_steps, state), InterruptFlag())
        try:
            loop.interrupts.install()
            model.train()
            with self._compile_errors(loop, state):
                last_val = self._run_steps(loop, state)
        finally:
            loop.interrupts.uninstall()
            if loop.bar is not None:
                loop.bar.close()
            if metrics:
                metrics.close()
            if self.world > 1:
                # A DDP wrapper sits in reference cycles and its reducer holds the process group: freed now, not
                # at some later collection, so that a caller who made the group can destroy it on return.
                del loop, train_model
                gc.collect()
        if self.rank == 0 and tcfg.plots:
            self._plots()
        self.log.info(f"finished at step {state.step} (epoch {state.step_epoch}): {self._stop_message(state)}; "
                      f"best {self.metric} {state.best_metric}")
        return last_val

    def _restore(self, model: nn.Module, optimizer) -> tuple[TrainState, dict[str, int]]:
        """``last``'s parameters, optimiser state and every RNG into this run; returns its trainer state and the
        limits it was trained under (:meth:`_saved_limits`). Changed budget keys are logged; :meth:`train` writes
        them into the folder's ``config.yaml`` if the run goes on."""
        log = self.log
        # on the CPU: the weights and moments are copied onto the parameters' device below, and torch puts Adam's step
        # counters where its implementation reads them: the fused one (the trainer's on CUDA) on the parameters'
        # device, the default one on the CPU (on CUDA they would cost a host sync per parameter per step)
        ckpt = load_checkpoint(self.model_dir / LAST, map_location="cpu")
        notes = self._resume_notes(ckpt.extra.get("written_by"))
        state = self._saved_state(ckpt.extra)
        try:
            load_into(model, ckpt.model_state, self.model_dir / LAST, expected_from="the saved config.yaml")
        except CheckpointError as err:
            if notes:
                raise CheckpointError(f"{err} ({'; '.join(notes)}: the code that built this model has changed "
                                      "since; finish the run with the version that started it, "
                                      "or start again)") from None
            raise
        if ckpt.optimizer_state is not None:
            optimizer.load_state_dict(ckpt.optimizer_state)
        if self._scaler is not None and ckpt.extra.get("grad_scaler"):
            self._scaler.load_state_dict(ckpt.extra["grad_scaler"])
        if ckpt.rng_state is None:
            raise CheckpointError(f"{self.model_dir / LAST} holds no random-number state to resume from (the trainer "
                                  f"always saves one); it was not written by `hyperplex train`")
        restore_rng(ckpt.rng_state)
        log.info(f"resumed from {self.model_dir / LAST} at step {state.step}, epoch {state.epoch}, "
                 f"batch {state.batch_index}")
        for change in [*notes, *self.resume_changes]:
            log.info(f"resume: {change}")
        return state, self._saved_limits(ckpt.extra, state)

    def _saved_state(self, extra: dict) -> TrainState:
        """The trainer state a checkpoint's ``extra`` holds. A field this version does not know (a later version
        wrote it) is an error naming the file, the fields and that version: resuming without it would train on
        from a state this code cannot reproduce."""
        path = self.model_dir / LAST
        saved = extra.get("trainer")
        if not isinstance(saved, dict):
            raise CheckpointError(f"{path} holds no trainer state (extra 'trainer': expected a dict, got "
                                  f"{type(saved).__name__}); it was not written by `hyperplex train`")
        known = {f.name for f in fields(TrainState)}
        unknown = sorted(set(saved) - known)
        if unknown:
            writer = extra.get("written_by")
            version = writer.get("hyperplex") if isinstance(writer, dict) else None
            wrote = f"was written with hyperplex {version}" if version else "does not say which hyperplex wrote it"
            raise CheckpointError(f"{path}: its trainer state has {'fields' if len(unknown) > 1 else 'a field'} "
                                  f"{', '.join(map(repr, unknown))} that hyperplex {self._writer()['hyperplex']} "
                                  f"does not know; the checkpoint {wrote}: resume it with that version, or train "
                                  f"into a new --model-dir (the checkpoint was left as it is)")
        return TrainState(**saved)

    @staticmethod
    def _saved_limits(extra: dict, state: TrainState) -> dict[str, int]:
        """``max_steps``, ``max_epochs`` and ``patience`` of the run that wrote a checkpoint (its stored config),
        which are what ended a finished run, not this run's possibly changed ones. A checkpoint without a config
        gets the values its state stopped at."""
        training = (extra.get("config") or {}).get("training") or {}
        stopped = {"max_steps": state.step, "max_epochs": state.epoch - 1, "patience": state.bad_validations}
        return {key: int(training.get(key, value) or 0) for key, value in stopped.items()}

    def _reopen_finished(self, state: TrainState, stopped_at: dict[str, int]) -> bool:
        """Whether a finished run goes on after a resume (its budget was raised); ``state`` is reopened if so.
        ``stopped_at``: the limits the run was trained under. A run still finished under the current limits is
        logged as such, naming the setting that ends it and how to extend it."""
        if not state.stop_reason:  # a checkpoint without a recorded stop reason: the limit that ended it then
            state.stop_reason = self._budget_reached(state, stopped_at) or "patience"
        if state.stop_reason == "patience" and self.tcfg.patience and state.bad_validations >= self.tcfg.patience:
            reason = "patience"
        else:
            reason = self._budget_reached(state)
        stopped = f"{self._stop_message(state, stopped_at)} at step {state.step}"
        if reason:
            also = "" if reason == state.stop_reason else \
                f"; training.{reason}={getattr(self.tcfg, reason)} ends it there too"
            self.log.info(f"that run had already finished ({stopped}); nothing to do{also}. To train on, "
                          f"{self._extend_advice(reason, state)}. The model folder is left as it was")
            return False
        if state.stop_reason in ("max_steps", "max_epochs", "patience"):
            now = f" with training.{state.stop_reason}={getattr(self.tcfg, state.stop_reason)}"
        else:
            now = ""
        self.log.info(f"that run had finished ({stopped}); the new budget continues it{now}")
        state.finished, state.stop_reason = False, ""
        if state.bad_validations >= (self.tcfg.patience or float("inf")):
            state.bad_validations = 0
        return True

    def _log_start(self, model: nn.Module, state: TrainState) -> int | None:
        """Log what is trained, where, with which budget and validation; returns the expected last step."""
        cfg, log = self.cfg, self.log
        n_params = sum(p.numel() for p in model.parameters())
        log.info(f"{cfg.name}: task {self.task.name}, model {cfg.model.architecture}, {n_params:,} parameters, "
                 f"device {self.device}, {self.world} process(es), {torch.get_num_threads()} thread(s)")
        steps_per_epoch = max(1, math.ceil(len(self.task.train_batches(state.epoch)) / self.tcfg.accum_steps))
        expected_last = self._log_budget(state, steps_per_epoch)
        if self.task.describe_validation():
            log.info(self.task.describe_validation())
        return expected_last

    def _progress_bar(self, total_steps: int | None, state: TrainState):
        """A tqdm bar on stderr (rank 0, ``training.progress_bar``, a terminal), else None."""
        if self.rank != 0 or not self.tcfg.progress_bar:
            return None
        from tqdm import tqdm

        return tqdm(total=total_steps, initial=state.step, unit="step", dynamic_ncols=True, file=sys.stderr,
                    disable=None)

    def _run_steps(self, loop: _Loop, state: TrainState) -> dict[str, float]:
        """Optimiser steps, epoch after epoch, until a limit ends the run; validation and checkpoints when
        due; a SIGINT/SIGTERM saves and stops at the next step boundary. Returns the last validation."""
        tcfg = self.tcfg
        last_val: dict[str, float] = {}
        throughput = _Throughput()
        reason = self._budget_reached(state)
        if reason and not state.finished:  # resumed exactly at its (new) limit: it ends here, not a step later
            state.stop_reason, state.finished = reason, True
            if loop.manager:
                loop.manager.save_last(model_state(loop.model), loop.optimizer.state_dict(), self._extra(state))
        while not state.finished:
            batches = self.task.train_batches(state.epoch)
            if not batches:
                raise ValueError("the training split produced no batches (is it empty after filtering?)")
            while state.batch_index < len(batches):
                group = batches[state.batch_index: state.batch_index + tcfg.accum_steps]
                epoch_done = self._step(loop, group, len(batches), state, throughput)
                due = (tcfg.validation_every and state.step % tcfg.validation_every == 0) or \
                    (not tcfg.validation_every and epoch_done) or state.finished
                if due:
                    last_val = self._validate_and_save(loop.model, loop.optimizer, state, loop.manager, loop.metrics)
                elif tcfg.checkpoint_every and state.step % tcfg.checkpoint_every == 0 and loop.manager:
                    loop.manager.save_last(model_state(loop.model), loop.optimizer.state_dict(), self._extra(state))
                if loop.interrupts.pending(self.world) and not state.finished:
                    self._save_and_stop(loop.interrupts.signal_number, loop.model, loop.optimizer, state,
                                        loop.manager, loop.bar)
                if epoch_done or state.finished:
                    break
        return last_val

    def _step(self, loop: _Loop, group: Sequence, num_batches: int, state: TrainState, throughput: _Throughput) -> bool:
        """One optimiser step over ``group`` at the scheduled learning rate, then the state moved past it
        (next epoch, the limit that ends the run, the loss window) and reported. Returns whether the step
        ended the epoch of ``num_batches`` batches."""
        count = sum(b.num_tokens for b in group)
        lr = loop.schedule.lr(self.tcfg.lr, state.step + 1, state.epoch)
        apply_lr(loop.optimizer, lr)
        step_loss = self._optimizer_step(group, count, loop, state)
        state.step += 1
        state.batch_index += len(group)
        epoch_done = state.batch_index >= num_batches
        if epoch_done:
            self._next_epoch(state)  # the checkpoint must point at the next epoch's start
        state.stop_reason = self._budget_reached(state)
        state.finished = bool(state.stop_reason)
        state.window_loss += step_loss
        state.window_tokens += count  # targets (or examples) since the last log line
        throughput.count += count
        self._report_step(loop, state, step_loss / max(count, 1), lr, throughput)
        return epoch_done

    def _report_step(self, loop: _Loop, state: TrainState, step_loss: float, lr: float,
                     throughput: _Throughput) -> None:
        """The progress bar moved on (``step_loss``: this step's mean loss); every ``log_every`` steps the
        window's mean loss, learning rate and speed logged and written to ``metrics.csv``, and the window
        started again."""
        tcfg, unit = self.tcfg, self.task.loss_unit  # what num_tokens (and so the speed) counts
        if loop.bar is not None:
            loop.bar.set_postfix(loss=f"{step_loss:.3f}", lr=f"{lr:.2e}", speed=f"{throughput.rate():.0f} {unit}/s",
                                 epoch=state.step_epoch, refresh=False)
            loop.bar.update(1)
        if state.step % tcfg.log_every != 0:
            return
        mean = state.window_loss / max(state.window_tokens, 1)
        self.log.info(f"step {state.step} epoch {state.step_epoch}: loss {mean:.4f} lr {lr:.3e} "
                      f"{throughput.rate():.0f} {unit}/s")
        if loop.metrics:
            loop.metrics.write(state.step, state.step_epoch, "train",
                               {"loss": mean, "lr": lr, "grad_norm": state.window_grad_norm / tcfg.log_every,
                                "grad_norm_max": state.window_grad_norm_max})
        state.window_loss, state.window_tokens = 0.0, 0
        state.window_grad_norm, state.window_grad_norm_max = 0.0, 0.0
        throughput.reset()

    def _optimizer_step(self, group: Sequence, count: int, loop: _Loop, state: TrainState) -> float:
        """One optimiser step over the accumulated ``group`` of batches (``count`` targets in all): forward
        and backward per batch, gradient norm (clipped if configured, recorded for the log window),
        update. Returns the summed loss of the global batch over every process.

        The losses and the gradient norm reach the host together, in one device synchronisation per step, so
        that on a GPU the host queues the whole backward pass without waiting; a non-finite loss is caught
        there, after its backward pass but before the update, so the weights and the optimizer state keep
        their last good values. Under DDP the same all-reduce carries each process's SIGINT/SIGTERM vote."""
        tcfg = self.tcfg
        train_model, model, optimizer, scaler = loop.train_model, loop.model, loop.optimizer, loop.scaler
        losses = []
        for j, batch in enumerate(group):
            shard = batch.shard(self.rank, self.world) if self.world > 1 else batch
            shard = shard.to(self.device)
            sync: contextlib.AbstractContextManager = contextlib.nullcontext()
            if self.world > 1 and j < len(group) - 1:
                sync = cast(nn.parallel.DistributedDataParallel, train_model).no_sync()
            with sync, contextlib.ExitStack() as step_weights:
                with self._autocast():
                    if self.world == 1 and not tcfg.compile:
                        # on one GPU each group of same-shaped PHM layers forms its H in one batched product, under
                        # the step's autocast as a layer would, and held through the backward pass
                        # (layers.training_step_weights); under DDP and torch.compile each layer forms its own
                        step_weights.enter_context(training_step_weights(model))
                    loss_sum = self.task.loss(train_model, shard).float()
                # DDP averages gradients over processes; scale so the result is the
                # gradient of (total loss / total tokens) of the global batch.
                scaled = loss_sum * (self.world / max(count, 1))
                (scaler.scale(scaled) if scaler else scaled).backward()
            losses.append(loss_sum.detach().double())
        local = torch.stack(losses)
        total = local.sum().reshape(1)
        if self.world > 1:  # a NaN on any process makes the global sum NaN on every process
            ballot = loop.interrupts.votes()
            votes = local.new_zeros(len(ballot))
            for i, vote in enumerate(ballot):
                if vote:  # a fill on the device, not a host-to-device copy that would wait for the queue
                    votes[i] = vote
            total = torch.cat([total, votes])
            if total.device.type != "cuda":
                total = total.cpu()
            dist.all_reduce(total)
        if scaler:
            scaler.unscale_(optimizer)
        if tcfg.clip_grad_norm > 0:
            grad_norm = nn.utils.clip_grad_norm_(model.parameters(), tcfg.clip_grad_norm)
        else:
            grad_norm = nn.utils.get_total_norm([p.grad for p in model.parameters() if p.grad is not None])
        host = torch.cat(  # one device-to-host copy
            [local, total.to(local.device), grad_norm.detach().double().reshape(1).to(local.device)]).tolist()
        values, global_loss, grad_norm = host[:len(losses)], host[len(losses)], host[-1]
        if self.world > 1:
            loop.interrupts.agree(host[len(losses) + 1:-1])
        self._check_finite(values, global_loss, state)
        state.window_grad_norm += grad_norm
        if not grad_norm <= state.window_grad_norm_max:  # a NaN norm is kept, not skipped by max()
            state.window_grad_norm_max = grad_norm
        if scaler:
            scaler.step(optimizer)
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return global_loss if self.world > 1 else sum(values)

    @contextlib.contextmanager
    def _compile_errors(self, loop: _Loop, state: TrainState):
        """With ``training.compile``, a failure of torch.compile in a step's forward or backward pass (its backend:
        no C++ compiler on a CPU machine, no Triton for a GPU; or tracing an operation, or a kernel it generated;
        the backward compiles at its first call) ends training with one line that says so and what to do, not a
        compiler's traceback. Nothing of that step has been applied (the update comes after both passes), and
        validation runs eager, so nothing else compiles: after a step that did update, ``last`` is saved at that
        step boundary, as a SIGTERM would save it, so the run goes on with ``--resume --training.compile=false``."""
        if not self.tcfg.compile:
            yield
            return
        from torch._dynamo.exc import TorchDynamoException  # BackendCompilerFailed, InductorError, TritonMissing ...
        from torch._inductor.exc import CppCompileError  # raised bare where a lazy backward compile fails

        try:
            yield
        except (TorchDynamoException, CppCompileError) as error:
            cause = getattr(error, "inner_exception", None) or error
            first = (str(cause).strip().splitlines() or [""])[0]
            what = f"{type(cause).__name__}: {first[:300]}" if first else type(cause).__name__
            then = "train without it (--training.compile=false)"
            if state.step > 0 and loop.manager is not None:
                loop.manager.save_last(model_state(loop.model), loop.optimizer.state_dict(), self._extra(state))
                then = (f"saved a resumable checkpoint of step {state.step} ({self.model_dir / LAST}); go on "
                        f"without it (--resume --training.compile=false)")
            guide = "https://pytorch.org/docs/stable/torch.compiler_troubleshooting.html"
            raise TrainingError(f"training.compile: torch.compile failed at step {state.step + 1} ({what}); {then} "
                                f"or see {guide}") from error

    def _save_and_stop(self, signal_number: int, model, optimizer, state: TrainState, manager, bar) -> None:
        """After a SIGINT/SIGTERM: write a resumable ``last`` at this step boundary, log it, stop."""
        name = signal.Signals(signal_number).name
        if manager is not None:
            manager.save_last(model_state(model), optimizer.state_dict(), self._extra(state))
        if bar is not None:
            bar.close()
        message = (f"interrupted by {name} at step {state.step} (epoch {state.step_epoch}); saved a resumable "
                   f"checkpoint {self.model_dir / LAST}; continue with the same command and --resume")
        self.log.info(message)
        raise TrainingInterrupted(message, signal_number, saved=True)

    def _next_epoch(self, state: TrainState) -> None:
        state.epoch += 1
        state.batch_index = 0

    def _limits(self, limits: dict[str, int] | None = None) -> dict[str, int]:
        """``limits``, or this run's ``max_steps``, ``max_epochs`` and ``patience``."""
        if limits is not None:
            return limits
        t = self.tcfg
        return {"max_steps": t.max_steps, "max_epochs": t.max_epochs, "patience": t.patience}

    def _budget_reached(self, state: TrainState, limits: dict[str, int] | None = None) -> str:
        """Which limit ends the run at ``state`` ("" while none does), under this run's limits or ``limits``;
        re-evaluated after a resume, so a resumed run with a larger budget goes on."""
        t = self._limits(limits)
        if t["max_steps"] and state.step >= t["max_steps"]:
            return "max_steps"
        if t["max_epochs"] and state.epoch > t["max_epochs"]:
            return "max_epochs"
        if t["patience"] and state.bad_validations >= t["patience"]:
            return "patience"
        return ""

    def _stop_message(self, state: TrainState, limits: dict[str, int] | None = None) -> str:
        """What ended the run, with the value of the setting that did (this run's, or ``limits``')."""
        t = self._limits(limits)
        return {"max_steps": f"reached training.max_steps={t['max_steps']}",
                "max_epochs": f"completed training.max_epochs={t['max_epochs']} epochs",
                "patience": f"early stopping: {self.metric} did not improve for training.patience={t['patience']} "
                            f"validations"}.get(state.stop_reason, "stopped")

    @staticmethod
    def _extend_advice(reason: str, state: TrainState) -> str:
        """How to lift the limit ``reason`` that ends a finished run at ``state``."""
        if reason == "max_epochs":
            done = state.epoch - 1
            return f"raise training.max_epochs, e.g. --training.max_epochs=N with N > {done}"
        if reason == "patience":
            return (f"raise training.patience, e.g. --training.patience=N with N > {state.bad_validations} "
                    f"(validations without improvement so far), or turn early stopping off with "
                    f"--training.patience=0")
        return f"raise training.max_steps, e.g. --training.max_steps=N with N > {state.step}"

    def _log_budget(self, state: TrainState, steps_per_epoch: int) -> int | None:
        """State at the start which limit will end the run; return the expected last step (None if unknown)."""
        t, log = self.tcfg, self.log
        by_epochs = t.max_epochs * steps_per_epoch if t.max_epochs else None
        patience = f"; early stopping after training.patience={t.patience} validations without improvement " \
            f"may end it sooner" if t.patience else ""
        per_epoch = f"{steps_per_epoch} steps per epoch"
        if t.max_steps and (by_epochs is None or t.max_steps <= by_epochs):
            also = f"; training.max_epochs={t.max_epochs} (≈ step {by_epochs:,}) comes later" if by_epochs else ""
            log.info(f"budget: training.max_steps={t.max_steps:,} ends the run ({per_epoch}, ≈ "
                     f"{t.max_steps / steps_per_epoch:.1f} epochs){also}{patience}")
            return t.max_steps
        if t.max_steps:
            log.warning(f"budget: training.max_epochs={t.max_epochs} ends the run at ≈ step {by_epochs:,} "
                        f"({per_epoch}), BEFORE training.max_steps={t.max_steps:,}; raise training.max_epochs (or "
                        f"set it to 0) to train for max_steps{patience}")
        else:
            log.info(f"budget: training.max_epochs={t.max_epochs} ends the run at ≈ step {by_epochs:,} "
                     f"({per_epoch}){patience}")
        return by_epochs

    def _schedule(self):
        t = self.tcfg
        if t.schedule == "inverse_sqrt":
            return build_schedule("inverse_sqrt", warmup_steps=max(1, t.warmup_steps))
        if t.schedule == "halving":
            return build_schedule("halving", start_epoch=t.halve_after_epoch)
        if t.schedule == "linear_decay":
            if not t.max_steps:
                raise ValueError("training.schedule linear_decay needs training.max_steps > 0")
            return build_schedule("linear_decay", warmup_steps=t.warmup_steps, total_steps=t.max_steps)
        return build_schedule("constant")

    def _check_finite(self, losses: list[float], global_loss: float, state: TrainState) -> None:
        """Stop at a non-finite loss: ``losses`` of this process's batches in the step, ``global_loss`` their
        sum over every process (the same on each, so every process stops at the same step)."""
        where = f"at step {state.step + 1} (epoch {state.epoch}"
        for j, value in enumerate(losses):
            if not math.isfinite(value):
                raise self._nonfinite(f"loss became {value} {where}, batch {state.batch_index + j + 1})",
                                      saved_by=state.step)
        if not math.isfinite(global_loss):
            raise self._nonfinite(f"loss became {global_loss} on another process {where}, the step's batches "
                                  f"from {state.batch_index + 1})", saved_by=state.step)

    def _nonfinite(self, what: str, saved_by: int) -> DivergedError:
        """The error that stops training at a NaN/inf; ``saved_by``: the latest step ``last`` can hold."""
        last = self.model_dir / LAST
        kept = f"the last good checkpoint {last} (step ≤ {saved_by}) is intact" if last.exists() \
            else "no checkpoint had been written yet"
        return DivergedError(f"{what}; training stopped, {kept}. Try a lower training.lr, "
                             f"training.clip_grad_norm or fp32")

    def _validate_and_save(self, model, optimizer, state: TrainState, manager, metrics) -> dict[str, float]:
        """Validate on rank 0, save last/best checkpoints, update early stopping; all ranks agree on stopping."""
        values: dict[str, float] = {}
        error: TrainingError | None = None
        if self.rank == 0:
            model.eval()
            with torch.no_grad(), self._autocast():
                values = self.task.validate(model)
            model.train()
            for name in dict.fromkeys(("loss", self.metric)):  # never save (over last) weights that score NaN
                if name in values and not math.isfinite(values[name]):
                    error = self._nonfinite(f"validation {name} became {values[name]} at step {state.step} "
                                            f"(epoch {state.step_epoch})", saved_by=state.step - 1)
                    break
            if error is None:
                self._record_validation(model, optimizer, state, manager, metrics, values)
        if self.world > 1:  # every rank learns whether to stop, and whether rank 0 hit an error
            flag = torch.tensor([float(state.finished), float(error is not None)],  # NCCL takes CUDA tensors only
                                device=self.device if self.device.type == "cuda" else "cpu")
            dist.broadcast(flag, src=0)
            state.finished = bool(flag[0].item())
            if flag[1].item() and error is None:
                error = DivergedError("rank 0 stopped training: its validation metrics were not finite")
        if error is not None:
            raise error
        return values

    def _record_validation(self, model, optimizer, state: TrainState, manager, metrics, values: dict) -> None:
        """Early-stopping bookkeeping, logs and the last/best checkpoints of one validation (rank 0)."""
        value = values[self.metric]
        if self._improved(value, state.best_metric):
            state.best_metric, state.bad_validations = value, 0
        else:
            state.bad_validations += 1
        if self.tcfg.patience and state.bad_validations >= self.tcfg.patience and not state.finished:
            self.log.info(f"early stopping: {self.metric} has not improved for {state.bad_validations} validations")
            state.finished, state.stop_reason = True, "patience"
        shown = " ".join(f"{k} {v:.4f}" for k, v in values.items())
        self.log.info(f"validation at step {state.step} (epoch {state.step_epoch}): {shown}")
        metrics.write(state.step, state.step_epoch, "dev", values)
        extra = self._extra(state)
        # the best file first: a run killed between the two resumes from the previous last, whose manager deletes
        # this best file; the other way round, last would hold a best value that no file has
        manager.save_if_best(value, state.step, model_state(model), None, extra)
        if self.tcfg.last_at_validation or state.finished:  # a finished run's last says so to a later --resume
            manager.save_last(model_state(model), optimizer.state_dict(), extra)

    def _plots(self) -> None:
        try:
            from hyperplex.train.plots import plot_metrics, plot_phm_rules

            plot_metrics(self.model_dir / "metrics.csv", self.model_dir / "curves.png")
            plot_phm_rules(self.model, self.model_dir / "phm_rules.png")
        except Exception as err:  # a plotting failure must not lose a finished run
            self.log.warning(f"could not draw plots: {err}")

