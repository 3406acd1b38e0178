"""Configs from other people: an alias bomb is refused in bounded time and memory; error messages stay short."""

import time

import pytest

from hyperplex.config import ConfigError, load_yaml
from hyperplex.config.core import MAX_YAML_NODES, _convert


def bomb(levels: int = 9) -> str:
    """The "billion laughs" document: each level lists the previous one 10 times (10^levels strings)."""
    lines = ['a0: &a0 "lol"']
    for i in range(1, levels + 1):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]")
    return "\n".join(lines) + f"\ndata:\n  train: *a{levels}\n"


def test_an_alias_bomb_is_refused_quickly_with_one_short_line(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    assert len(path.read_bytes()) < 1200
    start = time.process_time()
    with pytest.raises(ConfigError) as err:
        load_yaml(path)
    message = str(err.value)
    assert message.startswith(f"{path}: refused: its aliases expand to more than {MAX_YAML_NODES:,} values")
    assert len(message) < 300 and time.process_time() - start < 30  # a bound on the work, not a speed claim


def test_aliases_within_the_bound_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {lr: 0.1}\ntraining: *b\nmodel: {x: [1, 2]}\n")
    assert load_yaml(path)["training"] == {"lr": 0.1}


def test_a_recursive_alias_is_refused(tmp_path):
    path = tmp_path / "loop.yaml"
    path.write_text("data: &a [1, *a]\n")
    with pytest.raises(ConfigError, match="refused: an alias refers to a node that contains it"):
        load_yaml(path)


def test_type_errors_show_a_shortened_value():
    huge = [["x" * 10_000] * 1000] * 1000  # shared lists: cheap to hold, a billion characters to print
    with pytest.raises(ConfigError) as err:
        _convert(huge, str, "data.train")
    assert str(err.value).startswith("data.train: expected str, got list [[") and len(str(err.value)) < 400


def test_a_long_plain_list_is_not_an_alias_bomb(tmp_path):
    """200,000 seeds written out add no node by expansion: the file is as large as the data it holds."""
    path = tmp_path / "plan.yaml"
    path.write_text("seeds: [" + ", ".join(str(i) for i in range(200_000)) + "]\n")
    assert load_yaml(path)["seeds"][-1] == 199_999
