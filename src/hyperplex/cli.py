"""Command-line interface: ``hyperplex {demo}``."""

from __future__ import annotations

import argparse
import sys


def _demo(args: argparse.Namespace) -> int:
    from hyperplex.demo import run_demo

    run_demo(args.out, quick=args.quick, seed=args.seed)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyperplex", description="Parameterized hypercomplex multiplication (PHM) layers for NLP.")
    parser.add_argument("--debug", action="store_true", help="show full tracebacks on errors")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="PHM paper Fig. 2 on generated data: learn a 3-D rotation and the quaternion/octonion rules",
        description="Learn a 3-D rotation with a PHM layer, and learn the quaternion (n=4) and octonion (n=8) "
        "multiplication rules from examples of products; print a table and write plots.",
    )
    demo.add_argument("--quick", action="store_true", help="fewer training steps (about 2.5 s instead of 3.5 s; used by the tests)")
    demo.add_argument("--out", default="runs/demo", help="folder for the plots (default: runs/demo)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    demo.set_defaults(func=_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as err:
        if args.debug:
            raise
        print(f"hyperplex {args.command}: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
