"""Luong et al. (2015) attention: global (dot, general, concat) and local (local-m, local-p).

Thesis ch. 3 (002): ``a_t = align(h_t, h̄_s) = softmax_s score(h_t, h̄_s)`` (eq. 3.1/3.6),
``c_t = Σ_s a_ts h̄_s`` (eq. 3.3). Local attention looks only at a window of ``2D + 1`` positions
(eq. 3.7), ``[round(p_t) − D, round(p_t) + D]``, clipped at the sentence edges: local-m sets ``p_t = t``;
local-p predicts ``p_t = S · sigmoid(v_pᵀ tanh(W_p h_t))`` (eq. 3.8) with ``S`` the true source
length and weights the alignment by ``exp(−(s − p_t)² / 2σ²)``, ``σ = D/2`` (eq. 3.9).

Choices worth knowing:

- Local variants score with ``general`` inside the window, as Luong et al. did for their best
  local models (the thesis leaves the score open).
- local-m clamps ``p_t = t`` to the last source position, so target steps past the source end
  still see a window (Luong's ``p_t = t`` alone would leave it empty).
- local-p renormalises by default: ``a_ts ∝ softmax(score)_s · exp(−(s − p_t)²/2σ²)`` over the
  window, i.e. the Gaussian enters as a log-prior before the softmax, so every variant's
  weights sum to 1 over the valid positions. ``normalize=False`` gives eq. 3.9 literally (the
  window softmax times the Gaussian, summing to less than 1).
- ``v_a`` (concat) and ``v_p`` (local-p) are vectors (maps to one number), which no ``n > 1``
  PHM layer can represent, so they are plain parameters; every matrix comes from
  :func:`make_linear`. ``concat``'s ``W_a [h_t; h̄_s]`` is written as ``W_q h_t + W_k h̄_s``
  (the same map for dense weights; two PHM maps for PHM, like the PHM-LSTM's
  ``PHM(x_t) + PHM(h_{t−1})``), so ``W_k h̄_s`` is computed once per sentence.

Adding a variant: write one factory ``(query_size, memory_size, linear, window, normalize) ->
module`` and add one line to :data:`ATTENTIONS`.

Shapes everywhere: query ``(B, H)`` (one step) or ``(B, T, H)`` (T steps at once), memory
``(B, S, M)``, mask ``(B, S)`` bool (True = valid), context ``(B, [T,] M)``, weights ``(B, [T,] S)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn

from hyperplex.nn.linear import LinearSpec, make_linear

__all__ = ["DotScore", "GeneralScore", "ConcatScore", "MonotonicPosition", "PredictivePosition",
           "LuongAttention", "ATTENTIONS", "make_attention"]


# ---------------------------------------------------------------------------- scores
class DotScore(nn.Module):
    """``score(h_t, h̄_s) = h_tᵀ h̄_s`` (thesis eq. 3.2, dot). Needs ``query_size == memory_size``."""

    def __init__(self, query_size: int, memory_size: int, linear: LinearSpec | None = None) -> None:
        super().__init__()
        if query_size != memory_size:
            raise ValueError(f"dot attention needs query size == memory size, got {query_size} and {memory_size}; "
                             f"use 'general' or 'concat' for different sizes")

    def keys(self, memory: Tensor) -> Tensor:
        """Per-sentence precomputation: ``(B, S, M) -> (B, S, H)``."""
        return memory

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        """``query (B, T, H)``, ``keys (B, S, H)`` -> scores ``(B, T, S)``."""
        return query @ keys.transpose(1, 2)


class GeneralScore(DotScore):
    """``score(h_t, h̄_s) = h_tᵀ W_a h̄_s`` (thesis eq. 3.2, general); ``W_a h̄_s`` is precomputed."""

    def __init__(self, query_size: int, memory_size: int, linear: LinearSpec | None = None) -> None:
        nn.Module.__init__(self)
        (linear or LinearSpec()).check_divides(query_size, memory_size, where="general attention W_a")
        self.W_a = make_linear(memory_size, query_size, linear, bias=False)

    def keys(self, memory: Tensor) -> Tensor:
        return self.W_a(memory)  # (B, S, H)


class ConcatScore(nn.Module):
    """``score(h_t, h̄_s) = v_aᵀ tanh(W_q h_t + W_k h̄_s)`` (Luong et al. eq. 8, concat)."""

    def __init__(self, query_size: int, memory_size: int, linear: LinearSpec | None = None) -> None:
        super().__init__()
        (linear or LinearSpec()).check_divides(query_size, memory_size, where="concat attention W_a")
        self.W_q = make_linear(query_size, query_size, linear, bias=False)
        self.W_k = make_linear(memory_size, query_size, linear, bias=False)
        self.v_a = nn.Parameter(torch.empty(query_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.v_a.numel())
        nn.init.uniform_(self.v_a, -bound, bound)

    def keys(self, memory: Tensor) -> Tensor:
        return self.W_k(memory)  # (B, S, H)

    def forward(self, query: Tensor, keys: Tensor) -> Tensor:
        hidden = torch.tanh(self.W_q(query)[:, :, None] + keys[:, None])  # (B, T, S, H)
        return hidden @ self.v_a  # (B, T, S)


# ---------------------------------------------------------------------------- positions
class MonotonicPosition(nn.Module):
    """local-m: ``p_t = t`` (thesis §3.4), clamped to ``[0, S_len − 1]``."""

    def forward(self, query: Tensor, steps: Tensor, lengths: Tensor) -> Tensor:
        """``query (B, T, H)``, ``steps (T,)``, ``lengths (B,)`` -> ``p (B, T)``."""
        last = (lengths - 1).clamp_min(0).to(query.dtype)[:, None]  # (B, 1)
        return torch.minimum(steps.to(query.dtype)[None, :], last)


class PredictivePosition(nn.Module):
    """local-p: ``p_t = S_len · sigmoid(v_pᵀ tanh(W_p h_t))`` (thesis eq. 3.8), ``p_t ∈ [0, S_len]``."""

    def __init__(self, query_size: int, linear: LinearSpec | None = None) -> None:
        super().__init__()
        (linear or LinearSpec()).check_divides(query_size, where="local-p W_p")
        self.W_p = make_linear(query_size, query_size, linear, bias=False)
        self.v_p = nn.Parameter(torch.empty(query_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.v_p.numel())
        nn.init.uniform_(self.v_p, -bound, bound)

    def forward(self, query: Tensor, steps: Tensor, lengths: Tensor) -> Tensor:
        gate = torch.sigmoid(torch.tanh(self.W_p(query)) @ self.v_p)  # (B, T)
        return lengths.to(query.dtype)[:, None] * gate


# ---------------------------------------------------------------------------- attention
class LuongAttention(nn.Module):
    """Global or local Luong attention built from a score and (for local) a position predictor.

    Args:
        score: :class:`DotScore`, :class:`GeneralScore` or :class:`ConcatScore` (or a module with the same
            ``keys(memory)`` and ``forward(query, keys) -> (B, T, S)``).
        position: ``None`` (global) or a module ``(query, steps, lengths) -> p (B, T)``.
        window: half-width ``D`` of the local window (``D ≥ 1``).
        gaussian: multiply the alignment by ``exp(−(s − p_t)²/2σ²)``, ``σ = D/2`` (local-p).
        normalize: with ``gaussian``, renormalise so the weights sum to 1 (see module doc).
        name: the registry name, for ``repr``.

    Shape:
        ``forward(query (B, [T,] H), memory (B, S, M), mask (B, S) | None, step=0,
        lengths (B,) | None, keys=None) -> (context (B, [T,] M), weights (B, [T,] S))``.
        ``query[:, i]`` is target step ``step + i`` (used by local-m). ``lengths`` default to
        ``mask.sum(1)``; ``keys`` (from :meth:`keys`) may be passed to skip recomputing them.
        Every source needs at least one valid position.
    """

    def __init__(self, score: DotScore | ConcatScore, position: nn.Module | None = None, window: int = 10,
                 gaussian: bool = False, normalize: bool = True, name: str = "") -> None:
        super().__init__()
        if position is not None and (not isinstance(window, int) or window < 1):
            raise ValueError(f"local attention window D must be an integer >= 1, got {window!r}")
        self.score, self.position = score, position
        self.window, self.gaussian, self.normalize, self.name = window, gaussian, normalize, name

    def extra_repr(self) -> str:
        local = f", window={self.window}, gaussian={self.gaussian}, normalize={self.normalize}" if self.position else ""
        return f"name={self.name!r}{local}"

    def keys(self, memory: Tensor) -> Tensor:
        """What the score needs from the memory, computed once per sentence: ``(B, S, M) -> (B, S, H)``."""
        return self.score.keys(memory)

    def forward(self, query: Tensor, memory: Tensor, mask: Tensor | None = None, step: int = 0,
                lengths: Tensor | None = None, keys: Tensor | None = None) -> tuple[Tensor, Tensor]:
        single = query.dim() == 2
        if single:
            query = query[:, None]  # (B, 1, H)
        B, T = query.shape[:2]
        S = memory.shape[1]
        if mask is None:
            mask = torch.ones(B, S, dtype=torch.bool, device=memory.device)
        if mask.shape != (B, S):
            raise ValueError(f"attention mask must have shape (B, S) = {(B, S)}, got {tuple(mask.shape)}")
        keys = self.keys(memory) if keys is None else keys
        scores = self.score(query, keys)  # (B, T, S)
        valid = mask[:, None, :].expand(B, T, S)
        if self.position is not None:
            if lengths is None:
                lengths = mask.sum(1)
            steps = step + torch.arange(T, device=query.device)
            p = self.position(query, steps, lengths)  # (B, T)
            positions = torch.arange(S, device=query.device, dtype=query.dtype)
            distance = positions - p[..., None]  # (B, T, S)
            # eq. 3.7's window of 2D + 1 positions, centred on the position nearest p_t (a window of |s − p_t| ≤ D
            # around a real p_t holds only 2D), clipped by the mask; the Gaussian below is centred on p_t itself
            centre = torch.round(p.detach())[..., None]
            valid = valid & ((positions - centre).abs() <= self.window)
            if self.gaussian:
                sigma = self.window / 2.0  # thesis: σ = D/2
                log_prior = -distance.square() / (2 * sigma**2)  # eq. 3.9
                if self.normalize:
                    scores = scores + log_prior
        weights = torch.softmax(scores.masked_fill(~valid, float("-inf")), dim=-1)  # exactly 0 off the window
        if self.position is not None and self.gaussian and not self.normalize:
            weights = weights * log_prior.exp()
        context = weights @ memory  # eq. 3.3, (B, T, M)
        if single:
            return context[:, 0], weights[:, 0]
        return context, weights


# ---------------------------------------------------------------------------- registry
Factory = Callable[..., "LuongAttention | None"]


def _none(query_size, memory_size, linear=None, window=10, normalize=True):
    return None


def _dot(query_size, memory_size, linear=None, window=10, normalize=True):
    return LuongAttention(DotScore(query_size, memory_size, linear), name="dot")


def _general(query_size, memory_size, linear=None, window=10, normalize=True):
    return LuongAttention(GeneralScore(query_size, memory_size, linear), name="general")


def _concat(query_size, memory_size, linear=None, window=10, normalize=True):
    return LuongAttention(ConcatScore(query_size, memory_size, linear), name="concat")


def _local_m(query_size, memory_size, linear=None, window=10, normalize=True):
    return LuongAttention(GeneralScore(query_size, memory_size, linear), MonotonicPosition(), window,
                          gaussian=False, name="local-m")


def _local_p(query_size, memory_size, linear=None, window=10, normalize=True):
    return LuongAttention(GeneralScore(query_size, memory_size, linear), PredictivePosition(query_size, linear),
                          window, gaussian=True, normalize=normalize, name="local-p")


#: name -> factory ``(query_size, memory_size, linear, window, normalize) -> LuongAttention | None``.
ATTENTIONS: dict[str, Factory] = {
    "none": _none,
    "dot": _dot,
    "general": _general,
    "concat": _concat,
    "local-m": _local_m,
    "local-p": _local_p,
}


def make_attention(name: str, query_size: int, memory_size: int, linear: LinearSpec | None = None,
                   window: int = 10, normalize: bool = True) -> LuongAttention | None:
    """Build the attention called ``name`` (a key of :data:`ATTENTIONS`); ``None`` for ``"none"``."""
    if name not in ATTENTIONS:
        raise ValueError(f"unknown attention {name!r}; valid: {', '.join(ATTENTIONS)}")
    return ATTENTIONS[name](query_size, memory_size, linear, window, normalize)
