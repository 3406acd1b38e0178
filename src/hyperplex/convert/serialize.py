"""Save and load a converted model without pickle: safetensors weights plus a JSON spec.

A folder written by :func:`save_converted` holds

* ``model.safetensors`` — the whole model's state dict (tied weights stored once; the spec's
  ``aliases`` name the other keys), written through :func:`hyperplex.fileio.atomic_write`;
* ``hyperplex_convert.json`` — format name and version, how to rebuild the dense architecture
  (``model``), the dtype, and one entry per converted layer (:func:`~hyperplex.convert.conversion_spec`);
* for a ``transformers`` model: its ``config.json`` (and ``generation_config.json``); for a
  ``SentenceTransformer``: the files its own ``save`` writes except weights (``modules.json``,
  ``sentence_bert_config.json``, ``1_Pooling/config.json``, the transformer's ``config.json`` …);
  tokenizer files when a tokenizer is given (a ``SentenceTransformer`` saves its own).

:func:`load_converted` rebuilds the dense architecture from those files (no hub access), applies
the spec with empty layers and loads every tensor strictly, so outputs are bit-identical. The
folder is meant for :func:`load_converted`; ``from_pretrained`` on it would not find the dense weights.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile

import torch
from torch import nn

from hyperplex.convert.linears import apply_spec, conversion_spec, to_dense
from hyperplex.fileio import atomic_write, atomic_write_bytes, atomic_write_text

__all__ = ["save_converted", "load_converted", "SPEC_NAME", "WEIGHTS_NAME", "FORMAT", "FORMAT_VERSION", "LoadError"]

SPEC_NAME = "hyperplex_convert.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "hyperplex-converted"
FORMAT_VERSION = 1
# Weight files a SentenceTransformer's own save writes; ours replace them (one file, the converted layers).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


class LoadError(ValueError):
    """A converted-model folder cannot be loaded; the message names the file and the key or tensor."""


def _is_sentence_transformer(model: nn.Module) -> bool:
    return any(cls.__module__.startswith("sentence_transformers") and cls.__name__ == "SentenceTransformer"
               for cls in type(model).__mro__)


def _is_transformers_model(model: nn.Module) -> bool:
    return any(cls.__module__.startswith("transformers") and cls.__name__ == "PreTrainedModel"
               for cls in type(model).__mro__)


def _describe(model: nn.Module) -> dict:
    if _is_sentence_transformer(model):
        return {"library": "sentence-transformers", "class": "SentenceTransformer"}
    if _is_transformers_model(model):
        import transformers
        name = type(model).__name__
        if getattr(transformers, name, None) is not type(model):
            raise ValueError(f"{name} is not a class exported by transformers; save_converted can rebuild only those")
        return {"library": "transformers", "class": name}
    return {"library": "torch", "class": f"{type(model).__module__}.{type(model).__qualname__}"}


def _deduplicated_state(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """State dict with each shared tensor once (safetensors refuses aliases) and ``alias -> kept key``."""
    tensors, aliases, seen = {}, {}, {}
    for key, tensor in model.state_dict().items():
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                    tuple(tensor.stride()), tensor.dtype) if tensor.numel() else None
        if identity is not None and identity in seen:
            aliases[key] = seen[identity]
            continue
        if identity is not None:
            seen[identity] = key
        tensors[key] = tensor.detach().contiguous().cpu()
    return tensors, aliases


def _copy_tree(source: str, target: str, skip) -> None:
    """Copy files under ``source`` to ``target`` (each through atomic_write), except where ``skip(rel)``."""
    for root, _, files in os.walk(source):
        for file in sorted(files):
            path = os.path.join(root, file)
            rel = os.path.relpath(path, source)
            if skip(rel):
                continue
            os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
            with open(path, "rb") as handle:
                atomic_write_bytes(os.path.join(target, rel), handle.read())


def _sentence_transformer_weights(model: nn.Module, scratch: str) -> set[str]:
    """After ``model.save(scratch)``: the module folders (relative, ``""`` for the root) whose weight files
    ``load_converted`` rebuilds from their config (the Transformer modules). Every other module that
    holds converted layers is saved again into its folder as a dense copy (:func:`to_dense`), so the
    skeleton ``load_converted`` builds has weight files of the dense shapes."""
    with open(os.path.join(scratch, "modules.json"), encoding="utf-8") as handle:
        modules = json.load(handle)
    transformer_dirs = set()
    for entry in modules:
        path = os.path.normpath(entry.get("path", ""))
        path = "" if path == "." else path
        if entry.get("type", "").endswith("Transformer"):
            transformer_dirs.add(path)
            continue
        module = model[int(entry["idx"])]
        if conversion_spec(module) and hasattr(module, "save"):
            dense = copy.deepcopy(module)
            to_dense(dense)
            dense.save(os.path.join(scratch, path))
    return transformer_dirs


def save_converted(model: nn.Module, folder: str | os.PathLike, tokenizer=None) -> str:
    """Write ``model`` (converted by :func:`~hyperplex.convert.convert_linears`, or not) to ``folder``.

    Args:
        model: a ``transformers`` ``PreTrainedModel`` (class exported by ``transformers``), a
            ``SentenceTransformer``, or any ``nn.Module`` (then :func:`load_converted` needs the dense
            architecture passed as ``model=``).
        folder: created if missing; files already there with the same names are replaced atomically.
        tokenizer: optional ``transformers`` tokenizer saved beside the model.

    Returns:
        the folder path.
    """
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder}: exists and is not a folder")
    description = _describe(model)  # raises before anything is written
    tensors, aliases = _deduplicated_state(model)
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    # One floating dtype is restored by casting the rebuilt model; a mixed model is loaded as built.
    dtype = str(next(iter(floating))).removeprefix("torch.") if len(floating) == 1 else None
    spec = {
        "format": FORMAT, "version": FORMAT_VERSION, "model": description, "weights": WEIGHTS_NAME,
        "dtype": dtype,
        "aliases": aliases, "layers": conversion_spec(model),
    }
    os.makedirs(folder, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".save-") as scratch:
        if description["library"] == "sentence-transformers":
            # The model's own save writes modules.json and every module's config. The Transformer
            # modules' weight files are dropped (they would hold the converted layers under the dense
            # model's file name; load_converted rebuilds them from their config). Other modules with
            # weights (a Dense projection) cannot be rebuilt without a weights file, so theirs are kept,
            # written dense where they hold converted layers; the single weights file overrides them.
            model.save(scratch)
            transformer_dirs = _sentence_transformer_weights(model, scratch)
            _copy_tree(scratch, folder, lambda rel: rel.endswith(_WEIGHT_SUFFIXES)
                       and os.path.dirname(rel) in transformer_dirs)
            shutil.rmtree(scratch, ignore_errors=True)
            os.makedirs(scratch, exist_ok=True)
        elif description["library"] == "transformers":
            atomic_write_text(os.path.join(folder, "config.json"), model.config.to_json_string())
            generation = getattr(model, "generation_config", None)
            if generation is not None and getattr(model, "can_generate", lambda: False)():
                atomic_write_text(os.path.join(folder, "generation_config.json"), generation.to_json_string())
        if tokenizer is not None:
            tokenizer_dir = os.path.join(scratch, "tokenizer")
            tokenizer.save_pretrained(tokenizer_dir)
            _copy_tree(tokenizer_dir, folder, lambda rel: False)

    from safetensors.torch import save_file
    atomic_write(os.path.join(folder, WEIGHTS_NAME),
                 lambda tmp: save_file(tensors, tmp, metadata={"format": "pt", "hyperplex": FORMAT}))
    # The spec last: a folder with a spec always has the weights it describes.
    atomic_write_text(os.path.join(folder, SPEC_NAME), json.dumps(spec, indent=2) + "\n")
    return folder


def _read_spec(folder: str) -> dict:
    path = os.path.join(folder, SPEC_NAME)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{folder}: no such folder")
    if not os.path.isfile(path):
        raise LoadError(f"{folder}: no {SPEC_NAME}; not a folder written by hyperplex.convert.save_converted "
                        f"(found: {', '.join(sorted(os.listdir(folder))[:8]) or 'nothing'})")
    try:
        with open(path, encoding="utf-8") as handle:
            spec = json.load(handle)
    except json.JSONDecodeError as err:
        raise LoadError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise LoadError(f"{path}: key 'format' is {spec.get('format') if isinstance(spec, dict) else spec!r}, "
                        f"expected {FORMAT!r}")
    if spec.get("version") != FORMAT_VERSION:
        raise LoadError(f"{path}: format version {spec.get('version')!r}; this hyperplex reads version {FORMAT_VERSION}")
    for key in ("model", "layers", "weights"):
        if key not in spec:
            raise LoadError(f"{path}: missing key {key!r}")
    required = ("name", "kind", "n", "rule", "rank", "in_features", "out_features", "bias", "from_conv1d")
    for i, entry in enumerate(spec["layers"]):
        missing = [k for k in required if k not in entry]
        if missing:
            raise LoadError(f"{path}: layers[{i}] misses key {missing[0]!r}; expected {list(required)}")
    return spec


def _rebuild_transformers(folder: str, description: dict) -> nn.Module:
    import transformers
    cls = getattr(transformers, description.get("class", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise LoadError(f"{os.path.join(folder, SPEC_NAME)}: model class {description.get('class')!r} is not a "
                        f"transformers model class")
    config_path = os.path.join(folder, "config.json")
    if not os.path.isfile(config_path):
        raise LoadError(f"{folder}: no config.json to rebuild the {cls.__name__}")
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True)
    model = cls(config)
    generation_path = os.path.join(folder, "generation_config.json")
    if os.path.isfile(generation_path) and getattr(model, "generation_config", None) is not None:
        model.generation_config = transformers.GenerationConfig.from_pretrained(folder, local_files_only=True)
    return model


def _rebuild_sentence_transformer(folder: str) -> nn.Module:
    """Build the dense SentenceTransformer from the saved module configs.

    A SentenceTransformer's transformer module loads through ``from_pretrained``, which needs a
    weights file; a scratch copy of the config files gets a randomly initialised dense one
    (overwritten by :func:`load_converted` right after).
    """
    import transformers
    from sentence_transformers import SentenceTransformer

    modules_path = os.path.join(folder, "modules.json")
    if not os.path.isfile(modules_path):
        raise LoadError(f"{folder}: no modules.json to rebuild the SentenceTransformer")
    with open(modules_path, encoding="utf-8") as handle:
        modules = json.load(handle)
    with tempfile.TemporaryDirectory(prefix="hyperplex-skeleton-") as scratch:
        _copy_tree(folder, scratch, lambda rel: rel in (SPEC_NAME, WEIGHTS_NAME) or rel.startswith(".save-"))
        for entry in modules:
            if not entry.get("type", "").endswith("Transformer"):
                continue
            path = os.path.join(scratch, entry.get("path", ""))
            config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
            transformers.AutoModel.from_config(config).save_pretrained(path)
        return SentenceTransformer(scratch, device="cpu", local_files_only=True)


def load_converted(folder: str | os.PathLike, model: nn.Module | None = None) -> nn.Module:
    """Rebuild a model written by :func:`save_converted`, with bit-identical weights, in eval mode.

    Args:
        folder: the folder :func:`save_converted` wrote.
        model: the dense architecture to load into (required for a plain ``nn.Module``; for
            ``transformers`` models and ``SentenceTransformer`` it is rebuilt from the folder's config
            files, with no hub access). It is changed in place and returned.

    Raises:
        LoadError: no spec, a malformed spec, a spec layer that does not exist in the rebuilt model
            (a folder of another architecture), a tensor missing, unexpected or of another shape —
            each naming the file and the layer or tensor.
    """
    folder = os.fspath(folder)
    spec = _read_spec(folder)
    spec_path = os.path.join(folder, SPEC_NAME)
    weights_path = os.path.join(folder, spec["weights"])
    if not os.path.isfile(weights_path):
        raise LoadError(f"{folder}: {spec_path} names the weights file {spec['weights']!r}, which is missing")
    if model is None:
        library = spec["model"].get("library")
        if library == "transformers":
            model = _rebuild_transformers(folder, spec["model"])
        elif library == "sentence-transformers":
            model = _rebuild_sentence_transformer(folder)
        else:
            raise LoadError(f"{spec_path}: the model is a plain {spec['model'].get('class')}; pass the dense "
                            f"architecture as load_converted(folder, model=...)")
    if spec.get("dtype"):
        dtype = getattr(torch, str(spec["dtype"]), None)
        if not isinstance(dtype, torch.dtype):
            raise LoadError(f"{spec_path}: key 'dtype' is {spec['dtype']!r}, not a torch dtype such as 'float32'")
        model.to(dtype)
    try:
        apply_spec(model, spec["layers"], where=spec_path)
    except ValueError as err:
        raise LoadError(str(err)) from None
    _load_strict(model, weights_path, spec.get("aliases", {}))
    return model.eval()


def _load_strict(model: nn.Module, path: str, aliases: dict[str, str]) -> None:
    from safetensors import safe_open

    expected = model.state_dict()
    with safe_open(path, framework="pt") as handle:
        stored = set(handle.keys())
        unexpected = sorted(stored - set(expected))
        if unexpected:
            raise LoadError(f"{path}: tensor {unexpected[0]!r} has no place in the rebuilt {type(model).__name__}"
                            f" ({len(unexpected)} such tensors); a model folder of another architecture?")
        missing = sorted(k for k in expected if k not in stored and aliases.get(k) not in stored)
        if missing:
            raise LoadError(f"{path}: tensor {missing[0]!r} of the rebuilt {type(model).__name__} is not in the file "
                            f"({len(missing)} missing)")
        for key, target in expected.items():
            source = handle.get_slice(key if key in stored else aliases[key])
            shape = tuple(source.get_shape())
            if shape != tuple(target.shape):
                raise LoadError(f"{path}: tensor {key!r} has shape {shape} in the file but {tuple(target.shape)} "
                                f"in the rebuilt model")
            dtype = _SAFETENSORS_DTYPES.get(source.get_dtype())
            if dtype is not None and dtype != target.dtype:  # a silent cast would break bit-identity
                raise LoadError(f"{path}: tensor {key!r} is {dtype} in the file but {target.dtype} in the rebuilt model")
        with torch.no_grad():
            for key, target in expected.items():
                target.copy_(handle.get_tensor(key if key in stored else aliases[key]))
    for module in model.modules():
        if hasattr(module, "invalidate_cache"):
            module.invalidate_cache()
