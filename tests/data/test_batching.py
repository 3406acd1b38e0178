"""Batching: determinism per (seed, epoch), partition of indices, token budgets, bucketing, padding."""

import random

import pytest
import torch

from hyperplex.data.batching import make_batches, pad_sequences


def random_lengths(n: int = 500, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(1, 40) for _ in range(n)]


def flat(batches):
    return [i for b in batches for i in b]


@pytest.mark.parametrize("batch_type, batch_size", [("sentence", 16), ("token", 200)])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("bucket", [False, True])
def test_every_index_exactly_once(batch_type, batch_size, shuffle, bucket):
    lengths = random_lengths()
    batches = make_batches(lengths, batch_size, batch_type, shuffle=shuffle, seed=3, epoch=1, bucket=bucket)
    assert sorted(flat(batches)) == list(range(len(lengths)))
    assert all(batches)


def test_deterministic_per_seed_and_epoch():
    lengths = random_lengths()
    state = random.getstate(), torch.get_rng_state()
    a = make_batches(lengths, 300, "token", shuffle=True, seed=7, epoch=2)
    random.seed(123)  # the global RNG must not matter
    torch.manual_seed(123)
    b = make_batches(lengths, 300, "token", shuffle=True, seed=7, epoch=2)
    assert a == b
    assert make_batches(lengths, 300, "token", shuffle=True, seed=7, epoch=3) != a
    assert make_batches(lengths, 300, "token", shuffle=True, seed=8, epoch=2) != a
    random.setstate(state[0])
    torch.set_rng_state(state[1])


def test_global_rng_untouched():
    state = random.getstate()
    make_batches(random_lengths(), 16, "sentence", shuffle=True, seed=1, epoch=0)
    assert random.getstate() == state


def test_sentence_batches_sizes():
    batches = make_batches([5] * 10, 4, "sentence", shuffle=False, bucket=False)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_token_budget_counts_padding():
    lengths = random_lengths(400, seed=1)
    for shuffle in (False, True):
        for bucket in (False, True):
            for batch in make_batches(lengths, 120, "token", shuffle=shuffle, seed=0, bucket=bucket):
                assert max(lengths[i] for i in batch) * len(batch) <= 120


def test_token_batching_hand_case():
    # sequential (no bucketing): cost = longest × count
    lengths = [3, 3, 5, 2, 9, 1]
    assert make_batches(lengths, 10, "token", shuffle=False, bucket=False) == [[0, 1], [2, 3], [4], [5]]
    # [0,1]: 3·2=6, adding 5 → 5·3=15 > 10; [2,3]: 5·2=10; [4]: 9; 9·2 > 10 → [5]


def test_overlong_example_gets_its_own_batch():
    lengths = [2, 50, 2, 2]
    batches = make_batches(lengths, 10, "token", shuffle=False, bucket=False)
    assert batches == [[0], [1], [2, 3]]
    assert [1] in make_batches(lengths, 10, "token", shuffle=True, seed=0)


def test_zero_length_examples_still_count_one():
    assert make_batches([0, 0, 0], 2, "token", shuffle=False, bucket=False) == [[0, 1], [2]]


def test_bucketing_reduces_padding():
    lengths = random_lengths(2000, seed=2)

    def padding(batches):
        return sum(max(lengths[i] for i in b) * len(b) - sum(lengths[i] for i in b) for b in batches)

    plain = make_batches(lengths, 32, "sentence", shuffle=True, seed=0, bucket=False)
    bucketed = make_batches(lengths, 32, "sentence", shuffle=True, seed=0, bucket=True)
    assert padding(bucketed) < padding(plain) / 4


def test_no_shuffle_bucket_sorts_by_length():
    lengths = [4, 1, 3, 1, 2]
    assert make_batches(lengths, 2, "sentence", shuffle=False) == [[1, 3], [4, 2], [0]]


def test_shuffle_changes_batch_order_across_epochs():
    lengths = random_lengths(300)
    orders = {tuple(map(tuple, make_batches(lengths, 8, "sentence", shuffle=True, seed=0, epoch=e)))
              for e in range(5)}
    assert len(orders) == 5


@pytest.mark.parametrize("kwargs, pattern", [
    (dict(batch_size=0), "batch_size must be a positive integer"),
    (dict(batch_size=2.5), "batch_size must be a positive integer"),
    (dict(batch_size=4, batch_type="words"), "batch_type must be one of"),
])
def test_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        make_batches([1, 2], **kwargs)


def test_empty_and_negative():
    with pytest.raises(ValueError, match="no examples to batch"):
        make_batches([], 4)
    with pytest.raises(ValueError, match="non-negative"):
        make_batches([1, -1], 4)


def test_pad_sequences():
    padded, lengths = pad_sequences([[5, 6, 7], [8], [9, 10]], pad_index=0)
    assert torch.equal(padded, torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]]))
    assert torch.equal(lengths, torch.tensor([3, 1, 2]))
    assert padded.dtype == lengths.dtype == torch.long
    padded, _ = pad_sequences([[1], [2, 3]], pad_index=-1)
    assert padded.tolist() == [[1, -1], [2, 3]]
    padded, lengths = pad_sequences([[], []])
    assert padded.shape == (2, 0) and lengths.tolist() == [0, 0]
    with pytest.raises(ValueError, match="at least one sequence"):
        pad_sequences([])
