"""Every global RNG (Python, NumPy, torch, CUDA) captured and restored, for an exact resume."""
from __future__ import annotations

import random

import numpy as np
import torch


# ---------------------------------------------------------------------------- RNG
def capture_rng() -> dict:
    """Snapshot every global RNG: ``{"python", "numpy", "torch": uint8 Tensor, "cuda": [uint8 Tensor]}``.

    CUDA states are captured only when CUDA is already initialised (this never initialises it).
    """
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(), "cuda": cuda}


def restore_rng(state: dict) -> None:
    """Restore the RNGs captured by :func:`capture_rng` (e.g. ``Checkpoint.rng_state``).

    CUDA states are restored for as many devices as both the snapshot and this machine have.
    """
    missing = {"python", "numpy", "torch"} - set(state)
    if missing:
        raise ValueError(f"restore_rng: RNG state lacks {sorted(missing)}; expected the dict from capture_rng()")
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = list(state.get("cuda") or [])
    if cuda and torch.cuda.is_available():
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)
