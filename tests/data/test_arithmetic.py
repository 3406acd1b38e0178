import re

import pytest

from hyperplex.data.arithmetic import (
    ArithmeticSpec,
    evaluate_arithmetic_input,
    generate_arithmetic,
    generate_arithmetic_splits,
    iter_arithmetic,
    write_arithmetic,
)

# data README: x=<int>,y=<int>,<v1><op><v2>, assignment order random
INPUT = re.compile(r"^(x=(-?\d+),y=(-?\d+)|y=(-?\d+),x=(-?\d+)),([xy])([-+*])([xy])$")


def python_value(text: str) -> int:
    """Independent evaluator: parse with the spec regex, compute with Python ints."""
    m = INPUT.match(text)
    assert m, text
    x, y = (int(m[2]), int(m[3])) if m[2] is not None else (int(m[5]), int(m[4]))
    env = {"x": x, "y": y}
    a, op, b = env[m[6]], m[7], env[m[8]]
    return {"+": a + b, "-": a - b, "*": a * b}[op]


@pytest.fixture(scope="module")
def splits():
    return generate_arithmetic(3000, 500, seed=7)


def test_readme_example():
    assert evaluate_arithmetic_input("y=691,x=-999,y*x") == -690309
    assert python_value("y=691,x=-999,y*x") == -690309
    with pytest.raises(ValueError, match="not an arithmetic input"):
        evaluate_arithmetic_input("x=1,z=2,x+z")


def test_format_and_answers(splits):
    for text, target in splits[0] + splits[1]:
        m = INPUT.match(text)
        assert m, text
        values = [int(v) for v in m.groups()[1:5] if v is not None]
        assert all(-1000 <= v < 1000 for v in values)
        assert re.fullmatch(r"-?\d+", target) and str(int(target)) == target  # canonical decimal
        assert int(target) == python_value(text)


def test_sizes_unique_disjoint(splits):
    train, test = splits
    assert len(train) == 3000 and len(test) == 500
    train_inputs, test_inputs = {t for t, _ in train}, {t for t, _ in test}
    assert len(train_inputs) == 3000 and len(test_inputs) == 500
    assert not train_inputs & test_inputs


def test_everything_varies(splits):
    inputs = [t for t, _ in splits[0]]
    starts = {t[:2] for t in inputs}
    assert starts == {"x=", "y="}  # assignment order varies
    assert {t[-2] for t in inputs} == {"+", "-", "*"}
    assert {t[-3] + t[-1] for t in inputs} == {"xx", "xy", "yx", "yy"}
    x_first = sum(t.startswith("x=") for t in inputs) / len(inputs)
    assert 0.4 < x_first < 0.6


def test_deterministic_for_seed(splits):
    assert generate_arithmetic(3000, 500, seed=7) == splits
    other = generate_arithmetic(3000, 500, seed=8)
    assert other[0] != splits[0]


def test_test_split_fixed_when_train_grows(splits):
    train, test = generate_arithmetic(100, 500, seed=7)
    assert test == splits[1] and train == splits[0][:100]


def test_exhaustive_small_space():
    spec = ArithmeticSpec(low=-2, high=1, operators="+*")
    assert spec.size == 2 * 9 * 2 * 2 * 2
    train, test = generate_arithmetic(spec.size - 5, 5, seed=0, spec=spec)
    inputs = {t for t, _ in train + test}
    assert len(inputs) == spec.size  # every distinct sample exactly once
    assert all(int(y) == python_value(x) for x, y in train + test)


def test_too_many_samples_error():
    spec = ArithmeticSpec(low=0, high=2, operators="-")
    with pytest.raises(ValueError, match=r"33 unique samples requested .* only 32 exist"):
        generate_arithmetic(30, 3, seed=0, spec=spec)
    with pytest.raises(ValueError, match="non-negative integer"):
        generate_arithmetic(-1, 5, seed=0)
    with pytest.raises(ValueError, match="operators"):
        ArithmeticSpec(operators="+/")
    with pytest.raises(ValueError, match="empty"):
        ArithmeticSpec(low=3, high=3)


def test_default_space_size():
    assert ArithmeticSpec().size == 96_000_000


def test_splits_and_chunks():
    splits = generate_arithmetic_splits({"a": 10, "b": 20, "c": 0}, seed=3)
    assert [len(v) for v in splits.values()] == [10, 20, 0]
    chunks = list(iter_arithmetic(0, 30, seed=3, chunk_size=7))
    flat = [pair for inputs, targets in chunks for pair in zip(inputs, targets)]
    assert flat == splits["a"] + splits["b"]


def test_write_arithmetic(tmp_path):
    paths = write_arithmetic(tmp_path / "arithmetic", num_train=50, num_test=20, seed=1, num_valid=10)
    assert set(paths) == {"train", "valid", "test"}
    train, test = generate_arithmetic(50, 20, seed=1)
    src = (tmp_path / "arithmetic" / "test.src").read_text().splitlines()
    tgt = (tmp_path / "arithmetic" / "test.tgt").read_text().splitlines()
    assert list(zip(src, tgt)) == test
    seen = set()
    for name in ("train", "valid", "test"):
        lines = (tmp_path / "arithmetic" / f"{name}.src").read_text().splitlines()
        targets = (tmp_path / "arithmetic" / f"{name}.tgt").read_text().splitlines()
        assert len(lines) == len(targets) == {"train": 50, "valid": 10, "test": 20}[name]
        assert not seen & set(lines)
        seen |= set(lines)
        assert all(int(t) == python_value(s) for s, t in zip(lines, targets))
