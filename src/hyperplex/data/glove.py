"""Pre-trained word vectors in GloVe text format (Pennington et al. 2014), plain or gzipped.

Each line is ``word v1 … vd`` separated by single spaces. Only the vectors of words in the
model's vocabulary are kept; rows of vocabulary words absent from the file are left to the
caller's initialisation (the returned ``mask`` says which rows were found). The PHM paper's NLI
encoder (ICLR App. B.1) and Q-Att/DeAtt (Tay et al. §4.1) start from 300-d GloVe.
"""

from __future__ import annotations

import gzip
import os
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["GloveVectors", "load_glove"]


class GloveVectors(NamedTuple):
    """Result of :func:`load_glove`; unpacks as ``vectors, mask``.

    vectors: ``(V, dim)`` float tensor, row ``i`` the vector of vocabulary token ``i`` (zeros where not found).
    mask: ``(V,)`` bool tensor, True where the token's vector was read from the file.
    """

    vectors: Tensor
    mask: Tensor

    @property
    def found(self) -> int:
        """Number of vocabulary tokens whose vector was found."""
        return int(self.mask.sum())


def _open_text(path: str):
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, encoding="utf-8")


def _is_float(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def load_glove(path: str | os.PathLike, vocabulary_tokens: list[str], dim: int | None = None,
               lowercase_fallback: bool = True, dtype: torch.dtype = torch.float32) -> GloveVectors:
    """Read the vectors of ``vocabulary_tokens`` from a GloVe text file (``.gz`` read as gzip).

    Args:
        path: GloVe text file; a first line ``<count> <dim>`` (word2vec text header) is skipped.
        vocabulary_tokens: token of each vocabulary index, length ``V``.
        dim: expected vector size; ``None`` takes it from the first line.
        lowercase_fallback: a token with no exact entry takes the vector of its lower-cased form
            (GloVe 6B is lower-cased); an exact entry always wins.

    Returns:
        :class:`GloveVectors` ``(vectors (V, dim), mask (V,))``; ``.found`` is the count.

    Raises:
        ValueError naming the file and line: a line whose number of values differs from
        ``dim`` (from the argument or the first line), a value that is not a float, a first
        line whose size differs from the ``dim`` asked for. Values are checked for every
        line whose word is in the vocabulary; other lines only for their number of fields.
        FileNotFoundError if ``path`` does not exist.
    """
    path = os.fspath(path)
    if dim is not None and dim < 1:
        raise ValueError(f"GloVe dim must be a positive integer, got {dim!r}")
    exact: dict[str, list[int]] = {}
    lower: dict[str, list[int]] = {}
    for index, token in enumerate(vocabulary_tokens):
        exact.setdefault(token, []).append(index)
        if lowercase_fallback:
            lower.setdefault(token.lower(), []).append(index)
    rows: dict[int, list[float]] = {}
    by_exact: set[int] = set()
    seen_words: set[str] = set()
    with _open_text(path) as handle:
        for line_number, line in enumerate(handle, start=1):
            parts = line.rstrip().split(" ")
            if parts == [""]:
                continue  # blank line
            where = f"{path}, line {line_number}"
            if line_number == 1 and len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                if dim is not None and int(parts[1]) != dim:
                    raise ValueError(f"{where}: header says dimension {parts[1]}, expected dim={dim}")
                dim = int(parts[1])
                continue
            if dim is None:
                dim = len(parts) - 1
                if dim < 1:
                    raise ValueError(f"{where}: expected 'word v1 ... vd', got a line with no values")
            elif len(parts) - 1 != dim and line_number == 1:
                raise ValueError(f"{where}: dimension mismatch: the file has {len(parts) - 1} values per line, "
                                 f"expected dim={dim}")
            if len(parts) - 1 > dim and not any(_is_float(p) for p in parts[1:len(parts) - dim]):
                # words containing spaces occur in GloVe 840B (e.g. ". . ."): join the leading fields
                parts = [" ".join(parts[:len(parts) - dim])] + parts[len(parts) - dim:]
            if len(parts) - 1 != dim:
                raise ValueError(f"{where}: expected a word and {dim} values, got {len(parts) - 1} values")
            word = parts[0]
            if word in seen_words:
                continue  # the first occurrence wins
            seen_words.add(word)
            targets = [(i, True) for i in exact.get(word, [])]
            targets += [(i, False) for i in lower.get(word, []) if i not in by_exact]
            if not targets:
                continue
            try:
                values = [float(v) for v in parts[1:]]
            except ValueError:
                bad = next(v for v in parts[1:] if not _is_float(v))
                raise ValueError(f"{where}: value {bad!r} of word {word!r} is not a number") from None
            for i, is_exact in targets:
                if is_exact:
                    by_exact.add(i)
                elif i in rows:
                    continue  # keep the first lower-cased match
                rows[i] = values
    if dim is None:
        raise ValueError(f"{path}: empty GloVe file and no dim given")
    vectors = torch.zeros(len(vocabulary_tokens), dim, dtype=dtype)
    mask = torch.zeros(len(vocabulary_tokens), dtype=torch.bool)
    if rows:
        found = torch.tensor(sorted(rows))
        vectors[found] = torch.tensor([rows[i] for i in found.tolist()], dtype=dtype)
        mask[found] = True
    return GloveVectors(vectors, mask)
