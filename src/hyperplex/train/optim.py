"""Optimisers and learning-rate schedules.

Schedules are *stateless*: ``schedule.lr(base_lr, step, epoch)`` is a pure function of the update
and epoch counters, so a resumed run only needs those two counters (saved in the trainer state)
to continue with exactly the same learning rates — there is no scheduler ``state_dict`` to save.

Counting convention (every schedule): ``step`` is the 1-based index of the optimizer update about
to be made (``updates_done + 1``) and ``epoch`` the 1-based number of the epoch in progress
(``epochs_done + 1``). A trainer calls, before each ``optimizer.step()``::

    apply_lr(optimizer, schedule.lr(base_lr, step=updates_done + 1, epoch=epochs_done + 1))
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields

import torch

__all__ = [
    "OPTIMIZERS", "SCHEDULES", "Schedule", "Constant", "InverseSqrt", "Halving", "LinearDecay",
    "build_optimizer", "build_schedule", "apply_lr",
]

OPTIMIZERS = ("adam", "adamw", "sgd")


def build_optimizer(parameters: Iterable, name: str, lr: float, betas: Sequence[float] = (0.9, 0.98),
                    eps: float = 1e-9, weight_decay: float = 0.0, momentum: float = 0.0,
                    fused: bool = False) -> torch.optim.Optimizer:
    """Build a torch optimizer by name.

    Args:
        parameters: tensors to optimise, or param-group dicts (as for any ``torch.optim`` class).
        name: ``"adam"`` (``weight_decay`` is an L2 term added to the gradient), ``"adamw"``
            (decoupled weight decay, Loshchilov & Hutter) or ``"sgd"`` (``betas``/``eps`` unused).
        lr: base learning rate (> 0); a schedule rescales it each step via :func:`apply_lr`.
        betas, eps: Adam(W) moments; the defaults ``(0.9, 0.98)``, ``1e-9`` are the Transformer's
            (Vaswani et al. 2017 §5.3).
        weight_decay: ≥ 0.
        momentum: SGD momentum, ≥ 0 (the thesis uses plain SGD, momentum 0).
        fused: torch's fused implementation (one kernel for the whole update instead of one or a few per
            operation and group of tensors); the same update to rounding. The trainer asks for it on CUDA, where a
            step of a small model is bound by its kernel launches.

    Raises:
        ValueError: unknown name (listing the valid ones), empty parameter list, or a bad value.
    """
    params = list(parameters)
    if not params:
        raise ValueError("build_optimizer: the parameter list is empty (does the model have trainable parameters?)")
    key = name.lower() if isinstance(name, str) else name
    if key not in OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; valid: {', '.join(OPTIMIZERS)}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"optimizer lr must be a finite number > 0, got {lr!r}")
    if weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if momentum < 0:
        raise ValueError(f"momentum must be >= 0, got {momentum!r}")
    if key == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, fused=fused or None)
    if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
        raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
    if eps <= 0:
        raise ValueError(f"eps must be > 0, got {eps!r}")
    cls = torch.optim.Adam if key == "adam" else torch.optim.AdamW
    return cls(params, lr=lr, betas=(betas[0], betas[1]), eps=eps, weight_decay=weight_decay, fused=fused or None)


def apply_lr(optimizer: torch.optim.Optimizer, lr: float) -> float:
    """Set the learning rate of every param group of ``optimizer`` to ``lr``; returns ``lr``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    return lr


def _check_counters(step: int, epoch: int) -> None:
    if step < 1 or epoch < 1:
        raise ValueError(f"schedule counters are 1-based (step = updates done + 1, epoch = epochs done + 1); "
                         f"got step={step}, epoch={epoch}")


@dataclass(frozen=True)
class Schedule:
    """Base class: a stateless learning-rate schedule. Subclasses implement :meth:`multiplier`."""

    name = "base"

    def multiplier(self, step: int, epoch: int) -> float:
        """Multiplier of the base learning rate at 1-based ``step`` and ``epoch``."""
        raise NotImplementedError

    def lr(self, base_lr: float, step: int, epoch: int) -> float:
        """Learning rate for the update number ``step`` (1-based) in epoch number ``epoch`` (1-based)."""
        _check_counters(step, epoch)
        return base_lr * self.multiplier(step, epoch)

    def to_dict(self) -> dict:
        """``{"name": ..., **kwargs}``: ``build_schedule(**d)`` rebuilds the same schedule."""
        return {"name": self.name, **asdict(self)}


@dataclass(frozen=True)
class Constant(Schedule):
    """``lr = base_lr`` throughout."""

    name = "constant"

    def multiplier(self, step: int, epoch: int) -> float:
        return 1.0


@dataclass(frozen=True)
class InverseSqrt(Schedule):
    """Linear warm-up, then inverse-square-root decay, peaking at ``base_lr`` at ``step = warmup_steps``.

    ``lr = base_lr · min(step / w, sqrt(w / step))``. This is Vaswani et al. (2017) eq. 3,
    ``d_model^-0.5 · min(step^-0.5, step · w^-1.5)``, rescaled so the peak is ``base_lr``
    (i.e. ``base_lr = d_model^-0.5 · w^-0.5`` recovers it exactly). ``step`` counts from 1 (the first
    update uses ``base_lr / w``), so this is fairseq's ``inverse_sqrt`` with ``warmup_init_lr = 0`` one
    update ahead (fairseq's first update uses rate 0).
    """

    warmup_steps: int = 4000
    name = "inverse_sqrt"

    def __post_init__(self) -> None:
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 1:
            raise ValueError(f"inverse_sqrt: warmup_steps must be an integer >= 1, got {self.warmup_steps!r}")

    def multiplier(self, step: int, epoch: int) -> float:
        w = self.warmup_steps
        return min(step / w, math.sqrt(w / step))


@dataclass(frozen=True)
class Halving(Schedule):
    """Multiply the rate by ``factor`` once per epoch after epoch ``start_epoch``.

    ``lr = base_lr · factor^max(0, epoch − start_epoch)`` with 1-based ``epoch``. With the defaults
    this is the thesis' SGD schedule (thesis §4.1, after Luong et al. 2015): "train 12 epochs; the
    initial learning rate is 1.0; after 8 epochs, the learning rate is halved after every following
    epoch" — epochs 1–8 use 1.0, epoch 9 uses 0.5, epoch 10 0.25, epoch 12 0.0625.
    """

    start_epoch: int = 8
    factor: float = 0.5
    name = "halving"

    def __post_init__(self) -> None:
        if not isinstance(self.start_epoch, int) or self.start_epoch < 0:
            raise ValueError(f"halving: start_epoch must be an integer >= 0, got {self.start_epoch!r}")
        if not 0.0 < self.factor <= 1.0:
            raise ValueError(f"halving: factor must be in (0, 1], got {self.factor!r}")

    def multiplier(self, step: int, epoch: int) -> float:
        return self.factor ** max(0, epoch - self.start_epoch)


@dataclass(frozen=True)
class LinearDecay(Schedule):
    """Linear warm-up to ``base_lr`` at ``step = warmup_steps``, then linear decay to 0 after ``total_steps``.

    ``lr = base_lr · step / w`` for ``step ≤ w``, else ``base_lr · max(0, (T + 1 − step) / (T + 1 − max(w, 1)))``:
    continuous at the peak, positive for every one of the ``T`` updates, 0 from update ``T + 1`` on.
    ``warmup_steps = 0`` (no warm-up) starts at the peak, like ``warmup_steps = 1``.
    """

    warmup_steps: int = 0
    total_steps: int = 100_000
    name = "linear_decay"

    def __post_init__(self) -> None:
        w, t = self.warmup_steps, self.total_steps
        if not isinstance(w, int) or not isinstance(t, int) or w < 0 or t < 1 or w > t:
            raise ValueError(f"linear_decay: need integers 0 <= warmup_steps <= total_steps and total_steps >= 1, "
                             f"got warmup_steps={w!r}, total_steps={t!r}")

    def multiplier(self, step: int, epoch: int) -> float:
        w, t = self.warmup_steps, self.total_steps
        if step <= w:
            return step / w
        return max(0.0, (t + 1 - step) / (t + 1 - max(w, 1)))


SCHEDULES: dict[str, type[Schedule]] = {
    "constant": Constant, "inverse_sqrt": InverseSqrt, "halving": Halving, "linear_decay": LinearDecay,
}


def _kwargs_of(cls: type[Schedule]) -> list[str]:
    return [f.name for f in fields(cls)]


def build_schedule(name: str, **kwargs) -> Schedule:
    """Build a schedule from :data:`SCHEDULES` by name, e.g. ``build_schedule("inverse_sqrt", warmup_steps=4000)``.

    Raises:
        ValueError: unknown name (listing the valid ones) or unknown/invalid keyword arguments.
    """
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; valid: {', '.join(SCHEDULES)}")
    cls = SCHEDULES[name]
    valid = _kwargs_of(cls)
    unknown = sorted(set(kwargs) - set(valid))
    if unknown:
        raise ValueError(f"schedule {name!r}: unknown argument(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(valid) or '(none)'}")
    return cls(**kwargs)
