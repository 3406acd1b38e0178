"""LineIndex and LazyBatches (data/lines.py): the same lines as read_lines, read on demand from plain and
gzip files, with errors naming the file and line; batches made only when indexed."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from hyperplex.data.lines import LazyBatches, LineIndex
from hyperplex.data.readers import DataError, DataFileNotFoundError, read_lines

RAW = "\ufeffFirst line\r\n\n   \n  spaced  out \nCafé ünïcode — ok\n\u00a0\nlast without newline"


@pytest.mark.parametrize("compressed", [False, True])
def test_the_non_blank_lines_of_read_lines_in_order(tmp_path, compressed):
    path = tmp_path / ("c.txt.gz" if compressed else "c.txt")
    data = RAW.encode("utf-8")
    path.write_bytes(gzip.compress(data) if compressed else data)
    index = LineIndex(path)
    expected = [line for line in read_lines(path) if line]
    assert expected == ["First line", "spaced  out", "Café ünïcode — ok", "last without newline"]
    assert list(index) == expected and len(index) == 4 and index[-1] == "last without newline"
    assert index[1:3] == expected[1:3] and index[::-1] == expected[::-1]
    assert [index.line_number(i) for i in range(4)] == [1, 4, 5, 7]
    view = index.select([3, 0])
    assert list(view) == ["last without newline", "First line"] and view.line_number(0) == 7
    assert index.nbytes == 4 * 16  # two int64 offsets a line; the text stays in the file
    with pytest.raises(IndexError):
        index[4]
    index.close()


def test_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(DataFileNotFoundError, match="nope.txt"):
        LineIndex(tmp_path / "nope.txt")
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(DataError, match=r"empty\.txt: empty corpus"):
        LineIndex(tmp_path / "empty.txt")
    (tmp_path / "blank.txt").write_text("\n  \n")
    with pytest.raises(DataError, match=r"blank\.txt: no sentences \(only blank lines\)"):
        LineIndex(tmp_path / "blank.txt")
    (tmp_path / "bad.txt").write_bytes(b"fine\nbad \xff byte\n")
    with pytest.raises(DataError, match=r"bad\.txt, line 2: invalid UTF-8 \(byte ff at column 5\)"):
        LineIndex(tmp_path / "bad.txt")
    (tmp_path / "broken.gz").write_bytes(gzip.compress(b"one\ntwo\n")[:-6])
    with pytest.raises(DataError, match=r"broken\.gz: not a valid gzip file"):
        LineIndex(tmp_path / "broken.gz")


def test_batches_are_made_only_when_indexed():
    made = []

    def make(chunk):
        made.append(chunk)
        return sum(chunk)

    order = np.array([4, 0, 3, 1, 2, 6, 5])
    batches = LazyBatches(order, 3, make)
    assert len(batches) == 3 and made == []
    assert batches[1] == 1 + 2 + 6 and made == [[1, 2, 6]]
    assert batches[1:3] == [9, 5] and made[1:] == [[1, 2, 6], [5]]
    assert batches[-3] == 7 and [batches.chunk(k) for k in range(3)] == [[4, 0, 3], [1, 2, 6], [5]]
    with pytest.raises(IndexError):
        batches[3]
    with pytest.raises(ValueError, match="batch size"):
        LazyBatches(order, 0, make)
    given = LazyBatches.from_batches([[5], [1, 2, 6], [4, 0, 3]], make)
    assert len(given) == 3 and [given.chunk(k) for k in range(3)] == [[5], [1, 2, 6], [4, 0, 3]]
    assert given[-1] == 7 and given[0:2] == [5, 9]
    with pytest.raises(IndexError):
        given[3]
    with pytest.raises(ValueError, match="an empty batch"):
        LazyBatches.from_batches([[1], []], make)
