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
import math
import os
import random
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from torch import Tensor

from hyperplex import fileio
from hyperplex.fileio import WriteError

__all__ = [
    "CheckpointError", "Checkpoint", "save_checkpoint", "load_checkpoint", "checkpoint_info",
    "save_model_weights", "load_model_weights", "capture_rng", "restore_rng", "CheckpointManager",
    "average_checkpoints", "atomic_write", "load_into",
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
def atomic_write(path, write: Callable[[str], None]) -> None:
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
        if view in self._views:
            return self._views[view]  # the same tensor under another name: store once
        if storage in self._storages:
            t = t.clone()  # a different view of shared memory: safetensors refuses aliasing, store a copy
        base, k = name, 2
        while name in self.tensors:
            name, k = f"{base}#{k}", k + 1
        self.tensors[name] = t.to("cpu").contiguous()
        if storage:
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
    h.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return h.hexdigest()


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
        raise CheckpointError(f"restore_rng: RNG state lacks {sorted(missing)}; expected the dict from capture_rng()")
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(tuple(state["numpy"]))
    torch.set_rng_state(state["torch"].cpu())
    cuda = list(state.get("cuda") or [])
    if cuda and torch.cuda.is_available():
        for i, s in enumerate(cuda[: torch.cuda.device_count()]):
            torch.cuda.set_rng_state(s.cpu(), i)


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
    none = {name: None for name in payload["sha256"]}

    def strip(obj):  # arrays need their bytes; report them as None too
        if isinstance(obj, dict) and "__ndarray__" in obj:
            return {"__tensor__": obj["__ndarray__"]}
        if isinstance(obj, dict):
            return {k: strip(v) for k, v in obj.items()}
        return [strip(v) for v in obj] if isinstance(obj, list) else obj

    return {"kind": payload["kind"], "model_keys": list(payload["model"]), "has_optimizer": payload["optimizer"] is not None,
            "extra": _decode(strip(payload["extra"]), none), "manager": payload.get("manager")}


# ---------------------------------------------------------------------------- loading into a model
_MODEL_KEYS_SHOWN = ("architecture", "d_model", "num_heads", "d_ff", "encoder_layers", "decoder_layers",
                     "hidden_size", "num_layers", "embedding_size", "linear")


def load_into(model: torch.nn.Module, state: dict[str, Tensor], path, expected_from: str = "its config") -> None:
    """``model.load_state_dict(state)`` with one error line that says what does not fit: how many tensors
    differ in shape (the first three with both shapes), missing and unexpected names, and the model
    section the checkpoint ``path`` was saved with (when it records one)."""
    own = model.state_dict()
    shapes = [(k, tuple(state[k].shape), tuple(v.shape)) for k, v in own.items() if k in state
              and tuple(state[k].shape) != tuple(v.shape)]
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    if not (shapes or missing or unexpected):
        model.load_state_dict(state)
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
        shown = {k: model_section[k] for k in _MODEL_KEYS_SHOWN if k in model_section}
        if shown:
            saved = f"; the checkpoint was saved with model: {json.dumps(shown, sort_keys=False)}"
    except (CheckpointError, AttributeError, KeyError, TypeError):
        pass
    raise CheckpointError(f"{os.fspath(path)} does not fit the model built from {expected_from}: "
                          f"{'; '.join(parts)}{saved}")


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


# ---------------------------------------------------------------------------- manager
_BEST_PATTERN = re.compile(r"^best-(\d+)\.safetensors$")


class CheckpointManager:
    """Keeps ``last.safetensors`` and the best ``keep_best`` checkpoints of a model folder.

    Files in ``model_dir``: ``last.safetensors``; ``best-<step>.safetensors`` for the ``keep_best``
    best validation scores; ``best.safetensors``, a hard link (a copy where links are unsupported)
    to the single best; ``checkpoints.json``, the index (best first). Ties keep the earlier step.

    Every file is written atomically, and a file that drops out of the top ``k`` is deleted only
    after the new one and the index are safely on disk. Each best file also records its step and
    metric in its own header, so on start-up the manager rebuilds a missing or stale index from the
    files (after a crash between steps) and removes leftover temporary files.

    Args:
        model_dir: the model folder (created if missing).
        keep_best: how many best checkpoints to keep, ≥ 1.
        metric_mode: ``"max"`` (BLEU, accuracy) or ``"min"`` (loss, perplexity).
        metric_name: optional; recorded in the index, and a restart with a different name or mode
            raises :class:`CheckpointError` instead of mixing rankings.
    """

    INDEX = "checkpoints.json"
    LAST = "last.safetensors"
    BEST = "best.safetensors"

    def __init__(self, model_dir, keep_best: int = 1, metric_mode: str = "max", metric_name: str | None = None) -> None:
        if not isinstance(keep_best, int) or keep_best < 1:
            raise ValueError(f"keep_best must be an integer >= 1, got {keep_best!r}")
        if metric_mode not in ("max", "min"):
            raise ValueError(f"metric_mode must be 'max' or 'min', got {metric_mode!r}")
        self.model_dir, self.keep_best = os.fspath(model_dir), keep_best
        self.metric_mode, self.metric_name = metric_mode, metric_name
        try:
            os.makedirs(self.model_dir, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"{self.model_dir}: cannot create the model folder ({e.strerror or e})") from e
        self.entries: list[dict] = []  # [{"step", "metric", "file"}], best first
        self._recover()

    # ------------------------------------------------------------------ paths and ranking
    def path(self, name: str) -> str:
        """Absolute path of a file in the model folder."""
        return os.path.join(self.model_dir, name)

    @property
    def last_path(self) -> str:
        return self.path(self.LAST)

    @property
    def best_path(self) -> str:
        return self.path(self.BEST)

    @property
    def best_metric(self) -> float | None:
        """The best metric value kept so far, or ``None``."""
        return self.entries[0]["metric"] if self.entries else None

    def _key(self, entry: dict) -> tuple:
        return (-entry["metric"] if self.metric_mode == "max" else entry["metric"], entry["step"])

    def is_better(self, value: float, than: float | None) -> bool:
        """Whether ``value`` is strictly better than ``than`` (``None`` = nothing yet) under ``metric_mode``."""
        if than is None:
            return True
        return value > than if self.metric_mode == "max" else value < than

    # ------------------------------------------------------------------ saving
    def save_last(self, model_state: dict[str, Tensor], optimizer_state: dict | None = None,
                  extra: dict | None = None, rng: bool = True) -> str:
        """Atomically (over)write ``last.safetensors``; arguments as :func:`save_checkpoint`. Returns its path."""
        return save_checkpoint(self.last_path, model_state, optimizer_state, extra, rng)

    def save_if_best(self, metric_value: float, step: int, model_state: dict[str, Tensor],
                     optimizer_state: dict | None = None, extra: dict | None = None, rng: bool = True) -> str | None:
        """Save ``best-<step>.safetensors`` if ``metric_value`` ranks in the top ``keep_best``.

        Returns the new file's path, or ``None`` when it does not rank (nothing is written).
        Raises ``ValueError`` for a NaN or infinite metric.
        """
        metric_value = float(metric_value)
        if not math.isfinite(metric_value):
            raise ValueError(f"save_if_best: the validation metric is {metric_value}; refusing to rank it")
        entry = {"step": int(step), "metric": metric_value, "file": f"best-{int(step)}.safetensors"}
        ranked = sorted([e for e in self.entries if e["step"] != entry["step"]] + [entry], key=self._key)
        kept = ranked[: self.keep_best]
        if entry not in kept:
            return None
        info = {"step": entry["step"], "metric": metric_value, "metric_mode": self.metric_mode,
                "metric_name": self.metric_name}
        _save(self.path(entry["file"]), "checkpoint", model_state, optimizer_state, extra, rng, manager=info)
        self._commit(kept)
        return self.path(entry["file"])

    def _commit(self, kept: list[dict]) -> None:
        """Point best.safetensors at the top entry, write the index, then delete what dropped out."""
        dropped = [e for e in self.entries if e["file"] not in {k["file"] for k in kept}]
        if kept and not self._is_linked(kept[0]):
            self._link_best(kept[0])
        self.entries = kept
        self._write_index()
        for e in dropped:  # only now: the new file and the index are on disk
            try:
                os.unlink(self.path(e["file"]))
            except FileNotFoundError:
                pass

    def _is_linked(self, entry: dict) -> bool:
        try:
            return os.path.samefile(self.best_path, self.path(entry["file"]))
        except OSError:
            return False

    def _link_best(self, entry: dict) -> None:
        source = self.path(entry["file"])

        def write(tmp: str) -> None:
            try:
                os.link(source, tmp)
            except OSError:  # no hard links on this file system: copy
                shutil.copyfile(source, tmp)

        atomic_write(self.best_path, write)

    def _write_index(self) -> None:
        index = {"format": "hyperplex-checkpoint-index", "version": 1, "metric_mode": self.metric_mode,
                 "metric_name": self.metric_name, "keep_best": self.keep_best, "best": self.entries}

        def write(tmp: str) -> None:
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump(index, f, indent=1)

        atomic_write(self.path(self.INDEX), write)

    # ------------------------------------------------------------------ start-up recovery
    def _recover(self) -> None:
        """Rebuild the ranking from the index and the best-*.safetensors files actually present."""
        names = os.listdir(self.model_dir)
        for name in names:  # temporary files of writes killed mid-way
            if fileio.TMP_PATTERN.match(name):
                leftover = self.path(name)
                try:
                    shutil.rmtree(leftover) if os.path.isdir(leftover) else os.unlink(leftover)
                except OSError:
                    pass
        index_path, index = self.path(self.INDEX), {}
        if os.path.exists(index_path):
            try:
                with open(index_path, encoding="utf-8") as f:
                    index = json.load(f)
            except (OSError, ValueError) as e:
                log.warning("%s: unreadable checkpoint index (%s); rebuilding it from the best-*.safetensors files",
                            index_path, e)
        old_mode, old_name = index.get("metric_mode", self.metric_mode), index.get("metric_name", self.metric_name)
        if (old_mode, old_name) != (self.metric_mode, self.metric_name) and index.get("best"):
            raise CheckpointError(
                f"{index_path}: the best checkpoints here are ranked by {old_name!r} ({old_mode}), this run ranks by "
                f"{self.metric_name!r} ({self.metric_mode}); use another model_dir or delete the best-* files and the index")
        by_file = {e["file"]: e for e in index.get("best", []) if os.path.exists(self.path(e["file"]))}
        for name in names:
            if _BEST_PATTERN.match(name) and name not in by_file:  # written or dropped around a crash
                try:
                    info = checkpoint_info(self.path(name))["manager"] or {}
                except CheckpointError as e:
                    log.warning("ignoring %s: %s", name, e)
                    continue
                if "metric" in info and info.get("metric_mode") == self.metric_mode:
                    by_file[name] = {"step": info["step"], "metric": info["metric"], "file": name}
        self.entries = sorted(by_file.values(), key=self._key)
        if by_file or index:
            self._commit(self.entries[: self.keep_best])
