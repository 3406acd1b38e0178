"""Masks from sequence lengths, with one convention for the whole package: ``True`` marks a real token.

Attention layers that want the opposite (``key_padding_mask``: ``True`` at padding, as in
``torch.nn.MultiheadAttention``) take ``~lengths_to_mask(...)``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["lengths_to_mask", "lengths_out_of_range"]


def lengths_out_of_range(lengths: Tensor, low: int, high: int) -> bool:
    """Whether any of ``lengths`` lies outside ``[low, high]``: a caller's bug, not data, so the callers fail
    loudly. One reduction, so one host read for a CUDA tensor; none while torch.compile traces, where the read
    would split the graph (what hyperplex compiles is the trainer's forward, whose lengths the data pipeline
    computed from the batch itself), so there it answers False."""
    return not torch.compiler.is_compiling() and bool(((lengths < low) | (lengths > high)).any())


def lengths_to_mask(lengths: Tensor, max_len: int) -> Tensor:
    """``(B,)`` lengths → bool ``(B, max_len)``, ``True`` at the first ``lengths[b]`` positions of row ``b``."""
    if lengths.dim() != 1:
        raise ValueError(f"lengths must have shape (B,), got {tuple(lengths.shape)}")
    if lengths_out_of_range(lengths, 0, max_len):
        raise ValueError(f"lengths must be in [0, {max_len}], got {lengths.tolist()}")
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]
