"""The lines of a large text file, read from disk on demand: a training corpus that is never held whole.

:class:`LineIndex` keeps only the byte offsets of the file's non-blank lines (two ``int64`` arrays, 16
bytes a line) and a memory map of the file; ``index[i]`` decodes one line when it is asked for. A gzip
file is decompressed once into an unnamed temporary file (deleted when the index is closed or the
process ends), so the page cache, not the process, holds the text. Lines follow
:mod:`hyperplex.data.readers`' rules: split on ``\\n``, a trailing ``\\r`` and a leading byte-order mark
removed, surrounding whitespace stripped, strict UTF-8 (checked for the whole file up front).
"""

from __future__ import annotations

import gzip
import mmap
import os
import shutil
import tempfile
import zlib
from array import array
from collections.abc import Iterator, Sequence

import numpy as np

from hyperplex.data.readers import DataError, DataFileNotFoundError

__all__ = ["LazyBatches", "LineIndex"]

_GZIP_MAGIC = b"\x1f\x8b"
_BOM = b"\xef\xbb\xbf"


class _Storage:
    """The open file and its memory map, shared by an index and the views :meth:`LineIndex.select` makes."""

    def __init__(self, handle, view: mmap.mmap) -> None:
        self.handle, self.view = handle, view

    def close(self) -> None:
        self.view.close()
        self.handle.close()


class LineIndex(Sequence[str]):
    """The non-blank lines of a UTF-8 text file (plain or gzip), in file order, read on demand.

    ``len(index)`` lines; ``index[i]`` → the stripped line (``str``), ``index[a:b]`` → ``list[str]``;
    :meth:`line_number` gives a line's 1-based number in the file, for messages. Raises
    :class:`~hyperplex.data.readers.DataError` naming the file (and line) for a missing, empty,
    non-UTF-8 or all-blank file, or a broken gzip stream.
    """

    def __init__(self, path: str | os.PathLike, *, _parts: tuple | None = None) -> None:
        self.path = os.fspath(path)
        if _parts is not None:  # a view made by select()
            self._storage, self._starts, self._ends = _parts
            return
        if not os.path.exists(self.path):
            raise DataFileNotFoundError(self.path)
        if os.path.isdir(self.path):
            raise DataError("is a directory, expected a text file", self.path)
        handle = self._open_plain()
        try:
            size = os.fstat(handle.fileno()).st_size
            if size == 0:
                raise DataError("empty corpus: the file has no lines", self.path)
            view = mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)
        except BaseException:
            handle.close()
            raise
        self._storage = _Storage(handle, view)
        try:
            self._starts, self._ends = self._scan(view)
        except BaseException:
            self._storage.close()
            raise
        if not len(self._starts):
            self._storage.close()
            raise DataError("no sentences (only blank lines)", self.path)

    def _open_plain(self):
        """A binary handle on the file's uncompressed bytes (a temporary copy for gzip)."""
        with open(self.path, "rb") as probe:
            compressed = self.path.endswith(".gz") or probe.read(2) == _GZIP_MAGIC
        if not compressed:
            return open(self.path, "rb")
        copy = tempfile.TemporaryFile(prefix="hyperplex-lines-")
        try:
            with gzip.open(self.path, "rb") as source:
                shutil.copyfileobj(source, copy, 1 << 20)
            copy.flush()
        except (OSError, EOFError, zlib.error) as err:
            copy.close()
            raise DataError(f"not a valid gzip file ({err})", self.path) from err
        return copy

    def _scan(self, view: mmap.mmap) -> tuple[np.ndarray, np.ndarray]:
        """``(starts, ends)``: the byte span of every non-blank line, its ``\\n`` (and ``\\r``) left out."""
        starts, ends = array("q"), array("q")
        position, number = 0, 0
        size = len(view)
        while position < size:
            number += 1
            newline = view.find(b"\n", position)
            end = size if newline < 0 else newline
            start = position + 3 if number == 1 and view[:3] == _BOM else position
            raw = view[start:end]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                bad = raw[err.start:err.end].hex(" ")
                raise DataError(f"invalid UTF-8 (byte {bad} at column {err.start + 1}); the file must be UTF-8 "
                                f"text", self.path, number) from None
            if text.strip():
                starts.append(start)
                ends.append(end)
            position = end + 1
        return np.frombuffer(starts, dtype=np.int64).copy(), np.frombuffer(ends, dtype=np.int64).copy()

    def __len__(self) -> int:
        return len(self._starts)

    def _line(self, i: int) -> str:
        return self._storage.view[self._starts[i]:self._ends[i]].decode("utf-8").strip()

    def __getitem__(self, item):
        if isinstance(item, slice):
            return [self._line(i) for i in range(*item.indices(len(self)))]
        i = int(item)
        if not -len(self) <= i < len(self):
            raise IndexError(f"line {i} out of range for {len(self)} lines of {self.path}")
        return self._line(i % len(self))

    def __iter__(self) -> Iterator[str]:
        return (self._line(i) for i in range(len(self)))

    def line_number(self, i: int) -> int:
        """The 1-based number, in the file, of the ``i``-th kept line (blank lines counted)."""
        return self._storage.view[:self._starts[i]].count(b"\n") + 1

    def select(self, positions: Sequence[int] | np.ndarray) -> LineIndex:
        """A view of the lines at ``positions`` (in that order), sharing this index's open file."""
        positions = np.asarray(positions, dtype=np.int64)
        return LineIndex(self.path, _parts=(self._storage, self._starts[positions], self._ends[positions]))

    def close(self) -> None:
        """Close the file (and so every view of it); the temporary copy of a gzip file is deleted."""
        self._storage.close()

    def byte_lengths(self) -> np.ndarray:
        """``int64`` array: the UTF-8 length in bytes of every line (before stripping), a cheap proxy of its
        token count for length bucketing; nothing is read from the file."""
        return self._ends - self._starts

    @property
    def nbytes(self) -> int:
        """Bytes of memory the index itself holds (the offsets; the text stays in the file)."""
        return self._starts.nbytes + self._ends.nbytes


class LazyBatches(Sequence):
    """The batches of a shuffled order, each made only when it is indexed.

    Batch ``k`` is ``make(order[k * size:(k + 1) * size])`` (a list of ints; the last batch may be
    shorter), or with :meth:`from_batches` ``make`` of the ``k``-th given index list; ``len`` is the number
    of batches and a slice gives a list, so a trainer that indexes ``batches[i:i + accum]`` step by step
    reads and tokenises only those sentences.
    """

    def __init__(self, order: Sequence[int] | np.ndarray, size: int, make) -> None:
        if size < 1:
            raise ValueError(f"batch size must be ≥ 1, got {size}")
        self.order, self.make = np.asarray(order, dtype=np.int64), make
        self.bounds = np.append(np.arange(0, len(self.order), size, dtype=np.int64), len(self.order))

    @classmethod
    def from_batches(cls, batches: Sequence[Sequence[int]], make) -> LazyBatches:
        """Batches given as lists of item indices (e.g. :func:`hyperplex.data.batching.make_batches`'s
        length-bucketed ones), held as one flat ``int64`` array and its bounds; none may be empty."""
        if any(len(batch) == 0 for batch in batches):
            raise ValueError("an empty batch")
        self = cls.__new__(cls)
        self.make = make
        self.order = np.fromiter((i for batch in batches for i in batch), dtype=np.int64)
        self.bounds = np.append(0, np.cumsum([len(batch) for batch in batches], dtype=np.int64))
        return self

    def __len__(self) -> int:
        return len(self.bounds) - 1

    def chunk(self, k: int) -> list[int]:
        """The item indices of batch ``k``."""
        return self.order[self.bounds[k]:self.bounds[k + 1]].tolist()

    def __getitem__(self, item):
        if isinstance(item, slice):
            return [self.make(self.chunk(k)) for k in range(*item.indices(len(self)))]
        k = int(item)
        if not -len(self) <= k < len(self):
            raise IndexError(f"batch {k} out of range for {len(self)} batches")
        return self.make(self.chunk(k % len(self)))
