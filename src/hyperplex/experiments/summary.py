"""Cross-plan summary: for each plan, PHM against the low-rank row at its parameters and against the
dense row it replaces, with the difference of means and whether it exceeds the seed spread.

    hyperplex report summary runs/agreement/results.json runs/sst2/results.json ...
    hyperplex report summary runs/*/results.json --write docs/results.md

Reads the ``results.json`` files that ``hyperplex experiment`` writes and prints the markdown (between
``<!-- summary -->`` and ``<!-- /summary -->``); ``--write FILE`` replaces that section of FILE (inserted
after the first paragraph when absent). Roles come from the plan data, not from row names:

A row's kind is its ``model.linear.kind`` (hyperplex's own models), ``model.kind`` (a compressed pretrained
student: ``none`` is the dense teacher) or ``model.adapter.kind`` (a fine-tuned classifier: phm, lora, lokr,
full), from its overrides, else its config file.

- **PHM rows**: ``phm`` rows that another row's ``match_params`` names (when a plan
  has no ``match_params``, its PHM rows with n = 4 or 8 that have a dense counterpart);
- **matched rows**: the rows whose ``match_params`` names a PHM row (low-rank at its parameters);
- **dense counterpart**: the row with the same config, the same overrides apart from the kind settings,
  and the same ``train``, whose kind is dense. A ``train: false`` conversion is not compared with its dense
  teacher (whose agreement with itself is 1 by definition), and a healed student has no dense counterpart.

Rows that score a trained row's models elsewhere (``models_from`` with ``eval_split``/``eval_overrides``)
are compared the same way, in their own group. Sweep rows are left to the sweep figure
(:mod:`hyperplex.experiments.plot`).

Verdict: "PHM ahead" / "low-rank ahead" / "dense ahead" when the two 95% t-intervals of the means
(:func:`hyperplex.experiments.intervals.summarize`) do not overlap, else "within the spread"; a side with fewer than
two finished seeds gives "n=1: no interval" (or "not finished"). Welch's t-test p-value is shown beside it (scipy).
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from hyperplex.experiments.intervals import summarize
from hyperplex.experiments.markdown import format_count
from hyperplex.experiments.plan import RowSpec
from hyperplex.fileio import atomic_write_text

#: How the summary names the command that generated it.
PROG = "hyperplex report summary"
START, END = "<!-- summary -->", "<!-- /summary -->"
#: Metrics where smaller is better (as hyperplex.train.task.MINIMISED_METRICS; not imported: it pulls in torch).
MINIMISED = ("loss", "ppl")
ROLE_NAMES = {"dense": "dense", "lowrank": "low-rank", "phm": "PHM", "quaternion": "quaternion", "lora": "LoRA",
              "lokr": "LoKr"}


class SummaryError(ValueError):
    """A results.json that cannot be summarised (the message names the file and the key)."""


@dataclass
class Comparison:
    """PHM row ``phm`` against ``other`` (its matched or dense row), scored in evaluation group ``group``."""

    group: str  # "" (the plan's validation split) or how the models_from rows score (eval_split / eval_overrides)
    phm: dict
    other: dict
    other_role: str  # "low-rank" (or the matched row's kind) | "dense"
    relation: str  # "matched" | "dense"


# ---------------------------------------------------------------------------- reading
def load_results(path: str | Path) -> dict | None:
    """The ``results.json`` dict at ``path``, ``None`` when the file does not exist; a file that is not a
    results.json (bad JSON, missing ``plan``/``rows``/row keys) raises :class:`SummaryError`."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        results = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SummaryError(f"{path}: not a readable JSON file ({err})") from None
    if not isinstance(results, dict) or not isinstance(results.get("plan"), dict) \
            or not isinstance(results.get("rows"), list):
        raise SummaryError(f"{path}: expected a plan's results.json (an object with `plan` and `rows`)")
    for key in ("name", "metrics"):
        if key not in results["plan"]:
            raise SummaryError(f"{path}: `plan.{key}` is missing")
    if not results["plan"]["metrics"]:
        raise SummaryError(f"{path}: `plan.metrics` is empty")
    for i, row in enumerate(results["rows"]):
        for key in ("name", "label", "runs"):
            if not isinstance(row, dict) or key not in row:
                raise SummaryError(f"{path}: rows[{i}] has no `{key}`")
        for old, new in RowSpec.renamed_keys.items():
            if old in row:  # read as absent, it would pair the rows wrongly without a word
                raise SummaryError(f"{path}: rows[{i}] has `{old}`, which is now called `{new}`: write the report "
                                   "again (hyperplex experiment PLAN --report-only)")
    return results


def _option(overrides: list[str], key: str) -> str | None:
    """The last ``--KEY=VALUE`` of ``overrides`` (``None`` if absent)."""
    value = None
    for item in overrides:
        if item.startswith(f"--{key}="):
            value = item.split("=", 1)[1]
    return value


#: Where a row's factorisation is chosen, by model family: hyperplex's own models (``model.linear``), a
#: compressed pretrained student (``model.kind``/``model.n``: pretrained_student) and a fine-tuned
#: pretrained classifier (``model.adapter``: pretrained_classifier). The first whose keys the row sets wins.
SETTING_KEYS = ("model.linear", "model.adapter", "model")
#: Kinds that mean "the unfactorised model" in each family (a student's ``none`` is the dense teacher).
DENSE_KINDS = {"model.linear": "dense", "model.adapter": None, "model": "none"}


def _setting_prefix(raw: dict | None, overrides: list[str]) -> str:
    model = (raw or {}).get("model") or {}
    for prefix in SETTING_KEYS:
        if any(o.startswith(f"--{prefix}.kind=") for o in overrides):
            return prefix
    if isinstance(model.get("linear"), dict) or model.get("architecture") not in ("pretrained_student",
                                                                                   "pretrained_classifier"):
        return "model.linear"
    return "model.adapter" if isinstance(model.get("adapter"), dict) else "model"


def linear_setting(row: dict) -> tuple[str | None, int | None]:
    """(kind, n) of a trained row's factorisation: the row's overrides, else its config file (relative to the
    working directory: the repository root the plan ran from), else :class:`hyperplex.nn.linear.LinearSpec`'s
    defaults; ``(None, None)`` when the config cannot be read. For a compressed student (``model.kind``) the dense
    teacher (``none``) reads as ``dense``; for a fine-tuned classifier it is ``model.adapter.kind`` (phm, lora, lokr,
    full, none)."""
    overrides = row.get("overrides") or []
    from hyperplex.config import load_yaml, merge, parse_overrides

    path = Path(row.get("config") or "")
    path = path if path.is_absolute() else Path.cwd() / path
    try:
        raw = merge(load_yaml(path), parse_overrides(overrides))
    except (OSError, ValueError):  # a config renamed since the run (ConfigError): only the overrides are known
        raw = None
    prefix = _setting_prefix(raw, overrides)
    kind, n = _option(overrides, f"{prefix}.kind"), _option(overrides, f"{prefix}.n")
    if raw is None:
        return kind, (int(n) if n else None)
    section = raw.get("model") or {}
    for part in prefix.split(".")[1:]:
        section = section.get(part) or {}
    if prefix == "model.linear":
        from hyperplex.nn.linear import LinearSpec

        kind, n = kind or section.get("kind", LinearSpec.kind), n or section.get("n", LinearSpec.n)
    else:
        kind, n = kind or section.get("kind"), n or section.get("n")
    if kind is not None and kind == DENSE_KINDS[prefix]:
        kind = "dense"
    return kind, (int(n) if n is not None else None)


def _base(row: dict) -> tuple:
    """What a row trains apart from its factorisation: config, the other overrides, and whether it is trained
    at all (a ``train: false`` conversion is compared with the untrained teacher, a healed one is not)."""
    skip = tuple(f"--{prefix}." for prefix in SETTING_KEYS[:2]) + ("--model.kind=", "--model.n=", "--model.init=")
    return (row.get("config"), tuple(o for o in row.get("overrides") or [] if not o.startswith(skip)),
            row.get("train", True))


def comparisons(results: dict) -> list[Comparison]:
    """Every PHM-vs-matched and PHM-vs-dense pair of the plan, in row order; the same pairs again for each
    group of ``models_from`` rows that score both models of a pair elsewhere."""
    rows = [r for r in results["rows"] if not r.get("sweep_of")]
    trained = [r for r in rows if not r.get("models_from")]
    by_name = {r["name"]: r for r in trained}
    setting = {r["name"]: linear_setting(r) for r in trained}
    matched_to: dict[str, list[dict]] = {}
    for r in trained:
        if r.get("match_params") in by_name:
            matched_to.setdefault(r["match_params"], []).append(r)
    dense: dict[tuple, dict] = {}
    for r in trained:
        if setting[r["name"]][0] == "dense":
            dense.setdefault(_base(r), r)
    if matched_to:
        phms = [r for r in trained if r["name"] in matched_to and setting[r["name"]][0] == "phm"]
    else:
        phms = [r for r in trained if setting[r["name"]][0] == "phm" and setting[r["name"]][1] in (4, 8)
                and _base(r) in dense]
    pairs = []
    for p in phms:
        for m in matched_to.get(p["name"], []):
            kind = setting[m["name"]][0]
            pairs.append((p, m, ROLE_NAMES.get(kind or "", kind or "matched"), "matched"))
        if _base(p) in dense and p.get("train", True):  # a conversion vs its own teacher says nothing: skipped
            pairs.append((p, dense[_base(p)], "dense", "dense"))
    out = [Comparison("", p, o, role, rel) for p, o, role, rel in pairs]
    groups: dict[str, dict[str, dict]] = {}
    for r in rows:
        if r.get("models_from"):
            groups.setdefault(_group_name(r), {})[r["models_from"]] = r
    for group, scored in groups.items():
        out += [Comparison(group, scored[p["name"]], scored[o["name"]], role, rel) for p, o, role, rel in pairs
                if p["name"] in scored and o["name"] in scored]
    return out


def _group_name(row: dict) -> str:
    parts = []
    if row.get("eval_split"):
        parts.append(f"on `{row['eval_split']}`")
    if row.get("eval_overrides"):
        parts.append(f"with `{' '.join(row['eval_overrides'])}`")
    return ", ".join(parts) or "again"


# ---------------------------------------------------------------------------- statistics
def seed_values(row: dict, metric: str) -> list[float]:
    """The metric of every seed that finished and was evaluated."""
    return [r["metrics"][metric] for r in row["runs"] if metric in (r.get("metrics") or {})]


def welch_p(a: list[float], b: list[float]) -> float | None:
    """Two-sided p-value of Welch's t-test (scipy), ``None`` with n < 2 on a side or when both sides have zero
    spread."""
    if len(a) < 2 or len(b) < 2 or (min(a) == max(a) and min(b) == max(b)):  # no spread: t is undefined
        return None
    from scipy.stats import ttest_ind

    p = float(ttest_ind(a, b, equal_var=False).pvalue)
    return p if math.isfinite(p) else None


def verdict(phm: dict, other: dict, other_role: str, minimised: bool = False) -> str:
    """In words, from two :func:`~hyperplex.experiments.intervals.summarize` dicts: "PHM ahead" / "<other_role> ahead"
    when the 95% intervals do not overlap (better = larger, or smaller if ``minimised``), else "within the spread"."""
    if not phm["n"] or not other["n"]:
        return "not finished"
    if phm["n"] < 2 or other["n"] < 2:
        return "n=1: no interval"
    (a_lo, a_hi), (b_lo, b_hi) = phm["ci95"], other["ci95"]
    if not all(math.isfinite(v) for v in (a_lo, a_hi, b_lo, b_hi)):  # a NaN fails every comparison below
        return "not finite"
    if a_lo <= b_hi and b_lo <= a_hi:
        return "within the spread"
    phm_higher = a_lo > b_hi
    return "PHM ahead" if phm_higher != minimised else f"{other_role} ahead"


# ---------------------------------------------------------------------------- markdown
def _cell(row: dict, summary: dict, digits: int) -> str:
    counted = [r["params"] for r in row["runs"] if r.get("params")]
    params = f"; {format_count(counted[0]['total'])} params, " \
             f"{format_count(counted[0]['total_without_embeddings'])} w/o emb." if counted else ""
    if not summary["n"]:
        return f"{row['label']}: not finished{params}"
    value = f"{summary['mean']:.{digits}f}"
    if summary["std"] is not None:
        lo, hi = summary["ci95"]
        value += f" ± {summary['std']:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"
    return f"{row['label']}: {value} (n={summary['n']}{params})"


def plan_lines(results: dict) -> list[str]:
    """The summary table rows of one plan (or one line saying why there are none)."""
    plan = results["plan"]
    metric, digits = plan["metrics"][0], plan.get("digits", 2)
    minimised = metric in MINIMISED
    task = f"**{plan['name']}**"
    pairs = comparisons(results)
    if not pairs:
        return [f"| {task} | {metric} | no PHM row with a matched or dense row | | | | | |"]
    lines = []
    for c in pairs:
        a_vals, b_vals = seed_values(c.phm, metric), seed_values(c.other, metric)
        a, b = summarize(a_vals), summarize(b_vals)
        delta = f"{a['mean'] - b['mean']:+.{digits}f}" if a["n"] and b["n"] else "–"
        p = welch_p(a_vals, b_vals)
        where = f"{task} {c.group}" if c.group else task
        cells = [where, metric, f"vs {c.other_role}" + (" (matched params)" if c.relation == "matched" else ""),
                 _cell(c.phm, a, digits), _cell(c.other, b, digits), delta, "–" if p is None else f"{p:.2g}",
                 verdict(a, b, c.other_role, minimised)]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return lines


def render(entries: list[tuple[str, dict | None]], prog: str = PROG) -> str:
    """The summary section (without markers) from ``(path, results or None)`` pairs in command-line order."""
    lines = ["### Summary: PHM vs low-rank at equal parameters vs dense", "",
             f"Generated by `{prog} " + " ".join(p for p, _ in entries) + "` from each plan's "
             "`results.json` (the plan sections below hold every row; the commands, machines and dates are in each "
             "plan's `experiments/records/PLAN/results.md`). Each cell: the plan's "
             "first metric on its validation split (or where the group says), mean ± sample std [95% t-interval "
             "of the mean] over n seeds, and the model's parameters. Δ = PHM − other. A side is *ahead* only when "
             "the two 95% intervals do not overlap; otherwise the difference is *within the spread* of the seeds. "
             "p: Welch's two-sided t-test, for reference (with 3 seeds a side it has little power).", "",
             "| plan | metric | comparison | PHM | other | Δ | p | verdict |",
             "|---|---|---|---|---|---:|---:|---|"]
    missing = []
    for path, results in entries:
        if results is None:
            missing.append(path)
        else:
            lines += plan_lines(results)
    if missing:
        lines += ["", "Not in the summary yet (no results.json): " + ", ".join(f"`{p}`" for p in missing) + "."]
    return "\n".join(lines) + "\n"


def replace_summary(text: str, body: str) -> str:
    """``text`` with its ``<!-- summary -->`` section replaced by ``body``, or the section inserted after the
    first paragraph (after the leading headings and the paragraph that follows them) when absent."""
    section = f"{START}\n{body.rstrip()}\n{END}\n"
    i, j = text.find(START), text.find(END)
    if i >= 0 and j > i:
        if text.find(START, i + 1) >= 0:
            raise SummaryError(f"the marker {START!r} appears more than once; remove the duplicate section")
        tail = text[j + len(END):]
        return text[:i] + section + tail.removeprefix("\n")
    if i >= 0 or j >= 0:
        raise SummaryError(f"the summary markers are broken: expected {START!r} followed by {END!r}")
    blocks = [b for b in re.split(r"\n[ \t]*\n", text.strip("\n")) if b.strip()] if text.strip() else []
    k = 0
    while k < len(blocks) and blocks[k].lstrip().startswith("#"):
        k += 1
    k = min(k + 1, len(blocks))  # and the first paragraph
    return "\n\n".join(blocks[:k] + [section.rstrip("\n")] + blocks[k:]) + "\n"


def write_summary(path: str | Path, body: str) -> Path:
    """Replace (or insert) the summary section of the markdown file ``path`` (created if absent)."""
    path = Path(path)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    new = replace_summary(text, body)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, new)
    return path


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The arguments of ``hyperplex report summary``."""
    p.add_argument("results", nargs="+", help="results.json files of hyperplex experiment (a missing one is listed "
                                              "as not yet available)")
    p.add_argument("--write", metavar="FILE", help="replace the <!-- summary --> section of FILE (e.g. "
                                                   "docs/results.md) instead of printing it")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    """The command line of :func:`main`."""
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    add_arguments(p)
    return p


def run(args: argparse.Namespace, prog: str = PROG) -> int:
    """Print (or ``--write``) the summary a command line asks for; ``prog`` is how the section names the
    command. Returns the exit status (2 for a results.json that cannot be summarised; nothing is written)."""
    from hyperplex.guards import OutputError, check_outputs

    try:
        check_outputs({"--write": args.write}, args.results)  # never over a results.json it reads
    except OutputError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        entries = [(path, load_results(path)) for path in args.results]
        body = render(entries, prog)
        if args.write:
            write_summary(args.write, body)
    except SummaryError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for path, results in entries:
        if results is None:
            print(f"warning: {path}: no such file; listed as not yet available", file=sys.stderr)
    if args.write:
        print(f"summary of {sum(1 for _, r in entries if r)} plan(s) written to {args.write}", file=sys.stderr)
    else:
        print(f"{START}\n{body.rstrip()}\n{END}")
    return 0


def main(argv: list[str] | None = None, prog: str = PROG) -> int:
    """:func:`run` on the command line ``argv`` (``hyperplex report summary ...`` from the shell)."""
    return run(build_parser(prog).parse_args(argv), prog)
