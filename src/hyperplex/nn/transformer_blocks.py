"""Transformer encoder/decoder stacks (Vaswani et al. 2017) whose linear maps come from
:func:`hyperplex.nn.make_linear`: the standard, PHM (PHM paper §4.2) and Quaternion (Tay et al. §3.3)
Transformers differ only in the :class:`LinearSpec` they are given.

* Scope of the hypercomplex maps (Tay et al. §3.3, §4): ``"all"`` — every linear map of the layers
  (attention projections and FFN) uses the model's spec (*Quaternion Transformer (full)*, and the
  PHM-Transformer of PHM §4.2); ``"attention"`` — only the attention projections, the FFN stays dense
  (*partial*). See :func:`scoped_specs`.
* ``pre_norm``: ``x + f(LN(x))`` with a final LayerNorm (Tensor2Tensor's default, Tay et al.'s
  framework) or post-norm ``LN(x + f(x))`` (Vaswani et al.).
* Positions: sinusoidal (Vaswani et al. §3.5), added to embeddings scaled by ``√d``.
* The decoder supports incremental decoding: per-layer self-attention caches ``(B, H, t, d_k)`` and
  cross-attention keys/values projected once from the memory.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from hyperplex.nn.attention import ATTENTION_TYPES, KeyValue, MultiHeadAttention
from hyperplex.nn.linear import LinearSpec, make_linear

__all__ = ["sinusoidal_positions", "TransformerEmbedding", "FeedForward", "TransformerEncoderLayer",
           "TransformerDecoderLayer", "TransformerEncoder", "TransformerDecoder", "scoped_specs",
           "LINEAR_SCOPES"]

#: Which linear maps of a layer follow the model's LinearSpec (Tay et al. §3.3 full / partial).
LINEAR_SCOPES = ("all", "attention")


def scoped_specs(linear: LinearSpec, linear_scope: str) -> tuple[LinearSpec, LinearSpec]:
    """``(attention spec, FFN spec)`` for a model spec and scope ``"all"`` | ``"attention"``."""
    if linear_scope not in LINEAR_SCOPES:
        raise ValueError(f"unknown linear_scope {linear_scope!r}; valid: {', '.join(LINEAR_SCOPES)}")
    return linear, (linear if linear_scope == "all" else LinearSpec("dense"))


def sinusoidal_positions(max_positions: int, d_model: int) -> Tensor:
    """``(max_positions, d)`` table: ``PE[p, 2i] = sin(p / 10000^{2i/d})``, ``PE[p, 2i+1] = cos(…)``."""
    if d_model % 2:
        raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
    position = torch.arange(max_positions, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(max_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * inv_freq)
    table[:, 1::2] = torch.cos(position * inv_freq)
    return table.to(torch.get_default_dtype())


class TransformerEmbedding(nn.Module):
    """Token embedding ``× √d`` plus sinusoidal positions, then dropout: ``(B, T)`` → ``(B, T, d)``.

    ``weight`` (the ``nn.Embedding``'s) can be tied to an output projection. Embeddings are
    ``N(0, d^-1/2)`` so that ``√d · E`` has unit scale (as Tensor2Tensor / fairseq); the pad row is 0.
    """

    positions: Tensor  # (max_positions, d), a buffer

    def __init__(self, vocab_size: int, d_model: int, pad_index: int = 0, max_positions: int = 1024,
                 dropout: float = 0.0, device=None, dtype=None) -> None:
        super().__init__()
        self.d_model, self.pad_index, self.max_positions = d_model, pad_index, max_positions
        self.token = nn.Embedding(vocab_size, d_model, padding_idx=pad_index, device=device, dtype=dtype)
        self.register_buffer("positions", sinusoidal_positions(max_positions, d_model).to(device=device, dtype=dtype),
                             persistent=False)
        self.dropout = nn.Dropout(dropout)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.token.weight, 0.0, self.d_model ** -0.5)
        with torch.no_grad():
            self.token.weight[self.pad_index].zero_()

    @property
    def weight(self) -> Tensor:
        return self.token.weight

    def forward(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """``tokens (B, T)`` at positions ``offset … offset+T−1`` → ``(B, T, d)``."""
        T = tokens.shape[1]
        if offset + T > self.max_positions:
            raise ValueError(f"sequence of {offset + T} positions exceeds max_positions={self.max_positions}; "
                             f"raise model.max_positions in the config")
        x = self.token(tokens) * math.sqrt(self.d_model) + self.positions[offset:offset + T]
        return self.dropout(x)


class FeedForward(nn.Module):
    """Position-wise FFN ``Linear(ReLU(Linear(x)))`` — PHM §4.2: ``Y = PHM(ReLU(PHM(X)))``.

    Shape: ``(*, d)`` → ``(*, d)``; hidden width ``d_ff``; dropout after the ReLU.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, linear: LinearSpec | None = None,
                 device=None, dtype=None) -> None:
        super().__init__()
        linear = linear or LinearSpec()
        linear.check_divides(d_model, d_ff, where=f"FeedForward(d_model={d_model}, d_ff={d_ff})")
        self.linear1 = make_linear(d_model, d_ff, linear, True, device=device, dtype=dtype)
        self.linear2 = make_linear(d_ff, d_model, linear, True, device=device, dtype=dtype)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.linear2(self.dropout(torch.relu(self.linear1(x))))


class _Sublayers(nn.Module):
    """Residual wrapper shared by encoder and decoder layers: pre- or post-LayerNorm."""

    pre_norm: bool
    dropout: nn.Dropout

    def _residual(self, x: Tensor, norm: nn.LayerNorm, fn: Callable[[Tensor], tuple[Tensor, Any]]
                  ) -> tuple[Tensor, Any]:
        """``x + drop(f(LN(x)))`` (pre-norm) or ``LN(x + drop(f(x)))`` (post-norm); ``fn`` returns
        ``(y, extra)``, ``extra`` is passed through."""
        y, extra = fn(norm(x) if self.pre_norm else x)
        x = x + self.dropout(y)
        return (x if self.pre_norm else norm(x)), extra


class TransformerEncoderLayer(_Sublayers):
    """Self-attention + FFN block. ``x (B, S, d)``, ``padding_mask (B, S)`` (True = pad) → ``(B, S, d)``.

    Args:
        attention_spec / ffn_spec: LinearSpecs of the attention projections and the FFN
            (see :func:`scoped_specs`). attention_type: key of :data:`ATTENTION_TYPES`.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1, attention_dropout: float = 0.0,
                 attention_spec: LinearSpec | None = None, ffn_spec: LinearSpec | None = None, pre_norm: bool = True,
                 attention_type: str = "dot", attention_bias: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.pre_norm = pre_norm
        self.self_attn = _attention(attention_type)(d_model, num_heads, attention_dropout, attention_spec, True,
                                                    attention_bias, **factory)
        self.ffn = FeedForward(d_model, d_ff, dropout, ffn_spec, **factory)
        self.norm1, self.norm2 = nn.LayerNorm(d_model, **factory), nn.LayerNorm(d_model, **factory)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        x, _ = self._residual(x, self.norm1, lambda h: self.self_attn(h, key_padding_mask=padding_mask)[:2])
        x, _ = self._residual(x, self.norm2, lambda h: (self.ffn(h), None))
        return x


class TransformerDecoderLayer(_Sublayers):
    """Causal self-attention + cross-attention + FFN block.

    :meth:`forward`: ``x (B, T, d)``, ``memory (B, S, d)``, ``memory_padding_mask (B, S)`` →
    ``(x (B, T, d), self cache (keys, values) (B, H, P+T, d_k), cross weights (B, T, S) or None)``.
    """

    def __init__(self, d_model: int, num_heads: int, d_ff: int, dropout: float = 0.1, attention_dropout: float = 0.0,
                 attention_spec: LinearSpec | None = None, ffn_spec: LinearSpec | None = None, pre_norm: bool = True,
                 attention_type: str = "dot", attention_bias: bool = False, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        cls = _attention(attention_type)
        self.pre_norm = pre_norm
        self.self_attn = cls(d_model, num_heads, attention_dropout, attention_spec, True, attention_bias, **factory)
        self.cross_attn = cls(d_model, num_heads, attention_dropout, attention_spec, False, attention_bias, **factory)
        self.ffn = FeedForward(d_model, d_ff, dropout, ffn_spec, **factory)
        self.norm1, self.norm2, self.norm3 = (nn.LayerNorm(d_model, **factory) for _ in range(3))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, memory: Tensor | None, memory_padding_mask: Tensor | None = None,
                self_cache: KeyValue | None = None, cross_key_value: KeyValue | None = None,
                need_weights: bool = False) -> tuple[Tensor, KeyValue, Tensor | None]:
        """See the class docstring; ``self_cache``/``cross_key_value`` enable incremental decoding."""
        def self_block(h):
            out, _, cache = self.self_attn(h, causal=True, past_key_value=self_cache)
            return out, cache

        def cross_block(h):
            out, weights, _ = self.cross_attn(h, memory, memory_padding_mask, past_key_value=cross_key_value,
                                              need_weights=need_weights)
            return out, weights

        x, cache = self._residual(x, self.norm1, self_block)
        x, weights = self._residual(x, self.norm2, cross_block)
        x, _ = self._residual(x, self.norm3, lambda h: (self.ffn(h), None))
        return x, cache, weights


def _attention(name: str) -> type[MultiHeadAttention]:
    if name not in ATTENTION_TYPES:
        raise ValueError(f"unknown attention_type {name!r}; valid: {', '.join(ATTENTION_TYPES)}")
    return ATTENTION_TYPES[name]


class TransformerEncoder(nn.Module):
    """``num_layers`` encoder layers (+ final LayerNorm when pre-norm).

    ``x (B, S, d)``, ``padding_mask (B, S)`` bool True = pad → ``(B, S, d)``. Keyword arguments
    are those of :class:`TransformerEncoderLayer`.
    """

    def __init__(self, num_layers: int, d_model: int, pre_norm: bool = True, device=None, dtype=None, **layer_kwargs):
        super().__init__()
        self.layers = nn.ModuleList(TransformerEncoderLayer(d_model, pre_norm=pre_norm, device=device, dtype=dtype,
                                                            **layer_kwargs) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(d_model, device=device, dtype=dtype) if pre_norm else nn.Identity()

    def forward(self, x: Tensor, padding_mask: Tensor | None = None) -> Tensor:
        for layer in self.layers:
            x = layer(x, padding_mask)
        return self.final_norm(x)


class TransformerDecoder(nn.Module):
    """``num_layers`` decoder layers (+ final LayerNorm when pre-norm), with incremental decoding.

    :meth:`forward`: ``x (B, T, d)`` (embedded targets from position ``offset``), ``memory (B, S, d)``
    → ``(hidden (B, T, d), new self caches, cross weights of the last layer (B, T, S) or None)``.
    """

    def __init__(self, num_layers: int, d_model: int, pre_norm: bool = True, device=None, dtype=None, **layer_kwargs):
        super().__init__()
        self.layers = nn.ModuleList(TransformerDecoderLayer(d_model, pre_norm=pre_norm, device=device, dtype=dtype,
                                                            **layer_kwargs) for _ in range(num_layers))
        self.final_norm = nn.LayerNorm(d_model, device=device, dtype=dtype) if pre_norm else nn.Identity()

    def project_memory(self, memory: Tensor) -> list[KeyValue]:
        """Cross-attention keys/values ``(B, H, S, d_k)`` of every layer, computed once per source."""
        return [cast(TransformerDecoderLayer, layer).cross_attn.project_memory(memory) for layer in self.layers]

    def empty_caches(self, batch_size: int, device=None, dtype=None) -> list[KeyValue]:
        """Zero-length self-attention caches ``(B, H, 0, d_k)`` for step 0."""
        caches = []
        for layer in self.layers:
            attn = cast(TransformerDecoderLayer, layer).self_attn
            empty = torch.zeros(batch_size, attn.num_heads, 0, attn.head_dim, device=device, dtype=dtype)
            caches.append((empty, empty.clone()))
        return caches

    def forward(self, x: Tensor, memory: Tensor | None, memory_padding_mask: Tensor | None = None,
                self_caches: list[KeyValue] | None = None, cross_key_values: list[KeyValue] | None = None,
                need_weights: bool = False) -> tuple[Tensor, list[KeyValue], Tensor | None]:
        new_caches, weights = [], None
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, cache, w = layer(x, memory, memory_padding_mask,
                                self_caches[i] if self_caches is not None else None,
                                cross_key_values[i] if cross_key_values is not None else None,
                                need_weights and i == last)
            new_caches.append(cache)
            weights = w if i == last else weights
        return self.final_norm(x), new_caches, weights
