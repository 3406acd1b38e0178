"""Typed configuration: YAML → dataclasses, with errors that name the key.

Every config section is a dataclass whose fields carry ``metadata={"help": ...}``. This module
validates plain dicts into them generically (unknown keys name the closest valid key; wrong
types name the key and the expected type), applies dotted command-line overrides
(``--training.lr=3e-4``) and renders the config reference (``docs/config.md``) from the same
classes, so the reference cannot drift from the code.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import reprlib
import types
import typing
from pathlib import Path
from typing import Any, Literal, Union

import yaml


class ConfigError(ValueError):
    """A config that cannot be used; the message names the file/key and what was expected. ``key`` is the
    dotted key at fault (list items as ``key[i]``; a section for its own checks), ``None`` when none is."""

    def __init__(self, message: str, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


#: Values shown in error messages are cut (a few items, a few levels, 80 characters of a string), so a
#: huge value (a YAML alias bomb) gives a short message instead of building it whole.
_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 80, 80, 6, 6, 3
#: The most nodes a config document's aliases may add when expanded (``*name`` repeats ``&name``'s node). A long
#: plain list (a plan of 200,000 seeds) adds none: its nodes are in the file, already parsed.
MAX_YAML_NODES = 100_000


def _show(value: Any) -> str:
    """``repr(value)``, shortened (:data:`_REPR`, then at most 200 characters)."""
    text = _REPR.repr(value)
    return text if len(text) <= 200 else text[:197] + "..."


def _expanded_size(root) -> tuple[int, int]:
    """``(expanded, distinct)``: nodes of a composed YAML document with every alias expanded, counted without
    expanding anything (each node's size once, memoised, capped far above any limit), and the distinct nodes
    the file holds. ValueError on a cycle."""
    sizes: dict[int, int] = {}
    stack = [(root, False)]
    visiting: set[int] = set()
    while stack:
        node, done = stack.pop()
        key = id(node)
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [n for pair in node.value for n in pair]
        if done:
            visiting.discard(key)
            sizes[key] = min(1 + sum(sizes[id(c)] for c in children), 10 ** 15)
            continue
        if key in sizes:
            continue
        if key in visiting:
            raise ValueError("an alias refers to a node that contains it")
        visiting.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in children if id(c) not in sizes)
    return sizes[id(root)], len(sizes)


# ---------------------------------------------------------------------------- YAML
class _StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a key given twice in one mapping (PyYAML keeps the last silently)
    and a document whose aliases expand beyond :data:`MAX_YAML_NODES` nodes (a "billion laughs" file)."""

    def get_single_data(self):
        node = self.get_single_node()
        if node is None:
            return None
        try:
            expanded, distinct = _expanded_size(node)
        except ValueError as err:
            raise _TooLarge(str(err)) from None
        if expanded - distinct > MAX_YAML_NODES:
            raise _TooLarge(f"its aliases expand to more than {MAX_YAML_NODES:,} values beyond the {distinct:,} the "
                            f"file holds")
        return self.construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: let PyYAML report it
                continue
            if first is not None:
                raise _DuplicateKey(key, first, key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


class _TooLarge(Exception):
    """A document refused before it is built; the message says why."""


class _DuplicateKey(Exception):
    def __init__(self, key, first_line: int, second_line: int) -> None:
        super().__init__(key)
        self.key, self.first_line, self.second_line = key, first_line, second_line


def load_yaml(path: str | Path) -> dict:
    """Read a YAML mapping. A missing file, a folder, an empty file, malformed YAML (with the line) and a
    key given twice in one mapping (with both lines) raise :class:`ConfigError`."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a config file (give the YAML file, e.g. configs/x.yaml)")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)  # noqa: S506 - a SafeLoader
    except _DuplicateKey as dup:
        raise ConfigError(f"{path}:{dup.second_line}: key {_show(dup.key)} is given twice in the same section (first "
                          f"at line {dup.first_line}); remove one") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise ConfigError(f"malformed YAML at {where}: {err.problem}") from None
    except _TooLarge as err:
        raise ConfigError(f"{path}: refused: {err} (YAML anchors and aliases, `&name` / `*name`)") from None
    except RecursionError:
        raise ConfigError(f"{path}: nested too deeply to be a config") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (invalid byte at offset {err.start})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"cannot read YAML {path}: {err}") from None
    if data is None:
        raise ConfigError(f"{path} is empty (or only comments); a config needs at least a data and a model section")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of config sections at the top level, got {type(data).__name__}")
    return data


def key_lines(path: str | Path) -> dict[str, int]:
    """The 1-based line of every key of the YAML file ``path``, dotted as the config's keys are (list items
    as ``key[i]``); ``{}`` when the file cannot be read. Each node is walked once, so aliases add nothing."""
    try:
        root = yaml.compose(Path(path).read_text(encoding="utf-8"), Loader=yaml.SafeLoader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, RecursionError):
        return {}
    lines: dict[str, int] = {}
    seen: set[int] = set()
    todo = [(root, "")]
    while todo:
        node, prefix = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            children = [(f"{prefix}.{k.value}" if prefix else str(k.value), k, v)
                        for k, v in node.value if isinstance(k, yaml.ScalarNode)]
        elif isinstance(node, yaml.SequenceNode):
            children = [(f"{prefix}[{i}]", v, v) for i, v in enumerate(node.value)]
        else:
            continue
        for dotted, at, _ in children:
            lines.setdefault(dotted, at.start_mark.line + 1)
        # depth first in the file's order, so that an anchored node is walked where it is defined, not at an alias
        todo.extend((value, dotted) for dotted, _, value in reversed(children))
    return lines


def located(path: str | Path, err: ConfigError) -> str:
    """``path:LINE`` when the key ``err`` names is written in ``path``, else ``path``: the start of an error
    message about that file."""
    line = key_lines(path).get(err.key) if err.key else None
    return f"{path}:{line}" if line else str(path)


def parse_overrides(items: list[str]) -> dict:
    """``["training.lr=3e-4", "model.linear.n=8"]`` → nested dict. Values are parsed as YAML scalars."""
    result: dict = {}
    for item in items:
        key, sep, value = item.lstrip("-").partition("=")
        if not sep or not key:
            raise ConfigError(f"override {item!r} is not of the form --section.key=value")
        try:
            parsed = yaml.safe_load(value) if value != "" else ""
        except yaml.YAMLError:
            parsed = value
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {item!r} conflicts with another override of {part!r}")
        node[parts[-1]] = parsed
    return result


def merge(base: dict, override: dict) -> dict:
    """Recursive dict merge (override wins); neither input is modified."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


# ---------------------------------------------------------------------------- typing
#: Decimal/scientific notation that PyYAML leaves as a string (``1e-4``, ``3E+2``); accepted for float keys.
_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " | ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if origin is list:
        return f"list of {_type_name(typing.get_args(tp)[0])}"
    if dataclasses.is_dataclass(tp):
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Check/convert ``value`` against the annotation ``tp``; ``key`` is the dotted path for errors (and the
    :attr:`ConfigError.key` of one raised here, unless a deeper key set it first)."""
    try:
        return _checked(value, tp, key)
    except ConfigError as err:
        if err.key is None:
            err.key = key
        raise


def _checked(value: Any, tp: Any, key: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{key}: {_show(value)} is not one of {', '.join(repr(c) for c in choices)}{hint}")
        return value
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        sections = [a for a in args if dataclasses.is_dataclass(a)]
        if isinstance(value, dict) and len(sections) == 1:  # an optional section: its own error names the key
            return _convert(value, sections[0], key)
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except ConfigError as err:
                errors.append(err)
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {_show(value)}")
    if origin is list:
        (item_type,) = typing.get_args(tp)
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {type(value).__name__} {_show(value)}")
        return [_convert(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        resolve = getattr(tp, "resolve_class", None)  # a polymorphic section (``model:``): pick the subclass
        return from_dict(resolve(value, key) if resolve else tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected bool (true/false), got {_show(value)}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{key}: expected int, got {type(value).__name__} {_show(value)}")
        return value
    if tp is float:
        if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
            value = float(value)  # YAML 1.1 (PyYAML) reads `3e-4` (no dot) as a string
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected float, got {type(value).__name__} {_show(value)}")
        if not math.isfinite(value):  # a NaN passes every `x <= 0` check and poisons training hours later
            raise ConfigError(f"{key}: expected a finite float, got {_show(value)}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected str, got {type(value).__name__} {_show(value)}")
        return value
    if tp is dict or typing.get_origin(tp) is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {_show(value)}")
        return value
    raise TypeError(f"unsupported config annotation {tp!r} for {key}")


def from_dict(cls: type, data: Any, prefix: str = "") -> Any:
    """Validate ``data`` (a dict from YAML) into the dataclass ``cls``.

    Unknown keys raise :class:`ConfigError` naming the key and the closest valid key (a key that ``cls``
    lists in a ``renamed_keys`` class attribute, ``{old: new}``, names its new name); wrong types
    name the key and the expected type; the dataclass's own ``__post_init__`` checks run last and
    their ``ValueError`` is re-raised with the section's dotted path.
    """
    section = prefix or cls.__name__
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{section}: expected a mapping, got {type(data).__name__} {_show(data)}",
                          key=prefix or None)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    renamed = getattr(cls, "renamed_keys", {})
    kwargs = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if key in renamed:
            raise ConfigError(f"config key {_show(dotted)} is now called {renamed[key]!r}: rename it (its values "
                              "mean the same)", key=dotted)
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"unknown config key {_show(dotted)}{hint}", key=dotted)
        kwargs[key] = _convert(value, hints[key], dotted)
        choices = fields[key].metadata.get("choices")  # a registry-backed choice: the live table decides
        if choices is not None and kwargs[key] not in choices():
            valid = choices()
            close = difflib.get_close_matches(str(value), [str(c) for c in valid], n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{dotted}: {_show(value)} is not one of {', '.join(repr(c) for c in valid)}{hint}",
                              key=dotted)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:  # a top-level file's own checks need no class name before them
        named = re.split(r"[\s:]", str(err), maxsplit=1)[0]  # a check of one key names it first
        key = (f"{prefix}.{named}" if prefix else named) if named in fields else (prefix or None)
        raise ConfigError(f"{prefix}: {err}" if prefix else str(err), key=key) from None


def to_dict(obj: Any) -> Any:
    """Dataclass (nested) → plain dict/list/scalars, ready for YAML/JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


def dump_yaml(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


# ---------------------------------------------------------------------------- reference docs
def reference_markdown(cls: type, prefix: str = "", heading_level: int = 3, instance: Any = None) -> str:
    """Markdown table of every field of ``cls`` (recursing into nested dataclasses). Defaults are read
    from ``instance`` when given (a nested section's default object, which may differ from its class's)."""
    hints = typing.get_type_hints(cls)
    rows, nested = [], []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        dotted = f"{prefix}.{f.name}" if prefix else f.name
        tp = hints[f.name]
        if instance is not None:
            default = getattr(instance, f.name)
        elif f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            default = "(required)"
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            nested.append((dotted, tp, default if dataclasses.is_dataclass(default) else None))
            default = "see below"
        shown = yaml.safe_dump(to_dict(default), default_flow_style=True).strip().removesuffix("...").strip() \
            if default not in ("(required)", "see below") else default
        help_text = f.metadata.get("help", "").replace("|", "\\|").replace("\n", " ")
        type_name = " | ".join(repr(c) for c in f.metadata["choices"]()) if "choices" in f.metadata else _type_name(tp)
        rows.append(f"| `{dotted}` | {type_name.replace('|', chr(92) + '|')} | `{shown}` | {help_text} |")
    text = "| key | type | default | meaning |\n|---|---|---|---|\n" + "\n".join(rows) + "\n"
    for dotted, tp, value in nested:
        text += f"\n{'#' * heading_level} `{dotted}`\n\n" + reference_markdown(tp, dotted, heading_level, value)
    return text
