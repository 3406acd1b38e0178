"""Token ↔ id mapping with the project-wide special symbols.

The specials are fixed everywhere in hyperplex: ``<pad>`` = 0, ``<unk>`` = 1, ``<s>`` = 2 (BOS),
``</s>`` = 3 (EOS). A word-level vocabulary keeps the top-K tokens by frequency (the thesis'
setup); a sentencepiece vocabulary is built from the model's pieces in id order
(:meth:`Vocabulary.from_tokens`), so both map the same way.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Sequence

from hyperplex.data.readers import DataError, DataFileNotFoundError
from hyperplex.fileio import atomic_write_text

PAD, UNK, BOS, EOS = "<pad>", "<unk>", "<s>", "</s>"
#: The special symbols, in index order.
SPECIALS = (PAD, UNK, BOS, EOS)
PAD_INDEX, UNK_INDEX, BOS_INDEX, EOS_INDEX = 0, 1, 2, 3

_FORMAT = "hyperplex-vocabulary"


class Vocabulary:
    """A list of tokens whose first four are :data:`SPECIALS`; index = position in the list.

    Args:
        tokens: the non-special tokens, in index order (ids 4, 5, ...). Use
            :meth:`from_tokens` for a full list that already starts with the specials.
    """

    pad_index, unk_index, bos_index, eos_index = PAD_INDEX, UNK_INDEX, BOS_INDEX, EOS_INDEX

    def __init__(self, tokens: Iterable[str] = ()):
        self._itos = list(SPECIALS)
        self._stoi = {token: i for i, token in enumerate(self._itos)}
        for token in tokens:
            if not isinstance(token, str):
                raise ValueError(f"vocabulary tokens must be strings, got {token!r}")
            if token in self._stoi:
                raise ValueError(f"duplicate vocabulary token {token!r}")
            self._stoi[token] = len(self._itos)
            self._itos.append(token)

    @classmethod
    def from_tokens(cls, itos: Sequence[str]) -> Vocabulary:
        """Vocabulary from a full id-ordered token list, which must start with :data:`SPECIALS`."""
        if tuple(itos[:len(SPECIALS)]) != SPECIALS:
            raise ValueError(f"a vocabulary must start with the specials {list(SPECIALS)}, "
                             f"found {list(itos[:len(SPECIALS)])}")
        return cls(itos[len(SPECIALS):])

    @classmethod
    def build(cls, token_lists: Iterable[Sequence[str]], max_size: int | None = None,
              min_freq: int = 1) -> Vocabulary:
        """Top-``max_size`` tokens by frequency with count ≥ ``min_freq``.

        ``max_size`` counts the non-special tokens (the vocabulary has ``max_size + 4`` entries).
        Ties in frequency are broken alphabetically, so the result does not depend on data order.
        Specials occurring in the data are not added twice.
        """
        if max_size is not None and max_size < 0:
            raise ValueError(f"max_size must be >= 0 or None, got {max_size}")
        if min_freq < 1:
            raise ValueError(f"min_freq must be >= 1, got {min_freq}")
        counts: Counter[str] = Counter()
        for tokens in token_lists:
            counts.update(tokens)
        ranked = sorted((t for t, c in counts.items() if c >= min_freq and t not in SPECIALS),
                        key=lambda t: (-counts[t], t))
        return cls(ranked if max_size is None else ranked[:max_size])

    def __len__(self) -> int:
        return len(self._itos)

    def __contains__(self, token: str) -> bool:
        return token in self._stoi

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Vocabulary) and self._itos == other._itos

    def __repr__(self) -> str:
        return f"Vocabulary(size={len(self)})"

    @property
    def itos(self) -> list[str]:
        """All tokens in id order (a copy)."""
        return list(self._itos)

    def token_to_id(self, token: str) -> int:
        """Id of ``token``; ``<unk>``'s id for tokens not in the vocabulary."""
        return self._stoi.get(token, UNK_INDEX)

    def id_to_token(self, index: int) -> str:
        """Token with id ``index``; ValueError when out of range."""
        if not 0 <= index < len(self._itos):
            raise ValueError(f"token id {index} out of range for a vocabulary of size {len(self)}")
        return self._itos[index]

    def encode(self, tokens: Sequence[str], add_bos: bool = False, add_eos: bool = False) -> list[int]:
        """Ids of ``tokens`` (unknown → ``<unk>``), optionally framed by ``<s>`` / ``</s>``."""
        ids = [self._stoi.get(t, UNK_INDEX) for t in tokens]
        if add_bos:
            ids.insert(0, BOS_INDEX)
        if add_eos:
            ids.append(EOS_INDEX)
        return ids

    def decode(self, ids: Iterable[int], strip_specials: bool = True) -> list[str]:
        """Tokens of ``ids``.

        With ``strip_specials`` the output stops at the first ``</s>`` and drops ``<pad>`` and
        ``<s>`` (``<unk>`` is kept: it is a real output, and ``replace_unk`` needs it);
        otherwise every id is mapped verbatim.
        """
        tokens = []
        for index in ids:
            index = int(index)
            if strip_specials:
                if index == EOS_INDEX:
                    break
                if index in (PAD_INDEX, BOS_INDEX):
                    continue
            tokens.append(self.id_to_token(index))
        return tokens

    def save(self, path: str | os.PathLike) -> None:
        """Write the vocabulary as JSON (atomically)."""
        atomic_write_text(path, json.dumps({"format": _FORMAT, "version": 1, "tokens": self._itos},
                                           ensure_ascii=False, indent=0) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> Vocabulary:
        """Read a vocabulary written by :meth:`save`; :class:`DataError` naming the file if invalid."""
        path = os.fspath(path)
        if not os.path.exists(path):
            raise DataFileNotFoundError(path)
        try:
            with open(path, encoding="utf-8") as handle:
                obj = json.load(handle)
        except UnicodeDecodeError:
            raise DataError("vocabulary file is not UTF-8 text", path) from None
        except json.JSONDecodeError as err:
            raise DataError(f"invalid vocabulary JSON ({err.msg} at column {err.colno})", path, err.lineno) from None
        tokens = obj.get("tokens") if isinstance(obj, dict) else None
        if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
            raise DataError("not a hyperplex vocabulary: expected an object with a 'tokens' list of strings", path)
        try:
            return cls.from_tokens(tokens)
        except ValueError as err:
            raise DataError(f"invalid vocabulary: {err}", path) from None
