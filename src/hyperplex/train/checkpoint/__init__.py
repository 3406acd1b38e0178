"""Checkpoints: one safetensors file per checkpoint, never unpickled, written atomically.

- :mod:`~hyperplex.train.checkpoint.format`: the file format (tensors + JSON header, SHA-256 per
  tensor), :func:`save_checkpoint` / :func:`load_checkpoint`, weights-only files, :func:`load_into`, and
  :func:`model_state` (what of a model a checkpoint holds: a model may save only its trainable part).
- :mod:`~hyperplex.train.checkpoint.rng`: every global RNG captured and restored (exact resume).
- :mod:`~hyperplex.train.checkpoint.averaging`: :func:`average_checkpoints`, and :func:`write_average` (files or
  folders in, one weights file out).
- :mod:`~hyperplex.train.checkpoint.manager`: :class:`CheckpointManager` (``last``, best-k, index,
  crash recovery) and the file names :data:`LAST` / :data:`BEST`.
"""

from hyperplex.train.checkpoint.averaging import average_checkpoints, write_average
from hyperplex.train.checkpoint.format import (
    Checkpoint,
    CheckpointError,
    atomic_write,
    checkpoint_info,
    load_checkpoint,
    load_into,
    load_model_weights,
    model_state,
    save_checkpoint,
    save_model_weights,
)
from hyperplex.train.checkpoint.manager import BEST, LAST, CheckpointManager
from hyperplex.train.checkpoint.rng import capture_rng, restore_rng

__all__ = [
    "CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "checkpoint_info", "save_model_weights",
    "load_model_weights", "load_into", "capture_rng", "restore_rng", "CheckpointManager", "average_checkpoints",
    "write_average",
    "atomic_write", "model_state", "LAST", "BEST",
]
