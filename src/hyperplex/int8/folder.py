"""The on-disk format of an int8 model: :func:`save_quantized` / :func:`load_quantized`.

A folder holds what :func:`~hyperplex.convert.save_converted` writes to rebuild the float architecture, less
its float weights, plus ``model.int8.safetensors`` (plain tensors: int8 weights, float64 scales, int64 zero
points, float biases) and ``hyperplex_quantize.json`` (the format, the checksum, one entry per int8 layer).
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch.ao.nn.quantized.dynamic import Linear as _TorchDynamicLinear

from hyperplex.convert.serialize import QUANTIZED_SPEC_NAME, deduplicate_tensors, non_persistent_buffers, retie_aliases
from hyperplex.int8.layers import (
    PHM_PATHS,
    QUANTIZED_NAME,
    QuantizationError,
    QuantizedLinear,
    QuantizedLowRankLinear,
    QuantizedPHMLinear,
    empty_layer,
    layer_entry,
    quantized_engine,
    quantized_layers,
)
from hyperplex.layers.lowrank import LowRankLinear
from hyperplex.layers.phm import PHMLinear

__all__ = ["save_quantized", "load_quantized", "load_model_folder", "QUANT_SPEC_NAME", "QUANT_WEIGHTS_NAME"]

QUANT_SPEC_NAME = QUANTIZED_SPEC_NAME  # the one name, shared with load_converted's refusal
QUANT_WEIGHTS_NAME = "model.int8.safetensors"
QUANT_FORMAT = "hyperplex-quantized"
QUANT_FORMAT_VERSION = 1


def _plain_state(model: nn.Module) -> tuple[dict[str, Tensor], dict[str, str]]:
    """The quantised model's state as plain tensors (each :class:`QuantizedLinear` as its
    :meth:`~QuantizedLinear.int8_state`), a tensor shared under several keys stored once; and
    ``alias -> kept key``."""
    int8 = {name: m for name, m in model.named_modules() if isinstance(m, _TorchDynamicLinear)}
    ours = {name: m for name, m in int8.items() if isinstance(m, QuantizedLinear)}
    foreign = [name for name in int8 if name not in ours]
    if foreign:
        raise QuantizationError(f"layer {foreign[0]!r} was quantised by PyTorch directly; save_quantized "
                                f"writes models quantised by hyperplex.quantize")
    entries = [(k, v) for k, v in {**model.state_dict(), **non_persistent_buffers(model)}.items()
               if not any(k.startswith(f"{name}.") for name in int8)]
    for name, module in ours.items():
        entries += [(f"{name}.{key}", value) for key, value in module.int8_state().items()]
    return deduplicate_tensors(entries)


def _float_twin(module: QuantizedPHMLinear | QuantizedLowRankLinear | QuantizedLinear) -> nn.Module:
    """The float layer a quantised one stands for, with its dequantised weights (for the skeleton files)."""
    twin: nn.Module
    if isinstance(module, QuantizedPHMLinear):
        rule = module.phm_rule if module.rule_name == "custom" else module.rule_name
        phm = PHMLinear(module.in_features, module.out_features, module.n, bias=module.bias is not None, rule=rule)
        with torch.no_grad():
            if phm.rule_is_learned or module.n == 1:
                phm.phm_rule.copy_(module.phm_rule)
            phm.phm_weight.copy_(module.dequantized_phm_weight())
        twin = phm
    elif isinstance(module, QuantizedLowRankLinear):
        twin = LowRankLinear(module.in_features, module.out_features, module.rank,
                             bias=module.left._weight_bias()[1] is not None)
    else:
        twin = nn.Linear(module.in_features, module.out_features, bias=module._weight_bias()[1] is not None)
    source = getattr(module, "hyperplex_quantized_from", None)
    if source is not None:
        cast(Any, twin).hyperplex_converted_from = source
    return twin.eval()


def save_quantized(model: nn.Module, folder, tokenizer=None) -> str:
    """Write a model :func:`quantize` made to ``folder``; :func:`load_quantized` reads it back with
    bit-identical outputs.

    The folder holds what :func:`~hyperplex.convert.save_converted` writes to rebuild the float
    architecture (``hyperplex_convert.json``, ``config.json`` or a ``SentenceTransformer``'s module
    files, tokenizer files) except its float weights, plus

    * ``model.int8.safetensors``: every tensor of the quantised model, each int8 weight as
      ``NAME.weight_int8`` (int8, ``(out, in)``), ``NAME.weight_scales`` (float64, ``(out,)``),
      ``NAME.weight_zero_points`` (int64, ``(out,)``) and ``NAME.bias`` (float32); the rest (embeddings,
      layer norms, PHM rules and biases) at its own dtype;
    * ``hyperplex_quantize.json``: format name and version, the weights file and its SHA-256 (checked by
      :func:`load_quantized`), and one entry per int8 layer (``name``, ``kind`` ``linear|lowrank|phm``,
      sizes, ``n``/``rank``/``rule``, ``bias``, the PHM ``path``).

    Raises:
        QuantizationError: ``model`` is not quantised by :func:`quantize`. Nothing is written then.
    """
    import copy
    import json
    import os
    import tempfile
    from pathlib import Path

    from safetensors.torch import save_file

    from hyperplex.convert.serialize import SPEC_NAME, WEIGHTS_NAME, _sources, save_converted, spec_digest
    from hyperplex.fileio import sha256_file
    from hyperplex.guards import check_finite, check_output_folder, write_set

    folder = os.fspath(folder)
    layers = quantized_layers(model)
    if not layers:
        raise QuantizationError(f"{type(model).__name__} holds no int8 layer; quantise it first "
                                f"(hyperplex.quantize) or save it with save_converted")
    # the float folder it came from, or another model's folder, would no longer load as itself
    check_output_folder(folder, "save_quantized", QUANT_SPEC_NAME, _sources(model))
    tensors, aliases = _plain_state(model)
    check_finite(((k, v) for k, v in tensors.items() if not k.endswith("weight_zero_points")),
                 f"save_quantized {folder}")
    twin = copy.deepcopy(model)
    for name in layers:
        parent_name, _, child = name.rpartition(".")
        setattr(twin.get_submodule(parent_name), child, _float_twin(layers[name]))
    spec = {
        "format": QUANT_FORMAT, "version": QUANT_FORMAT_VERSION, "weights": QUANT_WEIGHTS_NAME,
        "weight_dtype": "qint8", "scheme": "per-output-channel symmetric int8 weights, dynamic int8 activations",
        "aliases": aliases,
        "layers": [layer_entry(name, m) for name, m in layers.items()],
    }
    os.makedirs(folder, exist_ok=True)
    files = []  # (path, writer): one set with the weights, the int8 spec last
    with tempfile.TemporaryDirectory(dir=folder, prefix=".save-int8-") as scratch:
        save_converted(twin, scratch, tokenizer=tokenizer)
        for root, _, names in os.walk(scratch):
            for file in sorted(names):
                rel = os.path.relpath(os.path.join(root, file), scratch)
                if rel == WEIGHTS_NAME:
                    continue
                with open(os.path.join(root, file), "rb") as handle:
                    data = handle.read()
                if rel == SPEC_NAME:  # the float weights are not written here: no checksum of a file it lacks
                    data = (json.dumps({**json.loads(data), "sha256": {}}, indent=2) + "\n").encode("utf-8")
                os.makedirs(os.path.dirname(os.path.join(folder, rel)), exist_ok=True)
                files.append((os.path.join(folder, rel), lambda tmp, data=data: Path(tmp).write_bytes(data)))

    def write(tmp: str) -> None:
        save_file(tensors, tmp, metadata={"format": "pt", "hyperplex": QUANT_FORMAT, "spec_sha256": spec_digest(spec)})
        spec["sha256"] = {QUANT_WEIGHTS_NAME: sha256_file(tmp)}
    write_set([*files, (os.path.join(folder, QUANT_WEIGHTS_NAME), write),
               (os.path.join(folder, QUANT_SPEC_NAME),
                lambda tmp: Path(tmp).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8"))])
    return folder


def _read_quant_spec(folder: str) -> dict:
    import json
    import os

    from hyperplex.convert.serialize import LoadError

    path = os.path.join(folder, QUANT_SPEC_NAME)
    if os.path.isfile(folder):
        raise LoadError(f"{folder}: is a file; expected a folder written by hyperplex.save_quantized")
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such folder")
    if not os.path.isfile(path):
        raise LoadError(f"{folder}: no {QUANT_SPEC_NAME}; not a folder written by hyperplex.convert.save_quantized")
    try:
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
    except json.JSONDecodeError as err:
        raise LoadError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(spec, dict) or spec.get("format") != QUANT_FORMAT:
        raise LoadError(f"{path}: key 'format' is {spec.get('format') if isinstance(spec, dict) else spec!r}, "
                        f"expected {QUANT_FORMAT!r}")
    if spec.get("version") != QUANT_FORMAT_VERSION:
        raise LoadError(f"{path}: format version {spec.get('version')!r}; this hyperplex reads version "
                        f"{QUANT_FORMAT_VERSION}")
    for key in ("weights", "layers"):
        if key not in spec:
            raise LoadError(f"{path}: missing key {key!r}")
    required = ("name", "kind", "in_features", "out_features", "bias", "n", "rule", "rank", "path")
    for i, entry in enumerate(spec["layers"] if isinstance(spec["layers"], list) else [None]):
        missing = [k for k in required if not isinstance(entry, dict) or k not in entry]
        if missing:
            raise LoadError(f"{path}: layers[{i}] misses key {missing[0]!r}; expected {list(required)}")
        if entry["kind"] == "phm" and entry["path"] not in PHM_PATHS:
            raise LoadError(f"{path}: layers[{i}] key 'path' is {entry['path']!r}; valid: {', '.join(PHM_PATHS)}")
    return spec


def _float_layer_matches(layer: nn.Module, entry: dict) -> bool:
    """Whether ``layer`` (in the rebuilt float model) is what the int8 spec entry was quantised from."""
    kinds = {"phm": PHMLinear, "lowrank": LowRankLinear, "linear": nn.Linear}
    if (not isinstance(layer, kinds.get(entry.get("kind", ""), ()))
            or (entry["kind"] == "linear" and type(layer) is not nn.Linear)):
        return False
    if (layer.in_features, layer.out_features, layer.bias is not None) != (
            entry["in_features"], entry["out_features"], entry["bias"]):
        return False
    return getattr(layer, "n", None) == entry["n"] and getattr(layer, "rank", None) == entry["rank"]


def load_quantized(folder, model: nn.Module | None = None) -> nn.Module:
    """Rebuild a model :func:`save_quantized` wrote, in eval mode, with bit-identical outputs.

    The float architecture is rebuilt as :func:`~hyperplex.convert.load_converted` does (for
    ``transformers`` models and ``SentenceTransformer`` models on the ``meta`` device, from the folder's
    config files), each layer the spec names is replaced by an empty int8 layer, and every tensor of
    ``model.int8.safetensors`` is put in place; no float weight of a quantised layer is ever built.

    Args:
        folder: the folder :func:`save_quantized` wrote.
        model: the float architecture to load into (required for a plain ``nn.Module``, as for
            :func:`~hyperplex.convert.load_converted`); changed in place, after every check, and returned.

    Raises:
        QuantizationError: this PyTorch has no quantised engine (checked first, before any file is read).
        LoadError: no or malformed ``hyperplex_quantize.json``; an int8 layer of the spec that the
            rebuilt model does not have (or has with other sizes); a tensor missing, unexpected, or of
            another shape or dtype — each naming the file and the layer or tensor.
    """
    import copy
    import os

    from hyperplex.convert import serialize
    from hyperplex.fileio import UnsafePathError, check_folder_files, sha256_file

    quantized_engine()
    folder = os.fspath(folder)
    spec = _read_quant_spec(folder)
    spec_path = os.path.join(folder, QUANT_SPEC_NAME)
    weights_path = os.path.join(folder, os.path.basename(str(spec["weights"])))
    if not os.path.isfile(weights_path):
        raise serialize.LoadError(f"{folder}: {spec_path} names the weights file {spec['weights']!r}, which is missing")
    try:
        check_folder_files(folder)
    except UnsafePathError as err:
        raise serialize.LoadError(str(err)) from None
    expected_sha = spec.get("sha256", {}).get(spec["weights"]) if isinstance(spec.get("sha256"), dict) else None
    if expected_sha is None:
        raise serialize.LoadError(f"{spec_path}: key 'sha256' records no checksum for the weights file "
                                  f"{spec['weights']!r}")
    if sha256_file(weights_path) != expected_sha:
        raise serialize.LoadError(f"{weights_path}: SHA-256 does not match the one {QUANT_SPEC_NAME} records (key "
                                  f"'sha256'); the file is damaged or was changed after saving")
    float_spec = serialize.read_spec(folder)
    float_spec_path = os.path.join(folder, serialize.SPEC_NAME)
    if model is None:
        model = serialize.model_skeleton(folder, float_spec)
    if not any(t.is_meta for t in model.state_dict().values()):
        # the caller's model: every check runs on a meta copy first, so a refusal leaves it unchanged
        _restore(copy.deepcopy(model).to("meta"), spec, float_spec, spec_path, float_spec_path, weights_path)
    _restore(model, spec, float_spec, spec_path, float_spec_path, weights_path)
    model.hyperplex_loaded_from = os.path.realpath(folder)
    return model.eval()


def _restore(model: nn.Module, spec: dict, float_spec: dict, spec_path: str, float_spec_path: str,
             weights_path: str) -> None:
    """Give the float ``model`` the int8 layers of ``spec`` and every tensor of the weights file
    (:func:`load_quantized`)."""
    from hyperplex.convert import serialize
    from hyperplex.convert.linears import apply_spec

    if float_spec.get("dtype"):
        model.to(getattr(torch, str(float_spec["dtype"])))
    try:
        apply_spec(model, float_spec["layers"], where=float_spec_path)
    except ValueError as err:
        raise serialize.LoadError(str(err)) from None
    replacements: dict[str, nn.Module] = {}
    for i, entry in enumerate(spec["layers"]):
        name = entry.get("name") if isinstance(entry, dict) else None
        layer = None
        if isinstance(name, str) and name:
            with contextlib.suppress(AttributeError):
                layer = model.get_submodule(name)
        if layer is None or not _float_layer_matches(layer, entry):
            found = "missing" if layer is None else f"a {type(layer).__name__}"
            raise serialize.LoadError(f"{spec_path}: int8 layer {name!r} (layers[{i}]: {entry}) is {found} in the "
                                      f"rebuilt {type(model).__name__}; a model folder of another architecture?")
        assert isinstance(name, str)  # a missing name has no layer, refused above
        replacements[name] = empty_layer(entry)
    for name, new in replacements.items():
        for sub_name, sub in new.named_modules():
            setattr(sub, QUANTIZED_NAME, f"{name}.{sub_name}" if sub_name else name)
        source = getattr(model.get_submodule(name), "hyperplex_converted_from", None)
        if source is not None:
            cast(Any, new).hyperplex_quantized_from = source
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, new)

    int8 = {name: m for name, m in model.named_modules() if isinstance(m, QuantizedLinear)}
    targets = {k: v for k, v in {**model.state_dict(keep_vars=True), **non_persistent_buffers(model, meta=True)}.items()
               if not any(k.startswith(f"{name}.") for name in int8)}
    for name, module in int8.items():
        targets.update({f"{name}.{key}": value for key, value in module.int8_state().items()})
    aliases = spec.get("aliases", {})
    if not isinstance(aliases, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in aliases.items()):
        raise serialize.LoadError(f"{spec_path}: key 'aliases' is not an object of tensor names to tensor names")
    loaded = serialize.read_tensors(weights_path, targets, aliases, type(model).__name__, spec=spec,
                                    spec_name=QUANT_SPEC_NAME)
    from hyperplex.guards import NonFiniteError, check_finite

    weights = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    try:
        check_finite(((k, v) for k, v in loaded.items() if k in weights or k.endswith("weight_scales")), weights_path)
    except NonFiniteError as err:
        raise serialize.LoadError(str(err)) from None
    for key, value in loaded.items():
        owner_name, _, leaf = key.rpartition(".")
        if any(key.startswith(f"{name}.") for name in int8):
            continue
        owner = model.get_submodule(owner_name)
        if leaf in owner._parameters:
            old = owner._parameters[leaf]
            owner._parameters[leaf] = nn.Parameter(value, requires_grad=old is None or old.requires_grad)
        else:
            owner._buffers[leaf] = value
    retie_aliases(model, aliases)  # one Parameter under both names again, as in the saved model
    for name, module in int8.items():
        module.load_int8_state({key[len(name) + 1:]: value for key, value in loaded.items()
                                if key.startswith(f"{name}.")})
    left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise serialize.LoadError(f"{weights_path}: tensor {left[0]!r} of the rebuilt {type(model).__name__} has no "
                                  f"value in the file ({len(left)} such tensors)")


def load_model_folder(folder, model: nn.Module | None = None) -> nn.Module:
    """The model of a folder :func:`~hyperplex.convert.save_converted` or :func:`save_quantized` wrote, whichever
    it is (the int8 spec is looked for first): the one entry point for a saved model folder, used by the ONNX
    export and the encoder scoring. Raises what :func:`load_quantized` / :func:`load_converted` raise."""
    import os

    from hyperplex.convert.serialize import load_converted

    if os.path.isfile(os.path.join(os.fspath(folder), QUANT_SPEC_NAME)):
        return load_quantized(folder, model)
    return load_converted(folder, model)
