"""benchmarks/gpu/check.sh refuses bad options before it runs anything: a mistake found after the speed steps would
cost device time."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,message", [
    (("--device", "tpu"), "--device must be cuda or cpu, got 'tpu'"),
    (("--converge", "experiments/nope.yaml", "--models", "small_phm4:1"), "--converge: no such plan file"),
    (("--converge", "experiments/multi30k_converged.yaml"), "--converge needs --models"),
    (("--models", "small_phm4:1"), "--converge: no such plan file ''"),
    (("--deadline-s", "soon"), "--deadline-s must be a whole number of seconds, got 'soon'"),
    (("--frobnicate",), "unknown option '--frobnicate'"),
    (("--skip", "kernel,benchmarks"), "--skip: unknown step 'benchmarks'"),
    (("--parallel", "0"), "--parallel must be a whole number ≥ 1, got '0'"),
])
def test_check_refuses_bad_options_before_running_a_step(tmp_path, args, message):
    result = subprocess.run(["bash", "benchmarks/gpu/check.sh", *args], cwd=ROOT, capture_output=True, text=True,
                            env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")}, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.integration
def test_skipped_steps_are_reported_and_not_run(tmp_path):
    """``--skip`` leaves steps out (their time goes to --converge) and says so in the summary, one row each."""
    import sys

    steps = ["kernel", "bench_phm", "bench_transformer", "bench_transformer_small", "bench_compress", "bench_adapters",
             "tests"]
    out = tmp_path / "out"
    command = ["bash", "benchmarks/gpu/check.sh", "--device", "cpu", "--quick", "--skip", ",".join(steps)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env={"PATH": "/usr/bin:/bin", "OUT": str(out), "PYTHON": sys.executable})
    assert result.returncode == 0, result.stderr
    summary = (out / "summary.md").read_text()
    for name in steps:
        assert f"| {name} | skipped (--skip) | 0 s |" in summary
    assert not (out / "kernel.json").exists() and not (out / "tests.log").exists()
