import pytest
import torch

from hyperplex.nn.masks import lengths_to_mask


def test_true_marks_real_tokens():
    mask = lengths_to_mask(torch.tensor([3, 1, 0]), 4)
    assert mask.tolist() == [[True, True, True, False], [True, False, False, False], [False] * 4]
    assert mask.dtype == torch.bool


def test_padding_mask_is_the_complement_and_row_sums_are_the_lengths():
    lengths = torch.tensor([5, 2, 7, 1])
    mask = lengths_to_mask(lengths, 7)
    assert torch.equal(mask.sum(1), lengths)
    assert torch.equal((~mask).sum(1), 7 - lengths)


def test_lengths_must_be_one_dimensional():
    with pytest.raises(ValueError, match=r"lengths must have shape \(B,\)"):
        lengths_to_mask(torch.tensor([[1, 2]]), 3)


@pytest.mark.parametrize("lengths", [[4], [-1, 2]])
def test_lengths_outside_the_sequence_are_refused(lengths):
    with pytest.raises(ValueError, match=r"lengths must be in \[0, 3\]"):
        lengths_to_mask(torch.tensor(lengths), 3)
