"""Masks from sequence lengths, with one convention for the whole package: ``True`` marks a real token.

Attention layers that want the opposite (``key_padding_mask``: ``True`` at padding, as in
``torch.nn.MultiheadAttention``) take ``~lengths_to_mask(...)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["lengths_to_mask"]


def lengths_to_mask(lengths: Tensor, max_len: int) -> Tensor:
    """``(B,)`` lengths → bool ``(B, max_len)``, ``True`` at the first ``lengths[b]`` positions of row ``b``."""
    if lengths.dim() != 1:
        raise ValueError(f"lengths must have shape (B,), got {tuple(lengths.shape)}")
    # a caller's bug, not data: fail loudly (one reduction, so one host sync for a CUDA tensor). Not while
    # torch.compile traces: the host read would split its graph, and what it compiles is the trainer's forward,
    # whose lengths the data pipeline computed from the batch itself
    if not torch.compiler.is_compiling() and bool(((lengths < 0) | (lengths > max_len)).any()):
        raise ValueError(f"lengths must be in [0, {max_len}], got {lengths.tolist()}")
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]
