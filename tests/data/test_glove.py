import gzip

import pytest
import torch

from hyperplex.data.glove import load_glove


def write(path, lines, gz=False):
    opener = gzip.open if gz else open
    with opener(path, "wt", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path


GOOD = ["the 0.1 0.2 -0.3", "cat 1 2 3", "dog -1.5e-1 0 4", "Paris 7 8 9", "paris 0 0 1", "the 9 9 9"]


@pytest.mark.parametrize("gz", [False, True])
def test_reads_vocabulary_rows(tmp_path, gz):
    path = write(tmp_path / ("v.txt.gz" if gz else "v.txt"), GOOD, gz)
    vocab = ["<pad>", "<unk>", "the", "dog", "zebra", "cat"]
    vectors, mask = load_glove(path, vocab)
    expected = torch.zeros(6, 3)
    expected[2] = torch.tensor([0.1, 0.2, -0.3])  # first occurrence of "the" wins
    expected[3] = torch.tensor([-0.15, 0.0, 4.0])
    expected[5] = torch.tensor([1.0, 2.0, 3.0])
    torch.testing.assert_close(vectors, expected)
    assert mask.tolist() == [False, False, True, True, False, True]
    assert load_glove(path, vocab).found == 3


def test_lowercase_fallback_and_exact_priority(tmp_path):
    path = write(tmp_path / "v.txt", GOOD)
    vectors, mask = load_glove(path, ["Paris", "Cat", "PARIS", "paris"], dim=3)
    assert mask.tolist() == [True, True, True, True]
    assert vectors[0].tolist() == [7, 8, 9]  # exact entry beats the lower-cased one
    assert vectors[1].tolist() == [1, 2, 3]  # Cat -> cat
    assert vectors[2].tolist() == [0, 0, 1]  # PARIS -> paris
    assert vectors[3].tolist() == [0, 0, 1]
    _, mask = load_glove(path, ["Cat"], lowercase_fallback=False)
    assert mask.tolist() == [False]


def test_word2vec_header_and_spaces_in_words(tmp_path):
    path = write(tmp_path / "v.txt", ["3 2", ". . . 1 2", "a 3 4", "", "b 5 6"])
    vectors, mask = load_glove(path, ["a", ". . .", "b"])
    assert vectors.tolist() == [[3, 4], [1, 2], [5, 6]] and mask.all()


def test_errors_name_file_and_line(tmp_path):
    path = write(tmp_path / "bad_count.txt", ["a 1 2 3", "b 1 2"])
    with pytest.raises(ValueError, match=r"bad_count.txt, line 2: expected a word and 3 values, got 2"):
        load_glove(path, ["a"])
    path = write(tmp_path / "extra.txt", ["a 1 2 3", "b 0.5 1 2 3"])
    with pytest.raises(ValueError, match=r"extra.txt, line 2: expected a word and 3 values, got 4"):
        load_glove(path, ["a"])
    path = write(tmp_path / "nan.txt", ["a 1 2 3", "b 1 x 3"])
    with pytest.raises(ValueError, match=r"nan.txt, line 2: value 'x' of word 'b' is not a number"):
        load_glove(path, ["b"])
    path = write(tmp_path / "dim.txt", ["a 1 2 3"])
    with pytest.raises(ValueError, match=r"dim.txt, line 1: dimension mismatch: the file has 3 values per line, "
                                         r"expected dim=300"):
        load_glove(path, ["a"], dim=300)
    path = write(tmp_path / "hdr.txt", ["10 4", "a 1 2 3 4"])
    with pytest.raises(ValueError, match=r"hdr.txt, line 1: header says dimension 4, expected dim=3"):
        load_glove(path, ["a"], dim=3)
    with pytest.raises(FileNotFoundError):
        load_glove(tmp_path / "missing.txt", ["a"])

