"""The arithmetic task (``data.format: arithmetic``): a generator of the mathematical language understanding
(MLU) task of Wangperawong 2018 and Tay et al. 2019 §4.4.

A sample is a character string ``x=<int>,y=<int>,<v1><op><v2>`` with the two assignments in a
random order, integers in ``[-1000, 1000)``, ``v1`` and ``v2`` each ``x`` or ``y`` and ``op``
one of ``+ - *``; the target is the decimal value of the expression, e.g.
``y=691,x=-999,y*x`` → ``-690309`` (spec: ``shared/data/README.md``).

Every distinct input string is one integer *index* in ``[0, N)`` (a mixed-radix code of
order, x, y, v1, op, v2; ``N = 2 · 2000² · 2 · 3 · 2 = 96,000,000`` for the default spec). A
seeded pseudo-random bijection of ``[0, N)`` (a Feistel network with cycle walking) maps
positions ``0, 1, 2, …`` to indices, so samples are unique without a set of seen strings,
splits taking consecutive position ranges are disjoint by construction, and memory does not
grow with the number of samples (``write_arithmetic`` streams).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["ArithmeticSpec", "generate_arithmetic", "generate_arithmetic_splits", "iter_arithmetic", "write_arithmetic",
           "evaluate_arithmetic_input", "FILE_SUFFIXES"]

#: Suffixes of the input and target files :func:`write_arithmetic` writes (``PREFIX.src`` / ``PREFIX.tgt``).
FILE_SUFFIXES = ("src", "tgt")

_VARIABLES = ("x", "y")
_FEISTEL_ROUNDS = 6
_MIX1, _MIX2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)  # splitmix64 finaliser


@dataclass(frozen=True)
class ArithmeticSpec:
    """The sample space: integers in ``[low, high)`` and the operators used (default: the paper's)."""

    low: int = -1000
    high: int = 1000
    operators: str = "+-*"

    def __post_init__(self) -> None:
        if self.high <= self.low:
            raise ValueError(f"arithmetic value range [low={self.low}, high={self.high}) is empty; expected low < high")
        ops = self.operators
        if not ops or set(ops) - set("+-*") or len(set(ops)) < len(ops):
            raise ValueError(f"arithmetic operators must be distinct characters from '+-*', got {self.operators!r}")

    @property
    def num_values(self) -> int:
        return self.high - self.low

    @property
    def characters(self) -> str:
        """Every character an input or target can hold (digits, a minus sign, the variables, ``=``, ``,`` and the
        operators): the character vocabulary of the task, known without generating a sample."""
        return "".join(sorted(set("0123456789-xy=,") | set(self.operators)))

    @property
    def size(self) -> int:
        """Number of distinct input strings: 2 orders · values² · 2 (v1) · ops · 2 (v2)."""
        return 2 * self.num_values**2 * 2 * len(self.operators) * 2


def evaluate_arithmetic_input(text: str) -> int:
    """Reference evaluator with Python int arithmetic: ``"y=691,x=-999,y*x"`` → ``-690309``.

    Raises ``ValueError`` if ``text`` is not of the form ``x=<int>,y=<int>,<v1><op><v2>``.
    """
    try:
        first, second, expression = text.split(",")
        env = dict(part.split("=") for part in (first, second))
        if sorted(env) != ["x", "y"] or len(expression) != 3:
            raise ValueError
        a, op, b = list(expression)
        x, y = int(env[a]), int(env[b])
    except (ValueError, KeyError):
        raise ValueError(f"not an arithmetic input {text!r}; expected 'x=<int>,y=<int>,<v1><op><v2>'") from None
    if op == "+":
        return x + y
    if op == "-":
        return x - y
    if op == "*":
        return x * y
    raise ValueError(f"unknown operator {op!r} in arithmetic input {text!r}; expected one of + - *")


def _mix(v: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic)."""
    v = v ^ (v >> np.uint64(30))
    v = v * _MIX1
    v = v ^ (v >> np.uint64(27))
    v = v * _MIX2
    return v ^ (v >> np.uint64(31))


class _Permutation:
    """Seeded bijection of ``[0, size)``: a balanced Feistel network on ``2^bits ≥ size`` with cycle walking."""

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        bits = max(2, (size - 1).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        # a string seed is stable across Python versions; its text fixes every generated data set, so it keeps
        # the task's paper name (MLU)
        rng = random.Random(f"hyperplex-mlu-{seed}")
        self.keys = [np.uint64(rng.getrandbits(64)) for _ in range(_FEISTEL_ROUNDS)]

    def _feistel(self, v: np.ndarray) -> np.ndarray:
        shift = np.uint64(self.half)
        left, right = v >> shift, v & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << shift) | right

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        out = self._feistel(positions.astype(np.uint64))
        outside = out >= np.uint64(self.size)
        while outside.any():  # cycle walking: a bijection of the larger domain restricted to [0, size)
            out[outside] = self._feistel(out[outside])
            outside = out >= np.uint64(self.size)
        return out.astype(np.int64)


def _decode(indices: np.ndarray, spec: ArithmeticSpec) -> tuple[list[str], list[str]]:
    """Sample indices ``(k,)`` → input strings and target strings."""
    rest = indices.copy()
    rest, swap = np.divmod(rest, 2)
    rest, v1 = np.divmod(rest, 2)
    rest, op = np.divmod(rest, len(spec.operators))
    rest, v2 = np.divmod(rest, 2)
    rest, x = np.divmod(rest, spec.num_values)
    y = rest  # < num_values because indices < spec.size
    x, y = x + spec.low, y + spec.low
    # the value, with int64 numpy arithmetic (|value| ≤ high² fits easily)
    a, b = np.where(v1 == 0, x, y), np.where(v2 == 0, x, y)
    value = np.select([np.asarray(list(spec.operators))[op] == c for c in "+-*"], [a + b, a - b, a * b])
    inputs, targets = [], []
    for s, x_, y_, p, q, o, val in zip(swap.tolist(), x.tolist(), y.tolist(), v1.tolist(), v2.tolist(),
                                         op.tolist(), value.tolist()):
        assignments = f"y={y_},x={x_}" if s else f"x={x_},y={y_}"
        inputs.append(f"{assignments},{_VARIABLES[p]}{spec.operators[o]}{_VARIABLES[q]}")
        targets.append(str(val))
    return inputs, targets


def _check_sizes(sizes: Mapping[str, int], spec: ArithmeticSpec) -> None:
    for name, n in sizes.items():
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise ValueError(f"arithmetic split {name!r}: size must be a non-negative integer, got {n!r}")
    total = sum(sizes.values())
    if total > spec.size:
        raise ValueError(f"arithmetic task: {total:,} unique samples requested ({dict(sizes)}) but only "
                         f"{spec.size:,} exist for integers in [{spec.low}, {spec.high}) and operators "
                         f"{spec.operators!r}")


def iter_arithmetic(start: int, stop: int, seed: int, spec: ArithmeticSpec | None = None,
             chunk_size: int = 100_000) -> Iterator[tuple[list[str], list[str]]]:
    """Yield ``(inputs, targets)`` chunks for positions ``[start, stop)`` of the seeded sample order.

    Positions index one fixed pseudo-random order of all ``spec.size`` distinct samples, so
    disjoint position ranges give disjoint samples.
    """
    spec = spec or ArithmeticSpec()
    if not 0 <= start <= stop <= spec.size:
        raise ValueError(f"arithmetic positions [{start}, {stop}) outside [0, {spec.size})")
    permutation = _Permutation(spec.size, seed)
    for begin in range(start, stop, chunk_size):
        yield _decode(permutation(np.arange(begin, min(stop, begin + chunk_size), dtype=np.int64)), spec)


def generate_arithmetic_splits(sizes: Mapping[str, int], seed: int, spec: ArithmeticSpec | None = None
                        ) -> dict[str, list[tuple[str, str]]]:
    """Disjoint splits ``{name: [(input, target), ...]}`` with ``sizes[name]`` samples each.

    Splits take consecutive ranges of one seeded order in the order given, so a split's samples
    depend only on the seed and the sizes of the splits listed before it.
    """
    spec = spec or ArithmeticSpec()
    _check_sizes(sizes, spec)
    splits, start = {}, 0
    for name, n in sizes.items():
        pairs: list[tuple[str, str]] = []
        for inputs, targets in iter_arithmetic(start, start + n, seed, spec):
            pairs.extend(zip(inputs, targets))
        splits[name], start = pairs, start + n
    return splits


def generate_arithmetic(num_train: int, num_test: int, seed: int, spec: ArithmeticSpec | None = None
                 ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(train, test)`` lists of ``(input, target)`` strings; unique, disjoint, deterministic for ``seed``.

    The test split is drawn first, so for a fixed seed and ``num_test`` the test set does not
    change with ``num_train`` (and smaller training sets are prefixes of larger ones).
    Raises ``ValueError`` if ``num_train + num_test`` exceeds the number of distinct samples.
    """
    splits = generate_arithmetic_splits({"test": num_test, "train": num_train}, seed, spec)
    return splits["train"], splits["test"]


def write_arithmetic(directory: str | os.PathLike, num_train: int, num_test: int, seed: int, num_valid: int = 0,
              spec: ArithmeticSpec | None = None) -> dict[str, tuple[str, str]]:
    """Write ``{train,valid,test}.{src,tgt}`` (one sample per line) under ``directory``; streams.

    Order of draws: test, valid, train (test and valid stay fixed when ``num_train`` grows);
    ``valid`` files are written only when ``num_valid > 0``. Returns ``{split: (src_path, tgt_path)}``.
    """
    spec = spec or ArithmeticSpec()
    sizes = {"test": num_test, "valid": num_valid, "train": num_train}
    _check_sizes(sizes, spec)
    os.makedirs(directory, exist_ok=True)
    paths, start = {}, 0
    for name, n in sizes.items():
        if name == "valid" and n == 0:
            continue
        src_path, tgt_path = (os.path.join(directory, f"{name}.{ext}") for ext in FILE_SUFFIXES)
        with open(src_path, "w", encoding="utf-8") as src, open(tgt_path, "w", encoding="utf-8") as tgt:
            for inputs, targets in iter_arithmetic(start, start + n, seed, spec):
                src.writelines(line + "\n" for line in inputs)
                tgt.writelines(line + "\n" for line in targets)
        paths[name], start = (src_path, tgt_path), start + n
    return paths
