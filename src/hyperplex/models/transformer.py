"""Transformer, PHM-Transformer and Quaternion Transformer models: a seq2seq translator (the seq2seq
protocol of ``models/search.py``) and an encoder-only sequence classifier.

One :class:`TransformerConfig` selects the variant:

==============================  ===========================================================
paper row                       config
==============================  ===========================================================
Transformer (Tm)                ``linear: {kind: dense}``
PHM-Tm n (PHM paper §4.2)       ``linear: {kind: phm, n: N}``, ``attention_type: dot``
PHM-Tm† n (PHM Table 2 †)       same plus ``rescale: 1.41421356`` (non-embedding parameters ×2, see ``rescale`` help)
Quaternion Tm (full)            ``linear: {kind: quaternion}``, ``attention_type: hamilton``
Quaternion Tm (partial)         same plus ``linear_scope: attention``
==============================  ===========================================================

The Quaternion rows use Hamilton attention (Tay et al. eq. 4) because that is the model Tay et al.
§3.3 define, and the PHM paper's Quaternion-Tm BLEU (Table 2) on the three corpora of Tay et al.'s
Table 3 (En-Vi, En-Ro, En-Et) is Tay et al.'s; ``attention_type: dot`` gives "quaternion projections +
ordinary attention". The PHM-Tm rows use ordinary attention (PHM §4.2 keeps ``softmax(QKᵀ/√d_k)V``).
Parameter counts do not depend on the attention type (the Hamilton product in attention has no parameters,
Tay et al. §3.3).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.config.registry import ModelConfig
from hyperplex.nn.linear import LinearSpec, make_linear
from hyperplex.nn.masks import lengths_to_mask
from hyperplex.nn.transformer_blocks import TransformerDecoder, TransformerEmbedding, TransformerEncoder, scoped_specs

__all__ = ["TransformerConfig", "TransformerTranslator", "TransformerClassifier"]


@dataclass
class TransformerConfig(ModelConfig):
    """Architecture of a (PHM / Quaternion) Transformer; sizes before ``rescale``."""

    d_model: int = field(default=512, metadata={"help": "model width d (embeddings, residual stream); multiple of "
                                                         "num_heads and of linear.n (4·num_heads for hamilton); 512"})
    num_heads: int = field(default=8, metadata={"help": "attention heads; default 8"})
    d_ff: int = field(default=2048, metadata={"help": "hidden width of the position-wise FFN; default 2048"})
    encoder_layers: int = field(default=6, metadata={"help": "encoder layers; default 6"})
    decoder_layers: int = field(default=6, metadata={"help": "decoder layers (translator only); default 6"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings, sublayer outputs and FFN "
                                                          "hidden; 0.1"})
    attention_dropout: float = field(default=0.0, metadata={"help": "dropout on attention weights; default 0.0"})
    pre_norm: bool = field(default=True, metadata={"help": "true: x + f(LN(x)) and a final LayerNorm (Tensor2Tensor, "
                                                           "Tay et al.'s framework); false: LN(x + f(x)) "
                                                           "(Vaswani et al.)"})
    tie_embeddings: bool = field(default=True, metadata={"help": "decoder input embedding = output projection weight "
                                                                 "(as Tensor2Tensor); default true"})
    share_embeddings: bool = field(default=False, metadata={"help": "source and target share one embedding matrix "
                                                                    "(needs one joint vocabulary); default false"})
    attention_type: Literal["dot", "hamilton"] = field(default="dot", metadata={
        "help": "dot: softmax(QK^T/sqrt(d_k))V per head; hamilton: Tay et al. eq. 4, Q⊗K with a softmax per "
                "quaternion component (the Quaternion Transformer); default dot"})
    attention_bias: bool = field(default=False, metadata={"help": "biases in the attention projections "
                                                                  "(Tensor2Tensor has none; fairseq has); "
                                                                  "default false"})
    linear: LinearSpec = field(default_factory=LinearSpec, metadata={
        "help": "linear maps of the layers: kind dense|phm|quaternion|lowrank, n, rule"})
    linear_scope: Literal["all", "attention"] = field(default="all", metadata={
        "help": "all: attention projections and FFN follow `linear` (PHM-Tm, Quaternion Tm full); attention: only "
                "the attention projections, FFN dense (Quaternion Tm partial); default all"})
    rescale: float = field(default=1.0, metadata={
        "help": "multiplies d_model and d_ff (rounded to valid multiples), so parameters scale by rescale^2. PHM "
                "Table 2 † ('re-scaling the parameters with a factor of 2 by doubling the hidden size') lists "
                "exactly 2x the parameters: rescale 1.41421356; rescale 2 doubles the sizes (4x parameters). 1.0"})
    max_positions: int = field(default=1024, metadata={"help": "longest sequence (positions table size); 1024"})
    output_layer: Literal["dense", "same"] = field(default="dense", metadata={
        "help": "untied vocabulary / class projection: dense (Tay et al. §3.5: W[r;x;y;z]+b) or same (follows "
                "`linear`; n must divide the vocabulary size). Ignored when tie_embeddings; default dense"})

    def __post_init__(self) -> None:
        for name in ("d_model", "num_heads", "d_ff", "max_positions"):
            if getattr(self, name) < 1:
                raise ValueError(f"TransformerConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("encoder_layers", "decoder_layers"):
            if getattr(self, name) < 0:
                raise ValueError(f"TransformerConfig.{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.dropout < 1 or not 0 <= self.attention_dropout < 1:
            raise ValueError("TransformerConfig.dropout and attention_dropout must be in [0, 1)")
        if self.rescale <= 0:
            raise ValueError(f"TransformerConfig.rescale must be > 0, got {self.rescale}")
        if isinstance(self.linear, dict):  # plain construction from a dict (the loader builds LinearSpec itself)
            self.linear = LinearSpec(**self.linear)
        self.sizes()  # sizes that n / the heads do not divide fail here, at config load, not after data reading

    def sizes(self) -> tuple[int, int]:
        """Effective ``(d_model, d_ff)`` after ``rescale``: ``d_model`` rounded to a multiple of
        lcm(2, num_heads, n) (×4 per head for Hamilton attention), ``d_ff`` to a multiple of n."""
        n = self.linear.num_components
        unit = math.lcm(2, self.num_heads * (4 if self.attention_type == "hamilton" else 1), n)
        d_model = max(unit, round(self.d_model * self.rescale / unit) * unit)
        d_ff = max(n, round(self.d_ff * self.rescale / n) * n)
        if self.rescale == 1.0 and (d_model, d_ff) != (self.d_model, self.d_ff):
            raise ValueError("; ".join(self._size_problems()))
        return d_model, d_ff

    def _size_problems(self) -> list[str]:
        """Each divisibility rule that ``d_model`` / ``d_ff`` break, named by its config keys."""
        n, problems = self.linear.num_components, []
        heads = self.num_heads * (4 if self.attention_type == "hamilton" else 1)
        if self.d_model % 2:
            problems.append(f"model.d_model={self.d_model} must be even (sinusoidal positions pair sin/cos)")
        if self.d_model % heads:
            per = "4 × model.num_heads (Hamilton attention splits each head into 4 components)" \
                if self.attention_type == "hamilton" else "model.num_heads"
            problems.append(f"model.d_model={self.d_model} must be a multiple of {per} = {heads}")
        if self.d_model % n:
            problems.append(f"model.d_model={self.d_model} must be a multiple of model.linear.n={n}")
        if self.d_ff % n:
            problems.append(f"model.d_ff={self.d_ff} must be a multiple of model.linear.n={n}")
        return problems

    def layer_kwargs(self) -> dict:
        """Keyword arguments shared by encoder and decoder layers."""
        d_model, d_ff = self.sizes()
        attention_spec, ffn_spec = scoped_specs(self.linear, self.linear_scope)
        return dict(num_heads=self.num_heads, d_ff=d_ff, dropout=self.dropout,
                    attention_dropout=self.attention_dropout, attention_spec=attention_spec, ffn_spec=ffn_spec,
                    attention_type=self.attention_type, attention_bias=self.attention_bias)


def _output_layer(config: TransformerConfig, d_model: int, size: int, where: str, device, dtype) -> nn.Module:
    spec = config.linear if config.output_layer == "same" else LinearSpec("dense")
    spec.check_divides(d_model, size, where=f"{where} (output_layer='same')")
    return make_linear(d_model, size, spec, True, device=device, dtype=dtype)


class TransformerTranslator(nn.Module):
    """Encoder–decoder Transformer implementing the seq2seq protocol (``forward``, ``encode``,
    ``decode_step``; see ``models/search.py``).

    State from :meth:`encode` (all batch-first): ``memory (B, S, d)``, ``src_padding_mask (B, S)``
    (True = pad), per decoder layer ``cross_keys``/``cross_values`` ``(B, H, S, d_k)`` (projected once)
    and ``self_keys``/``self_values`` ``(B, H, t, d_k)`` (grow by one position per step).
    """

    def __init__(self, config: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int, *,
                 pad_index: int = 0, unk_index: int = 1, bos_index: int = 2, eos_index: int = 3,
                 device=None, dtype=None) -> None:
        super().__init__()
        if config.decoder_layers < 1:
            raise ValueError("TransformerTranslator needs decoder_layers >= 1")
        self.config = config
        self.pad_index, self.unk_index, self.bos_index, self.eos_index = pad_index, unk_index, bos_index, eos_index
        d_model, _ = config.sizes()
        self.d_model = d_model
        factory = {"device": device, "dtype": dtype}
        embed = dict(pad_index=pad_index, max_positions=config.max_positions, dropout=config.dropout, **factory)
        self.src_embed = TransformerEmbedding(src_vocab_size, d_model, **embed)
        self.tgt_embed = TransformerEmbedding(tgt_vocab_size, d_model, **embed)
        if config.share_embeddings:
            if src_vocab_size != tgt_vocab_size:
                raise ValueError(f"share_embeddings needs one vocabulary; got source {src_vocab_size} and "
                                 f"target {tgt_vocab_size} entries")
            self.tgt_embed.token.weight = self.src_embed.token.weight
        layer = config.layer_kwargs()
        self.encoder = TransformerEncoder(config.encoder_layers, d_model, config.pre_norm, **factory, **layer)
        self.decoder = TransformerDecoder(config.decoder_layers, d_model, config.pre_norm, **factory, **layer)
        if config.tie_embeddings:  # logits = h Eᵀ (Tensor2Tensor's shared_embedding_and_softmax_weights)
            self.output_projection: nn.Module = nn.Linear(d_model, tgt_vocab_size, bias=False, **factory)
            self.output_projection.weight = self.tgt_embed.token.weight
        else:
            self.output_projection = _output_layer(config, d_model, tgt_vocab_size, "TransformerTranslator", **factory)

    def forward(self, src: Tensor, src_lengths: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher forcing: ``src (B, S)``, ``src_lengths (B,)``, ``tgt_in (B, T)`` (BOS first) → logits ``(B, T, V)``.

        Target padding needs no mask: it sits after the real tokens, which the causal mask already
        hides from them; outputs at padded positions are ignored by the loss.
        """
        mask = ~lengths_to_mask(src_lengths, src.shape[1])
        memory = self.encoder(self.src_embed(src), mask)  # (B, S, d)
        hidden, _, _ = self.decoder(self.tgt_embed(tgt_in), memory, mask)  # (B, T, d)
        return self.output_projection(hidden)

    def encode(self, src: Tensor, src_lengths: Tensor) -> dict:
        """``src (B, S)``, ``src_lengths (B,)`` → decoding state (see the class docstring)."""
        mask = ~lengths_to_mask(src_lengths, src.shape[1])
        memory = self.encoder(self.src_embed(src), mask)
        cross = self.decoder.project_memory(memory)
        caches = self.decoder.empty_caches(src.shape[0], device=memory.device, dtype=memory.dtype)
        return {"memory": memory, "src_padding_mask": mask,
                "cross_keys": [k for k, _ in cross], "cross_values": [v for _, v in cross],
                "self_keys": [k for k, _ in caches], "self_values": [v for _, v in caches]}

    def decode_step(self, prev_tokens: Tensor, state: dict, step: int) -> tuple[Tensor, dict, Tensor]:
        """One incremental step: ``prev_tokens (B,)`` at position ``step`` → ``(log_probs (B, V), new_state,
        attention (B, S))``; attention = last decoder layer's cross-attention averaged over heads."""
        cached = state["self_keys"][0].shape[2]
        if cached != step:
            raise ValueError(f"decode_step(step={step}) but the state holds {cached} decoded positions")
        x = self.tgt_embed(prev_tokens.unsqueeze(1), offset=step)  # (B, 1, d)
        hidden, caches, weights = self.decoder(
            x, None, state["src_padding_mask"], list(zip(state["self_keys"], state["self_values"])),
            list(zip(state["cross_keys"], state["cross_values"])), need_weights=True)
        log_probs = F.log_softmax(self.output_projection(hidden[:, 0]), dim=-1)  # (B, V)
        new_state = dict(state, self_keys=[k for k, _ in caches], self_values=[v for _, v in caches])
        return log_probs, new_state, weights[:, 0]


class TransformerClassifier(nn.Module):
    """Encoder-only Transformer for sequence classification (sentiment, subject–verb agreement).

    ``forward(tokens (B, T), lengths (B,)) -> logits (B, C)``: embeddings → encoder → pooling over the
    real tokens (``mean``, ``max`` or ``first``) → output layer (dense, or ``linear`` if
    ``config.output_layer == "same"``). ``decoder_layers`` and ``tie_embeddings`` are ignored.
    """

    POOLINGS = ("mean", "first", "max")

    def __init__(self, config: TransformerConfig, vocab_size: int, num_classes: int, *,
                 pad_index: int = 0, pooling: str = "mean", device=None, dtype=None) -> None:
        super().__init__()
        if pooling not in self.POOLINGS:
            raise ValueError(f"unknown pooling {pooling!r}; valid: {', '.join(self.POOLINGS)}")
        self.config, self.pad_index, self.pooling = config, pad_index, pooling
        d_model, _ = config.sizes()
        self.d_model = d_model
        factory = {"device": device, "dtype": dtype}
        self.embed = TransformerEmbedding(vocab_size, d_model, pad_index, config.max_positions, config.dropout,
                                          **factory)
        self.encoder = TransformerEncoder(config.encoder_layers, d_model, config.pre_norm, **factory,
                                          **config.layer_kwargs())
        self.classifier = _output_layer(config, d_model, num_classes, "TransformerClassifier", **factory)

    def forward(self, tokens: Tensor, lengths: Tensor) -> Tensor:
        mask = ~lengths_to_mask(lengths, tokens.shape[1])  # (B, T) True = pad
        hidden = self.encoder(self.embed(tokens), mask)  # (B, T, d)
        if self.pooling == "first":
            pooled = hidden[:, 0]
        elif self.pooling == "max":
            pooled = hidden.masked_fill(mask.unsqueeze(-1), float("-inf")).amax(dim=1)
        else:
            keep = (~mask).unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * keep).sum(1) / keep.sum(1)
        return self.classifier(pooled)  # (B, C)
