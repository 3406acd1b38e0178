"""Adapter-only files: ``adapter.safetensors`` (the adapter's weights, nothing of the base model) and
``adapter.json`` (its config, the adapted layers and their sizes, the weights file's SHA-256).

Both are written with :func:`hyperplex.fileio.atomic_write`. Loading checks everything — the spec's
fields, that every listed layer exists in the model with the listed sizes, the checksum, every key
and shape — before the model is changed.
"""

from __future__ import annotations

import hashlib
import json
import os

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from hyperplex.adapters.config import PHMAdapterConfig
from hyperplex.adapters.layer import PHMAdaptedLinear, is_adaptable, linear_sizes
from hyperplex.adapters.model import (_check_name, _deltas, adapter_names, add_adapter, adapter_state_dict,
                                      expected_adapter_shapes, load_adapter_state_dict, set_active)
from hyperplex.fileio import atomic_write, atomic_write_text, read_bounded

__all__ = ["save_adapter", "load_adapter", "read_adapter_spec", "WEIGHTS_NAME", "SPEC_NAME", "FORMAT"]

WEIGHTS_NAME = "adapter.safetensors"
SPEC_NAME = "adapter.json"
FORMAT = "hyperplex-phm-adapter"
VERSION = 1
#: The largest ``adapter.json`` read (a FIFO or a huge file is refused, not read without end).
MAX_SPEC_BYTES = 16 << 20


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def save_adapter(model: nn.Module, name: str, folder: str | os.PathLike) -> None:
    """Write adapter ``name`` of ``model`` to ``folder/adapter.safetensors`` and ``folder/adapter.json``
    (the folder is created). Only the adapter's weights are written; if the adapter is currently
    merged they are still its own weights, not the merged base."""
    deltas = _deltas(model, name)
    config = deltas[0][1].config
    state = {key: t.contiguous().clone() for key, t in adapter_state_dict(model, name).items()}
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder}: exists and is a file; save_adapter writes a folder ({SPEC_NAME} and {WEIGHTS_NAME})")
    os.makedirs(folder, exist_ok=True)
    weights = os.path.join(folder, WEIGHTS_NAME)
    atomic_write(weights, lambda tmp: save_file(state, tmp, metadata={"format": "pt", "adapter": name}))
    spec = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "config": config.to_dict(),
        "layers": {path: {"in_features": d.in_features, "out_features": d.out_features} for path, d in deltas},
        "dtype": str(next(iter(state.values())).dtype).removeprefix("torch."),
        "weights_sha256": _sha256(weights),
    }
    atomic_write_text(os.path.join(folder, SPEC_NAME), json.dumps(spec, indent=2) + "\n")


def read_adapter_spec(folder: str | os.PathLike) -> tuple[dict, PHMAdapterConfig]:
    """Parse and validate ``folder/adapter.json``; returns ``(spec, config)``. Errors name the file and key."""
    path = os.path.join(os.fspath(folder), SPEC_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: no adapter spec here (expected {SPEC_NAME} and {WEIGHTS_NAME} from save_adapter)")
    try:
        spec = json.loads(read_bounded(path, MAX_SPEC_BYTES).decode("utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}, column {e.colno}: not valid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deeply; not an adapter spec") from None
    if not isinstance(spec, dict):
        raise ValueError(f"{path}: expected a JSON object")
    if spec.get("format") != FORMAT:
        raise ValueError(f"{path}: 'format' is {spec.get('format')!r}, expected {FORMAT!r}")
    if spec.get("version") != VERSION:
        raise ValueError(f"{path}: 'version' {spec.get('version')!r} is not supported (this hyperplex reads {VERSION})")
    for key, kind in (("name", str), ("config", dict), ("layers", dict), ("weights_sha256", str)):
        if not isinstance(spec.get(key), kind):
            raise ValueError(f"{path}: key {key!r} missing or not a {kind.__name__}")
    config = PHMAdapterConfig.from_dict(spec["config"], where=f"{path}: 'config'")
    _check_name(spec["name"], f"{path}: key 'name'")
    for layer, sizes in spec["layers"].items():
        if not (isinstance(sizes, dict) and all(isinstance(sizes.get(k), int) for k in ("in_features", "out_features"))):
            raise ValueError(f"{path}: layers.{layer} must be {{'in_features': int, 'out_features': int}}")
    if not spec["layers"]:
        raise ValueError(f"{path}: 'layers' is empty")
    return spec, config


def load_adapter(model: nn.Module, folder: str | os.PathLike, name: str | None = None, activate: bool = True) -> str:
    """Attach the adapter saved in ``folder`` to ``model`` (a base model without it) under ``name``
    (default: the saved name) and load its weights; returns the name. With ``activate`` it becomes the
    active adapter (as after :func:`add_adapter`), else the previously active one stays active.

    Raises ``ValueError`` naming the file and the problem — a listed layer missing from the model or
    not a linear layer, different sizes, a corrupted or mismatched weights file, missing or extra
    keys, wrong shapes — before the model is changed.
    """
    folder = os.fspath(folder)
    spec, config = read_adapter_spec(folder)
    spec_path = os.path.join(folder, SPEC_NAME)
    name = spec["name"] if name is None else name
    _check_name(name)
    if name in adapter_names(model):
        raise ValueError(f"the model already has an adapter named {name!r}; pass another name= to load_adapter")
    modules = dict(model.named_modules())
    problems, sizes = [], {}
    for path, listed in spec["layers"].items():
        module = modules.get(path)
        base = module.base_layer if isinstance(module, PHMAdaptedLinear) else module
        if module is None:
            problems.append(f"{path}: no such module in the model")
        elif not is_adaptable(base):
            problems.append(f"{path}: is a {type(base).__name__}, not an nn.Linear/Conv1D")
        else:
            d, k = linear_sizes(base)
            if (d, k) != (listed["in_features"], listed["out_features"]):
                problems.append(f"{path}: the adapter was saved for {listed['in_features']} → {listed['out_features']} "
                                f"features, the model's layer has {d} → {k}")
            sizes[path] = (d, k)
    if problems:
        raise ValueError(f"{spec_path}: the adapter does not fit this model: " + "; ".join(problems[:5])
                         + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))
    weights_path = os.path.join(folder, WEIGHTS_NAME)
    if not os.path.isfile(weights_path):
        raise FileNotFoundError(f"{weights_path}: missing (the spec {spec_path} refers to it)")
    if _sha256(weights_path) != spec["weights_sha256"]:
        raise ValueError(f"{weights_path}: SHA-256 differs from the one in {spec_path} (file changed or from another save)")
    state = load_file(weights_path)
    not_finite = sorted(k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all()))
    if not_finite:
        raise ValueError(f"{weights_path}: tensor {not_finite[0]!r} holds NaN or infinite values ({len(not_finite)} "
                         f"such tensors); the adapter is not loaded")
    expected = expected_adapter_shapes(config, sizes)
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    wrong = [f"{k}: expected {expected[k]}, found {tuple(state[k].shape)}" for k in expected
             if k in state and tuple(state[k].shape) != expected[k]]
    if missing or unexpected or wrong:
        raise ValueError(f"{weights_path}: does not match {spec_path}: missing keys {missing[:5]}, unexpected keys "
                         f"{unexpected[:5]}, wrong shapes {wrong[:5]}")
    previous = next((layer.active_adapter for layer in modules.values()
                     if isinstance(layer, PHMAdaptedLinear) and layer.active_adapter), None)
    add_adapter(model, name, config, layers=list(spec["layers"]))
    with torch.no_grad():
        load_adapter_state_dict(model, name, state, where=weights_path)
    if not activate:
        set_active(model, previous)
    return name
