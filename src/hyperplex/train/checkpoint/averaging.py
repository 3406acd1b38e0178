"""Checkpoint averaging (Vaswani et al. 2017 §6.1): :func:`average_checkpoints` (the mean weights) and
:func:`write_average` (``hyperplex average``: files or folders in, one weights file out)."""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from torch import Tensor

from hyperplex.train.checkpoint.format import CheckpointError, load_model_weights, save_model_weights
from hyperplex.train.checkpoint.manager import BEST, LAST, CheckpointManager


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
    out: dict[str, Tensor] = {}
    seen: dict[int, str] = {}
    for k, t in first.items():
        if id(t) in seen:  # tied in the source: keep the same tensor under both names
            out[k] = out[seen[id(t)]]
            continue
        seen[id(t)] = k
        out[k] = (sums[k] / len(paths)).to(t.dtype) if t.is_floating_point() else sums[k].clone()
    return out


# ---------------------------------------------------------------------------- files in, one file out
def write_average(inputs: Sequence[str | Path], output: str | Path) -> Path:
    """Average the weights of checkpoints (files, or every ``best-*.safetensors`` of a folder) into
    ``output`` (a folder: ``output/averaged.safetensors``), a weights file recording ``averaged_from``;
    returns its path. Before any work, the output is refused (:class:`hyperplex.guards.OutputError`) if it is an
    input, not a regular file, or another file of a model folder than an average (``averaged*.safetensors`` or
    one this function wrote), and (``ValueError``) if it is a checkpoint a training run manages."""
    from hyperplex.guards import check_outputs

    paths = _checkpoints_to_average(inputs)
    out = Path(output)
    if out.is_dir():
        out = out / "averaged.safetensors"
    check_outputs({"-o": out}, [*inputs, *paths], owns=("averaged*.safetensors", *_written_here(out)))
    _check_average_output(out, paths)
    state = average_checkpoints(paths)
    save_model_weights(out, state, {"averaged_from": json.dumps([str(p) for p in paths])})
    return out


def _checkpoints_to_average(inputs: Sequence[str | Path]) -> list[Path]:
    """The files named, a folder standing for its ``best-*.safetensors`` (sorted)."""
    paths: list[Path] = []
    for item in inputs:
        p = Path(item)
        if p.is_dir():
            found = sorted(p.glob("best-*.safetensors"))
            if not found:
                raise FileNotFoundError(f"{p}: no best-*.safetensors checkpoints to average")
            paths += found
        elif p.is_file():
            paths.append(p)
        else:
            raise FileNotFoundError(f"checkpoint not found: {p}")
    return paths


def _written_here(path: Path) -> tuple[str, ...]:
    """``(name,)`` when ``path`` is a weights file :func:`write_average` wrote (it records ``averaged_from``), so
    writing it again replaces only an average."""
    if not path.is_file():  # a FIFO would block the read; the guard names it
        return ()
    try:
        from safetensors import safe_open

        with safe_open(os.fspath(path), framework="pt") as handle:
            header = json.loads((handle.metadata() or {}).get("hyperplex", "{}"))
        return (path.name,) if "averaged_from" in (header.get("extra") or {}) else ()
    except Exception:  # noqa: BLE001 - not a safetensors file: not one of its outputs
        return ()


def _check_average_output(out: Path, paths: list[Path]) -> None:
    """The averaged file may not replace one of its inputs, nor a checkpoint a training run's index names
    (``best``/``last``/``best-N``, listed in ``checkpoints.json``): the index would describe another file."""
    target = os.path.realpath(out)
    if any(os.path.realpath(p) == target for p in paths):
        raise ValueError(f"-o {out}: is one of the checkpoints being averaged; write the average to another file")
    index = out.parent / CheckpointManager.INDEX
    if index.is_file() and (out.name in (BEST, LAST)
                            or (out.name.startswith("best-") and out.suffix == ".safetensors")):
        raise ValueError(f"-o {out}: a checkpoint the training run in {out.parent} manages ({index.name}); write the "
                         f"average to another file, e.g. {out.parent / 'averaged.safetensors'}")
