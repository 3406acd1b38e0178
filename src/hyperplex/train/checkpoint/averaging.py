"""Checkpoint averaging (Vaswani et al. 2017 §6.1)."""
from __future__ import annotations

import os
from collections.abc import Sequence

from torch import Tensor


from hyperplex.train.checkpoint.format import CheckpointError, load_model_weights

# ---------------------------------------------------------------------------- averaging
def average_checkpoints(paths: Sequence) -> dict[str, Tensor]:
    """Element-wise mean of the model weights of several checkpoints (Vaswani et al. 2017 §6.1).

    Floating-point tensors are averaged in float64 and cast back; integer/bool tensors (e.g.
    BatchNorm's ``num_batches_tracked``) are taken from the last path. Tied weights stay tied.

    Raises:
        CheckpointError: no paths, an unreadable file, or keys/shapes/dtypes that differ (naming the key).
    """
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise CheckpointError("average_checkpoints: no checkpoint paths given")
    first = load_model_weights(paths[0])
    sums = {k: t.double() if t.is_floating_point() else t for k, t in first.items()}
    for path in paths[1:]:
        state = load_model_weights(path)
        for k in set(first) ^ set(state):
            where, other = (path, paths[0]) if k in first else (paths[0], path)
            raise CheckpointError(f"{where}: key {k!r} is missing (present in {other}); cannot average")
        for k, t in state.items():
            if t.shape != first[k].shape or t.dtype != first[k].dtype:
                raise CheckpointError(f"{path}: key {k!r} has shape {tuple(t.shape)} dtype {t.dtype}, but {paths[0]} "
                                      f"has {tuple(first[k].shape)} {first[k].dtype}; cannot average")
            sums[k] = sums[k] + t.double() if t.is_floating_point() else t
    out, seen = {}, {}
    for k, t in first.items():
        if id(t) in seen:  # tied in the source: keep the same tensor under both names
            out[k] = out[seen[id(t)]]
            continue
        seen[id(t)] = k
        out[k] = (sums[k] / len(paths)).to(t.dtype) if t.is_floating_point() else sums[k].clone()
    return out
