"""Ctrl-C and SIGTERM during training: finish the step, save a resumable checkpoint, stop.

The first SIGINT/SIGTERM is remembered by :class:`InterruptFlag`; the trainer checks it at the end
of every optimiser step, writes ``last.safetensors`` and raises :class:`TrainingInterrupted`, which
the CLI turns into exit code ``128 + signal`` (130 / 143). A second signal stops at once.
"""

from __future__ import annotations

import signal
import sys
import threading

import torch
import torch.distributed as dist

__all__ = ["TrainingInterrupted", "InterruptFlag"]


class TrainingInterrupted(Exception):
    """SIGINT/SIGTERM stopped training. ``saved``: a resumable ``last.safetensors`` was written first.

    The CLI exits with ``128 + signal_number`` (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, signal_number: int, saved: bool) -> None:
        super().__init__(message)
        self.signal_number, self.saved = signal_number, saved


class InterruptFlag:
    """SIGINT/SIGTERM during training: the first one is remembered, and the loop saves a resumable
    checkpoint at the end of the current step and stops; a second one stops at once (nothing saved,
    the previous ``last`` intact). Handlers are installed only in the main thread and restored after."""

    def __init__(self) -> None:
        self.signal_number = 0
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signal_number: int, frame) -> None:
        if self.signal_number:
            raise TrainingInterrupted(f"interrupted again by {signal.Signals(signal_number).name}: stopped at once "
                                      f"without saving (the last checkpoint written, if any, is intact)",
                                      signal_number, saved=False)
        self.signal_number = signal_number
        print(f"\n{signal.Signals(signal_number).name}: saving a resumable checkpoint at the end of this step "
              f"(again to stop at once)", file=sys.stderr, flush=True)

    def pending(self, world: int = 1, device: torch.device | None = None) -> bool:
        """Whether any process got a signal (under DDP every rank must stop at the same step)."""
        if world > 1:
            flag = torch.tensor([self.signal_number], dtype=torch.int64,
                                device=device if device is not None and device.type == "cuda" else "cpu")
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
            self.signal_number = int(flag.item())
        return bool(self.signal_number)
