"""Single-file checkpoints in safetensors: loading never unpickles anything.

One ``.safetensors`` file holds every tensor — model weights as ``model.<name>``, optimizer state as
``optimizer.state.<param_idx>.<key>``, the torch RNG state as ``rng.torch`` — and every other item
(optimizer ``param_groups``, the trainer state, Python/NumPy RNG states, the resolved config, …) as
JSON in the safetensors metadata (key ``hyperplex``). Tuples, dicts with non-string keys and NumPy
arrays survive the round trip exactly; tensors nested anywhere in ``extra`` are stored as tensors.

Integrity: the metadata holds a SHA-256 of every tensor (name, dtype, shape and bytes) and one of
the JSON payload, so a truncated file, a flipped byte in the header or data, a plain safetensors
file or a missing file all raise :class:`CheckpointError` naming the path and the problem.

Atomicity: every file is written to a temporary file in the same folder, fsynced, then moved into
place with ``os.replace`` (and the folder fsynced), so a kill at any instant leaves either the old
or the new complete file.

Tied weights: tensors that share memory are stored once and restored as one tensor under every
name (``load_state_dict`` then fills the tied parameter as usual); overlapping but different views
are stored as separate copies.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from hyperplex import fileio
from hyperplex.fileio import WriteError
from hyperplex.train.checkpoint.rng import capture_rng
from hyperplex.train.protocols import CustomCheckpointState

__all__ = [
    "CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "checkpoint_info", "save_model_weights",
    "load_model_weights", "load_into", "model_state", "atomic_write",
]

log = logging.getLogger(__name__)

FORMAT = "hyperplex-checkpoint"
FORMAT_VERSION = 1
_RESERVED = ("__tensor__", "__ndarray__", "__tuple__", "__items__")


class CheckpointError(ValueError):
    """A checkpoint cannot be written or read; the message names the file and what is wrong."""


@dataclass
class Checkpoint:
    """A loaded checkpoint.

    Attributes:
        model_state: ``{name: Tensor}`` for ``model.load_state_dict``; tied names share one tensor.
        optimizer_state: a ``state_dict()`` for ``optimizer.load_state_dict``, or ``None``.
        extra: the ``extra`` dict given to :func:`save_checkpoint` (JSON values, tuples, tensors, arrays).
        rng_state: the :func:`capture_rng` dict saved with it (pass to :func:`restore_rng`), or ``None``.
        path: the file it was read from.
        kind: ``"checkpoint"`` (from :func:`save_checkpoint`) or ``"weights"`` (:func:`save_model_weights`).
    """

    model_state: dict[str, Tensor]
    optimizer_state: dict | None
    extra: dict
    rng_state: dict | None
    path: str = ""
    kind: str = "checkpoint"


# ---------------------------------------------------------------------------- atomic files
def atomic_write(path, write: Callable[[str], object]) -> None:
    """:func:`hyperplex.fileio.atomic_write`, raising :class:`CheckpointError` (also for safetensors errors)."""
    try:
        fileio.atomic_write(path, write)
    except (WriteError, SafetensorError) as e:
        if isinstance(e, WriteError):
            raise CheckpointError(str(e)) from e
        raise CheckpointError(f"{os.fspath(path)}: cannot write ({e}); the previous file, if any, is unchanged") from e


# ---------------------------------------------------------------------------- encoding
class _Encoder:
    """Turns nested Python values into JSON, collecting tensors (stored once per shared storage)."""

    def __init__(self) -> None:
        self.tensors: dict[str, Tensor] = {}
        self._views: dict[tuple, str] = {}  # exact view → stored name (tied weights)
        self._storages: set[tuple] = set()

    def tensor(self, name: str, t: Tensor) -> str:
        t = t.detach()
        storage = (t.device, t.untyped_storage().data_ptr()) if t.numel() else None
        view = (*storage, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype) if storage else None
        if view is not None and view in self._views:
            return self._views[view]  # the same tensor under another name: store once
        if storage in self._storages:
            t = t.clone()  # a different view of shared memory: safetensors refuses aliasing, store a copy
        base, k = name, 2
        while name in self.tensors:
            name, k = f"{base}#{k}", k + 1
        self.tensors[name] = t.to("cpu").contiguous()
        if storage is not None and view is not None:
            self._views[view] = name
            self._storages.add(storage)
        return name

    def encode(self, obj, name: str, where: str):
        if obj is None or isinstance(obj, (bool, int, float, str)):
            return obj
        if isinstance(obj, Tensor):
            return {"__tensor__": self.tensor(name, obj)}
        if isinstance(obj, np.ndarray):
            if obj.dtype.hasobject:
                raise CheckpointError(f"{where}: cannot store a NumPy array of Python objects")
            raw = torch.from_numpy(np.ascontiguousarray(obj).reshape(-1).view(np.uint8).copy())
            return {"__ndarray__": self.tensor(name, raw), "dtype": obj.dtype.str, "shape": list(obj.shape)}
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, tuple):
            return {"__tuple__": [self.encode(v, f"{name}.{i}", f"{where}[{i}]") for i, v in enumerate(obj)]}
        if isinstance(obj, list):
            return [self.encode(v, f"{name}.{i}", f"{where}[{i}]") for i, v in enumerate(obj)]
        if isinstance(obj, dict):
            if all(isinstance(k, str) and k not in _RESERVED for k in obj):
                return {k: self.encode(v, f"{name}.{k}", f"{where}[{k!r}]") for k, v in obj.items()}
            return {"__items__": [[self.encode(k, f"{name}.key", f"{where} key"),
                                   self.encode(v, f"{name}.{k}", f"{where}[{k!r}]")] for k, v in obj.items()]}
        raise CheckpointError(f"{where}: cannot store a {type(obj).__name__} in a checkpoint "
                              f"(allowed: None, bool, int, float, str, list, tuple, dict, Tensor, NumPy array)")


def _decode(obj, tensors: dict[str, Tensor]):
    if isinstance(obj, list):
        return [_decode(v, tensors) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]]
    if "__ndarray__" in obj:
        raw = tensors[obj["__ndarray__"]].cpu().numpy()
        return np.frombuffer(raw.tobytes(), dtype=np.dtype(obj["dtype"])).reshape(obj["shape"]).copy()
    if "__tuple__" in obj:
        return tuple(_decode(v, tensors) for v in obj["__tuple__"])
    if "__items__" in obj:
        return {_decode(k, tensors): _decode(v, tensors) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors) for k, v in obj.items()}


def _digest(t: Tensor) -> str:
    h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().data)
    return h.hexdigest()


# ---------------------------------------------------------------------------- save / load
def _save(path, kind: str, model_state: dict, optimizer_state: dict | None, extra: dict | None,
          rng: bool, manager: dict | None = None) -> str:
    path = os.fspath(path)
    extra = {} if extra is None else extra
    if not isinstance(extra, dict):
        raise CheckpointError(f"{path}: extra must be a dict, got {type(extra).__name__}")
    enc = _Encoder()
    model = {}
    for key, value in model_state.items():
        if not isinstance(value, Tensor):
            raise CheckpointError(f"{path}: model_state[{key!r}] is a {type(value).__name__}, expected a Tensor")
        model[key] = enc.tensor(f"model.{key}", value)
    payload = {
        "format_version": FORMAT_VERSION, "kind": kind, "model": model,
        "optimizer": None if optimizer_state is None else enc.encode(optimizer_state, "optimizer", "optimizer_state"),
        "extra": enc.encode(extra, "extra", "extra"),
        "rng": enc.encode(capture_rng(), "rng", "rng") if rng else None,
        "manager": manager,
    }
    payload["sha256"] = {name: _digest(t) for name, t in enc.tensors.items()}
    text = json.dumps(payload, separators=(",", ":"))
    metadata = {"format": FORMAT, "hyperplex": text, "hyperplex_sha256": hashlib.sha256(text.encode()).hexdigest()}
    atomic_write(path, lambda tmp: save_file(enc.tensors, tmp, metadata=metadata))
    return path


def save_checkpoint(path, model_state: dict[str, Tensor], optimizer_state: dict | None = None,
                    extra: dict | None = None, rng: bool = True) -> str:
    """Write a training checkpoint atomically to ``path`` (a ``.safetensors`` file); returns the path.

    Args:
        model_state: ``model.state_dict()`` (tensors on any device; saved on CPU).
        optimizer_state: ``optimizer.state_dict()`` or ``None``.
        extra: trainer state, config, … — JSON values, tuples, dicts (any hashable keys), tensors and
            NumPy arrays, nested freely (e.g. ``{"step": 10, "config": {...}, "sampler": gen.get_state()}``).
        rng: also save the global Python, NumPy, torch (and initialised CUDA) RNG states.

    Raises:
        CheckpointError: an unstorable value (naming where it is) or the file cannot be written.
    """
    return _save(path, "checkpoint", model_state, optimizer_state, extra, rng)


def save_model_weights(path, state: dict[str, Tensor], metadata: dict | None = None) -> str:
    """Write model weights only (e.g. averaged ones) atomically; ``metadata`` is stored as ``extra``."""
    return _save(path, "weights", state, None, metadata, rng=False)


def _read_header(path) -> tuple[str, dict]:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise CheckpointError(f"{path}: no such checkpoint file")
    if os.path.isdir(path):
        raise CheckpointError(f"{path}: is a directory, expected a .safetensors checkpoint file")
    if not os.path.isfile(path):  # a FIFO or device file would block or never end
        raise CheckpointError(f"{path}: not a regular file (a FIFO or device?), "
                              "expected a .safetensors checkpoint file")
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            metadata = f.metadata() or {}
    except Exception as e:  # SafetensorError, OSError: truncated, corrupted or not safetensors
        raise CheckpointError(f"{path}: not a readable safetensors file, it is truncated, corrupted or of another "
                              f"format ({e})") from e
    if metadata.get("format") != FORMAT or "hyperplex" not in metadata:
        raise CheckpointError(f"{path}: not a hyperplex checkpoint (safetensors metadata 'format' is "
                              f"{metadata.get('format')!r}, expected {FORMAT!r})")
    text = metadata["hyperplex"]
    if hashlib.sha256(text.encode()).hexdigest() != metadata.get("hyperplex_sha256"):
        raise CheckpointError(f"{path}: corrupted checkpoint: the metadata checksum does not match")
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: corrupted checkpoint metadata ({e})") from e
    except RecursionError:
        raise CheckpointError(f"{path}: checkpoint metadata nested too deeply; not written by hyperplex") from None
    if not isinstance(payload, dict):
        raise CheckpointError(f"{path}: checkpoint metadata is not a JSON object; not written by hyperplex")
    if payload.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format version {payload.get('format_version')} is newer than "
                              f"this hyperplex supports ({FORMAT_VERSION}); upgrade hyperplex")
    return path, payload


def _read_tensors(path: str, payload: dict, names, map_location) -> dict[str, Tensor]:
    tensors = {}
    try:
        with safe_open(path, framework="pt", device="cpu") as f:
            present = set(f.keys())
            for name in names:
                if name not in present:
                    raise CheckpointError(f"{path}: corrupted checkpoint: tensor {name!r} is missing")
                tensors[name] = f.get_tensor(name)
    except CheckpointError:
        raise
    except Exception as e:
        raise CheckpointError(f"{path}: cannot read tensors, the file is corrupted ({e})") from e
    for name, t in tensors.items():
        if _digest(t) != payload["sha256"].get(name):
            raise CheckpointError(f"{path}: corrupted checkpoint: checksum mismatch for tensor {name!r}")
    if map_location is not None and str(map_location) != "cpu":
        tensors = {name: t.to(map_location) for name, t in tensors.items()}
    return tensors


def load_checkpoint(path, map_location="cpu") -> Checkpoint:
    """Read and verify a file written by :func:`save_checkpoint` or :func:`save_model_weights`.

    Args:
        map_location: device for the tensors (``"cpu"``, ``"cuda:0"``, a ``torch.device``).

    Raises:
        CheckpointError: missing file, not a hyperplex checkpoint, truncated or corrupted (checksum).
    """
    path, payload = _read_header(path)
    tensors = _read_tensors(path, payload, list(payload["sha256"]), map_location)
    try:
        model = {key: tensors[name] for key, name in payload["model"].items()}
        optimizer = _decode(payload["optimizer"], tensors)
        extra = _decode(payload["extra"], tensors)
        rng = _decode(payload["rng"], tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"{path}: corrupted checkpoint structure ({e!r})") from e
    return Checkpoint(model, optimizer, extra, rng, path, payload["kind"])


def load_model_weights(path, map_location="cpu") -> dict[str, Tensor]:
    """Only the model weights of a checkpoint or weights file (other tensors are not read)."""
    path, payload = _read_header(path)
    tensors = _read_tensors(path, payload, sorted(set(payload["model"].values())), map_location)
    return {key: tensors[name] for key, name in payload["model"].items()}


def checkpoint_info(path) -> dict:
    """Header-only summary, without reading tensors: ``{"kind", "model_keys", "has_optimizer", "extra", "manager"}``.

    ``extra`` is decoded with tensors and arrays replaced by ``None``.
    """
    path, payload = _read_header(path)
    none: dict[str, Any] = dict.fromkeys(payload["sha256"])

    def strip(obj):  # arrays need their bytes; report them as None too
        if isinstance(obj, dict) and "__ndarray__" in obj:
            return {"__tensor__": obj["__ndarray__"]}
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()}
        return [strip(v) for v in obj] if isinstance(obj, list) else obj

    return {"kind": payload["kind"], "model_keys": list(payload["model"]),
            "has_optimizer": payload["optimizer"] is not None,
            "extra": _decode(strip(payload["extra"]), none), "manager": payload.get("manager")}


# ---------------------------------------------------------------------------- loading into a model
_MODEL_KEYS_SHOWN = ("architecture", "d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers",
                     "hidden_size", "num_layers", "embedding_size", "linear")


def model_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """What a checkpoint stores of ``model``: ``model.checkpoint_state_dict()`` where the model has the
    :class:`~hyperplex.train.protocols.CustomCheckpointState` hook (a frozen pretrained base with an adapter
    saves only the trainable tensors and a signature of the base,
    :class:`~hyperplex.models.pretrained_classifier.PretrainedClassifier`), else ``model.state_dict()``. The model's
    ``load_checkpoint_state_dict(state)`` is then the inverse that :func:`load_into` calls."""
    return model.checkpoint_state_dict() if isinstance(model, CustomCheckpointState) else model.state_dict()


def load_into(model: torch.nn.Module, state: dict[str, Tensor], path, expected_from: str = "its config") -> None:
    """``model.load_state_dict(state)`` (or the model's ``load_checkpoint_state_dict``, :func:`model_state`)
    with one error line that says what does not fit: how many tensors differ in shape (the first three
    with both shapes), missing and unexpected names, and the model section the checkpoint ``path`` was
    saved with (when it records one)."""
    own = model_state(model)
    shapes = [(k, tuple(state[k].shape), tuple(v.shape)) for k, v in own.items() if k in state
              and tuple(state[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if not (shapes or missing or unexpected):
        if not isinstance(model, CustomCheckpointState):
            model.load_state_dict(state)
            return
        try:
            model.load_checkpoint_state_dict(state)
        except ValueError as err:  # e.g. an adapter trained on another base model
            raise CheckpointError(f"{os.fspath(path)}: {err}") from None
        return
    parts = []
    if shapes:
        shown = ", ".join(f"{k}: checkpoint {a} vs model {b}" for k, a, b in shapes[:3])
        parts.append(f"{len(shapes)} tensor(s) differ in shape ({shown}{', …' if len(shapes) > 3 else ''})")
    if missing:
        parts.append(f"{len(missing)} missing ({', '.join(missing[:3])}{', …' if len(missing) > 3 else ''})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({', '.join(unexpected[:3])}"
                     f"{', …' if len(unexpected) > 3 else ''})")
    saved = ""
    try:
        config = checkpoint_info(path)["extra"].get("config") or {}
        model_section = config.get("model") or {}
        saved_model = {k: model_section[k] for k in _MODEL_KEYS_SHOWN if k in model_section}
        if saved_model:
            saved = f"; the checkpoint was saved with model: {json.dumps(saved_model, sort_keys=False)}"
    except (CheckpointError, AttributeError, KeyError, TypeError):
        pass
    raise CheckpointError(f"{os.fspath(path)} does not fit the model built from {expected_from}: "
                          f"{'; '.join(parts)}{saved}")


