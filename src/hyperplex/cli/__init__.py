"""The command line: ``hyperplex {demo,train,compress,score-encoder,corpus,evaluate,translate,params,average,
experiment,export}``.

- :mod:`~hyperplex.cli.main`: argument parsing, printing and the one-line error contract. What each verb does
  is a library function: :mod:`hyperplex.train.run` (``train``, ``compress``), :mod:`hyperplex.inference.verbs`
  (``evaluate``, ``translate``), :func:`hyperplex.train.checkpoint.write_average`,
  :mod:`hyperplex.inference.parameters`, :mod:`hyperplex.scoring`, :mod:`hyperplex.experiments` (with ``demo``:
  :mod:`hyperplex.experiments.demo`).
"""

from hyperplex.cli.main import build_parser, main

__all__ = ["main", "build_parser"]
