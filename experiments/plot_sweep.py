"""``python experiments/plot_sweep.py RESULTS.json OUT.png``: the command of earlier reports, kept so that
the command recorded in ``docs/results.md`` still runs. It is ``python -m hyperplex.experiments.plot``
(:mod:`hyperplex.experiments.plot`)."""

import sys

from hyperplex.experiments.plot import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python experiments/plot_sweep.py"))
