"""``hyperplex score-encoder``'s table: the result of :func:`hyperplex.scoring.score_encoders` as markdown."""

from __future__ import annotations

from hyperplex.scoring import PROBE_C

__all__ = ["COLUMNS", "format_table"]

#: (result key, table header, the --metrics name it needs or None for the size columns).
COLUMNS = [("agreement", "agreement", "agreement"), ("wikiqa_map", "WikiQA MAP", "wikiqa"),
           ("wikiqa_mrr", "WikiQA MRR", "wikiqa"), ("sst2_probe", "SST-2 probe", "sst2"),
           ("params", "params", None), ("converted_layers", "converted layers", None),
           ("selected_params", "params of converted layers", None), ("file_bytes", "file size", None)]
DIGITS = 4


def _cell(key: str, value) -> str:
    if key in ("params", "converted_layers", "selected_params"):
        return f"{value:,}"
    if key == "file_bytes":
        return f"{value / 1e6:.1f} MB"
    return f"{value:.{DIGITS}f}"


def format_table(result: dict) -> str:
    """The result of :func:`~hyperplex.scoring.score_encoders` as a markdown table (teacher first) and a line
    per data file."""
    columns = [(key, header) for key, header, _ in COLUMNS if key in result["rows"][0]]
    lines = ["| model | conversion | " + " | ".join(h for _, h in columns) + " |",
             "|---|---|" + "---:|" * len(columns)]
    for row in result["rows"]:
        lines.append(f"| {row['name']} | {row['conversion']} | "
                     + " | ".join(_cell(key, row[key]) for key, _ in columns) + " |")
    details, files = result["details"], result["files"]
    notes = []
    if "agreement" in details:
        notes.append(f"agreement: mean cosine to the teacher on {details['agreement']['sentences']:,} distinct "
                     f"sentences of {files['agreement']}")
    if "wikiqa" in details:
        d = details["wikiqa"]
        notes.append(f"WikiQA: zero-shot, {d['questions']} questions with a correct answer ({d['skipped']} without, "
                     f"skipped), {d['candidates']:,} candidates of {files['wikiqa']}")
    if "sst2_probe" in details:
        d = details["sst2_probe"]
        notes.append(f"SST-2 probe: logistic regression (C = {PROBE_C:g}) trained on {d['train']:,} and tested on "
                     f"{d['test']:,} other whole sentences (of {d['pool']:,}) of {files['sst2']}, split seed "
                     f"{d['split_seed']}")
    notes.append("params of converted layers: the layers the students converted (the teacher: the same layers "
                 "dense); file size: model.safetensors as save_converted writes it")
    return "\n".join(lines) + "\n\n" + "\n".join(notes)
