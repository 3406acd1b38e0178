"""benchmarks/gpu/kernel_summary.py, the table check.sh prints last for the kernel step: every fused variant timed,
the fastest of them against the target, and the rest of the row from the same points."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORD = ROOT / "benchmarks" / "gpu" / "records" / "2026-11-30-h200" / "kernel.json"


def _module():
    spec = importlib.util.spec_from_file_location("kernel_summary", ROOT / "benchmarks" / "gpu" / "kernel_summary.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _point(n, rows, variant, x_dense, target=None, error=1e-3):
    return {"n": n, "rows": rows, "variant": variant, "x_dense": x_dense, "target": target, "GBps": 100 * x_dense,
            "copy_fraction": x_dense / 10, "error": error}


def test_the_fastest_variant_is_named_and_held_to_the_target():
    data = {"meta": {"device": "card", "copy_GBps": 4000.0, "dense_TFLOPs": 700.0},
            "rows": [_point(4, 1, "dense", 1.0), _point(4, 1, "structured", 1.4), _point(4, 1, "fused", 0.9, 0.3),
                     _point(4, 1, "fused-1k", 0.7, 0.3), _point(4, 1, "fused-atomic", 0.25, 0.3, error=4e-3),
                     _point(4, 1, "copy", 0.15, error=0.0),
                     _point(4, 8, "dense", 1.0), _point(4, 8, "fused", 0.8), _point(4, 8, "fused-1k", 0.6)]}
    lines = _module().summary(data).splitlines()
    assert lines[0] == "kernel on card: copy 4000 GB/s, dense 700.0 TFLOP/s measured"
    assert lines[2] == ("| n | rows | fused | fused-1k | fused-atomic | best | target | structured | copy "
                        "| best GB/s (% copy) | max err |")
    assert lines[4] == ("| 4 | 1 | 0.900 | 0.700 | 0.250 | fused-atomic | ≤ 0.30 met | 1.400 | 0.150 | 25 (2%) "
                        "| 4.0e-03 |")
    # a variant not timed at a point is '-', and a point without a target has none
    assert lines[5] == "| 4 | 8 | 0.800 | 0.600 | - | fused-1k |  | - | - | 60 (6%) | 1.0e-03 |"
    assert len(lines) == 6


def test_an_incomplete_step_says_so_and_a_recorded_step_reads_back():
    data = json.loads(RECORD.read_text())
    text = _module().summary(data)
    assert "INCOMPLETE" not in text
    # the first GPU session's one-row points: the one-kernel reduction was the fastest and missed every target
    for n, target in ((2, 0.55), (4, 0.30), (8, 0.18), (16, 0.12)):
        assert any(line.startswith(f"| {n} | 1 | ") and f"| fused-1k | ≤ {target:.2f} MISSED |" in line
                   for line in text.splitlines())
    data["meta"]["complete"] = False
    assert "INCOMPLETE: the step stopped before the last point" in _module().summary(data).splitlines()[0]
