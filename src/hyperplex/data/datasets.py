"""In-memory datasets of already-encoded ids, and the :class:`Batch` they produce.

The datasets hold no task logic: they pad, add BOS/EOS to targets and group examples with
:func:`~hyperplex.data.batching.make_batches`. Every batch keeps the example indices so outputs
written in batch order can be put back in corpus order, and its normaliser ``num_tokens``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from hyperplex.data.batching import make_batches, pad_sequences
from hyperplex.data.vocab import BOS_INDEX, EOS_INDEX, PAD_INDEX


@dataclass
class Batch:
    """A padded batch.

    Attributes:
        tensors: named tensors, each with the batch on dim 0 (e.g. ``src (B, S)``).
        indices: dataset index of each row (to restore corpus order).
        num_tokens: the loss normaliser: target tokens (seq2seq) or examples (classification).
        example_sizes: each row's share of ``num_tokens``, so :meth:`shard` can recompute it
            (``None`` = 1 per row).
    """

    tensors: dict[str, torch.Tensor]
    indices: list[int]
    num_tokens: int
    example_sizes: list[int] | None = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def to(self, device: torch.device | str, non_blocking: bool = False) -> Batch:
        """A copy with every tensor moved to ``device``."""
        tensors = {k: v.to(device, non_blocking=non_blocking) for k, v in self.tensors.items()}
        return Batch(tensors, list(self.indices), self.num_tokens, self.example_sizes)

    def shard(self, rank: int, world_size: int) -> Batch:
        """Rows ``rank::world_size`` of this batch (data-parallel split), with their ``num_tokens``.

        Padding columns are kept, so a shard may end in all-pad columns (masked by the models).
        A shard is empty (0 rows, ``num_tokens`` 0) when ``world_size`` exceeds the batch size.
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size}), got {rank}")
        rows = list(range(rank, len(self.indices), world_size))
        index = torch.tensor(rows, dtype=torch.long)
        tensors = {k: v.index_select(0, index.to(v.device)) for k, v in self.tensors.items()}
        sizes = None if self.example_sizes is None else [self.example_sizes[r] for r in rows]
        num_tokens = len(rows) if sizes is None else sum(sizes)
        return Batch(tensors, [self.indices[r] for r in rows], num_tokens, sizes)


def _check_nonempty(seqs: Sequence[Sequence[int]], what: str) -> None:
    for i, seq in enumerate(seqs):
        if len(seq) == 0:
            raise ValueError(f"example {i} has an empty {what}; drop empty examples first (filter_examples)")


class _EncodedDataset:
    """Shared batching over :meth:`lengths` and :meth:`collate`."""

    def __len__(self) -> int:
        return len(self.lengths)

    lengths: list[int]

    def collate(self, indices: Sequence[int]) -> Batch:
        """The batch of examples ``indices`` (in that order)."""
        raise NotImplementedError

    def batches(self, batch_size: int, batch_type: str = "sentence", shuffle: bool = False, seed: int = 0,
                epoch: int = 0, bucket: bool = True) -> list[Batch]:
        """All batches of one epoch; see :func:`~hyperplex.data.batching.make_batches` for the arguments."""
        return [self.collate(b) for b in make_batches(self.lengths, batch_size, batch_type, shuffle=shuffle,
                                                      seed=seed, epoch=epoch, bucket=bucket)]


class Seq2SeqDataset(_EncodedDataset):
    """Source/target id sequences for translation (targets optional, for inference).

    Batch tensors: ``src (B, S)``, ``src_lengths (B,)`` and, with targets, ``tgt_in (B, T+1)`` =
    BOS + target, ``tgt_out (B, T+1)`` = target + EOS, ``tgt_lengths (B,)`` (target length + 1),
    all padded with ``pad_index``. ``num_tokens`` = number of ``tgt_out`` tokens (EOS included),
    or of source tokens without targets. Sources are used as given (add EOS when encoding if the
    model wants one). Bucketing length: max(source, target + 1).
    """

    def __init__(self, src_ids: Sequence[Sequence[int]], tgt_ids: Sequence[Sequence[int]] | None = None,
                 pad_index: int = PAD_INDEX, bos_index: int = BOS_INDEX, eos_index: int = EOS_INDEX):
        if tgt_ids is not None and len(src_ids) != len(tgt_ids):
            raise ValueError(f"source and target counts differ: {len(src_ids)} sources, {len(tgt_ids)} targets")
        if len(src_ids) == 0:
            raise ValueError("empty dataset: no examples")
        _check_nonempty(src_ids, "source")
        self.src_ids, self.tgt_ids = src_ids, tgt_ids
        self.pad_index, self.bos_index, self.eos_index = pad_index, bos_index, eos_index
        if tgt_ids is None:
            self.lengths = [len(s) for s in src_ids]
        else:
            self.lengths = [max(len(s), len(t) + 1) for s, t in zip(src_ids, tgt_ids)]

    def collate(self, indices: Sequence[int]) -> Batch:
        indices = list(indices)
        src, src_lengths = pad_sequences([self.src_ids[i] for i in indices], self.pad_index)  # (B, S), (B,)
        tensors = {"src": src, "src_lengths": src_lengths}
        if self.tgt_ids is None:
            sizes = src_lengths.tolist()
        else:
            targets = [list(self.tgt_ids[i]) for i in indices]
            tensors["tgt_in"], tgt_lengths = pad_sequences([[self.bos_index] + t for t in targets],
                                                           self.pad_index)  # (B, T+1)
            tensors["tgt_out"], _ = pad_sequences([t + [self.eos_index] for t in targets], self.pad_index)
            tensors["tgt_lengths"] = tgt_lengths
            sizes = tgt_lengths.tolist()
        return Batch(tensors, indices, sum(sizes), sizes)


def _label_tensor(labels: Sequence) -> torch.Tensor:
    """LongTensor for integer class labels, FloatTensor for real-valued targets."""
    tensor = torch.as_tensor(list(labels))
    return tensor.long() if not tensor.is_floating_point() else tensor.float()


class ClassificationDataset(_EncodedDataset):
    """Token id sequences with one label each (sentiment, agreement).

    Batch tensors: ``tokens (B, T)`` padded with ``pad_index``, ``lengths (B,)``, ``labels (B,)``.
    ``num_tokens`` = number of examples. Bucketing length: the sequence length.
    """

    #: Integer query ids of the examples, for MAP/MRR: none for single texts.
    groups: torch.Tensor | None = None

    def __init__(self, token_ids: Sequence[Sequence[int]], labels: Sequence, pad_index: int = PAD_INDEX):
        if len(token_ids) != len(labels):
            raise ValueError(f"{len(token_ids)} sequences but {len(labels)} labels")
        if len(token_ids) == 0:
            raise ValueError("empty dataset: no examples")
        _check_nonempty(token_ids, "token sequence")
        self.token_ids, self.labels, self.pad_index = token_ids, _label_tensor(labels), pad_index
        self.lengths = [len(t) for t in token_ids]

    def collate(self, indices: Sequence[int]) -> Batch:
        indices = list(indices)
        tokens, lengths = pad_sequences([self.token_ids[i] for i in indices], self.pad_index)  # (B, T), (B,)
        labels = self.labels[torch.tensor(indices, dtype=torch.long)]  # (B,)
        return Batch({"tokens": tokens, "lengths": lengths, "labels": labels}, indices, len(indices))


class PairDataset(_EncodedDataset):
    """Sentence pairs with a label (NLI) or a relevance score and a query id (answer selection).

    Batch tensors: ``a (B, Ta)``, ``a_lengths (B,)``, ``b (B, Tb)``, ``b_lengths (B,)``,
    ``labels (B,)`` and, when ``groups`` is given, ``groups (B,)`` (integer query ids, for MAP/MRR).
    ``num_tokens`` = number of examples. Bucketing length: len(a) + len(b).
    """

    def __init__(self, a_ids: Sequence[Sequence[int]], b_ids: Sequence[Sequence[int]], labels: Sequence,
                 groups: Sequence[int] | None = None, pad_index: int = PAD_INDEX):
        counts = {"a": len(a_ids), "b": len(b_ids), "labels": len(labels)}
        if groups is not None:
            counts["groups"] = len(groups)
        if len(set(counts.values())) != 1:
            raise ValueError(f"pair dataset inputs differ in length: {counts}")
        if len(a_ids) == 0:
            raise ValueError("empty dataset: no examples")
        _check_nonempty(a_ids, "first sequence (a)")
        _check_nonempty(b_ids, "second sequence (b)")
        self.a_ids, self.b_ids, self.pad_index = a_ids, b_ids, pad_index
        self.labels = _label_tensor(labels)
        self.groups = None if groups is None else torch.as_tensor(list(groups), dtype=torch.long)
        self.lengths = [len(a) + len(b) for a, b in zip(a_ids, b_ids)]

    def collate(self, indices: Sequence[int]) -> Batch:
        indices = list(indices)
        rows = torch.tensor(indices, dtype=torch.long)
        a, a_lengths = pad_sequences([self.a_ids[i] for i in indices], self.pad_index)  # (B, Ta), (B,)
        b, b_lengths = pad_sequences([self.b_ids[i] for i in indices], self.pad_index)  # (B, Tb), (B,)
        tensors = {"a": a, "a_lengths": a_lengths, "b": b, "b_lengths": b_lengths, "labels": self.labels[rows]}
        if self.groups is not None:
            tensors["groups"] = self.groups[rows]
        return Batch(tensors, indices, len(indices))


class JointPairDataset(ClassificationDataset):
    """Sentence pairs already joined into one sequence by a pretrained tokenizer — a cross-encoder's input,
    e.g. BERT's ``[CLS] a [SEP] b [SEP]`` — with a label (NLI) or a relevance score and a query id (ranking).

    Batch tensors: ``tokens (B, T)`` padded with ``pad_index``, ``lengths (B,)``, ``labels (B,)``; with
    ``token_types`` also ``token_types (B, T)`` (the segment of each token: 0 = first text, 1 = second;
    padding 0); with ``groups`` also ``groups (B,)`` (integer query ids, for MAP/MRR). ``num_tokens`` = number
    of examples. Bucketing length: the joined length.
    """

    def __init__(self, token_ids: Sequence[Sequence[int]], labels: Sequence,
                 token_types: Sequence[Sequence[int]] | None = None, groups: Sequence[int] | None = None,
                 pad_index: int = PAD_INDEX):
        super().__init__(token_ids, labels, pad_index)
        if token_types is not None and [len(t) for t in token_types] != self.lengths:
            raise ValueError("token_types must have one segment id per token of every sequence")
        if groups is not None and len(groups) != len(token_ids):
            raise ValueError(f"{len(token_ids)} sequences but {len(groups)} groups")
        self.token_types = token_types
        self.groups = None if groups is None else torch.as_tensor(list(groups), dtype=torch.long)

    def collate(self, indices: Sequence[int]) -> Batch:
        batch = super().collate(indices)
        rows = torch.tensor(batch.indices, dtype=torch.long)
        if self.token_types is not None:
            batch.tensors["token_types"], _ = pad_sequences([self.token_types[i] for i in batch.indices], 0)  # (B, T)
        if self.groups is not None:
            batch.tensors["groups"] = self.groups[rows]
        return batch
