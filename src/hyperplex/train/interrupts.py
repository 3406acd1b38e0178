"""Ctrl-C and SIGTERM during training: finish the step, save a resumable checkpoint, stop.

The first SIGINT/SIGTERM is remembered by :class:`InterruptFlag`; the trainer checks it at the end
of every optimiser step, writes ``last.safetensors`` and raises :class:`TrainingInterrupted`, which
the CLI turns into exit code ``128 + signal`` (130 / 143). A second signal stops at once.

Under DDP every process must stop at the same step. Each process's signal travels as a vote in the
all-reduce that already sums the step's losses (one collective and one device synchronisation a step,
not a second pair for the flag); every process reads the same sums, so all stop together.
"""

from __future__ import annotations

import signal
import sys
import threading
from typing import Any

__all__ = ["TrainingInterrupted", "InterruptFlag"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)  # the signals handled, in the order of the vote entries


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
        self.signal_number = 0  # the first signal this process got (0: none)
        self._voted = 0  # this process's signal when it last voted
        self.agreed = 0  # the signal every process stops for (DDP, set by agree)
        self._previous: dict[int, Any] = {}  # signal -> the handler signal.getsignal gave

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

    def votes(self) -> list[float]:
        """This process's signal as one entry per handled signal (1 for the one it got, if any), to be
        summed over the processes with the step's losses and handed back to :meth:`agree`."""
        self._voted = self.signal_number
        return [float(self._voted == sig) for sig in _SIGNALS]

    def agree(self, counts: list[float]) -> None:
        """The votes of :meth:`votes` summed over every process: if any process got a signal, every
        process stops at this step, named by its own signal if it voted one, else by the signal most
        processes got. A signal that arrives after the vote is voted at the next step."""
        if not any(counts):
            return
        self.agreed = self._voted or max(zip(counts, _SIGNALS))[1]
        self.signal_number = self.signal_number or self.agreed

    def pending(self, world: int = 1) -> bool:
        """Whether training should save and stop at this step boundary. One process: whether it got a
        signal. Under DDP: whether the last :meth:`agree` found one on any process, so that a signal
        arriving between the vote and this check cannot stop one process a step before the others."""
        return bool(self.agreed if world > 1 else self.signal_number)
