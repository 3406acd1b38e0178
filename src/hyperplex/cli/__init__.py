"""The command line: ``hyperplex {demo,train,compress,evaluate,score-encoder,translate,params,average,bench}``.

- :mod:`~hyperplex.cli.main`: argument parsing and the one-line error contract.
- :mod:`~hyperplex.cli.runner`: what each verb does, as plain functions callable from Python.
- :mod:`~hyperplex.cli.demo`: the PHM paper's Figure 2 experiments behind ``hyperplex demo``.
"""

from hyperplex.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
