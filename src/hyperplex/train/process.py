"""Process setup for training: the torchrun/DDP environment, the device, a writable model folder."""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist

__all__ = ["distributed", "resolve_device", "check_writable"]


def distributed() -> tuple[int, int]:
    """(rank, world size) from the torchrun environment; initialises the process group once."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() and os.environ.get("HYPERPLEX_BACKEND") != "gloo" else "gloo"
        dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size()


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """``auto`` → CUDA (this rank's GPU under torchrun) if available, else CPU; unknown devices are errors."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"training.device: unknown device {name!r} (expected auto, cpu, cuda or cuda:N)") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"training.device is {name!r} but CUDA is not available on this machine")
    return device


def check_writable(model_dir: Path) -> None:
    """Create the model folder and prove it is writable before any work is done."""
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        probe = model_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise OSError(f"model folder {model_dir} is not writable: {err.strerror or err}") from None
