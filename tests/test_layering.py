"""Dependencies run one way: every ``hyperplex`` import (module level or inside a function) points to a
module at the same layer or below. The layers, lowest first:

0. ``algebra``, ``fileio``, ``threads``, ``metrics``, ``config`` (core, registry)
1. ``guards`` (output guard, path names, finite weights), ``layers``, ``pretrained`` (finding and loading a
   pretrained encoder: reads its files through ``fileio``)
2. ``nn``, ``data``
3. ``convert``, ``adapters`` (dense layers of any model swapped for PHM / low-rank layers or wrapped by adapters)
4. ``models`` (every model, the pretrained student and classifier too: they are built with ``convert`` and
   ``adapters``)
5. ``config.experiment``, ``config.reference`` (the experiment schema, which names model configs)
6. ``train`` (the trainer, and what the verbs do as Python calls: ``run.train`` / ``run.compress``,
   ``inference.evaluate`` / ``inference.translate``, ``load.load_model``; tasks are found through the registry)
7. ``tasks``
8. ``scoring`` (sentence encoders in their folders scored next to their teacher: loads trained models)
9. ``experiments`` (experiment plans: they train and evaluate through ``train.run`` and ``train.inference``)
10. ``cli`` (argument parsing, printing and exit codes: it calls the layers below, ``experiments`` included)
    and the package root, which re-exports the public API

Within one layer, packages may not import each other (``convert`` ↔ ``adapters``), except a package
importing itself. Registry entries name modules as strings and are loaded lazily; they are plugin
tables, not imports, and are not counted.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "hyperplex"
#: The top layer: the command line and the package root, which may import each other.
TOP = 10

LAYERS = {
    "hyperplex.algebra": 0, "hyperplex.fileio": 0, "hyperplex.threads": 0, "hyperplex.metrics": 0,
    "hyperplex.config": 0,
    "hyperplex.config.core": 0, "hyperplex.config.registry": 0,
    "hyperplex.guards": 1, "hyperplex.layers": 1, "hyperplex.pretrained": 1,
    "hyperplex.nn": 2, "hyperplex.data": 2,
    "hyperplex.convert": 3, "hyperplex.adapters": 3,
    "hyperplex.models": 4,
    "hyperplex.config.experiment": 5, "hyperplex.config.reference": 5,
    "hyperplex.train": 6,
    "hyperplex.tasks": 7,
    "hyperplex.scoring": 8,
    "hyperplex.experiments": 9,
    "hyperplex.cli": TOP, "hyperplex.__main__": TOP, "hyperplex": TOP,
}


def layer_of(module: str) -> tuple[int, str]:
    """(layer, owning entry) of a dotted module name: the longest prefix listed in LAYERS."""
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        if name in LAYERS:
            return LAYERS[name], name
    raise KeyError(module)


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out.append((".".join(parts), path))
    return out


def imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, imported hyperplex module) for every import statement in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "hyperplex"]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] != "hyperplex":
                continue
            if target == "hyperplex":  # `from hyperplex import algebra` imports the submodule
                found += [(node.lineno, f"hyperplex.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, target))
    return found


def test_every_module_has_a_layer():
    missing = []
    for module, _ in modules():
        try:
            layer_of(module)
        except KeyError:
            missing.append(module)
    assert not missing, f"add these modules to LAYERS: {missing}"


@pytest.mark.parametrize("module,path", modules(), ids=[m for m, _ in modules()])
def test_imports_point_down(module, path):
    own_layer, own_entry = layer_of(module)
    upward = []
    for line, target in imports(path, module):
        layer, entry = layer_of(target)
        same_package = entry.split(".")[:2] == own_entry.split(".")[:2]
        if layer > own_layer or (layer == own_layer and not same_package and own_layer != TOP):
            upward.append(f"{path.relative_to(SRC.parent)}:{line} imports {target} (layer {layer} > {own_layer})"
                          if layer > own_layer else f"{path.relative_to(SRC.parent)}:{line} imports {target} "
                          f"(same layer {layer}, another package)")
    assert not upward, "\n".join(upward)
