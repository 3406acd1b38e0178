"""Datasets and Batch: tensors, BOS/EOS framing, normalisers, shard() partitions, order restoration."""

import os

import pytest
import torch

from hyperplex.data.datasets import Batch, ClassificationDataset, JointPairDataset, PairDataset, Seq2SeqDataset
from hyperplex.data.readers import filter_examples, read_parallel
from hyperplex.data.tokenizers import WordTokenizer


def test_seq2seq_batch_tensors():
    ds = Seq2SeqDataset([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]])
    batch = ds.collate([0, 1])
    assert batch["src"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch["src_lengths"].tolist() == [3, 1]
    assert batch["tgt_in"].tolist() == [[2, 9, 10, 0], [2, 11, 12, 13]]   # BOS + target
    assert batch["tgt_out"].tolist() == [[9, 10, 3, 0], [11, 12, 13, 3]]  # target + EOS
    assert batch["tgt_lengths"].tolist() == [3, 4]
    assert batch.num_tokens == 7 == int((batch["tgt_out"] != 0).sum())
    assert batch.indices == [0, 1] and len(batch) == 2
    assert ds.lengths == [3, 4] and len(ds) == 2


def test_seq2seq_without_targets_and_custom_indices():
    ds = Seq2SeqDataset([[5, 6], [7]], pad_index=9, bos_index=1, eos_index=2)
    batch = ds.collate([1, 0])
    assert set(batch.tensors) == {"src", "src_lengths"}
    assert batch["src"].tolist() == [[7, 9], [5, 6]] and batch.num_tokens == 3
    ds = Seq2SeqDataset([[5]], [[6]], pad_index=9, bos_index=1, eos_index=2)
    assert ds.collate([0])["tgt_in"].tolist() == [[1, 6]] and ds.collate([0])["tgt_out"].tolist() == [[6, 2]]


def test_dataset_validation():
    with pytest.raises(ValueError, match="2 sources, 1 targets"):
        Seq2SeqDataset([[1], [2]], [[3]])
    with pytest.raises(ValueError, match="example 1 has an empty source"):
        Seq2SeqDataset([[1], []], [[3], [4]])
    with pytest.raises(ValueError, match="empty dataset"):
        Seq2SeqDataset([], [])
    with pytest.raises(ValueError, match="2 sequences but 1 labels"):
        ClassificationDataset([[1], [2]], [0])
    with pytest.raises(ValueError, match=r"differ in length: \{'a': 2, 'b': 2, 'labels': 2, 'groups': 1\}"):
        PairDataset([[1], [2]], [[3], [4]], [0, 1], groups=[7])
    with pytest.raises(ValueError, match="example 0 has an empty second sequence"):
        PairDataset([[1]], [[]], [0])


def test_classification_dataset():
    ds = ClassificationDataset([[4, 5], [6], [7, 8, 9]], [1, 0, 1])
    batch = ds.collate([2, 1])
    assert batch["tokens"].tolist() == [[7, 8, 9], [6, 0, 0]]
    assert batch["lengths"].tolist() == [3, 1] and batch["labels"].tolist() == [1, 0]
    assert batch["labels"].dtype == torch.long and batch.num_tokens == 2
    assert ClassificationDataset([[4]], [0.5]).collate([0])["labels"].dtype == torch.float32


def test_pair_dataset_with_groups():
    ds = PairDataset([[4, 5], [6], [7]], [[8], [9, 10, 11], [12]], [0, 1, 0], groups=[3, 3, 5])
    batch = ds.collate([0, 1, 2])
    assert batch["a"].tolist() == [[4, 5], [6, 0], [7, 0]] and batch["a_lengths"].tolist() == [2, 1, 1]
    assert batch["b"].tolist() == [[8, 0, 0], [9, 10, 11], [12, 0, 0]] and batch["b_lengths"].tolist() == [1, 3, 1]
    assert batch["labels"].tolist() == [0, 1, 0] and batch["groups"].tolist() == [3, 3, 5]
    assert ds.lengths == [3, 4, 2] and batch.num_tokens == 3
    assert "groups" not in PairDataset([[1]], [[2]], [1]).collate([0]).tensors


def test_joint_pair_dataset_pads_token_types_and_keeps_groups():
    # [CLS] a [SEP] b [SEP] as a pretrained tokenizer joins a pair: 2 = [CLS], 3 = [SEP], types 0 then 1
    ids = [[2, 7, 3, 8, 9, 3], [2, 7, 7, 3, 8, 3], [2, 5, 3, 6, 3]]
    types = [[0, 0, 0, 1, 1, 1], [0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1]]
    ds = JointPairDataset(ids, [1.0, 0.0, 1.0], types, groups=[4, 4, 9], pad_index=1)
    batch = ds.collate([2, 0])
    assert batch["tokens"].tolist() == [[2, 5, 3, 6, 3, 1], [2, 7, 3, 8, 9, 3]] and batch["lengths"].tolist() == [5, 6]
    assert batch["token_types"].tolist() == [[0, 0, 0, 1, 1, 0], [0, 0, 0, 1, 1, 1]]  # padding: type 0
    assert batch["labels"].tolist() == [1.0, 1.0] and batch["groups"].tolist() == [9, 4]
    assert ds.lengths == [6, 6, 5] and batch.num_tokens == 2
    assert [s["token_types"].tolist() for s in (batch.shard(0, 2), batch.shard(1, 2))] == \
        [[[0, 0, 0, 1, 1, 0]], [[0, 0, 0, 1, 1, 1]]]
    plain = JointPairDataset(ids, [0, 1, 0]).collate([0])  # a tokenizer without token types; no groups
    assert set(plain.tensors) == {"tokens", "lengths", "labels"}
    with pytest.raises(ValueError, match="one segment id per token"):
        JointPairDataset(ids, [0, 1, 0], [[0, 0, 0, 1, 1, 1]] * 3)
    with pytest.raises(ValueError, match="3 sequences but 2 groups"):
        JointPairDataset(ids, [0, 1, 0], groups=[1, 2])


def make_seq2seq(n=60):
    src = [[4 + (i % 7)] * (1 + i % 9) for i in range(n)]
    tgt = [[5 + (i % 5)] * (1 + (i * 7) % 11) for i in range(n)]
    return Seq2SeqDataset(src, tgt)


@pytest.mark.parametrize("batch_type, batch_size", [("sentence", 8), ("token", 40)])
def test_batches_cover_dataset_and_are_deterministic(batch_type, batch_size):
    ds = make_seq2seq()
    batches = ds.batches(batch_size, batch_type, shuffle=True, seed=1, epoch=0)
    assert sorted(i for b in batches for i in b.indices) == list(range(len(ds)))
    again = ds.batches(batch_size, batch_type, shuffle=True, seed=1, epoch=0)
    assert [b.indices for b in again] == [b.indices for b in batches]
    assert all(torch.equal(x["tgt_out"], y["tgt_out"]) for x, y in zip(batches, again))
    other = ds.batches(batch_size, batch_type, shuffle=True, seed=1, epoch=1)
    assert [b.indices for b in other] != [b.indices for b in batches]
    assert sum(b.num_tokens for b in batches) == sum(len(t) + 1 for t in ds.tgt_ids)
    if batch_type == "token":  # budget over the bucketing length max(src, tgt + 1)
        assert all(max(ds.lengths[i] for i in b.indices) * len(b) <= batch_size for b in batches)


def test_indices_restore_order():
    ds = make_seq2seq(30)
    outputs = {}
    for batch in ds.batches(4, "sentence", shuffle=True, seed=0):
        for row, index in enumerate(batch.indices):  # e.g. translations written in batch order
            outputs[index] = batch["src"][row, :batch["src_lengths"][row]].tolist()
    assert [outputs[i] for i in range(len(ds))] == [list(s) for s in ds.src_ids]


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_shard_partitions_batch(world_size):
    ds = make_seq2seq(10)
    batch = ds.collate(list(range(10)))
    shards = [batch.shard(rank, world_size) for rank in range(world_size)]
    assert sorted(i for s in shards for i in s.indices) == batch.indices
    assert sum(s.num_tokens for s in shards) == batch.num_tokens
    for rank, shard in enumerate(shards):
        rows = list(range(rank, 10, world_size))
        assert shard.indices == [batch.indices[r] for r in rows]
        for name, tensor in batch.tensors.items():
            assert torch.equal(shard[name], tensor[rows])
        assert shard.num_tokens == int((shard["tgt_out"] != 0).sum())


def test_shard_classification_and_edge_cases():
    batch = ClassificationDataset([[4], [5], [6]], [0, 1, 0]).collate([0, 1, 2])
    assert batch.shard(1, 2).indices == [1] and batch.shard(1, 2).num_tokens == 1
    empty = batch.shard(3, 4)
    assert len(empty) == 0 and empty.num_tokens == 0 and empty["tokens"].shape == (0, 1)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\), got 2"):
        batch.shard(2, 2)


def test_batch_to():
    batch = Batch({"x": torch.ones(2, 3, dtype=torch.long)}, [0, 1], 2)
    moved = batch.to("cpu")
    assert moved is not batch and torch.equal(moved["x"], batch["x"]) and moved.indices == [0, 1]
    if torch.cuda.is_available():
        assert batch.to("cuda")["x"].is_cuda


def test_multi30k_pipeline(shared_data):
    """Read → clean → tokenise → encode → token batches on the real Multi30k validation split."""
    from hyperplex.data.vocab import Vocabulary

    folder = os.path.join(shared_data, "multi30k_en_de")
    pairs = read_parallel(os.path.join(folder, "val.en.gz"), os.path.join(folder, "val.de.gz"))
    pairs, _, report = filter_examples(pairs, max_length=60)
    assert report.total == 1014
    tok = WordTokenizer(lowercase=True)
    src = [tok.tokenize(s) for s, _ in pairs]
    tgt = [tok.tokenize(t) for _, t in pairs]
    src_vocab, tgt_vocab = Vocabulary.build(src, max_size=2000), Vocabulary.build(tgt, max_size=2000)
    ds = Seq2SeqDataset([src_vocab.encode(s) for s in src], [tgt_vocab.encode(t) for t in tgt])
    batches = ds.batches(1000, "token", shuffle=True, seed=0)
    assert sorted(i for b in batches for i in b.indices) == list(range(len(pairs)))
    assert all(b["tgt_in"].numel() <= 1000 for b in batches)
