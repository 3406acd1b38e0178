"""``python experiments/summary.py RESULTS.json ... [--write FILE]``: the command of earlier reports, kept
so that the command recorded in ``docs/results.md`` still runs. It is
``python -m hyperplex.experiments.summary`` (:mod:`hyperplex.experiments.summary`)."""

import sys

from hyperplex.experiments.summary import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog="python experiments/summary.py"))
