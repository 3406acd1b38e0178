"""Adapter-only files: ``adapter.safetensors`` (the adapter's weights, nothing of the base model) and
``adapter.json`` (its config, the adapted layers and their sizes, the modules it trains in full and their
tensor shapes, a record of the base model, the weights file's SHA-256).

The base record (``base_model``) holds the base model's name (``name_or_path`` of a ``transformers`` model,
else its class name), its class, and ``weights_sha256``, the signature of the base weights under the
adapted layers (:func:`~hyperplex.adapters.state_dict.base_signature`). Loading refuses a model whose adapted
layers or modules to save have other shapes, always, and one whose base weights differ from the record
unless ``allow_other_base_weights=True``.

Version 1 files (no base record, no modules to save) still load, without the base check. Both files are
written as one set (:func:`hyperplex.guards.write_set`, the spec last); NaN or infinite weights are refused
at save and at load (:func:`hyperplex.guards.check_finite`). Loading checks everything — the spec's fields, that
every listed module exists in the model with the listed sizes, the base weights, the checksum, every key
and shape — before the model is changed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from safetensors.torch import load_file, save_file
from torch import nn

from hyperplex.adapters.config import PHMAdapterConfig
from hyperplex.adapters.layer import AdapterWrapper, PHMAdaptedLinear
from hyperplex.adapters.model import (
    active_adapter,
    adapter_config,
    adapter_layer_sizes,
    adapter_names,
    adapter_saved_modules,
    add_adapter,
    set_active,
)
from hyperplex.adapters.state_dict import (
    adapter_state_dict,
    base_signature,
    expected_adapter_shapes,
    load_adapter_state_dict,
    state_mismatch,
)
from hyperplex.adapters.targets import check_adapter_name, outer_modules
from hyperplex.fileio import read_bounded, sha256_file
from hyperplex.guards import (
    InputFileError,
    check_finite,
    check_input_file,
    check_output_folder,
    input_file_problem,
    write_set,
)
from hyperplex.layers.selection import dense_sizes, is_dense

__all__ = ["save_adapter", "load_adapter", "read_adapter_spec", "WEIGHTS_NAME", "SPEC_NAME", "FORMAT", "VERSION"]

WEIGHTS_NAME = "adapter.safetensors"
SPEC_NAME = "adapter.json"
FORMAT = "hyperplex-phm-adapter"
#: The version written; every version in :data:`READABLE` is read (1: no base record, no modules to save).
VERSION = 2
READABLE = (1, 2)
#: The largest ``adapter.json`` read (a FIFO or a huge file is refused, not read without end).
MAX_SPEC_BYTES = 16 << 20


def _base_record(model: nn.Module, layers: list[str]) -> dict:
    name = getattr(model, "name_or_path", None)
    return {"name": name if isinstance(name, str) and name else type(model).__name__,
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "weights_sha256": base_signature(model, layers)}


def _state_shapes(module: nn.Module) -> dict[str, list[int]]:
    return {key: list(t.shape) for key, t in module.state_dict().items()}


def save_adapter(model: nn.Module, name: str, folder: str | os.PathLike) -> None:
    """Write adapter ``name`` of ``model`` to ``folder/adapter.safetensors`` and ``folder/adapter.json``
    (the folder is created). Only the adapter's weights are written (with its copies of the modules it
    trains in full), and a record of the base; if the adapter is currently merged they are still its own
    weights, not the merged base."""
    config = adapter_config(model, name)
    layers = adapter_layer_sizes(model, name)
    saved = adapter_saved_modules(model, name)
    state = {key: t.contiguous().clone() for key, t in adapter_state_dict(model, name).items()}
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder}: exists and is a file; save_adapter writes a folder "
                         f"({SPEC_NAME} and {WEIGHTS_NAME})")
    check_output_folder(folder, "save_adapter", SPEC_NAME)  # never over another model's files
    check_finite(state, f"save_adapter {name!r}")  # load_adapter refuses them: such a file could never be loaded
    os.makedirs(folder, exist_ok=True)
    weights = os.path.join(folder, WEIGHTS_NAME)

    def write_weights(tmp: str) -> None:
        save_file(state, tmp, metadata={"format": "pt", "adapter": name})
        spec["weights_sha256"] = sha256_file(tmp)
    spec = {
        "format": FORMAT,
        "version": VERSION,
        "name": name,
        "config": config.to_dict(),
        "layers": {path: {"in_features": d, "out_features": k} for path, (d, k) in layers.items()},
        "modules_to_save": {path: _state_shapes(module) for path, module in saved.items()},
        "base_model": _base_record(model, list(layers)),
        "dtype": str(next(iter(state.values())).dtype).removeprefix("torch."),
    }
    write_set([(weights, write_weights), (os.path.join(folder, SPEC_NAME),  # both or neither, the spec last
               lambda tmp: Path(tmp).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8"))])


def read_adapter_spec(folder: str | os.PathLike) -> tuple[dict, PHMAdapterConfig]:
    """Parse and validate ``folder/adapter.json``; returns ``(spec, config)``. Errors name the file and key.
    A version 1 spec comes back with ``modules_to_save`` empty and ``base_model`` ``None``."""
    path = os.path.join(os.fspath(folder), SPEC_NAME)
    problem = input_file_problem(path)
    if problem is not None and problem != "does not exist":
        raise InputFileError(f"{path}: the adapter spec {problem}; a file written by save_adapter is expected")
    if problem is not None:
        raise FileNotFoundError(f"{path}: no adapter spec here "
                                f"(expected {SPEC_NAME} and {WEIGHTS_NAME} from save_adapter)")
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
    if spec.get("version") not in READABLE:
        raise ValueError(f"{path}: 'version' {spec.get('version')!r} is not supported (this hyperplex reads "
                         f"{', '.join(map(str, READABLE))})")
    required = [("name", str), ("config", dict), ("layers", dict), ("weights_sha256", str)]
    if spec["version"] >= 2:
        required += [("modules_to_save", dict), ("base_model", dict)]
    else:
        spec = {**spec, "modules_to_save": {}, "base_model": None}
    for key, kind in required:
        if not isinstance(spec.get(key), kind):
            raise ValueError(f"{path}: key {key!r} missing or not a {kind.__name__}")
    config = PHMAdapterConfig.from_dict(spec["config"], where=f"{path}: 'config'")
    check_adapter_name(spec["name"], f"{path}: key 'name'")
    for layer, sizes in spec["layers"].items():
        if not (isinstance(sizes, dict)
                and all(isinstance(sizes.get(k), int) for k in ("in_features", "out_features"))):
            raise ValueError(f"{path}: layers.{layer} must be {{'in_features': int, 'out_features': int}}")
    if not spec["layers"]:
        raise ValueError(f"{path}: 'layers' is empty")
    for module, shapes in spec["modules_to_save"].items():
        if not (isinstance(shapes, dict) and all(isinstance(s, list) and all(isinstance(i, int) for i in s)
                                                 for s in shapes.values())):
            raise ValueError(f"{path}: modules_to_save.{module} must map each state key to a list of ints (its shape)")
    base = spec["base_model"]
    if base is not None and not all(isinstance(base.get(k), str) for k in ("name", "class", "weights_sha256")):
        raise ValueError(f"{path}: base_model must hold strings 'name', 'class' and 'weights_sha256'")
    return spec, config


def _fit_problems(modules: dict[str, nn.Module], spec: dict, n: int) -> tuple[list[str], dict[str, tuple[int, int]]]:
    """What keeps the spec's layers and modules to save from fitting the model (as text), and the layers' sizes
    (``n``: the adapter's number of components, which must divide both sizes)."""
    problems, sizes = [], {}
    for path, listed in spec["layers"].items():
        module = modules.get(path)
        base = module.base_layer if isinstance(module, PHMAdaptedLinear) else module
        if base is None:
            problems.append(f"{path}: no such module in the model")
        elif not is_dense(base):
            problems.append(f"{path}: is a {type(base).__name__}, not an nn.Linear/Conv1D")
        else:
            d, k = dense_sizes(base)
            if (d, k) != (listed["in_features"], listed["out_features"]):
                problems.append(f"{path}: the adapter was saved for {listed['in_features']} → {listed['out_features']} "
                                f"features, the model's layer has {d} → {k}")
            elif d % n or k % n:
                problems.append(f"{path}: n={n} does not divide its {d} → {k} features")
            sizes[path] = (d, k)
    for path, shapes in spec["modules_to_save"].items():
        module = modules.get(path)
        if module is None:
            problems.append(f"{path}: no such module in the model (a module to save)")
            continue
        own = _state_shapes(module.base_layer if isinstance(module, AdapterWrapper) else module)
        if own != shapes:
            differ = sorted(k for k in set(own) | set(shapes) if own.get(k) != shapes.get(k))
            problems.append(f"{path}: the module to save differs: " + ", ".join(
                f"{k} saved {shapes.get(k, 'absent')}, model {own.get(k, 'absent')}" for k in differ[:3]))
    return problems, sizes


def load_adapter(model: nn.Module, folder: str | os.PathLike, name: str | None = None, activate: bool = True, *,
                 allow_other_base_weights: bool = False) -> str:
    """Attach the adapter saved in ``folder`` to ``model`` (a base model without it) under ``name``
    (default: the saved name) and load its weights; returns the name. With ``activate`` it becomes the
    active adapter (as after :func:`add_adapter`), else the previously active one stays active.

    Raises ``ValueError`` naming the file and the problem — a listed layer or module to save missing from
    the model, not a linear layer, other sizes or shapes, base weights other than those the adapter was
    saved with (allowed with ``allow_other_base_weights=True``: the adapter then runs on a base it was not
    trained on), a corrupted or mismatched weights file, missing or extra keys, wrong shapes — before the
    model is changed.
    """
    folder = os.fspath(folder)
    spec, config = read_adapter_spec(folder)
    spec_path = os.path.join(folder, SPEC_NAME)
    name = spec["name"] if name is None else name
    check_adapter_name(name)
    if name in adapter_names(model):
        raise ValueError(f"the model already has an adapter named {name!r}; pass another name= to load_adapter")
    problems, sizes = _fit_problems(dict(outer_modules(model)), spec, config.n)
    if problems:
        raise ValueError(f"{spec_path}: the adapter does not fit this model: " + "; ".join(problems[:5])
                         + (f"; and {len(problems) - 5} more" if len(problems) > 5 else ""))
    base = spec["base_model"]
    if base is not None and not allow_other_base_weights:
        found = _base_record(model, list(spec["layers"]))
        if found["weights_sha256"] != base["weights_sha256"]:
            raise ValueError(f"{spec_path}: the base model's weights differ from those the adapter was saved with "
                             f"(SHA-256 of the {len(spec['layers'])} adapted layers' weights and biases: saved "
                             f"{base['weights_sha256'][:16]}…, this model {found['weights_sha256'][:16]}…; saved on "
                             f"{base['name']} ({base['class']}), this model is {found['name']} ({found['class']})); "
                             f"pass allow_other_base_weights=True to load it on this base anyway")
    weights_path = os.path.join(folder, WEIGHTS_NAME)
    check_input_file(weights_path, f"the weights file {spec_path} refers to")
    if sha256_file(weights_path) != spec["weights_sha256"]:
        raise ValueError(f"{weights_path}: SHA-256 differs from the one in {spec_path} "
                         "(file changed or from another save)")
    state = load_file(weights_path)
    check_finite(state, weights_path)  # the rule save_adapter applies too
    problem = state_mismatch(expected_adapter_shapes(config, sizes, spec["modules_to_save"]), state)
    if problem:
        raise ValueError(f"{weights_path}: does not match {spec_path}: {problem}")
    previous = active_adapter(model)
    add_adapter(model, name, config, layers=list(spec["layers"]), saved=list(spec["modules_to_save"]))
    load_adapter_state_dict(model, name, state, where=weights_path)
    if not activate:
        set_active(model, previous)
    return name
