"""``hyperplex report {summary,frontier,budget,sweep,convergence}`` and ``hyperplex config-reference``: the tables and
figures of experiment results, and the config reference, as verbs of the one command line. Each report's arguments and
work are its module's (:mod:`hyperplex.experiments.summary`, ``.frontier``, ``.budget``, ``.plot``)."""

from __future__ import annotations

import argparse
import importlib

#: report name → (module, one-line help). The module has ``add_arguments(parser)``, ``run(args, prog)``, and
#: its docstring's first paragraph is the description.
REPORTS = {
    "summary": ("hyperplex.experiments.summary",
                "the summary table of several plans' results.json (the <!-- summary --> section of docs/results.md)"),
    "frontier": ("hyperplex.experiments.frontier",
                 "quality against size (and serving cost) of compressed encoders: table and figure"),
    "budget": ("hyperplex.experiments.budget", "quality against training budget of healing recipes: table and figure"),
    "sweep": ("hyperplex.experiments.plot", "the figure of a sweep plan (metric and spikes against the swept key)"),
    "convergence": ("hyperplex.experiments.convergence",
                    "an early-stopped plan at convergence: steps to the best checkpoint, why each model stopped, "
                    "gaps between rows with Welch intervals beside the paper's"),
}


def _run_report(args: argparse.Namespace) -> int:
    module = importlib.import_module(REPORTS[args.report][0])
    return module.run(args, f"hyperplex report {args.report}")


def add_report(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex report``: one subcommand per entry of :data:`REPORTS`."""
    report = sub.add_parser("report", parents=[common], help="tables and figures of experiment results",
                            description="Tables and figures of experiment results (the results.json that "
                                        "`hyperplex experiment` writes). See experiments/README.md.")
    kinds = report.add_subparsers(dest="report", required=True, metavar="{" + ",".join(REPORTS) + "}")
    for name, (module_name, help_text) in REPORTS.items():
        module = importlib.import_module(module_name)
        parser = kinds.add_parser(name, parents=[common], help=help_text, description=_description(module, help_text))
        module.add_arguments(parser)
        parser.set_defaults(func=_run_report)


def _description(module, fallback: str) -> str:
    """The first paragraph of the report module's docstring as a sentence for ``--help``: the colon that introduces
    its example command and the reST quotes dropped."""
    first = (module.__doc__ or fallback).split("\n\n")[0].strip().replace("``", "`")
    return first[:-1] + "." if first.endswith(":") else first


def _config_reference(args: argparse.Namespace) -> int:
    from hyperplex.config.reference import run

    return run(args, "hyperplex config-reference")


def add_config_reference(sub, common: argparse.ArgumentParser) -> None:
    """``hyperplex config-reference``: docs/config.md, commented templates, the `#:` comments of config files."""
    from hyperplex.config.reference import DESCRIPTION, add_arguments

    parser = sub.add_parser("config-reference", parents=[common], help="the config reference, templates and "
                            "`#:` comments, generated from the config classes", description=DESCRIPTION)
    add_arguments(parser)
    parser.set_defaults(func=_config_reference)
