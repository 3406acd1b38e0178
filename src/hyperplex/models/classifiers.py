"""Sentence-pair classifiers: the NLI encoder (ICLR App. B.1), decomposable attention (DeAtt) and
the Quaternion attention model Q-Att (Tay et al. 2019 §3.2).

Pair-classifier protocol: ``Model(config, vocab_size, num_outputs, *, pad_index=0, device=None, dtype=None)``
(the constructor every model of :mod:`hyperplex.models` shares, so the tasks and ``hyperplex params``
build any architecture the same way) and
``forward(a (B, Ta), a_lengths (B,), b (B, Tb), b_lengths (B,)) -> logits (B, C)``
with ``C = num_outputs`` (3 for NLI; 1 for a ranking score trained with binary cross-entropy).
Positions at or past a sequence's length are padding and never influence the logits. Every
linear map comes from :func:`hyperplex.nn.make_linear` with the config's :class:`LinearSpec`,
except the final ``→ C`` output layer, which is dense because ``C`` is rarely divisible by ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import Tensor, nn

from hyperplex.algebra import hamilton, merge_components, split_components
from hyperplex.config.registry import ModelConfig
from hyperplex.nn.attention import component_softmax
from hyperplex.nn.linear import LinearSpec, make_linear
from hyperplex.nn.masks import lengths_to_mask
from hyperplex.nn.rnn import PHMLSTM

__all__ = [
    "NLIEncoderConfig", "NLIEncoderClassifier",
    "DecomposableAttentionConfig", "DecomposableAttention",
    "QuaternionAttentionConfig", "QuaternionAttentionModel",
    "hamilton_alignment_scores",
]

_ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}
_ACTIVATION_HELP = "non-linearity of the feed-forward layers: relu, tanh or gelu"


def _masked_softmax(scores: Tensor, mask: Tensor, dim: int) -> Tensor:
    """Softmax of ``scores`` along ``dim`` over positions where ``mask`` (broadcastable) is True.

    Masked positions get exactly 0; a row with no valid position gives all zeros (not NaN).
    """
    weights = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=dim)
    return weights.masked_fill(~mask, 0.0)


def _feed_forward(sizes: list[int], spec: LinearSpec, activation: str, dropout: float, factory: dict) -> nn.Sequential:
    """``[Dropout → Linear → activation]`` per consecutive pair of ``sizes`` (Parikh et al. 2016 F, G, H)."""
    layers: list[nn.Module] = []
    for d_in, d_out in zip(sizes[:-1], sizes[1:]):
        layers += [nn.Dropout(dropout), make_linear(d_in, d_out, spec, **factory), _ACTIVATIONS[activation]()]
    return nn.Sequential(*layers)


def _component_cat(parts: list[Tensor], num_components: int = 4) -> Tensor:
    """Component-wise concatenation (Tay et al. §3.2 "[;]"): ``[r₁;r₂;…; x₁;x₂;…; y…; z…]``.

    Each part ``(..., 4·mᵢ)`` → ``(..., 4·Σmᵢ)``, so the result is again a quaternion vector in
    the ``[r; x; y; z]`` layout that a quaternion linear layer expects.
    """
    return merge_components(torch.cat([split_components(p, num_components) for p in parts], dim=-1))


def hamilton_alignment_scores(a: Tensor, b: Tensor) -> Tensor:
    """Quaternion alignment ``E = A ⊗ Bᵀ`` (Tay et al. §3.2): ``E_ij = Σ_k A_ik ⊗ B_jk``.

    ``a`` (B, Ta, 4m), ``b`` (B, Tb, 4m), each row ``m`` quaternions ``[r; x; y; z]``; returns the
    four component score matrices ``(B, 4, Ta, Tb)`` (order r, x, y, z). Hamilton product
    eq. 2 written as 16 component matmuls instead of a ``(B, Ta, Tb, 4m)`` intermediate.
    """
    ar, ax, ay, az = split_components(a, 4).unbind(-2)  # each (B, Ta, m)
    br, bx, by, bz = (c.transpose(-1, -2) for c in split_components(b, 4).unbind(-2))  # each (B, m, Tb)
    return torch.stack([
        ar @ br - ax @ bx - ay @ by - az @ bz,
        ax @ br + ar @ bx - az @ by + ay @ bz,
        ay @ br + az @ bx + ar @ by - ax @ bz,
        az @ br - ay @ bx + ax @ by + ar @ bz,
    ], dim=1)


class _PairModel(nn.Module):
    """Shared parts: embedding table, input checks, loading pre-trained vectors."""

    def __init__(self, vocab_size: int, embedding_dim: int, num_outputs: int, pad_index: int,
                 freeze_embeddings: bool, factory: dict) -> None:
        super().__init__()
        if num_outputs < 1:
            raise ValueError(f"{type(self).__name__}: num_outputs must be >= 1 (1 = ranking score), got {num_outputs}")
        self.num_outputs, self.pad_index = num_outputs, pad_index
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=pad_index, **factory)
        self.embedding.weight.requires_grad_(not freeze_embeddings)

    def reset_parameters(self) -> None:
        """Re-initialise every sub-module that knows how."""
        for module in self.modules():
            reset = getattr(module, "reset_parameters", None)
            if module is not self and callable(reset):
                reset()

    @torch.no_grad()
    def load_pretrained_embeddings(self, vectors: Tensor, mask: Tensor | None = None) -> None:
        """Copy rows of ``vectors`` (V, E) into the embedding table where ``mask`` (V,) is True (all if None).

        Use with :func:`hyperplex.data.glove.load_glove`; rows not found keep their random init.
        """
        weight = self.embedding.weight
        if vectors.shape != weight.shape:
            raise ValueError(f"{type(self).__name__}: pre-trained vectors have shape {tuple(vectors.shape)}, "
                             f"expected (vocab_size, embedding_dim) = {tuple(weight.shape)}")
        mask = torch.ones(len(vectors), dtype=torch.bool) if mask is None else mask.bool()
        weight[mask.to(weight.device)] = vectors[mask].to(weight)

    def _inputs(self, a: Tensor, a_lengths: Tensor, b: Tensor, b_lengths: Tensor
                ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Validate a batch; return embeddings ``(B, Ta, E)``, ``(B, Tb, E)`` and masks ``(B, Ta)``, ``(B, Tb)``."""
        name = type(self).__name__
        for label, tokens, lengths in (("a", a, a_lengths), ("b", b, b_lengths)):
            if tokens.dim() != 2 or lengths.shape != (a.shape[0],) or tokens.shape[0] != a.shape[0]:
                raise ValueError(f"{name}: expected {label} (B, T) and {label}_lengths (B,) with B = {a.shape[0]}, "
                                 f"got {tuple(tokens.shape)} and {tuple(lengths.shape)}")
            if bool((lengths < 1).any()) or bool((lengths > tokens.shape[1]).any()):
                raise ValueError(f"{name}: {label}_lengths must lie in [1, {tokens.shape[1]}], got {lengths.tolist()}")
        return (self.embedding(a), self.embedding(b),
                lengths_to_mask(a_lengths.to(a.device), a.shape[1]),
                lengths_to_mask(b_lengths.to(b.device), b.shape[1]))


# --------------------------------------------------------------------------- NLI encoder (ICLR App. B.1)
@dataclass
class NLIEncoderConfig(ModelConfig):
    """Siamese (PHM-)LSTM encoder classifier of the PHM paper (Zhang et al. 2021, App. B.1)."""

    embedding_dim: int = field(default=300, metadata={"help": "word embedding size (300 = GloVe 300d); default 300"})
    hidden_size: int = field(default=300, metadata={"help": "LSTM hidden size per direction; default 300 (App. B.1)"})
    num_layers: int = field(default=1, metadata={"help": "stacked LSTM layers; default 1"})
    bidirectional: bool = field(default=False, metadata={
        "help": "bidirectional encoder; default false (App. B.1 uses unidirectional encoders)"})
    dropout: float = field(default=0.1, metadata={
        "help": "dropout on embeddings, between LSTM layers and before MLP layers (not given in the paper); "
                "default 0.1"})
    mlp_dim: int = field(default=300, metadata={"help": "width of the MLP hidden layers; default 300"})
    mlp_layers: int = field(default=2, metadata={
        "help": "hidden layers of the MLP before the output layer (App. B.1: two-layer 300D MLP); default 2"})
    activation: Literal["relu", "tanh", "gelu"] = field(default="relu", metadata={
        "help": _ACTIVATION_HELP + "; default relu"})
    features: Literal["infersent", "concat"] = field(default="infersent", metadata={
        "help": "pair features from pooled u, v: infersent = [u; v; |u-v|; u*v] (Conneau et al. 2017, standard "
                "practice; App. B.1 does not say), concat = [u; v]; default infersent"})
    freeze_embeddings: bool = field(default=False, metadata={
        "help": "keep word embeddings fixed (App. B.1 fixes GloVe; leave false when training from scratch); "
                "default false"})
    linear: LinearSpec = field(default_factory=LinearSpec, metadata={
        "help": "linear maps of the LSTM and the MLP: phm n=2/5/10 gives the PHM-LSTM of Table 1"})


class NLIEncoderClassifier(_PairModel):
    """One (PHM-)LSTM encoder shared by premise and hypothesis; max+mean pooling; MLP (ICLR App. B.1).

    ``u = [max_t h_t; mean_t h_t]`` over the valid positions of each sentence (``(B, 2·H·dirs)``),
    features ``[u; v; |u−v|; u⊙v]`` (``(B, 8·H·dirs)``), ``mlp_layers`` hidden layers of
    ``mlp_dim`` and a dense output layer.

    Shape: ``forward(a (B, Ta), a_lengths (B,), b (B, Tb), b_lengths (B,)) -> logits (B, num_outputs)``.
    """

    def __init__(self, config: NLIEncoderConfig, vocab_size: int, num_outputs: int, *,
                 pad_index: int = 0, device=None, dtype=None) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__(vocab_size, config.embedding_dim, num_outputs, pad_index, config.freeze_embeddings, factory)
        self.config = config
        config.linear.check_divides(config.embedding_dim, config.hidden_size, config.mlp_dim, where="NLIEncoderConfig")
        self.encoder = PHMLSTM(config.embedding_dim, config.hidden_size, config.num_layers, batch_first=True,
                               dropout=config.dropout if config.num_layers > 1 else 0.0,
                               bidirectional=config.bidirectional, linear=config.linear, **factory)
        pooled = 2 * config.hidden_size * (2 if config.bidirectional else 1)  # [max; mean]
        features = pooled * (4 if config.features == "infersent" else 2)
        self.embedding_dropout = nn.Dropout(config.dropout)
        self.mlp = _feed_forward([features] + [config.mlp_dim] * config.mlp_layers, config.linear,
                                 config.activation, config.dropout, factory)
        self.output = make_linear(config.mlp_dim if config.mlp_layers else features, num_outputs, LinearSpec(),
                                  **factory)

    def extra_repr(self) -> str:
        return f"num_outputs={self.num_outputs}, pad_index={self.pad_index}"

    def encode(self, embedded: Tensor, lengths: Tensor, mask: Tensor) -> Tensor:
        """Max+mean pooled sentence vector over valid positions: ``(B, T, E)`` → ``(B, 2·H·dirs)``."""
        states, _ = self.encoder(self.embedding_dropout(embedded), lengths)  # (B, T, H·dirs)
        valid = mask.unsqueeze(-1)  # (B, T, 1)
        maximum = states.masked_fill(~valid, float("-inf")).amax(dim=1)
        mean = states.masked_fill(~valid, 0.0).sum(dim=1) / lengths.unsqueeze(-1).to(states)
        return torch.cat([maximum, mean], dim=-1)

    def forward(self, a: Tensor, a_lengths: Tensor, b: Tensor, b_lengths: Tensor) -> Tensor:
        ea, eb, mask_a, mask_b = self._inputs(a, a_lengths, b, b_lengths)
        u = self.encode(ea, a_lengths.to(a.device), mask_a)  # (B, 2·H·dirs); the encoder is shared
        v = self.encode(eb, b_lengths.to(b.device), mask_b)
        features = [u, v, (u - v).abs(), u * v] if self.config.features == "infersent" else [u, v]
        return self.output(self.mlp(torch.cat(features, dim=-1)))  # (B, C)


# --------------------------------------------------------------------------- DeAtt (Parikh et al. 2016)
@dataclass
class DecomposableAttentionConfig(ModelConfig):
    """Decomposable attention (Parikh et al. 2016) with the [a; β; a⊙β; a−β] compare input (Tay et al. §4.1)."""

    embedding_dim: int = field(default=300, metadata={"help": "word embedding size; default 300"})
    hidden_size: int = field(default=200, metadata={
        "help": "size d of the projected embeddings and of F, G, H (Tay et al. Table 1: d=200 or 50); default 200"})
    projection: bool = field(default=True, metadata={
        "help": "linear projection of the embeddings to hidden_size (Parikh et al.); false needs "
                "hidden_size == embedding_dim; default true"})
    dropout: float = field(default=0.2, metadata={
        "help": "dropout before every feed-forward layer (Parikh et al.: 0.2); default 0.2"})
    activation: Literal["relu", "tanh", "gelu"] = field(default="relu", metadata={
        "help": _ACTIVATION_HELP + "; default relu"})
    freeze_embeddings: bool = field(default=False, metadata={"help": "keep word embeddings fixed; default false"})
    linear: LinearSpec = field(default_factory=LinearSpec, metadata={"help": "every linear map but the output layer"})


class DecomposableAttention(_PairModel):
    """DeAtt: attend, compare, aggregate (Parikh et al. 2016; baseline of Tay et al. §4.1).

    Attend: ``e_ij = F(a_i)ᵀ F(b_j)``, ``β_i = Σ_j softmax_j(e_ij) b_j``, ``α_j = Σ_i softmax_i(e_ij) a_i``.
    Compare: ``v1_i = G([a_i; β_i; a_i⊙β_i; a_i−β_i])``, ``v2_j = G([b_j; α_j; b_j⊙α_j; b_j−α_j])``.
    Aggregate: ``logits = W H([Σ_i v1_i; Σ_j v2_j])``. F, G, H: two feed-forward layers each.

    Shape: ``forward(a (B, Ta), a_lengths (B,), b (B, Tb), b_lengths (B,)) -> logits (B, num_outputs)``.
    """

    def __init__(self, config: DecomposableAttentionConfig, vocab_size: int, num_outputs: int, *,
                 pad_index: int = 0, device=None, dtype=None) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__(vocab_size, config.embedding_dim, num_outputs, pad_index, config.freeze_embeddings, factory)
        self.config = config
        d = config.hidden_size
        if not config.projection and d != config.embedding_dim:
            raise ValueError(f"DecomposableAttentionConfig: projection=false needs hidden_size == embedding_dim, "
                             f"got {d} and {config.embedding_dim}")
        config.linear.check_divides(config.embedding_dim, d, where="DecomposableAttentionConfig")
        spec, act, p = config.linear, config.activation, config.dropout
        self.projection = (make_linear(config.embedding_dim, d, spec, bias=False, **factory) if config.projection
                           else nn.Identity())
        self.attend = _feed_forward([d, d, d], spec, act, p, factory)  # F
        self.compare = _feed_forward([4 * d, d, d], spec, act, p, factory)  # G
        self.aggregate = _feed_forward([2 * d, d, d], spec, act, p, factory)  # H
        self.output = make_linear(d, num_outputs, LinearSpec(), **factory)

    def extra_repr(self) -> str:
        return f"num_outputs={self.num_outputs}, pad_index={self.pad_index}"

    def forward(self, a: Tensor, a_lengths: Tensor, b: Tensor, b_lengths: Tensor) -> Tensor:
        ea, eb, mask_a, mask_b = self._inputs(a, a_lengths, b, b_lengths)
        a_rep, b_rep = self.projection(ea), self.projection(eb)  # (B, Ta, d), (B, Tb, d)
        scores = self.attend(a_rep) @ self.attend(b_rep).transpose(1, 2)  # (B, Ta, Tb), Parikh eq. 1
        beta = _masked_softmax(scores, mask_b[:, None, :], dim=2) @ b_rep  # (B, Ta, d), eq. 2
        alpha = _masked_softmax(scores, mask_a[:, :, None], dim=1).transpose(1, 2) @ a_rep  # (B, Tb, d)
        v1 = self.compare(torch.cat([a_rep, beta, a_rep * beta, a_rep - beta], dim=-1))  # (B, Ta, d), eq. 3
        v2 = self.compare(torch.cat([b_rep, alpha, b_rep * alpha, b_rep - alpha], dim=-1))  # (B, Tb, d)
        v1 = v1.masked_fill(~mask_a[..., None], 0.0).sum(dim=1)  # (B, d), eq. 4
        v2 = v2.masked_fill(~mask_b[..., None], 0.0).sum(dim=1)
        return self.output(self.aggregate(torch.cat([v1, v2], dim=-1)))  # (B, C), eq. 5


# --------------------------------------------------------------------------- Q-Att (Tay et al. 2019 §3.2)
@dataclass
class QuaternionAttentionConfig(ModelConfig):
    """Quaternion attention model Q-Att (Tay et al. 2019, §3.2, §3.4, §4.1)."""

    embedding_dim: int = field(default=300, metadata={"help": "word embedding size; default 300"})
    hidden_size: int = field(default=200, metadata={
        "help": "real size of the quaternion representations, 4 x the paper's d (d=50 -> 200); multiple of 4; "
                "default 200"})
    projection: bool = field(default=True, metadata={
        "help": "non-linear projection of the (pre-trained) embeddings into quaternion space (§3.4); false treats "
                "each embedding as [r; x; y; z] and needs hidden_size == embedding_dim; default true"})
    ffn_layers: int = field(default=1, metadata={"help": "layers of each quaternion FFN (compare and final); "
                                                         "default 1"})
    dropout: float = field(default=0.2, metadata={"help": "dropout before every feed-forward layer; default 0.2"})
    activation: Literal["relu", "tanh", "gelu"] = field(default="relu", metadata={
        "help": _ACTIVATION_HELP + " (component-wise, §3.1); default relu"})
    freeze_embeddings: bool = field(default=False, metadata={"help": "keep word embeddings fixed; default false"})
    linear: LinearSpec = field(default_factory=lambda: LinearSpec("quaternion"), metadata={
        "help": "the quaternion FFNs (QFFN); default quaternion (Hamilton rule); phm n=4 learns the rule"})
    projection_linear: LinearSpec = field(default_factory=LinearSpec, metadata={
        "help": "the embedding projection (real embeddings -> quaternion space); default dense"})


class QuaternionAttentionModel(_PairModel):
    """Q-Att: Hamilton-product alignment, quaternion compare and aggregate (Tay et al. 2019 §3.2).

    With quaternion sequences ``A`` (B, Ta, 4m) and ``B`` (B, Tb, 4m) (non-linear projections of the
    embeddings, §3.4): ``E = A ⊗ Bᵀ`` (four ``Ta × Tb`` score matrices), ``G = ComponentSoftmax(E)``
    over ``b`` positions, ``B′_c = G_c B_c``; ``F = ComponentSoftmax(Eᵀ)`` over ``a`` positions,
    ``A′_c = F_c A_c`` for each component ``c ∈ {r, x, y, z}``;
    ``C₁ = Σ_i QFFN([A′_i; B_i; A′_i ⊗ B_i; A′_i − B_i])`` over ``b`` positions,
    ``C₂ = Σ_i QFFN([B′_i; A_i; B′_i ⊗ A_i; B′_i − A_i])`` over ``a`` positions,
    ``Y = QFFN([C₁; C₂; C₁ ⊗ C₂; C₁ − C₂])`` and ``logits = W [Y_r; Y_x; Y_y; Y_z] + b`` (§3.5).
    ``[;]`` is component-wise concatenation, ``QFFN`` a quaternion linear layer plus activation.

    Shape: ``forward(a (B, Ta), a_lengths (B,), b (B, Tb), b_lengths (B,)) -> logits (B, num_outputs)``.
    """

    def __init__(self, config: QuaternionAttentionConfig, vocab_size: int, num_outputs: int, *,
                 pad_index: int = 0, device=None, dtype=None) -> None:
        factory = {"device": device, "dtype": dtype}
        super().__init__(vocab_size, config.embedding_dim, num_outputs, pad_index, config.freeze_embeddings, factory)
        self.config = config
        d = config.hidden_size
        if d % 4:
            raise ValueError(f"QuaternionAttentionConfig: hidden_size must be a multiple of 4 (quaternions), got {d}")
        if not config.projection and d != config.embedding_dim:
            raise ValueError(f"QuaternionAttentionConfig: projection=false needs hidden_size == embedding_dim, "
                             f"got {d} and {config.embedding_dim}")
        if config.ffn_layers < 1:
            raise ValueError(f"QuaternionAttentionConfig: ffn_layers must be >= 1, got {config.ffn_layers}")
        config.linear.check_divides(4 * d, d, where="QuaternionAttentionConfig.linear")
        act, p = config.activation, config.dropout
        if config.projection:
            config.projection_linear.check_divides(config.embedding_dim, d,
                                                   where="QuaternionAttentionConfig.projection_linear")
            self.projection: nn.Module = _feed_forward([config.embedding_dim, d], config.projection_linear, act, p,
                                                       factory)
        else:
            self.projection = nn.Dropout(p)
        sizes = [4 * d] + [d] * config.ffn_layers
        self.compare = _feed_forward(sizes, config.linear, act, p, factory)
        self.aggregate = _feed_forward(sizes, config.linear, act, p, factory)
        self.output = make_linear(d, num_outputs, LinearSpec(), **factory)

    def extra_repr(self) -> str:
        return f"num_outputs={self.num_outputs}, pad_index={self.pad_index}"

    @staticmethod
    def align(a: Tensor, b: Tensor, mask_a: Tensor, mask_b: Tensor) -> tuple[Tensor, Tensor]:
        """Aligned sequences ``(B′ (B, Ta, 4m), A′ (B, Tb, 4m))`` of Tay et al. §3.2.

        ``B′_i`` is the attention-weighted summary of ``B`` for position ``i`` of ``A``, and
        ``A′_j`` that of ``A`` for position ``j`` of ``B``; padding gets zero weight.
        """
        scores = hamilton_alignment_scores(a, b)  # (B, 4, Ta, Tb): E = A ⊗ Bᵀ
        g = component_softmax(scores, mask_b[:, None, :])  # G = ComponentSoftmax(E) over b, (B, 4, Ta, Tb)
        f = component_softmax(scores.transpose(2, 3), mask_a[:, None, :])  # F = ComponentSoftmax(Eᵀ), (B, 4, Tb, Ta)
        a_parts = split_components(a, 4).transpose(1, 2)  # (B, 4, Ta, m)
        b_parts = split_components(b, 4).transpose(1, 2)  # (B, 4, Tb, m)
        b_aligned = merge_components((g @ b_parts).transpose(1, 2))  # B′_c = G_c B_c, (B, Ta, 4m)
        a_aligned = merge_components((f @ a_parts).transpose(1, 2))  # A′_c = F_c A_c, (B, Tb, 4m)
        return b_aligned, a_aligned

    def forward(self, a: Tensor, a_lengths: Tensor, b: Tensor, b_lengths: Tensor) -> Tensor:
        ea, eb, mask_a, mask_b = self._inputs(a, a_lengths, b, b_lengths)
        qa, qb = self.projection(ea), self.projection(eb)  # (B, Ta, d), (B, Tb, d) quaternion, §3.4
        b_aligned, a_aligned = self.align(qa, qb, mask_a, mask_b)
        c1 = self.compare(_component_cat([a_aligned, qb, hamilton(a_aligned, qb), a_aligned - qb]))  # (B, Tb, d)
        c2 = self.compare(_component_cat([b_aligned, qa, hamilton(b_aligned, qa), b_aligned - qa]))  # (B, Ta, d)
        c1 = c1.masked_fill(~mask_b[..., None], 0.0).sum(dim=1)  # Σ over positions, (B, d)
        c2 = c2.masked_fill(~mask_a[..., None], 0.0).sum(dim=1)
        y = self.aggregate(_component_cat([c1, c2, hamilton(c1, c2), c1 - c2]))  # (B, d) quaternion
        return self.output(y)  # components [r; x; y; z] concatenated into a real layer, §3.5
