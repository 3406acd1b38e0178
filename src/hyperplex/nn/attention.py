"""Multi-head attention whose projections come from :func:`hyperplex.nn.make_linear`, and the
Quaternion Transformer's Hamilton-product attention (Tay et al. 2019, eq. 4).

* :class:`MultiHeadAttention` — ``softmax(QKᵀ/√d_k) V`` per head (``F.scaled_dot_product_attention``).
  Self-attention forms Q, K, V with ONE projection of width ``3d`` split three ways (PHM paper §4.2,
  Φ); cross-attention has a Q projection and one fused K/V projection of width ``2d``. The output
  projection over the concatenated heads is ``make_linear`` too, so with a PHM spec weights are
  shared across heads (PHM paper §4.2, ``X = PHM([H₁; …; H_Nh])``).
* :class:`HamiltonAttention` — same projections; scores are the Hamilton product ``Q ⊗ Kᵀ``, which
  gives four score matrices (r, x, y, z), a softmax over keys per component (:func:`component_softmax`)
  and component ``a`` of the output is ``G_a V_a`` (Tay et al. eq. 4 and §3.2).

Masks: ``key_padding_mask`` ``(B, S)`` bool, ``True`` = padding (ignored), as in
``nn.MultiheadAttention``; ``causal=True`` lets query ``t`` see keys ``≤ t`` (offset by the length of a
key/value cache). Caches are ``(keys, values)`` of shape ``(B, H, S, d_k)`` — batch on dim 0 so that
beam search can reorder them with ``index_select(0, idx)``.

Layout of the fused projections: a PHM output of width ``p·d`` is ``n`` components of ``p·d/n`` each
(:func:`hyperplex.algebra.split_components`); Φ splits *every component* ``p`` ways, so Q, K and V are
each a proper hypercomplex transform of ``X`` (``Q = W_q ⊗ X`` with the rule shared by Q, K, V) and
keep the ``[r; x; y; z]`` layout Hamilton attention needs. For ``n = 1`` this is an ordinary
``chunk(p)``, the layout of ``nn.MultiheadAttention.in_proj_weight``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hyperplex.algebra import algebra_rule, merge_components, split_components
from hyperplex.nn.linear import LinearSpec, make_linear

__all__ = ["MultiHeadAttention", "HamiltonAttention", "component_softmax", "causal_mask", "split_fused",
           "ATTENTION_TYPES"]

KeyValue = tuple[Tensor, Tensor]


def split_fused(x: Tensor, parts: int, num_components: int = 1) -> tuple[Tensor, ...]:
    """Φ of PHM §4.2: split a fused projection ``(*, parts·d)`` into ``parts`` tensors ``(*, d)``.

    The last dimension is read as ``num_components`` hypercomplex components, each holding
    ``parts`` pieces of ``d / num_components``; piece ``p`` of every component forms output ``p``.
    """
    n = num_components
    pieces = split_components(x, n).unflatten(-1, (parts, -1))  # (*, n, parts, d/n)
    return tuple(merge_components(pieces[..., p, :]) for p in range(parts))


def causal_mask(query_len: int, key_len: int, device=None) -> Tensor:
    """Bool ``(T, S)``, ``True`` where query ``t`` may attend key ``s``: ``s ≤ t + (S − T)``.

    The offset ``S − T`` is the number of cached past positions in incremental decoding.
    """
    past = key_len - query_len
    if past < 0:
        raise ValueError(f"causal attention needs at least as many keys as queries, got T={query_len}, S={key_len}")
    q = torch.arange(query_len, device=device).unsqueeze(1) + past
    return torch.arange(key_len, device=device).unsqueeze(0) <= q


def component_softmax(scores: Tensor, mask: Tensor | None = None) -> Tensor:
    """ComponentSoftmax (Tay et al. §3.2, eq. 4): a softmax over keys for each component separately.

    Args:
        scores: ``(..., n, T, S)`` — one score matrix per hypercomplex component.
        mask: bool, broadcastable to ``(..., T, S)`` (no component dim), ``True`` = may attend.
    Returns:
        ``(..., n, T, S)``; every ``[..., a, t, :]`` sums to 1 and is 0 where ``mask`` is ``False``.
    """
    if mask is not None:
        scores = scores.masked_fill(~mask.unsqueeze(-3), float("-inf"))
    return torch.softmax(scores, dim=-1)


class MultiHeadAttention(nn.Module):
    """Multi-head scaled dot-product attention with factory-made (dense / PHM / quaternion) projections.

    Args:
        d_model: model width ``d``; divisible by ``num_heads`` and by the spec's ``n``.
        num_heads: number of heads ``H``; head width ``d_k = d / H``.
        dropout: dropout on the attention weights (training only).
        linear: :class:`LinearSpec` of the projections (dense if ``None``).
        self_attention: ``True``: one ``d → 3d`` projection for Q, K, V; ``False`` (cross-attention):
            ``q_proj`` ``d → d`` and one ``d → 2d`` ``kv_proj`` for the memory.
        bias: biases in the projections (Tensor2Tensor, Tay et al.'s framework, has none).

    Shape (:meth:`forward`): ``query (B, T, d)``, ``memory (B, S, d)`` → ``(B, T, d)``, weights
    ``(B, T, S)`` averaged over heads, new cache ``(keys, values)`` each ``(B, H, S', d_k)``.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, linear: LinearSpec | None = None,
                 self_attention: bool = True, bias: bool = True, device=None, dtype=None) -> None:
        super().__init__()
        linear = linear or LinearSpec()
        if num_heads < 1 or d_model % num_heads:
            raise ValueError(f"{type(self).__name__}: d_model={d_model} must be a positive multiple of "
                             f"num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"{type(self).__name__}: dropout must be in [0, 1), got {dropout}")
        where = f"{type(self).__name__}(d_model={d_model})"
        linear.check_divides(d_model, where=where)
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
        self.dropout, self.self_attention = dropout, self_attention
        self.num_components = linear.num_components
        if self_attention:
            self.qkv_proj = make_linear(d_model, 3 * d_model, linear, bias, **factory)  # PHM §4.2: Φ(PHM(X))
        else:
            self.q_proj = make_linear(d_model, d_model, linear, bias, **factory)
            self.kv_proj = make_linear(d_model, 2 * d_model, linear, bias, **factory)
        self.out_proj = make_linear(d_model, d_model, linear, bias, **factory)  # PHM §4.2: PHM([H₁;…;H_Nh])

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}, "
                f"self_attention={self.self_attention}")

    # ------------------------------------------------------------------ heads
    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, d)`` → ``(B, H, T, d_k)``: contiguous chunks of ``d`` per head."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def merge_heads(self, x: Tensor) -> Tensor:
        """``(B, H, T, d_k)`` → ``(B, T, d)`` (inverse of :meth:`split_heads`)."""
        return x.transpose(1, 2).flatten(-2)

    def project_memory(self, memory: Tensor) -> KeyValue:
        """Keys and values ``(B, H, S, d_k)`` of a cross-attention memory ``(B, S, d)``; compute once
        per source sentence and pass as ``past_key_value`` when decoding step by step."""
        if self.self_attention:
            raise ValueError("project_memory is for cross-attention (self_attention=False)")
        k, v = split_fused(self.kv_proj(memory), 2, self.num_components)
        return self.split_heads(k), self.split_heads(v)

    # ------------------------------------------------------------------ forward
    def forward(self, query: Tensor, memory: Tensor | None = None, key_padding_mask: Tensor | None = None,
                causal: bool = False, past_key_value: KeyValue | None = None, need_weights: bool = False,
                ) -> tuple[Tensor, Tensor | None, KeyValue]:
        """Attend from ``query`` to itself (self-attention) or to ``memory`` (cross-attention).

        Args:
            query: ``(B, T, d)``.
            memory: ``(B, S, d)`` for cross-attention; ignored if ``past_key_value`` is given.
            key_padding_mask: ``(B, S_total)`` bool, ``True`` = padding, over all keys (cached + new).
            causal: mask future keys (offset by the cache length).
            past_key_value: self-attention: cached ``(keys, values)`` ``(B, H, P, d_k)`` of earlier
                positions, extended with this call's; cross-attention: the projected memory.
            need_weights: also return attention weights ``(B, T, S)`` averaged over heads (and components).
        Returns:
            ``(output (B, T, d), weights or None, (keys, values))`` — the cache for the next call.
        """
        if query.dim() != 3 or query.shape[-1] != self.d_model:
            raise ValueError(f"{type(self).__name__}: expected query (B, T, {self.d_model}), got {tuple(query.shape)}")
        if self.self_attention:
            q, k, v = split_fused(self.qkv_proj(query), 3, self.num_components)
            q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (B, H, T, d_k)
            if past_key_value is not None:
                k = torch.cat([past_key_value[0], k], dim=2)  # (B, H, P + T, d_k)
                v = torch.cat([past_key_value[1], v], dim=2)
        else:
            q = self.split_heads(self.q_proj(query))
            if past_key_value is not None:
                k, v = past_key_value
            elif memory is not None:
                k, v = self.project_memory(memory)
            else:
                raise ValueError("cross-attention needs `memory` or `past_key_value`")
        mask = self._mask(q, k, key_padding_mask, causal)  # (B|1, 1, T, S) bool or None
        out, weights = self.attend(q, k, v, mask, need_weights)
        return self.out_proj(self.merge_heads(out)), weights, (k, v)

    def _mask(self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None, causal: bool) -> Tensor | None:
        """Bool ``True`` = may attend, broadcastable to ``(B, H, T, S)``."""
        B, S = k.shape[0], k.shape[2]
        mask = None
        if key_padding_mask is not None:
            if key_padding_mask.shape != (B, S):
                raise ValueError(f"key_padding_mask must have shape (B, S) = ({B}, {S}), "
                                 f"got {tuple(key_padding_mask.shape)}")
            mask = ~key_padding_mask.bool()[:, None, None, :]  # (B, 1, 1, S)
        if causal:
            cm = causal_mask(q.shape[2], S, device=q.device)[None, None]  # (1, 1, T, S)
            mask = cm if mask is None else mask & cm
        return mask

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool,
               ) -> tuple[Tensor, Tensor | None]:
        """``softmax(QKᵀ/√d_k) V`` per head: ``(B, H, T, d_k)`` → ``(B, H, T, d_k)``, weights ``(B, T, S)``."""
        p = self.dropout if self.training else 0.0
        if not need_weights:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p), None
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, H, T, S)
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        out = F.dropout(weights, p, self.training) @ v
        return out, weights.mean(dim=1)


class HamiltonAttention(MultiHeadAttention):
    """Quaternion self-/cross-attention of Tay et al. eq. 4: ``ComponentSoftmax(Q ⊗ K / √d_k) V``.

    Heads are taken *inside* each quaternion component, so a head sees ``m = d / (4H)`` quaternions
    in the ``[r; x; y; z]`` layout of §3.5: ``(B, T, d)`` → ``(B, H, T, 4, m)``. For every query/key
    pair, ``E = Σ_j q_j ⊗ k_j`` (the Hamilton product of the two quaternion vectors, summed over the
    ``m`` quaternions) has four components; each gives a ``T × S`` score matrix, softmax-normalised
    over keys, and output component ``a`` is ``G_a V_a``. Needs ``d`` divisible by ``4·H``; the
    projections are whatever ``linear`` says (quaternion for the paper's model). Same interface as
    :class:`MultiHeadAttention`; weights are averaged over heads and the four components.
    """

    num_quaternion_components = 4

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, linear: LinearSpec | None = None,
                 self_attention: bool = True, bias: bool = True, device=None, dtype=None) -> None:
        if d_model % (4 * num_heads):
            raise ValueError(f"HamiltonAttention: d_model={d_model} must be a multiple of 4 * num_heads = "
                             f"{4 * num_heads} (each head holds whole quaternions)")
        super().__init__(d_model, num_heads, dropout, linear, self_attention, bias, device, dtype)
        # rule[i, a, c]: coefficient of e_a in e_i e_c (hyperplex.algebra); a buffer so it follows .to().
        self.register_buffer("hamilton_rule", algebra_rule("quaternion", dtype=dtype, device=device), persistent=False)

    def split_heads(self, x: Tensor) -> Tensor:
        """``(B, T, d)`` → ``(B, H, T, d_k)`` where each head's ``d_k`` is ``[r; x; y; z]`` of ``m``."""
        B, T, _ = x.shape
        x = x.view(B, T, 4, self.num_heads, self.head_dim // 4)  # (B, T, 4, H, m)
        return x.permute(0, 3, 1, 2, 4).flatten(-2)  # (B, H, T, 4m)

    def merge_heads(self, x: Tensor) -> Tensor:
        """Inverse of :meth:`split_heads`: ``(B, H, T, 4m)`` → ``(B, T, d)``."""
        B, H, T, _ = x.shape
        return x.view(B, H, T, 4, -1).permute(0, 2, 3, 1, 4).reshape(B, T, self.d_model)

    def hamilton_scores(self, q: Tensor, k: Tensor) -> Tensor:
        """``(Q ⊗ Kᵀ)_a[t, s] = Σ_{i,c} rule[i,a,c] ⟨q_t,i , k_s,c⟩``: ``(B, H, T, 4m)``, ``(B, H, S, 4m)``
        → ``(B, H, 4, T, S)``. Computed as 4 matmuls of ``Q`` with rule-mixed keys ``K'_a``."""
        rule = self.hamilton_rule.to(k.dtype)
        kc = k.unflatten(-1, (4, -1))  # (B, H, S, 4c, m)
        mixed = torch.einsum("iac,bhscm->bhasim", rule, kc).flatten(-2)  # (B, H, 4a, S, 4i·m) = K'_a
        return q.unsqueeze(2) @ mixed.transpose(-1, -2)  # (B, H, 4, T, S)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, need_weights: bool,
               ) -> tuple[Tensor, Tensor | None]:
        scores = self.hamilton_scores(q, k) / math.sqrt(self.head_dim)  # Tay et al. eq. 4
        weights = component_softmax(scores, mask)  # (B, H, 4, T, S)
        p = self.dropout if self.training else 0.0
        vc = v.unflatten(-1, (4, -1)).transpose(2, 3)  # (B, H, 4, S, m)
        out = F.dropout(weights, p, self.training) @ vc  # component a: G_a V_a → (B, H, 4, T, m)
        out = out.transpose(2, 3).flatten(-2)  # (B, H, T, 4m)
        return out, (weights.mean(dim=(1, 2)) if need_weights else None)


#: Attention variants by config name (``TransformerConfig.attention_type``).
ATTENTION_TYPES: dict[str, type[MultiHeadAttention]] = {"dot": MultiHeadAttention, "hamilton": HamiltonAttention}
