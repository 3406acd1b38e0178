"""Batch composition (sentence- or token-count budgets, length bucketing, seeded shuffling) and padding.

Shuffling uses a local ``random.Random`` seeded from ``(seed, epoch)`` only, never the global
RNG, so the data order of any epoch can be recomputed exactly when a run is resumed.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

BATCH_TYPES = ("sentence", "token")

#: With shuffling, examples are sorted by length within pools of this many batches (the
#: BucketIterator recipe): batches hold similar lengths, yet differ from epoch to epoch.
POOL_BATCHES = 100


def epoch_rng(seed: int, epoch: int) -> random.Random:
    """The local RNG of one epoch; a string seed is hashed with SHA-512, the same in every process."""
    return random.Random(f"hyperplex-batches:{seed}:{epoch}")


def _chunk(order: list[int], lengths: Sequence[int], batch_size: int, batch_type: str) -> list[list[int]]:
    """Split ``order`` into consecutive batches within the budget."""
    if batch_type == "sentence":
        return [order[i:i + batch_size] for i in range(0, len(order), batch_size)]
    batches: list[list[int]] = []
    current: list[int] = []
    longest = 0
    for index in order:
        length = max(lengths[index], 1)  # an empty example still occupies a row
        new_longest = max(longest, length)
        if current and new_longest * (len(current) + 1) > batch_size:
            batches.append(current)
            current, new_longest = [], length
        current.append(index)
        longest = new_longest
    if current:
        batches.append(current)
    return batches


def make_batches(lengths: Sequence[int], batch_size: int, batch_type: str = "sentence", shuffle: bool = False,
                 seed: int = 0, epoch: int = 0, bucket: bool = True) -> list[list[int]]:
    """Group example indices ``0 .. len(lengths)-1`` into batches; every index appears exactly once.

    Args:
        lengths: length of each example (tokens), used for bucketing and token budgets.
        batch_size: examples per batch (``sentence``) or the padded-token budget
            ``max_length × examples ≤ batch_size`` of each batch (``token``). An example longer
            than the token budget forms a batch on its own (it is never dropped).
        batch_type: ``"sentence"`` or ``"token"``.
        shuffle: shuffle examples and batch order, deterministically for ``(seed, epoch)``.
        seed, epoch: select the permutation (a different one every epoch).
        bucket: group similar lengths to reduce padding. With ``shuffle``, examples are
            sorted by length inside shuffled pools of :data:`POOL_BATCHES` batches and the
            batches are then shuffled; without ``shuffle``, all examples are sorted by length
            (stable), which suits evaluation (restore order with the batch indices).

    Returns:
        A list of batches, each a list of example indices.
    """
    if batch_type not in BATCH_TYPES:
        raise ValueError(f"batch_type must be one of {BATCH_TYPES}, got {batch_type!r}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if len(lengths) == 0:
        raise ValueError("no examples to batch (empty dataset)")
    if any(length < 0 for length in lengths):
        raise ValueError("example lengths must be non-negative")
    order = list(range(len(lengths)))
    rng = epoch_rng(seed, epoch)
    if shuffle:
        rng.shuffle(order)
    if not bucket:
        batches = _chunk(order, lengths, batch_size, batch_type)
    elif not shuffle:
        batches = _chunk(sorted(order, key=lambda i: lengths[i]), lengths, batch_size, batch_type)
    else:
        per_batch = batch_size
        if batch_type == "token":  # approximate examples per batch from the mean length
            mean = max(1.0, sum(lengths) / len(lengths))
            per_batch = max(1, int(batch_size / mean))
        pool = per_batch * POOL_BATCHES
        batches = []
        for start in range(0, len(order), pool):
            # sorted() is stable, so equal lengths stay in their shuffled order
            chunk = sorted(order[start:start + pool], key=lambda i: lengths[i])
            batches.extend(_chunk(chunk, lengths, batch_size, batch_type))
    if shuffle:
        rng.shuffle(batches)
    return batches


def pad_sequences(seqs: Sequence[Sequence[int]], pad_index: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad id sequences into one tensor.

    Returns ``(padded, lengths)``: LongTensor ``(B, T)`` with ``T`` the longest length, filled
    with ``pad_index`` after each sequence, and LongTensor ``(B,)`` of the true lengths.
    """
    if len(seqs) == 0:
        raise ValueError("pad_sequences needs at least one sequence")
    longest = max(len(s) for s in seqs)
    rows = [list(s) + [pad_index] * (longest - len(s)) for s in seqs]
    padded = torch.tensor(rows, dtype=torch.long).reshape(len(seqs), longest)  # (B, T)
    lengths = torch.tensor([len(s) for s in seqs], dtype=torch.long)  # (B,)
    return padded, lengths
