"""benchmarks/harness.py: its statistics on given timings (a fake clock, no real measurement), the rotation of the
rounds, the peak of allocation events, the machine header and the JSON it writes."""

from __future__ import annotations

import argparse
import itertools
import json
import math

import pytest
import torch
from conftest import load_benchmark

harness = load_benchmark("harness")


def fake_clock(durations: dict[str, float], log: list[str]):
    """A clock that advances by ``durations[name]`` for each call of the function ``calls`` returns for ``name``."""
    now = [0.0]

    def clock():
        return now[0]

    def call(name):
        def run():
            log.append(name)
            now[0] += durations[name]
        return run
    return clock, call


def test_rotations_put_every_name_first_in_turn():
    assert list(harness.rotations(["a", "b", "c"], 4)) == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                          ["a", "b", "c"]]
    assert list(harness.rotations([], 2)) == [[], []]


def test_interleave_times_blocks_in_rotating_order_after_the_warm_up():
    log = []
    clock, call = fake_clock({"dense": 2.0, "phm": 1.0, "kron": 8.0}, log)
    timings = harness.interleave({name: call(name) for name in ("dense", "phm", "kron")}, 3,
                                 number={"dense": 2, "phm": 4, "kron": 1}, warmup=1, clock=clock)
    assert timings.samples == {"dense": [2.0] * 3, "phm": [1.0] * 3, "kron": [8.0] * 3}  # seconds per call
    assert log[:3] == ["dense", "phm", "kron"]  # the warm-up, untimed
    blocks = [name for name, _ in itertools.groupby(log[3:])]  # one block of `number` calls per sample
    assert blocks == ["dense", "phm", "kron", "phm", "kron", "dense", "kron", "dense", "phm"]  # rotating order
    assert log[3:].count("phm") == 3 * 4
    assert timings.ratio("phm", "dense") == 0.5 and timings.median("kron") == 8.0 and timings.spread("phm") == 0


def test_before_runs_untimed_before_each_sample():
    log = []
    clock, call = fake_clock({"a": 1.0, "b": 3.0, "setup": 100.0}, log)
    setup = call("setup")
    timings = harness.interleave({"a": call("a"), "b": call("b")}, 2, warmup=0, clock=clock,
                                 before=lambda name: setup())
    assert timings.samples == {"a": [1.0, 1.0], "b": [3.0, 3.0]}
    assert log == ["setup", "a", "setup", "b", "setup", "b", "setup", "a"]


def test_ratios_pair_the_rounds_so_drift_cancels():
    # the machine slows down 10x in round 2: each round's ratio is still 0.5
    timings = harness.Timings({"dense": [2.0, 20.0, 2.2], "phm": [1.0, 10.0, 1.1]})
    assert timings.ratio("phm", "dense") == pytest.approx(0.5)
    assert timings.median("phm") / timings.median("dense") == pytest.approx(1.1 / 2.2)
    assert timings.spread("dense") == pytest.approx((20.0 - 2.0) / 2.2)
    summary = timings.summary("dense", scale=1e3)
    assert summary["phm"] == {"median": pytest.approx(1100.0), "min": 1000.0, "spread": pytest.approx(9 / 1.1),
                              "samples": [1000.0, 10000.0, 1100.0], "ratio": pytest.approx(0.5)}
    with pytest.raises(ValueError, match="3 samples against 2"):
        harness.paired_ratio([1.0, 2.0, 3.0], [1.0, 2.0])
    assert harness.spread([4.0]) == 0 and math.isnan(harness.spread([0.0, 0.0]))


def test_calls_per_block_fills_the_target():
    log = []
    clock, call = fake_clock({"x": 0.002}, log)
    assert harness.calls_per_block(call("x"), 0.05, clock=clock) == (25, 0.002)
    assert len(log) == 2  # a warm-up and one timed call
    log.clear()
    clock, call = fake_clock({"slow": 3.0}, log)
    assert harness.calls_per_block(call("slow"), 0.05, clock=clock) == (1, 3.0) and len(log) == 1  # no second call


def test_calls_per_block_does_not_calibrate_on_a_cold_first_call():
    """A first call slowed by set-up (a kernel compiled: 1.5 s) against 2 ms warm: the block holds 25 warm calls,
    not one."""
    now, log = [0.0], []

    def call():
        log.append(len(log))
        now[0] += 1.5 if len(log) == 1 else 0.002

    number, once = harness.calls_per_block(call, 0.05, clock=lambda: now[0])
    assert number == 25 and once == pytest.approx(0.002)
    assert len(log) == 2


def test_running_peak_and_the_profiler_peak():
    assert harness.running_peak([100, 50, -120, 200, -230]) == 230
    assert harness.running_peak([]) == 0
    # a step that holds one 4 MiB float tensor at a time, then two: the profiler sees at least the two
    peak = harness.peak_bytes(lambda: (torch.ones(1 << 20), torch.ones(1 << 20)))
    assert peak >= 8 * 2**20


def test_machine_header_and_json(tmp_path):
    info = harness.machine()
    assert info["logical_cores"] >= info["usable_cores"] >= 1 and info["torch"] == torch.__version__
    assert "card" not in info  # the CPU: no card fields
    line = harness.header(info)
    assert info["cpu"] in line and torch.__version__ in line
    assert f"{info['cpu']} ({torch.backends.cpu.get_cpu_capability()})," in line  # AVX2 / AVX512 / DEFAULT ...
    assert f"machine: {info['cpu']}," in harness.header({**info, "cpu_capability": None})  # records written before
    card = {**info, "card": "H100", "card_memory_gib": 79.6, "capability": "9.0", "driver": None, "cuda": "12.8",
            "triton": "3.4.0"}
    assert "H100" in harness.header(card) and "Triton 3.4.0" in harness.header(card)
    written = harness.write_json(tmp_path / "sub" / "out.json", {"rows": [{"x": math.nan, (1, 2): 3}]}, command="c")
    read = json.loads((tmp_path / "sub" / "out.json").read_text())
    assert read["rows"] == [{"x": None, "(1, 2)": 3}] and read["meta"]["command"] == "c"
    assert read["meta"]["machine"]["cpu"] == written["meta"]["machine"]["cpu"]


def test_shared_options_and_a_missing_card(monkeypatch):
    parser = argparse.ArgumentParser()
    harness.add_arguments(parser)
    args = parser.parse_args(["--json", "x.json", "--threads", "1"])
    assert (args.out, args.device, args.threads) == ("x.json", "cpu", 1)
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)  # this process's threads stay as they are
    assert harness.setup(args) == torch.device("cpu") and threads == [1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="--device cuda: this torch sees no CUDA device"):
        harness.setup(parser.parse_args(["--device", "cuda"]))
    with pytest.raises(SystemExit, match="--threads must be positive"):
        harness.setup(parser.parse_args(["--threads", "0"]))
