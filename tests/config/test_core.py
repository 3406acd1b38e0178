"""hyperplex.config: YAML reading, dict → dataclass validation, overrides, merging and the reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import pytest

from hyperplex.config import (
    ConfigError,
    dump_yaml,
    from_dict,
    load_yaml,
    located,
    merge,
    parse_overrides,
    reference_markdown,
    to_dict,
)
from hyperplex.config.core import key_lines


@dataclass
class Inner:
    size: int = field(default=4, metadata={"help": "a size"})
    names: list[str] = field(default_factory=list, metadata={"help": "names"})

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"size must be ≥ 1, got {self.size}")


@dataclass
class Outer:
    rate: float = field(default=0.5, metadata={"help": "a | rate"})
    mode: Literal["fast", "slow"] = field(default="fast", metadata={"help": "mode"})
    maybe: int | None = field(default=None, metadata={"help": "optional"})
    flag: bool = field(default=False, metadata={"help": "flag"})
    inner: Inner = field(default_factory=Inner, metadata={"help": "inner section"})

    renamed_keys: ClassVar[dict[str, str]] = {"speed": "rate"}


# ---------------------------------------------------------------------------- from_dict / to_dict
def test_from_dict_converts_and_round_trips_through_to_dict():
    raw = {"rate": 2, "mode": "slow", "maybe": 3, "flag": True, "inner": {"size": 7, "names": ["a", "b"]}}
    cfg = from_dict(Outer, raw)
    assert cfg == Outer(rate=2.0, mode="slow", maybe=3, flag=True, inner=Inner(7, ["a", "b"]))
    assert isinstance(cfg.rate, float)
    assert to_dict(cfg) == {**raw, "rate": 2.0}
    assert from_dict(Outer, to_dict(cfg)) == cfg


@pytest.mark.parametrize("raw,message,key", [
    ({"rat": 1.0}, "unknown config key 'rat'; did you mean 'rate'?", "rat"),
    ({"inner": {"sise": 1}}, "unknown config key 'inner.sise'; did you mean 'size'?", "inner.sise"),
    ({"mode": "slwo"}, "mode: 'slwo' is not one of 'fast', 'slow' (did you mean 'slow'?)", "mode"),
    ({"rate": "fast"}, "rate: expected float, got str 'fast'", "rate"),
    ({"rate": float("nan")}, "rate: expected a finite float, got nan", "rate"),
    ({"flag": "yes please"}, "flag: expected bool (true/false), got 'yes please'", "flag"),
    ({"maybe": 1.5}, "maybe: expected int | null, got 1.5", "maybe"),
    ({"inner": {"size": 0}}, "inner: size must be ≥ 1, got 0", "inner.size"),
    ({"inner": {"names": "a"}}, "inner.names: expected list of str, got str 'a'", "inner.names"),
    ({"inner": 3}, "inner: expected a mapping, got int 3", "inner"),
    ({"speed": 1.0}, "config key 'speed' is now called 'rate': rename it (its values mean the same)", "speed"),
])
def test_from_dict_errors_name_the_key_and_what_was_expected(raw, message, key):
    with pytest.raises(ConfigError) as caught:
        from_dict(Outer, raw)
    assert str(caught.value) == message and caught.value.key == key


def test_a_bad_list_item_is_its_own_key():
    with pytest.raises(ConfigError, match=r"^inner.names\[1\]: expected str") as caught:
        from_dict(Outer, {"inner": {"names": ["a", 2]}})
    assert caught.value.key == "inner.names[1]"


def test_key_lines_give_each_key_its_line_and_located_starts_the_message(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("# a comment\nrate: 1\ninner:\n\n  size: 0   # too small\n  names:\n    - a\n    - 2\n"
                    "base: {deep: &b {x: 1}}\nother: *b\n")
    lines = key_lines(path)
    assert {k: lines[k] for k in ("rate", "inner", "inner.size", "inner.names", "inner.names[1]", "base.deep.x")} == {
        "rate": 2, "inner": 3, "inner.size": 5, "inner.names": 6, "inner.names[1]": 8, "base.deep.x": 9}
    assert "other.x" not in lines  # an alias's node is walked once, where it is defined
    with pytest.raises(ConfigError) as caught:
        from_dict(Outer, {"rate": 1, "inner": {"size": 1, "names": ["a", 2]}})
    assert located(path, caught.value) == f"{path}:8"
    assert located(path, ConfigError("no key")) == str(path)  # nothing to point at: the file alone
    assert located(path, ConfigError("x", key="nowhere")) == str(path)  # a key the file does not write
    assert key_lines(tmp_path / "missing.yaml") == {} and key_lines(tmp_path) == {}


def test_scientific_notation_strings_and_integral_floats_are_accepted():
    assert from_dict(Outer, {"rate": "3e-4"}).rate == 3e-4
    assert from_dict(Outer, {"maybe": 4.0}).maybe == 4
    assert from_dict(Outer, {"rate": 1}).rate == 1.0
    with pytest.raises(ConfigError, match="rate: expected float, got bool True"):
        from_dict(Outer, {"rate": True})


# ---------------------------------------------------------------------------- overrides and merge
def test_parse_overrides_builds_nested_dicts_with_yaml_scalars():
    assert parse_overrides(["--a.b=3", "a.c=x", "--d=[1, 2]", "--e=", "--f=true"]) == \
        {"a": {"b": 3, "c": "x"}, "d": [1, 2], "e": "", "f": True}


@pytest.mark.parametrize("item", ["--a.b", "=3"])
def test_parse_overrides_refuses_items_without_key_or_value(item):
    with pytest.raises(ConfigError, match="is not of the form --section.key=value"):
        parse_overrides([item])


def test_parse_overrides_refuses_a_key_under_a_scalar():
    with pytest.raises(ConfigError, match="conflicts with another override of 'a'"):
        parse_overrides(["--a=1", "--a.b=2"])


def test_merge_is_recursive_and_leaves_inputs_unchanged():
    base = {"a": {"b": 1, "c": 2}, "d": 3}
    over = {"a": {"c": 20, "e": 5}, "d": {"x": 1}}
    assert merge(base, over) == {"a": {"b": 1, "c": 20, "e": 5}, "d": {"x": 1}}
    assert base == {"a": {"b": 1, "c": 2}, "d": 3} and over == {"a": {"c": 20, "e": 5}, "d": {"x": 1}}


# ---------------------------------------------------------------------------- YAML files
def test_load_yaml_round_trips_dump_yaml(tmp_path):
    data = {"name": "x", "training": {"lr": 0.001, "betas": [0.9, 0.98]}, "text": "ümlaut"}
    (tmp_path / "c.yaml").write_text(dump_yaml(data), encoding="utf-8")
    assert load_yaml(tmp_path / "c.yaml") == data


def test_duplicate_keys_are_refused_in_nested_sections_too(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("a:\n  b: 1\nc: 2\na:\n  b: 3\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: key 'a' is given twice in the same section \(first at line 1\)"):
        load_yaml(path)
    path.write_text("a:\n  b: 1\n  c:\n    d: 1\n    d: 2\n")
    with pytest.raises(ConfigError, match=r"c.yaml:5: key 'd' is given twice .*first at line 4"):
        load_yaml(path)
    path.write_text("a:\n  b: 1\nc:\n  b: 1\n")  # the same key in different sections is fine
    assert load_yaml(path) == {"a": {"b": 1}, "c": {"b": 1}}


@pytest.mark.parametrize("text,message", [
    ("", "is empty"), ("# only a comment\n", "is empty"), ("- 1\n- 2\n", "got list"),
    ("a: [1, 2\n", "malformed YAML at"),
])
def test_load_yaml_refuses_files_that_are_not_configs(tmp_path, text, message):
    (tmp_path / "c.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_yaml(tmp_path / "c.yaml")


# ---------------------------------------------------------------------------- reference
def test_reference_lists_every_field_with_type_default_and_escaped_help():
    text = reference_markdown(Outer)
    assert "| `rate` | float | `0.5` | a \\| rate |" in text
    assert "| `mode` | 'fast' \\| 'slow' | `fast` | mode |" in text
    assert "| `maybe` | int \\| null | `null` | optional |" in text
    assert "| `inner` | mapping | `see below` | inner section |" in text
    assert "### `inner`" in text and "| `inner.size` | int | `4` | a size |" in text
