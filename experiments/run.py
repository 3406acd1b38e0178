"""``python experiments/run.py PLAN.yaml ...``: the command that committed results record, so that those
commands run. It is ``hyperplex experiment PLAN.yaml ...`` (:mod:`hyperplex.experiments.cli`), with this
script's path recorded as the command."""

import shlex
import sys
from pathlib import Path

from hyperplex.experiments.cli import main


def _prog() -> str:
    script = Path(__file__).resolve()
    try:
        script = script.relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return shlex.join(["python", str(script)])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], prog=_prog()))
