"""benchmarks/bench_finetune.py on the tiny random BERT with the rows of experiments/sst2_adapters.yaml: trainable
counts equal the classifier's own and `hyperplex params`' (and the adapter formulas), merged models give the
unmerged logits after a real (non-zero) delta is folded in, the table has one line per row, and the memory
measurement builds the same model. Speed and memory figures are printed, never asserted."""

from __future__ import annotations

import gzip
import random
import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")
pytest.importorskip("peft")

from conftest import TINY_BERT_WORDS, load_benchmark, write_tiny_bert

from hyperplex.inference.parameters import params

ROOT = Path(__file__).resolve().parents[2]
PLAN = ROOT / "experiments" / "sst2_adapters.yaml"
# the tiny BERT has 32 positions; every row gets these on top of its plan overrides
EXTRA = ["--model.max_length=16"]


bench = load_benchmark("bench_finetune")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(tiny BERT folder, an SST-2-like tsv.gz of its words)."""
    folder = tmp_path_factory.mktemp("bench_finetune")
    (folder / "bert").mkdir()
    write_tiny_bert(folder / "bert")
    rng = random.Random(0)
    data = folder / "train.tsv.gz"
    with gzip.open(data, "wt", encoding="utf-8") as handle:
        handle.write("sentence\tlabel\n")
        for i in range(40):
            handle.write(" ".join(rng.choice(TINY_BERT_WORDS) for _ in range(rng.randint(2, 12))) + f"\t{i % 2}\n")
    return folder / "bert", data


def _args(setup, *more: str) -> list[str]:
    bert, data = setup
    return ["--model", str(bert), "--data", str(data), *(f"--override={o}" for o in EXTRA), "--threads", "1",
            "--batch-size", "8", "--b1-sentences", "2", "--rounds", "1", "--warmup", "1", *more]


def _params_trainable(row, bert) -> int:
    """`hyperplex params`' trainable count of a plan row (its config + overrides + ours)."""
    text = params(row.config, [*row.overrides, *EXTRA, f"--model.path={bert}"])
    return int(re.search(r"trainable ([\d,]+) of", text).group(1).replace(",", ""))


def test_counts_merge_and_table(setup):
    rows = ["phm4", "phm4_rank8", "phm8", "lora", "lokr", "full"]
    result = bench.main(_args(setup, "--rows", *rows, "--memory-steps", "0"))
    by_name = {r["name"]: r for r in result["rows"]}
    assert list(by_name) == [*rows, "base"]
    # the tiny BERT's 4 query/value layers are 32 × 32; the head is Linear(32, 2)
    head = 32 * 2 + 2
    assert by_name["phm4"]["trainable"] == 4 * (32 * 32 // 4 + 4 ** 3) + head
    assert by_name["phm4_rank8"]["trainable"] == 4 * (8 * (32 + 32) + 4 ** 3) + head
    assert by_name["phm8"]["trainable"] == 4 * (32 * 32 // 8 + 8 ** 3) + head
    assert by_name["lora"]["trainable"] == 4 * 5 * (32 + 32) + head  # r = 5 is the closest to PHM n=4's 1,280
    assert by_name["full"]["trainable"] == by_name["full"]["total"]
    assert by_name["base"]["trainable"] == head
    specs = {s.name: s for s in bench.plan_rows(PLAN, rows)}
    for name, row in by_name.items():
        assert row["trainable"] == _params_trainable(specs[name], setup[0]), name
    for name in ("phm4", "phm4_rank8", "phm8", "lora", "lokr"):
        row = by_name[name]
        assert row["merge_close"] and row["merge_max_diff"] < 1e-5, name
        assert row["delta_max"] > 0, name  # the timed steps made the adapter non-zero: the merge folded a real ΔW
        assert row["b1_merged_ratio"] > 0 and row["b8_merged_ratio"] > 0
    for name in ("full", "base"):
        assert "merge_max_diff" not in by_name[name]
    assert by_name["lora"]["step_ratio"] == 1.0 and by_name["base"]["b1_ratio"] == 1.0
    assert all(r["rss_ratio"] is None for r in result["rows"])
    assert all(r["step_ms"] > 0 and r["b1_ms"] > 0 and r["b8_ms"] > 0 for r in result["rows"])
    table = bench.format_table(result).splitlines()
    assert len(table) == 2 + len(by_name)  # the header, its rule and one line per row
    assert all(line.count("|") == table[0].count("|") for line in table)  # no cell breaks the columns


def test_memory_child_builds_the_same_row(setup):
    """The memory process's model (run here in-process) has the row's trainable count; RSS is only printed."""
    spec = bench.plan_rows(PLAN, ["lora"])[0]
    job = {"row": spec.__dict__, "extra": [*EXTRA, f"--model.path={setup[0]}"], "data": str(setup[1]),
           "batch_size": 8, "seed": 0, "steps": 1, "threads": 1}
    result = bench.memory_child(job)
    assert result["name"] == "lora" and result["trainable"] == _params_trainable(spec, setup[0])
    assert result["growth_mb"] >= 0 and result["peak_mb"] > 0


def test_bad_rows_are_refused_before_building(setup):
    with pytest.raises(ValueError, match=r"--rows: nope not in .*sst2_adapters.yaml \(its rows: full, phm4"):
        bench.plan_rows(PLAN, ["nope"])
    with pytest.raises(ValueError, match="no LoRA row"):
        bench.main(_args(setup, "--rows", "phm4", "--memory-steps", "0"))
    with pytest.raises(SystemExit, match="--rounds must be ≥ 1"):
        bench.main(_args(setup, "--rounds", "0"))


@pytest.mark.slow
def test_memory_in_fresh_processes(setup):
    """The whole script with its per-row memory processes (one interpreter start each)."""
    result = bench.main(_args(setup, "--rows", "lora", "--memory-steps", "2"))
    lora, base = result["rows"]
    assert lora["rss_ratio"] == 1.0 and lora["rss_growth_mb"] >= 0 and base["peak_rss_mb"] > 0
