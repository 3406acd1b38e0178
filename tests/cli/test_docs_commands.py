"""Every `hyperplex` command line in the README's and the guides' shell blocks is one the CLI accepts: its verb and
options parse, the configs and plans it names are in the repository, and its config overrides name real keys with
values of the right type. A renamed flag or key fails here rather than at a reader's prompt. Nothing is run."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from hyperplex.cli.main import _split_overrides, build_parser
from hyperplex.config.experiment import load_experiment

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", *sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").glob("*.md")),
         "experiments/README.md", "experiments/lanes/README.md"]
#: A value the page's reader fills in (``--model.n=N``, ``STUDENT``): parsed, but not checked as a config value.
PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_]*$")


def commands() -> list[tuple[str, list[str]]]:
    """``(PAGE:LINE, argv after "hyperplex")`` for each hyperplex command of a ```bash block."""
    found = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        for block in re.finditer(r"```bash\n(.*?)```", text, re.S):
            first_line = text.count("\n", 0, block.start(1)) + 1
            for number, line in _logical_lines(block.group(1), first_line):
                if not line or line.startswith("#"):
                    continue
                lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
                lexer.whitespace_split, lexer.commenters = True, "#"
                words = list(lexer)
                segment: list[str] = []
                for word in [*words, ";"]:
                    if word in (";", "&&", "||", "|", "&"):
                        argv = _after_hyperplex(segment)
                        if argv is not None:
                            found.append((f"{page}:{number}", argv))
                        segment = []
                    else:
                        segment.append(word)
    return found


def _logical_lines(block: str, first_line: int) -> list[tuple[int, str]]:
    """The block's command lines, each with a backslash-continued line joined to it, and the number of the page's
    line it starts on."""
    lines, pending, start = [], "", first_line
    for number, line in enumerate(block.split("\n"), first_line):
        if not pending:
            start = number
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        lines.append((start, (pending + line).strip()))
        pending = ""
    return lines


def _after_hyperplex(words: list[str]) -> list[str] | None:
    """The arguments after the program ``hyperplex`` (``.venv/bin/hyperplex``, ``python -m hyperplex``,
    ``torchrun … -m hyperplex``), or None for another program."""
    for i, word in enumerate(words):
        if Path(word).name == "hyperplex" and (i == 0 or words[i - 1] == "-m" or "=" in words[i - 1]
                                                 or "/" in word):
            return words[i + 1:]
    return None


def test_the_docs_hold_the_commands_this_test_reads():
    found = commands()
    pages = {where.split(":")[0] for where, _ in found}
    assert {"README.md", "docs/training.md", "docs/compress.md", "docs/adapters.md"} <= pages, pages
    verbs = {argv[0] for _, argv in found}
    assert {"demo", "train", "translate", "evaluate", "compress", "score-encoder", "export", "experiment",
            "params"} <= verbs, verbs


@pytest.mark.parametrize("where,argv", commands(), ids=lambda value: value if isinstance(value, str) else None)
def test_a_documented_command_is_one_the_cli_accepts(where, argv):
    parser = build_parser()
    if argv[0] == "experiment":
        options, overrides = argv, []
    else:
        options, overrides = _split_overrides(argv)
    try:
        args = parser.parse_args(options)
    except SystemExit:
        pytest.fail(f"{where}: `hyperplex {shlex.join(argv)}` is refused by the CLI's parser (see its output above)")
    for name in ("config", "plan"):
        path = getattr(args, name, None)
        if isinstance(path, str) and path.startswith(("configs/", "experiments/")):
            assert (ROOT / path).is_file(), f"{where}: names {path}, which is not in the repository"
    config = getattr(args, "config", None)
    if isinstance(config, str) and config.startswith("configs/"):
        checked = [o for o in overrides if not PLACEHOLDER.match(o.split("=", 1)[-1])]
        try:
            load_experiment(ROOT / config, checked, model_dir=getattr(args, "model_dir", None) or "runs/docs-check")
        except Exception as err:  # noqa: BLE001 - the message is the finding
            pytest.fail(f"{where}: `hyperplex {shlex.join(argv)}`: {err}")


def _verb_options() -> dict[str, set[str]]:
    """Each verb's option strings (``report``'s: those of all its kinds)."""
    import argparse

    def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
        for action in parser._actions:  # argparse keeps its sub-commands only here
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}

    options = {}
    for verb, parser in subparsers(build_parser()).items():
        options[verb] = set(parser._option_string_actions)
        for kind in subparsers(parser).values():
            options[verb] |= set(kind._option_string_actions)
    return options


def prose_mentions() -> list[tuple[str, str, str]]:
    """``(PAGE, verb, option)`` for each ``--option`` in an inline ```hyperplex VERB …``` of the pages' prose
    (usage synopses such as ``hyperplex evaluate MODEL [--split …]`` included; config keys are not options)."""
    found = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", (ROOT / page).read_text(encoding="utf-8"), flags=re.S).replace("\n", " ")
        for span in re.finditer(r"`(?:\S*/)?hyperplex ([a-z-]+)([^`]*)`", text):
            for option in re.findall(r"(?<![\w-])(--?[a-zA-Z][\w-]*)(?![\w.-])", span.group(2)):
                found.append((page, span.group(1), option))
    return found


def test_every_option_the_docs_name_for_a_verb_is_one_of_its_options():
    options = _verb_options()
    mentions = prose_mentions()
    assert len(mentions) > 20 and {"evaluate", "translate", "experiment"} <= {verb for _, verb, _ in mentions}
    wrong = sorted({f"{page}: `hyperplex {verb}` has no option {option}" if verb in options else
                    f"{page}: there is no verb `hyperplex {verb}`"
                    for page, verb, option in mentions if option not in options.get(verb, ())})
    assert not wrong, "\n".join(wrong)
