"""The package version, in one place: ``pyproject.toml`` reads it, ``hyperplex.__version__`` re-exports it."""

__version__ = "0.2.0"
