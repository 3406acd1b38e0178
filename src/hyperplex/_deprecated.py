"""Old import paths, kept for one release: each still works and warns once per import with a
``DeprecationWarning`` naming the new path.

The table names modules as strings and loads them lazily (like the registry's plugin tables), so this module
sits at the bottom of the import order and any package may use it. Two kinds of old paths:

* a moved module (``hyperplex.convert.quantize``): a finder on ``sys.meta_path`` answers the old name with a
  module that re-exports the new module's public names (its ``__all__``);
* a name a package no longer exports (``from hyperplex.convert import quantize``): the package's
  ``__getattr__`` is :func:`attribute_getter`'s, which returns the object from its new home.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import types
import warnings

__all__ = ["MOVED_MODULES", "MOVED_NAMES", "attribute_getter", "install"]

#: old module path → new module path.
MOVED_MODULES = {
    "hyperplex.convert.quantize": "hyperplex.int8",
    "hyperplex.convert.export": "hyperplex.convert.onnx",
    "hyperplex.convert.quality": "hyperplex.scoring.quality",
    "hyperplex.train.inference": "hyperplex.inference.verbs",
    "hyperplex.train.load": "hyperplex.inference.load",
    "hyperplex.train.export": "hyperplex.inference.export",
    "hyperplex.train.params": "hyperplex.inference.parameters",
    "hyperplex.experiments.quality": "hyperplex.scoring.plan_metrics",
    "hyperplex.adapters.finetune": "hyperplex.models.finetune",
    "hyperplex.adapters.state": "hyperplex.adapters.state_dict",
    "hyperplex.nn.transformer": "hyperplex.nn.transformer_blocks",
}

_METRICS = ("BleuResult", "ChrfResult", "CorpusScore", "accuracy", "corpus_bleu", "corpus_chrf",
            "mean_average_precision", "mean_reciprocal_rank", "perplexity", "ranking_metrics")
#: package → {old name: (new module, name there, how to call it now)}.
MOVED_NAMES = {
    "hyperplex.convert": {
        "quantize": ("hyperplex.int8", "quantize", "hyperplex.quantize(model, Int8Config(...))"),
        "model_bytes": ("hyperplex.int8", "model_bytes", "hyperplex.model_bytes"),
        "is_quantized": ("hyperplex.int8", "is_quantized", "hyperplex.int8.is_quantized"),
        "save_quantized": ("hyperplex.int8", "save_quantized", "hyperplex.save_quantized"),
        "load_quantized": ("hyperplex.int8", "load_quantized", "hyperplex.load_quantized"),
        "QuantizationError": ("hyperplex.int8", "QuantizationError", "hyperplex.QuantizationError"),
    },
    "hyperplex.train": {name: ("hyperplex.metrics", name, f"hyperplex.metrics.{name}") for name in _METRICS},
}


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} is deprecated and will be removed in the next release; use {new}",
                  DeprecationWarning, stacklevel=3)


class _PackageWithMovedNames(types.ModuleType):
    """A package whose old name is both a moved module and a moved function (``hyperplex.convert.quantize``):
    importing the old module path must not replace the package attribute, which stays the function."""

    def __setattr__(self, name: str, value) -> None:
        if isinstance(value, types.ModuleType) and value.__name__ in MOVED_MODULES and \
                name in MOVED_NAMES.get(self.__name__, {}):
            return  # the old module stays importable through sys.modules
        super().__setattr__(name, value)


def attribute_getter(package: str):
    """The module ``__getattr__`` of ``package`` (called while it is being imported): a name it no longer exports,
    from its new home, with a warning."""
    moved = MOVED_NAMES.get(package, {})
    if package in sys.modules:
        sys.modules[package].__class__ = _PackageWithMovedNames

    def __getattr__(name: str):
        if name not in moved:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module, attribute, replacement = moved[name]
        _warn(f"{package}.{name}", replacement)
        return getattr(importlib.import_module(module), attribute)

    return __getattr__


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        warnings.warn(f"{module.__name__} is deprecated and will be removed in the next release; use {self.new}",
                      DeprecationWarning, stacklevel=2)
        target = importlib.import_module(self.new)
        public = list(getattr(target, "__all__", [n for n in vars(target) if not n.startswith("_")]))
        module.__dict__.update({name: getattr(target, name) for name in public})
        module.__all__ = public


class _AliasFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new = MOVED_MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(new))


def install() -> None:
    """Put the finder of the moved modules on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


install()
