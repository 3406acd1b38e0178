"""Save and load a converted model without pickle: safetensors weights plus a JSON spec.

A folder written by :func:`save_converted` holds

* ``model.safetensors`` — the whole model's state dict (tied weights stored once; the spec's
  ``aliases`` name the other keys; its metadata records the SHA-256 of the spec, ``spec_sha256``);
* ``hyperplex_convert.json`` — format name and version, how to rebuild the dense architecture
  (``model``), the dtype, and one entry per converted layer (:func:`~hyperplex.convert.conversion_spec`);
* for a ``transformers`` model: its ``config.json`` (and ``generation_config.json``); for a
  ``SentenceTransformer``: the files its own ``save`` writes except weights (``modules.json``,
  ``sentence_bert_config.json``, ``1_Pooling/config.json``, the transformer's ``config.json`` …);
  tokenizer files when a tokenizer is given (a ``SentenceTransformer`` saves its own).

All of them are written as one set (:func:`hyperplex.guards.write_set`), the spec last. NaN or infinite
weights are refused at save and at load (:func:`hyperplex.guards.check_finite`).

:func:`load_converted` treats the folder as untrusted input. Before any model is built it checks the
spec (types, sizes, duplicate layers), that every file name in it stays inside the folder, that the folder
holds only regular files (no FIFO, device or link out of it), the ``modules.json`` paths and module types,
and the SHA-256 the spec records for the weights file. The skeleton is then built on the ``meta`` device
(no dense weight of a converted layer is ever allocated), the spec applied, and every tensor assigned
from the file strictly, so outputs are bit-identical and the peak memory of a load is about the
converted model's size. No code from the folder is imported (``trust_remote_code`` is always off).
The folder is meant for :func:`load_converted`; ``from_pretrained`` on it would not find the dense weights.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import tempfile
from typing import Any, cast

import torch
from torch import nn

from hyperplex.convert.linears import KINDS, apply_spec, conversion_spec, to_dense
from hyperplex.fileio import (
    UnsafePathError,
    check_folder_files,
    inside,
    read_bounded,
    sha256_file,
)
from hyperplex.guards import NonFiniteError, check_finite
from hyperplex.pretrained import QUANTIZED_SPEC, read_modules_json

__all__ = ["save_converted", "load_converted", "read_spec", "model_skeleton", "read_tensors",
           "non_persistent_buffers", "SPEC_NAME", "WEIGHTS_NAME", "FORMAT", "FORMAT_VERSION", "LoadError"]

SPEC_NAME = "hyperplex_convert.json"
#: The spec of an int8 folder (:func:`hyperplex.int8.save_quantized`), which load_converted refuses.
QUANTIZED_SPEC_NAME = QUANTIZED_SPEC
WEIGHTS_NAME = "model.safetensors"
FORMAT = "hyperplex-converted"
FORMAT_VERSION = 2
#: Versions :func:`load_converted` reads (version 1 folders do not store non-persistent buffers).
READ_VERSIONS = (1, 2)
#: Bounds on what a spec may hold: its size, its layer count (``modules.json``: :func:`read_modules_json`).
MAX_SPEC_BYTES = 64 << 20
MAX_LAYERS = 100_000
#: The floating dtypes a spec's ``dtype`` may name.
DTYPES = ("float16", "bfloat16", "float32", "float64")
#: Module types a converted SentenceTransformer's ``modules.json`` may name (classes of the installed
#: sentence-transformers; never code shipped in the folder).
_MODULE_PREFIX = "sentence_transformers."
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
    return deduplicate_tensors(model.state_dict().items())


def retie_aliases(model: nn.Module, aliases: dict[str, str]) -> None:
    """Make each ``alias`` parameter the very ``Parameter`` its kept name holds again (a tied weight saved once
    by :func:`deduplicate_tensors`), as it was in the saved model."""
    for alias, kept in aliases.items():
        owner, _, leaf = alias.rpartition(".")
        kept_owner, _, kept_leaf = kept.rpartition(".")
        module, source = model.get_submodule(owner), model.get_submodule(kept_owner)
        if leaf in module._parameters and kept_leaf in source._parameters:
            module._parameters[leaf] = source._parameters[kept_leaf]


def deduplicate_tensors(entries) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(name, tensor)`` pairs as ``{name: contiguous CPU tensor}`` with each shared tensor (same storage,
    offset, shape, strides and dtype) kept once, and ``{alias: kept name}`` for the others."""
    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    for key, tensor in entries:
        identity = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                    tuple(tensor.stride()), tensor.dtype) if tensor.numel() else None
        if identity is not None and identity in seen:
            aliases[key] = seen[identity]
            continue
        if identity is not None:
            seen[identity] = key
        tensors[key] = tensor.detach().contiguous().cpu()
    return tensors, aliases


def _copy_tree(source: str, target: str, skip, files: list) -> None:
    """Add ``(target path, writer)`` to ``files`` for each file under ``source`` except where ``skip(rel)``
    (the folders are made; the files are written later, as one set with the weights and the spec)."""
    for root, _, names in os.walk(source):
        for file in sorted(names):
            path = os.path.join(root, file)
            rel = os.path.relpath(path, source)
            if skip(rel):
                continue
            os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
            with open(path, "rb") as handle:
                data = handle.read()
            files.append((os.path.join(target, rel), lambda tmp, data=data: _write_bytes(tmp, data)))


def _write_bytes(path: str, data: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(data)


def spec_digest(spec: dict) -> str:
    """SHA-256 of a spec without its ``sha256`` key (canonical JSON), recorded in the weights file's metadata:
    a spec edited after saving (re-tied ``aliases``, other ``layers``) no longer matches its weights."""
    import hashlib

    core = {k: v for k, v in spec.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(core, sort_keys=True, separators=(",", ":")).encode("utf-8")).hexdigest()


def _sentence_transformer_weights(model: nn.Sequential, scratch: str) -> set[str]:
    """After ``model.save(scratch)``: the module folders (relative, ``""`` for the root) whose weight files
    ``load_converted`` rebuilds from their config (the Transformer modules). Every other module that
    holds converted layers is saved again into its folder as a dense copy (:func:`to_dense`), so the
    skeleton ``load_converted`` builds has weight files of the dense shapes."""
    transformer_dirs = set()
    for entry in read_modules_json(scratch):
        path = os.path.normpath(entry.get("path", ""))
        path = "" if path == "." else path
        if entry.get("type", "").endswith("Transformer"):
            transformer_dirs.add(path)
            continue
        module = model[int(entry["idx"])]
        if conversion_spec(module) and hasattr(module, "save"):
            dense: Any = copy.deepcopy(module)
            to_dense(dense)
            dense.save(os.path.join(scratch, path))
    return transformer_dirs


def _sources(model: nn.Module) -> set[str]:
    """The folders ``model`` was loaded from, as far as it records them (``load_converted``'s mark, the
    ``name_or_path`` of every ``transformers`` model inside it)."""
    found = set()
    for module in model.modules():
        for value in (getattr(module, "hyperplex_loaded_from", None),
                      getattr(getattr(module, "config", None), "_name_or_path", None)):
            if isinstance(value, str) and value and os.path.isdir(value):
                found.add(os.path.realpath(value))
    return found


def non_persistent_buffers(model: nn.Module, *, meta: bool = False) -> dict[str, torch.Tensor]:
    """Buffers outside the state dict (position ids, rotary frequencies), by dotted name: saved too, so a load
    that builds the skeleton on the ``meta`` device restores them exactly instead of recomputing them. The
    tensors themselves (not copies); those on the ``meta`` device only when ``meta`` (a skeleton's places)."""
    found = {}
    for prefix, module in model.named_modules():
        for name in getattr(module, "_non_persistent_buffers_set", ()):
            tensor = module._buffers.get(name)
            if tensor is not None and (meta or tensor.device.type != "meta"):
                found[f"{prefix}.{name}" if prefix else name] = tensor
    return found


def save_converted(model: nn.Module, folder: str | os.PathLike, tokenizer=None, overwrite: bool = False) -> str:
    """Write ``model`` (converted by :func:`hyperplex.compress`, or not) to ``folder``.

    Args:
        model: a ``transformers`` ``PreTrainedModel`` (class exported by ``transformers``), a
            ``SentenceTransformer``, or any ``nn.Module`` (then :func:`load_converted` needs the dense
            architecture passed as ``model=``).
        folder: created if missing; files already there with the same names are replaced atomically.
        tokenizer: optional ``transformers`` tokenizer saved beside the model.
        overwrite: allow ``folder`` to be the folder ``model`` was loaded from, or a folder holding weight
            files that :func:`save_converted` did not write (refused by default: the original would no
            longer load as itself).

    The spec records the SHA-256 of the weights file (checked by :func:`load_converted`).

    Returns:
        the folder path.
    """
    from hyperplex.guards import check_finite, check_output_folder, write_set

    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder}: exists and is not a folder")
    _refuse_quantized(model)
    description = _describe(model)  # raises before anything is written
    if not overwrite:  # the folder it came from, or another model's folder, would no longer load as itself
        check_output_folder(folder, "save_converted", SPEC_NAME, _sources(model))
    if any(t.device.type == "meta" for t in model.state_dict().values()):
        raise ValueError(f"{type(model).__name__} has tensors on the meta device (no values); load its weights first")
    check_finite(model.named_parameters(), f"save_converted {folder}")
    tensors, aliases = _deduplicated_state(model)
    buffers = {k: v.detach().contiguous().cpu() for k, v in non_persistent_buffers(model).items() if k not in tensors}
    floating = {t.dtype for t in tensors.values() if t.is_floating_point()}
    # One floating dtype is restored by casting the rebuilt model; a mixed model is loaded as built.
    dtype = str(next(iter(floating))).removeprefix("torch.") if len(floating) == 1 else None
    spec = {
        "format": FORMAT, "version": FORMAT_VERSION, "model": description, "weights": WEIGHTS_NAME,
        "dtype": dtype,
        "aliases": aliases, "buffers": sorted(buffers), "layers": conversion_spec(model),
    }
    os.makedirs(folder, exist_ok=True)
    files: list = []  # (path, writer): written as one set, the spec last
    with tempfile.TemporaryDirectory(dir=folder, prefix=".save-") as scratch:
        if description["library"] == "sentence-transformers":
            # The model's own save writes modules.json and every module's config. The Transformer
            # modules' weight files are dropped (they would hold the converted layers under the dense
            # model's file name; load_converted rebuilds them from their config). Other modules with
            # weights (a Dense projection) cannot be rebuilt without a weights file, so theirs are kept,
            # written dense where they hold converted layers; the single weights file overrides them.
            sentence_model: Any = model
            sentence_model.save(scratch)
            transformer_dirs = _sentence_transformer_weights(sentence_model, scratch)
            _copy_tree(scratch, folder, lambda rel: rel.endswith(_WEIGHT_SUFFIXES)
                       and os.path.dirname(rel) in transformer_dirs, files)
            shutil.rmtree(scratch, ignore_errors=True)
            os.makedirs(scratch, exist_ok=True)
        elif description["library"] == "transformers":
            texts = {"config.json": cast(Any, model).config.to_json_string()}
            generation = getattr(model, "generation_config", None)
            if generation is not None and getattr(model, "can_generate", lambda: False)():
                texts["generation_config.json"] = generation.to_json_string()
            files += [(os.path.join(folder, name), lambda tmp, t=text: _write_bytes(tmp, t.encode("utf-8")))
                      for name, text in texts.items()]
        if tokenizer is not None:
            tokenizer_dir = os.path.join(scratch, "tokenizer")
            tokenizer.save_pretrained(tokenizer_dir)
            _copy_tree(tokenizer_dir, folder, lambda rel: False, files)

    from safetensors.torch import save_file

    def write(tmp: str) -> None:
        save_file({**tensors, **buffers}, tmp,
                  metadata={"format": "pt", "hyperplex": FORMAT, "spec_sha256": spec_digest(spec)})
        spec["sha256"] = {WEIGHTS_NAME: sha256_file(tmp)}
    # One set, the spec last: a folder with a spec always has the weights and files it describes, and a
    # failure while writing (a full disk) leaves the old files, all of them.
    write_set([*files, (os.path.join(folder, WEIGHTS_NAME), write),
               (os.path.join(folder, SPEC_NAME), lambda tmp: _write_bytes(tmp, (json.dumps(spec, indent=2) + "\n")
                                                                           .encode("utf-8")))])
    return folder


def _refuse_quantized(model: nn.Module) -> None:
    """A model with int8 layers has no float weights to save here: say where it goes instead."""
    # by module name: hyperplex.int8 is built on this package, so it cannot be imported from here
    if any(type(m).__module__.startswith(("hyperplex.int8", "torch.ao.nn.quantized")) for m in model.modules()):
        raise ValueError(f"{type(model).__name__} holds int8 layers (hyperplex.quantize); save it with "
                         f"hyperplex.save_quantized, which load_quantized reads back")


def _is_int(value, minimum: int = 1) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum


def _check_layer(entry, i: int, path: str) -> None:
    """One ``layers`` entry: the keys, their types and ranges (LoadError naming ``layers[i]`` and the key)."""
    from hyperplex.algebra import ALGEBRAS

    required = ("name", "kind", "n", "rule", "rank", "in_features", "out_features", "bias", "from_conv1d")
    if not isinstance(entry, dict):
        raise LoadError(f"{path}: layers[{i}] is {_short(entry)}, expected an object with keys {list(required)}")
    missing = [k for k in required if k not in entry]
    if missing:
        raise LoadError(f"{path}: layers[{i}] misses key {missing[0]!r}; expected {list(required)}")
    where = f"{path}: layers[{i}]"
    if not isinstance(entry["name"], str) or not entry["name"]:
        raise LoadError(f"{where}: key 'name' is {_short(entry['name'])}, expected a dotted module name")
    if entry["kind"] not in KINDS:
        raise LoadError(f"{where} ({entry['name']!r}): key 'kind' is {_short(entry['kind'])}; "
                        f"valid: {', '.join(KINDS)}")
    for key in ("in_features", "out_features"):
        if not _is_int(entry[key]):
            raise LoadError(f"{where} ({entry['name']!r}): key {key!r} is {_short(entry[key])}, "
                            "expected a positive integer")
    for key in ("bias", "from_conv1d"):
        if not isinstance(entry[key], bool):
            raise LoadError(f"{where} ({entry['name']!r}): key {key!r} is {_short(entry[key])}, expected true or false")
    if entry["kind"] == "phm":
        if not _is_int(entry["n"]):
            raise LoadError(f"{where} ({entry['name']!r}): key 'n' is {_short(entry['n'])}, "
                            "expected a positive integer")
        rules = ("learned", "custom", *ALGEBRAS)
        if entry["rule"] not in rules:
            raise LoadError(f"{where} ({entry['name']!r}): key 'rule' is {_short(entry['rule'])}; "
                            f"valid: {', '.join(rules)}")
    elif not _is_int(entry["rank"]):
        raise LoadError(f"{where} ({entry['name']!r}): key 'rank' is {_short(entry['rank'])}, "
                        "expected a positive integer")


def _short(value) -> str:
    import reprlib

    return reprlib.repr(value)


def _read_spec(folder: str) -> dict:
    """The validated spec of ``folder``: every key of the right type, layer names unique, the weights file
    name inside the folder. LoadError naming the file and the key otherwise; nothing else is read."""
    path = os.path.join(folder, SPEC_NAME)
    if not os.path.exists(folder):
        raise FileNotFoundError(f"{folder}: no such folder")
    if not os.path.isdir(folder):
        raise LoadError(f"{folder}: is a file; expected a folder written by hyperplex.convert.save_converted")
    if not os.path.isfile(path):
        raise LoadError(f"{folder}: no {SPEC_NAME}; not a folder written by hyperplex.convert.save_converted "
                        f"(found: {', '.join(sorted(os.listdir(folder))[:8]) or 'nothing'})")
    try:
        raw = read_bounded(path, MAX_SPEC_BYTES)
        text = raw.decode("utf-8")
        spec = json.loads(text)
    except UnsafePathError as err:
        raise LoadError(str(err)) from None
    except UnicodeDecodeError as err:
        raise LoadError(f"{path}: not UTF-8 text (byte {err.start}: {raw[err.start:err.start + 1]!r})") from None
    except json.JSONDecodeError as err:
        raise LoadError(f"{path}: invalid JSON ({err.msg} at line {err.lineno})") from None
    except RecursionError:
        raise LoadError(f"{path}: JSON nested too deeply; not a spec written by save_converted") from None
    if not isinstance(spec, dict) or spec.get("format") != FORMAT:
        raise LoadError(f"{path}: key 'format' is {_short(spec.get('format') if isinstance(spec, dict) else spec)}, "
                        f"expected {FORMAT!r}")
    if spec.get("version") not in READ_VERSIONS:
        raise LoadError(f"{path}: format version {_short(spec.get('version'))}; this hyperplex reads versions "
                        f"{', '.join(map(str, READ_VERSIONS))}")
    for key in ("model", "layers", "weights"):
        if key not in spec:
            raise LoadError(f"{path}: missing key {key!r}")
    model = spec["model"]
    if not isinstance(model, dict) or model.get("library") not in ("transformers", "sentence-transformers", "torch") \
            or not isinstance(model.get("class"), str):
        raise LoadError(f"{path}: key 'model' is {_short(model)}, expected {{'library': 'transformers' | "
                        f"'sentence-transformers' | 'torch', 'class': NAME}}")
    try:
        inside(folder, spec["weights"], f"{path}: key 'weights'")
    except UnsafePathError as err:
        raise LoadError(str(err)) from None
    if spec.get("dtype") is not None and spec["dtype"] not in DTYPES:
        raise LoadError(f"{path}: key 'dtype' is {_short(spec['dtype'])}, expected one of {', '.join(DTYPES)} or null")
    for key in ("aliases", "sha256"):
        value = spec.get(key, {})
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise LoadError(f"{path}: key {key!r} is {_short(value)}, expected an object of names to strings")
    buffers = spec.get("buffers", [])
    if not isinstance(buffers, list) or not all(isinstance(b, str) for b in buffers):
        raise LoadError(f"{path}: key 'buffers' is {_short(buffers)}, expected a list of tensor names")
    layers = spec["layers"]
    if not isinstance(layers, list):
        raise LoadError(f"{path}: key 'layers' is {_short(layers)}, expected a list of layer objects")
    if len(layers) > MAX_LAYERS:
        raise LoadError(f"{path}: key 'layers' has {len(layers):,} entries, more than {MAX_LAYERS:,}")
    seen: dict[str, int] = {}
    for i, entry in enumerate(layers):
        _check_layer(entry, i, path)
        if entry["name"] in seen:
            raise LoadError(f"{path}: layers[{i}] names layer {entry['name']!r} again (layers[{seen[entry['name']]}] "
                            f"already does); each layer is listed once")
        seen[entry["name"]] = i
    return spec


def _check_modules_json(folder: str) -> None:
    """A converted SentenceTransformer's ``modules.json``: each module's ``path`` inside the folder and its
    ``type`` a class of the installed sentence-transformers (never code shipped in the folder)."""
    path = os.path.join(folder, "modules.json")
    if not os.path.isfile(path):
        raise LoadError(f"{folder}: no modules.json to rebuild the SentenceTransformer")
    try:
        modules = read_modules_json(folder)
    except ValueError as err:
        raise LoadError(str(err)) from None
    for i, entry in enumerate(modules):
        module_type = entry.get("type")
        if not isinstance(module_type, str) or not module_type.startswith(_MODULE_PREFIX):
            raise LoadError(f"{path}: entry {i} key 'type' is {_short(module_type)}; a converted model may use only "
                            f"sentence-transformers' own modules ({_MODULE_PREFIX}…)")
        name = entry.get("path", "")
        if name == "":
            continue
        try:
            inside(folder, name, f"{path}: entry {i} key 'path'")
        except UnsafePathError as err:
            raise LoadError(str(err)) from None


@contextlib.contextmanager
def _meta_transformer_modules():
    """While active, sentence-transformers' ``Transformer`` modules build their ``transformers`` model from its
    config on the ``meta`` device instead of loading a weights file (the converted folder has none)."""
    import transformers
    from sentence_transformers.base.modules import transformer as st_transformer

    autos = getattr(st_transformer, "TRANSFORMER_TASK_TO_AUTO_MODEL", {})
    original = st_transformer.Transformer._load_model

    def load_model(self, model_name_or_path, transformer_task, config, *args, **kwargs):
        auto = autos.get(transformer_task, transformers.AutoModel)
        with torch.device("meta"):
            return auto.from_config(config)

    st_transformer.Transformer._load_model = load_model
    try:
        yield
    finally:
        st_transformer.Transformer._load_model = original


def _skeleton_transformers(folder: str, description: dict) -> nn.Module:
    import transformers

    cls = getattr(transformers, description.get("class", ""), None)
    if not (isinstance(cls, type) and issubclass(cls, transformers.PreTrainedModel)):
        raise LoadError(f"{os.path.join(folder, SPEC_NAME)}: model class {_short(description.get('class'))} is not a "
                        f"transformers model class")
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise LoadError(f"{folder}: no config.json to rebuild the {cls.__name__}")
    config = transformers.AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    with torch.device("meta"):
        model = cls(config)
    if (os.path.isfile(os.path.join(folder, "generation_config.json"))
            and getattr(model, "generation_config", None) is not None):
        model.generation_config = transformers.GenerationConfig.from_pretrained(folder, local_files_only=True)
    return model


def _check_json_files(folder: str) -> None:
    """Every ``.json`` file of the folder (module configs such as ``1_Pooling/config.json``, tokenizer files)
    parses as JSON: a damaged one is a LoadError naming it, not a library's message without the file."""
    for root, _, files in os.walk(folder):
        for name in files:
            if not name.endswith(".json") or name == SPEC_NAME:
                continue
            path = os.path.join(root, name)
            try:
                json.loads(read_bounded(path, MAX_SPEC_BYTES).decode("utf-8"))
            except UnsafePathError as err:
                raise LoadError(str(err)) from None
            except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
                raise LoadError(f"{path}: invalid JSON ({err})") from None


def _skeleton_sentence_transformer(folder: str) -> nn.Module:
    """The SentenceTransformer of the folder's module configs, its ``transformers`` models on ``meta``."""
    from sentence_transformers import SentenceTransformer

    _check_modules_json(folder)
    try:
        with _meta_transformer_modules():
            return SentenceTransformer(folder, device="meta", local_files_only=True, trust_remote_code=False)
    except (TypeError, KeyError, ValueError, AttributeError, OSError) as err:  # a module config it cannot use
        raise LoadError(f"{folder}: sentence-transformers cannot rebuild the model from its module files "
                        f"(modules.json and each module's config: {type(err).__name__}: {_short(str(err))})") from None


def load_converted(folder: str | os.PathLike, model: nn.Module | None = None) -> nn.Module:
    """Rebuild a model written by :func:`save_converted`, with bit-identical weights, in eval mode.

    Args:
        folder: the folder :func:`save_converted` wrote (untrusted: checked before use, see the module notes).
        model: the dense architecture to load into (required for a plain ``nn.Module``; for
            ``transformers`` models and ``SentenceTransformer`` the skeleton is built on the ``meta`` device
            from the folder's config files, with no hub access and no dense weights). It is changed in place
            (only after every check passed) and returned.

    Raises:
        LoadError: no spec, a malformed spec (naming the key), a file name that leaves the folder, a folder
            entry that is not a regular file, a checksum that does not match, a spec layer that does not exist
            in the rebuilt model, a tensor missing, unexpected or of another shape or dtype, a fixed PHM rule
            whose stored values are not its algebra's — each naming the file and the key, layer or tensor.
    """
    folder = os.fspath(folder)
    if os.path.isfile(os.path.join(folder, QUANTIZED_SPEC_NAME)):
        raise LoadError(f"{folder}: an int8 folder (it holds {QUANTIZED_SPEC_NAME}, written by save_quantized); "
                        "load it with hyperplex.convert.load_quantized")
    spec = _read_spec(folder)
    spec_path = os.path.join(folder, SPEC_NAME)
    library = spec["model"]["library"]
    if model is None and library == "torch":
        raise LoadError(f"{spec_path}: the model is a plain {spec['model']['class']}; pass the dense "
                        f"architecture as load_converted(folder, model=...)")
    try:
        check_folder_files(folder)
    except UnsafePathError as err:
        raise LoadError(str(err)) from None
    _check_json_files(folder)
    weights_path = os.path.join(folder, spec["weights"])
    if os.path.isdir(weights_path):
        raise LoadError(f"{spec_path}: key 'weights' names {spec['weights']!r}, which is a folder, not a file")
    if not os.path.isfile(weights_path):
        raise LoadError(f"{folder}: {spec_path} names the weights file {spec['weights']!r}, which is missing")
    expected_sha = spec.get("sha256", {}).get(spec["weights"])
    if expected_sha is None and spec["version"] >= 2:
        raise LoadError(f"{spec_path}: key 'sha256' records no checksum for the weights file {spec['weights']!r}; "
                        f"save_converted always writes one")
    if expected_sha is not None and sha256_file(weights_path) != expected_sha:
        raise LoadError(f"{weights_path}: SHA-256 does not match the one {SPEC_NAME} records (key 'sha256'); the "
                        f"file is damaged or was changed after saving")
    given = model is not None
    if model is None:
        model = model_skeleton(folder, spec)
        meta = True
    else:
        meta = any(t.device.type == "meta" for t in model.state_dict().values())
    if given:  # the caller's model (a meta skeleton too): every check runs on a meta copy first, so a refusal
        # leaves it unchanged
        _prepare(copy.deepcopy(model).to("meta"), spec, spec_path, weights_path, assign=True, check_only=True)
    _prepare(model, spec, spec_path, weights_path, assign=meta)
    if meta:
        left = [name for name, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
        if left:
            raise LoadError(f"{weights_path}: tensor {left[0]!r} of the rebuilt {type(model).__name__} is not in the "
                            f"file and has no value ({len(left)} such tensors)")
    for module in model.modules():
        invalidate = getattr(module, "invalidate_cache", None)
        if callable(invalidate):
            invalidate()
    cast(Any, model).hyperplex_loaded_from = os.path.realpath(folder)
    return model.eval()


def _prepare(model: nn.Module, spec: dict, spec_path: str, weights_path: str, assign: bool,
             check_only: bool = False) -> None:
    """Cast to the spec's dtype, apply its layers, check and load the tensors (:func:`_load_tensors`)."""
    if spec.get("dtype"):
        model.to(getattr(torch, spec["dtype"]))
    try:
        apply_spec(model, spec["layers"], where=spec_path)
    except ValueError as err:
        raise LoadError(str(err)) from None
    if "buffers" not in spec and not check_only:  # a version 1 folder: recompute what it did not store
        _initialise_buffers(model, weights_path)
    _load_tensors(model, weights_path, spec, assign=assign, check_only=check_only)


def _initialise_buffers(model: nn.Module, path: str) -> None:
    """Give the non-persistent buffers still on ``meta`` (position ids …) their values the way ``transformers``
    does when it loads a meta-built model: the owning ``PreTrainedModel``'s ``_init_weights`` of their module.
    Each is first filled with a sentinel; one left unset is a LoadError (re-save the folder to store it)."""
    owners: dict[int, Any] = {}
    for module in model.modules():
        if callable(getattr(module, "_init_weights", None)) and hasattr(module, "config"):
            for sub in module.modules():
                owners.setdefault(id(sub), module)
    for prefix, module in model.named_modules():
        names = [n for n in getattr(module, "_non_persistent_buffers_set", ())
                 if module._buffers.get(n) is not None and module._buffers[n].is_meta]
        if not names:
            continue
        owner = owners.get(id(module))
        sentinels = {}
        for name in names:
            meta = module._buffers[name]
            if meta.dtype == torch.bool or owner is None:
                raise LoadError(f"{path}: buffer {prefix + '.' + name!r} is not stored in this version 1 folder and "
                                f"cannot be recomputed; re-save the model with save_converted")
            sentinel = float("nan") if meta.is_floating_point() else torch.iinfo(meta.dtype).min
            module._buffers[name] = torch.full(meta.shape, sentinel, dtype=meta.dtype)
            sentinels[name] = sentinel
        assert owner is not None  # refused for each buffer above
        with torch.no_grad():
            owner._init_weights(module)
        for name, sentinel in sentinels.items():
            value = module._buffers[name]
            unset = value.isnan() if value.is_floating_point() else value == sentinel
            if value.is_meta or bool(unset.any()):
                raise LoadError(f"{path}: buffer {prefix + '.' + name!r} is not stored in this version 1 folder and "
                                f"its model does not recompute it; re-save the model with save_converted")


def _load_tensors(model: nn.Module, path: str, spec: dict, assign: bool, check_only: bool = False) -> None:
    """Check every stored tensor against ``model`` (names, shapes, dtypes), then load them: copied into
    the model's tensors, or (``assign``, a ``meta`` skeleton) assigned in their place, ties restored."""
    aliases, buffers = spec.get("aliases", {}), spec.get("buffers", [])
    expected = model.state_dict()
    extra = {}
    for key in buffers:  # non-persistent buffers: outside the state dict, stored for a meta-built skeleton
        owner, _, leaf = key.rpartition(".")
        try:
            module = model.get_submodule(owner)
        except AttributeError:
            module = None
        if module is None or leaf not in getattr(module, "_non_persistent_buffers_set", ()):
            raise LoadError(f"{path}: buffer {key!r} (key 'buffers' of the spec) has no place in the rebuilt "
                            f"{type(model).__name__}")
        extra[key] = module._buffers[leaf]
    targets = {**expected, **extra}
    values = read_tensors(path, targets, aliases, type(model).__name__, spec=spec)
    weights = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    try:
        check_finite(((k, v) for k, v in values.items() if k in weights), path)
    except NonFiniteError as err:
        raise LoadError(str(err)) from None
    _check_rules(values, spec["layers"], path)
    if check_only:
        return
    if not assign:
        with torch.no_grad():
            for key, target in targets.items():
                target.copy_(values[key])
        return
    state = {key: values[key] for key in expected}
    model.load_state_dict(state, strict=True, assign=True)
    for key, _tensor in extra.items():
        owner, _, leaf = key.rpartition(".")
        model.get_submodule(owner)._buffers[leaf] = values[key]
    retie_aliases(model, aliases)


def _check_spec_digest(spec: dict, metadata: dict, path: str) -> None:
    """The weights file records the digest of the spec it was saved with (folders written before it was
    recorded have none and are read as they are)."""
    recorded = metadata.get("spec_sha256")
    if recorded is not None and recorded != spec_digest(spec):
        raise LoadError(f"{path}: the spec {SPEC_NAME} was changed after saving (its SHA-256 is not the one the "
                        f"weights file records, metadata 'spec_sha256'); re-save the model rather than edit the spec")


def _check_aliases(aliases: dict, stored: set, targets: dict, path: str, spec_name: str = SPEC_NAME) -> None:
    """Each alias names a tensor of the rebuilt model that the file does not store, tied to one it stores."""
    for alias, kept in aliases.items():
        where = f"{path}: key 'aliases' of {spec_name}: {_short(alias)} -> {_short(kept)}"
        if alias not in targets:
            raise LoadError(f"{where}: {_short(alias)} is no tensor of the rebuilt model")
        if alias in stored:
            raise LoadError(f"{where}: the file stores {_short(alias)} itself, so it cannot be tied to another tensor")
        if kept not in stored:
            raise LoadError(f"{where}: the file stores no tensor {_short(kept)}")


def _check_rules(values: dict[str, torch.Tensor], layers: list[dict], path: str) -> None:
    """A fixed-algebra PHM layer must hold its algebra's table (a learned rule stored under a fixed rule's
    name would otherwise be loaded into a frozen buffer)."""
    from hyperplex.algebra import ALGEBRAS, algebra_rule

    for entry in layers:
        if entry["kind"] != "phm" or entry["rule"] not in ALGEBRAS:
            continue
        rule = values.get(entry["name"] + ".phm_rule")
        if rule is None:
            continue  # n = 1: no rule stored under the layer (the missing-tensor check names it otherwise)
        table = algebra_rule(entry["rule"], dtype=rule.dtype)
        if rule.shape != table.shape or not torch.equal(rule, table):
            raise LoadError(f"{path}: tensor {entry['name'] + '.phm_rule'!r} does not hold the {entry['rule']} table "
                            f"the spec names (layers: rule {entry['rule']!r}); was the rule changed?")


def read_spec(folder: str | os.PathLike) -> dict:
    """The checked ``hyperplex_convert.json`` of ``folder`` (:class:`LoadError` naming the key otherwise)."""
    return _read_spec(os.fspath(folder))


def model_skeleton(folder: str | os.PathLike, spec: dict) -> nn.Module:
    """The dense architecture ``spec`` (:func:`read_spec`) describes, built from ``folder``'s config files on the
    ``meta`` device (no weights, no hub access): the one loader of model folders that :func:`load_converted`,
    :func:`hyperplex.int8.load_quantized` and the ONNX export share. :class:`LoadError` for a plain
    ``nn.Module``, whose architecture the folder cannot rebuild."""
    folder = os.fspath(folder)
    library = spec["model"].get("library")
    if library == "transformers":
        return _skeleton_transformers(folder, spec["model"])
    if library == "sentence-transformers":
        return _skeleton_sentence_transformer(folder)
    raise LoadError(f"{os.path.join(folder, SPEC_NAME)}: the model is a plain {_short(spec['model'].get('class'))}; "
                    f"pass its architecture as model=...")


def read_tensors(path: str, targets: dict[str, torch.Tensor], aliases: dict[str, str] | None = None,
                 owner: str = "model", spec: dict | None = None,
                 spec_name: str = SPEC_NAME) -> dict[str, torch.Tensor]:
    """Every tensor of the safetensors file ``path``, checked strictly against ``targets`` (name → a tensor of
    the expected shape and dtype, ``meta`` ones too) and returned under the target names; ``aliases`` maps a
    target name to the key it is stored under (a tied tensor saved once). :class:`LoadError` naming the file
    and the tensor for a file that is not safetensors, a tensor with no place in ``owner``, one missing, or
    one of another shape or dtype (a silent cast would break bit-identity); with ``spec``, also a spec changed
    after saving (the digest the file records) and aliases that do not tie a missing tensor to a stored one.
    Nothing is changed."""
    from safetensors import SafetensorError, safe_open

    aliases = aliases or {}
    try:
        handle = safe_open(path, framework="pt")
    except (SafetensorError, OSError) as err:
        raise LoadError(f"{path}: not a safetensors file ({_short(str(err))})") from None
    with handle:
        if spec is not None:
            _check_spec_digest(spec, handle.metadata() or {}, path)
        stored = set(handle.keys())
        _check_aliases(aliases, stored, targets, path, spec_name)
        unexpected = sorted(stored - set(targets))
        if unexpected:
            raise LoadError(f"{path}: tensor {unexpected[0]!r} has no place in the rebuilt {owner}"
                            f" ({len(unexpected)} such tensors); a model folder of another architecture?")
        keys = {key: key if key in stored else aliases.get(key) for key in targets}
        missing = sorted(k for k, source in keys.items() if source not in stored)
        if missing:
            raise LoadError(f"{path}: tensor {missing[0]!r} of the rebuilt {owner} is not in the file "
                            f"({len(missing)} missing)")
        for key, target in targets.items():
            source = handle.get_slice(keys[key])
            shape = tuple(source.get_shape())
            if shape != tuple(target.shape):
                raise LoadError(f"{path}: tensor {key!r} has shape {shape} in the file but {tuple(target.shape)} "
                                f"in the rebuilt model")
            dtype = _SAFETENSORS_DTYPES.get(source.get_dtype())
            if dtype != target.dtype:
                raise LoadError(f"{path}: tensor {key!r} is {source.get_dtype()} in the file but {target.dtype} in the "
                                f"rebuilt model")
        loaded = {key: handle.get_tensor(key) for key in stored}
    return {key: loaded[source] for key, source in keys.items()}
