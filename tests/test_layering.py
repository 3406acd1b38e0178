"""Dependencies run one way: every ``hyperplex`` import (module level or inside a function) points to a
module at the same layer or below. The layers, lowest first:

0. ``algebra``, ``fileio``, ``threads``, ``metrics``, ``config`` (core, registry), ``_deprecated`` (the table of
   old import paths: it names modules as strings, like the registry)
1. ``guards`` (output guard, path names, finite weights), ``layers``, ``pretrained`` (finding and loading a
   pretrained encoder: reads its files through ``fileio``)
2. ``nn``, ``data``, ``transforms`` (what the typed configs of the transforms share: ``targets`` / ``exclude``)
3. ``convert``, ``adapters`` (dense layers of any model swapped for PHM / low-rank layers or wrapped by adapters;
   the one loader of model folders, ``convert.serialize``)
4. ``int8`` (int8 layers, the transform and its folder format: built on ``convert``'s folders)
5. ``models`` (every model, the pretrained student and classifier too: they are built with ``convert`` and
   ``adapters``; ``models.finetune`` holds the fine-tuning kinds of ``model.adapter``, peft's among them)
6. ``config.experiment``, ``config.reference`` (the experiment schema, which names model configs)
7. ``train`` (the trainer, checkpoints, optimisers, plots; tasks are found through the registry)
8. ``inference`` (the verbs that use a model without training it: ``load.load_model``, ``verbs.evaluate`` /
   ``verbs.translate``, ``export``, ``parameters``)
9. ``train.run`` (``run.train`` / ``run.compress``, the training verbs as Python calls: ``compress`` loads a
   trained model through ``inference``)
10. ``tasks``
11. ``scoring`` (encoder scoring: sentence encoders in their folders scored next to their teacher, the
    quality metrics of plans; loads trained models)
12. ``experiments`` (experiment plans: they train and evaluate through ``train.run`` and ``inference``)
13. ``cli`` (argument parsing, printing and exit codes: it calls the layers below, ``experiments`` included)
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
TOP = 13

LAYERS = {
    "hyperplex.algebra": 0, "hyperplex.fileio": 0, "hyperplex.threads": 0, "hyperplex.metrics": 0,
    "hyperplex.config": 0, "hyperplex._deprecated": 0,
    "hyperplex.config.core": 0, "hyperplex.config.registry": 0,
    "hyperplex.guards": 1, "hyperplex.layers": 1, "hyperplex.pretrained": 1,
    "hyperplex.nn": 2, "hyperplex.data": 2, "hyperplex.transforms": 2,
    "hyperplex.convert": 3, "hyperplex.adapters": 3,
    "hyperplex.int8": 4,
    "hyperplex.models": 5,
    "hyperplex.config.experiment": 6, "hyperplex.config.reference": 6,
    "hyperplex.train": 7,
    "hyperplex.inference": 8,
    "hyperplex.train.run": 9,
    "hyperplex.tasks": 10,
    "hyperplex.scoring": 11,
    "hyperplex.experiments": 12,
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


def test_module_names_are_unique():
    """No two modules share a file name (``__init__`` aside): a name says which module is meant."""
    seen: dict[str, list[str]] = {}
    for path in SRC.rglob("*.py"):
        if path.name != "__init__.py":
            seen.setdefault(path.name, []).append(str(path.relative_to(SRC)))
    assert not {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_moved_modules_resolve_with_a_warning():
    """Each old import path of the one-release table still imports, warns naming its new path, and re-exports
    the new module's public names."""
    import importlib
    import sys

    from hyperplex._deprecated import MOVED_MODULES

    for old, new in MOVED_MODULES.items():
        sys.modules.pop(old, None)
        with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
            module = importlib.import_module(old)
        target = importlib.import_module(new)
        assert module.__all__ and all(getattr(module, n) is getattr(target, n) for n in module.__all__)
