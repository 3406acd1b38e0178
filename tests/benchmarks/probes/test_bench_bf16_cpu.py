"""benchmarks/probes/bench_bf16_cpu.py: a tiny run times both precisions, pairs them by round, and records the check."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import load_benchmark

from hyperplex.train.process import cpu_has_fast_bf16


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_bf16_cpu")


def test_tiny_run_times_both_precisions_and_records_the_check(bench, tmp_path, capsys):
    out = tmp_path / "bf16.json"
    argv = ["--rows", "8", "--d", "16", "--k", "24", "--rounds", "2", "--threads", "1", "--out", str(out)]
    assert bench.main(argv) == 0
    record = json.loads(out.read_text())
    result = record["result"]
    assert (result["rows"], result["d"], result["k"]) == (8, 16, 24)
    for precision in ("fp32", "bf16"):
        assert len(result[precision]["samples"]) == 2 and all(s > 0 for s in result[precision]["samples"])
    pairs = [b / f for b, f in zip(result["bf16"]["samples"], result["fp32"]["samples"])]
    assert result["bf16"]["ratio"] == pytest.approx(sorted(pairs)[0] / 2 + sorted(pairs)[1] / 2)  # median of 2
    assert result["fp32"]["ratio"] == 1.0
    assert record["fast_bf16"] is cpu_has_fast_bf16()
    assert record["capability"] == torch.backends.cpu.get_cpu_capability()
    assert "bench_bf16_cpu.py --rows 8" in record["meta"]["command"]
    assert f"bf16 instructions: {cpu_has_fast_bf16()}" in capsys.readouterr().out


def test_a_bad_thread_count_exits_with_a_message(bench):
    with pytest.raises(SystemExit, match="--threads must be positive"):
        bench.main(["--threads", "0"])
