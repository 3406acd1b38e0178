"""experiments/gpu/: converge.sh's checks and its skipping of finished models, and collect.py's summary and packing.

The training itself is the plan runner's (tested in this folder); here, what decides which models a device call
trains, what it reports and what it brings back within the call's limits.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml

from hyperplex.train.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[2]
CONVERGE = ROOT / "experiments" / "gpu" / "converge.sh"
PLAN = "experiments/multi30k_converged.yaml"


def _collect_module():
    spec = importlib.util.spec_from_file_location("gpu_collect", ROOT / "experiments" / "gpu" / "collect.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _metrics(folder: Path, rows: list[tuple[int, str, str, float]]) -> None:
    lines = ["step,split,name,value"] + [f"{step},{split},{name},{value}" for step, split, name, value in rows]
    (folder / "metrics.csv").write_text("\n".join(lines) + "\n")


def _work(tmp_path: Path, state_bytes: int = 1000) -> Path:
    """A --work folder after a call: small_phm4:1 finished, small_phm8:1 stopped with a checkpoint, small_phm2:1
    failed before its first checkpoint, small_phm4:2 failed before making its folder (only its log is there), and
    small_phm16:1, never started, has neither."""
    work = tmp_path / "work"
    record = work / "records" / "plan" / "small_phm4" / "seed1"
    record.mkdir(parents=True)
    (record / "record.json").write_text("{}")
    (record / "experiment.json").write_text('{"segments": [{"seconds": 100.5}, {"seconds": 20}]}')
    _metrics(record, [(250, "dev", "bleu", 20.0), (500, "dev", "bleu", 31.25), (750, "dev", "bleu", 30.0),
                      (750, "train", "loss", 2.0)])
    # the steady speed: the windows after the start and after a validation hold other work and are left out
    (record / "train.log").write_text("\n".join([
        "2026-12-01 10:00:00 INFO plan: task translation, model transformer, 1,000 parameters, device cuda",
        "2026-12-01 10:00:09 INFO step 50 epoch 1: loss 5.0000 lr 1.000e-04 100 tokens/s",
        "2026-12-01 10:00:10 INFO step 100 epoch 1: loss 4.0000 lr 1.000e-04 300 tokens/s",
        "2026-12-01 10:00:11 INFO validation at step 100 (epoch 1): bleu 1.0000",
        "2026-12-01 10:00:14 INFO step 150 epoch 1: loss 3.9000 lr 1.000e-04 50 tokens/s",
        "2026-12-01 10:00:15 INFO step 200 epoch 2: loss 3.8000 lr 1.000e-04 500 tokens/s",
        "2026-12-01 10:00:16 INFO step 250 epoch 2: loss 3.7000 lr 1.000e-04 400 tokens/s"]) + "\n")
    run = work / "runs" / "plan" / "small_phm8" / "seed1"
    run.mkdir(parents=True)
    (run / "last.safetensors").write_bytes(b"\0" * state_bytes)
    (run / "config.yaml").write_text("model: {}\n")
    (run / "src.model").write_text("tokenizer")
    (run / "best.safetensors").write_bytes(b"\0" * 10)  # not part of what resumes a run
    (run / "train.log").write_text("\n".join([  # only the latest segment's windows count
        "step 50 epoch 1: loss 4.0000 lr 1.000e-04 900 tokens/s",
        "step 100 epoch 1: loss 4.0000 lr 1.000e-04 900 tokens/s",
        "step 150 epoch 1: loss 4.0000 lr 1.000e-04 900 tokens/s",
        "resumed from last.safetensors at step 150, epoch 1, batch 3",
        "step 200 epoch 1: loss 3.9000 lr 1.000e-04 10 tokens/s",
        "step 250 epoch 1: loss 3.8000 lr 1.000e-04 70 tokens/s",
        # stopped between two log lines: the checkpoint's step is only in the log
        "interrupted by SIGTERM at step 321 (epoch 2); saved a resumable checkpoint last.safetensors"]) + "\n")
    _metrics(run, [(250, "dev", "bleu", 12.5), (300, "train", "loss", 3.0)])
    (work / "runs" / "plan" / "small_phm2" / "seed1").mkdir(parents=True)
    (work / "logs").mkdir()
    (work / "logs" / "small_phm4-seed1.log").write_text("trained\n")
    (work / "logs" / "small_phm4-seed2.log").write_text("error: before its folder was made\n")
    return work


def _run_collect(work: Path, out: Path, monkeypatch, limit: int | None = None) -> str:
    collect = _collect_module()
    if limit is not None:
        monkeypatch.setattr(collect, "RETURN_LIMIT", limit)
    assert collect.main(["--plan-name", "plan", "--work", str(work), "--out", str(out), "--device", "cpu",
                         "small_phm4:1", "small_phm8:1", "small_phm2:1", "small_phm16:1", "small_phm4:2"]) == 0
    return (out / "converge-summary.txt").read_text()


def test_collect_reports_each_model_and_packs_the_records_and_a_small_resumable_state(tmp_path, monkeypatch):
    work, out = _work(tmp_path), tmp_path / "out"
    summary = _run_collect(work, out, monkeypatch)
    lines = summary.splitlines()
    assert lines[0].startswith("# device cpu; driver -; torch ")
    assert lines[1] == "model\tstatus\tsteps\tbest_val_bleu\tseconds\tsteady_per_s"
    assert lines[2:7] == ["small_phm4:1\tfinished\t750\t31.25\t120\t400",
                          "small_phm8:1\tunfinished\t321\t12.50\t0\t70",
                          "small_phm2:1\tfailed\t0\t-\t0\t-", "small_phm16:1\tnot started\t0\t-\t0\t-",
                          "small_phm4:2\tfailed\t0\t-\t0\t-"]
    assert "resume-plan.tar.gz holds 1 unfinished model(s)" in lines[7]
    with tarfile.open(out / "records-plan.tar.gz") as tar:
        assert "plan/small_phm4/seed1/record.json" in tar.getnames()
    with tarfile.open(out / "resume-plan.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"small_phm8/seed1/last.safetensors", "small_phm8/seed1/config.yaml", "small_phm8/seed1/src.model"} <= names
    assert "small_phm8/seed1/best.safetensors" not in names
    with tarfile.open(out / "logs.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["logs", "logs/small_phm4-seed1.log", "logs/small_phm4-seed2.log"]


@pytest.mark.parametrize("state_bytes", [3000, 50_000])  # over the limit once packed; more than twice the limit
def test_collect_brings_back_no_resumable_state_over_the_return_limit(tmp_path, monkeypatch, state_bytes):
    work, out = _work(tmp_path, state_bytes), tmp_path / "out"
    out.mkdir()
    (out / "resume-plan.tar.gz").write_bytes(b"left by an earlier call")
    # random bytes do not compress: 3,000 of them are packed (under twice the limit) and found too big; 50,000
    # are not packed at all
    (work / "runs" / "plan" / "small_phm8" / "seed1" / "last.safetensors").write_bytes(os.urandom(state_bytes))
    summary = _run_collect(work, out, monkeypatch, limit=2000)
    assert not (out / "resume-plan.tar.gz").exists()
    assert "over the 16 MiB a returned file may have; it stays in" in summary
    assert "converge.sh command, made again before the machine is given back, resumes them" in summary


@pytest.mark.parametrize("limit", [None, 2000, 300])
def test_collect_packs_the_compile_cache_when_it_fits(tmp_path, monkeypatch, limit):
    """--compile-cache: the folder's files, by their paths inside it, in compile-cache.tar.gz, and a line that says
    how to carry it back; over the limit once packed, no file (not one left by an earlier call either) and a line
    that says so; over eight times the limit before packing, not packed at all."""
    work, out = _work(tmp_path), tmp_path / "out"
    cache = tmp_path / "cache"
    (cache / "fxgraph" / "ab").mkdir(parents=True)
    (cache / "fxgraph" / "ab" / "entry").write_bytes(os.urandom(3000))  # random bytes: 3,000 packed stay > 2,000
    (cache / "triton").mkdir()
    (cache / "triton" / "kernel.cubin").write_bytes(b"\0" * 100)
    out.mkdir()
    (out / "compile-cache.tar.gz").write_bytes(b"left by an earlier call")
    collect = _collect_module()
    if limit is not None:
        monkeypatch.setattr(collect, "RETURN_LIMIT", limit)
    assert collect.main(["--plan-name", "plan", "--work", str(work), "--out", str(out), "--device", "cpu",
                         "--compile-cache", str(cache), "small_phm4:1"]) == 0
    last = (out / "converge-summary.txt").read_text().splitlines()[-1]
    if limit is None:
        with tarfile.open(out / "compile-cache.tar.gz") as tar:
            assert sorted(tar.getnames()) == ["fxgraph/ab/entry", "triton/kernel.cubin"]
        assert last.startswith("# compile-cache.tar.gz holds torch.compile's cache (2 files, ")
        assert last.endswith("carry it back as .gpu/compile-cache.tar.gz and later calls start their models from it")
    elif limit == 2000:  # 3,100 bytes: packed, then found too big
        assert not (out / "compile-cache.tar.gz").exists()
        assert last.startswith("# torch.compile's cache (2 files, ") and last.endswith(": not brought back")
    else:  # 3,100 bytes > 8 × 300: never packed
        assert not (out / "compile-cache.tar.gz").exists()
        assert last == "# torch.compile's cache (2 files, 0 MiB) is too large to bring back in 16 MiB: not packed"


def _converge(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """converge.sh on the CPU; waited for until its --budget-s (the bound it keeps) and a minute for stopping and
    packing have passed, so that a loaded machine fails a test only where the script overruns its own budget."""
    data = tmp_path / "data"
    data.mkdir(exist_ok=True)
    environment = {"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out"), "HYPERPLEX_PYTHON": sys.executable,
                   **(env or {})}
    return subprocess.run(["bash", str(CONVERGE), "--data", str(data), "--work", str(tmp_path / "work"),
                           "--device", "cpu", *args], capture_output=True, text=True, env=environment,
                          timeout=int(args[args.index("--budget-s") + 1]) + 60 if "--budget-s" in args else 120)


@pytest.mark.parametrize("args,message", [
    (("--plan", "experiments/nope.yaml", "--models", "small_phm4:1"), "--plan: no such file"),
    (("--plan", PLAN), "--models 'ROW:SEED ...' is required"),
    (("--plan", PLAN, "--models", "small_phm4"), "'small_phm4' is not ROW:SEED"),
    (("--plan", PLAN, "--models", "small_phm4:1", "--budget-s", "10"), "--budget-s must be a whole number"),
    (("--plan", PLAN, "--models", "small_phm4:1", "--frobnicate"), "unknown option '--frobnicate'"),
    (("--plan", PLAN, "--models", "small_phm4:1", "--cpus", "0"), "--cpus must be a whole number ≥ 1, got '0'"),
    (("--plan", PLAN, "--models", "small_phm4:1", "--compile", "yes"), "--compile must be on or off, got 'yes'"),
    (("--plan", PLAN, "--models", "small_phm4:1", "--parallel", "0"), "--parallel must be a whole number ≥ 1"),
    (("--plan", PLAN, "--models", "small_phm4:1", "--check", "--checked"), "--check and --checked exclude each other"),
])
def test_converge_refuses_bad_arguments_before_training(tmp_path, args, message):
    result = _converge(tmp_path, *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "work" / "runs").exists()


def test_converge_trains_no_model_that_is_already_recorded(tmp_path):
    recorded = sorted(p.parent.parent.name + ":" + p.parent.name.removeprefix("seed")
                      for p in (ROOT / "experiments" / "records" / "multi30k_converged").glob("*/seed*/record.json"))
    if not recorded:
        pytest.skip("no model of the plan is recorded in this clone")
    result = _converge(tmp_path, "--plan", PLAN, "--models", f"{recorded[0]} {recorded[0]}")
    assert result.returncode == 0, result.stderr
    assert f"{recorded[0]} is already recorded" in result.stdout
    assert "nothing to train" in result.stdout
    assert not (tmp_path / "work" / "runs").exists()


def test_converge_does_not_train_again_a_model_finished_in_an_earlier_call_but_reports_it(tmp_path):
    record = tmp_path / "work" / "records" / "multi30k_converged" / "small_phm16" / "seed7"
    record.mkdir(parents=True)
    (record / "record.json").write_text("{}")
    _metrics(record, [(500, "dev", "bleu", 21.5)])
    result = _converge(tmp_path, "--plan", PLAN, "--models", "small_phm16:7")
    assert result.returncode == 0, result.stderr
    assert "small_phm16:7 finished in an earlier call" in result.stdout
    assert "small_phm16:7\tfinished\t500\t21.50\t0\t-" in (tmp_path / "out" / "converge-summary.txt").read_text()
    with tarfile.open(tmp_path / "out" / "records-multi30k_converged.tar.gz") as tar:
        assert "multi30k_converged/small_phm16/seed7/record.json" in tar.getnames()


def _tiny_plan(tmp_path: Path, **training) -> Path:
    """A plan of one row, a seconds-long PHM Transformer on generated data (6 steps unless ``training`` says
    otherwise), seeds 1 and 2."""
    from conftest import write_tiny_config

    config = write_tiny_config(tmp_path, **{"max_steps": 6, "validation_every": 3, **training})
    plan = tmp_path / "tinyplan.yaml"
    plan.write_text(yaml.safe_dump({"name": "tinyplan", "title": "tiny", "seeds": [1, 2], "budget": [],
                                    "metrics": ["bleu"], "rows": [{"name": "phm", "label": "PHM",
                                                                   "config": str(config)}]}))
    return plan


def test_a_model_whose_compilation_fails_trains_again_without_it(tmp_path):
    """``--compile on`` on a machine where torch.compile cannot work (here the CPU backend's C++ compiler is made to
    fail): the trainer stops before its first update, converge.sh starts the model again eagerly within the budget,
    and the finished record's config says it trained without compilation; a later call does not try compiling a
    model whose log records that fallback."""
    plan = _tiny_plan(tmp_path)
    result = _converge(tmp_path, "--plan", str(plan), "--models", "phm:1", "--compile", "on", "--budget-s", "200",
                       env={"CXX": "/bin/false"})
    assert result.returncode == 0, result.stdout + result.stderr
    assert "training through torch.compile: on" in result.stdout
    assert "phm:1: torch.compile failed (see its log); training it without compilation" in result.stdout
    log = (tmp_path / "work" / "logs" / "phm-seed1.log").read_text()
    assert "training.compile: torch.compile failed at step 1" in log
    assert "phm:1\tfinished\t6\t" in (tmp_path / "out" / "converge-summary.txt").read_text()
    record = tmp_path / "work" / "records" / "tinyplan" / "phm" / "seed1"
    assert yaml.safe_load((record / "config.yaml").read_text())["training"]["compile"] is False
    # a model whose compilation failed in an earlier call into the same --work (its log says so) starts without it
    (tmp_path / "work" / "logs" / "phm-seed2.log").write_text(
        "converge.sh: torch.compile failed; starting again without it\n")
    again = _converge(tmp_path, "--plan", str(plan), "--models", "phm:2", "--compile", "on", "--budget-s", "200",
                      env={"CXX": "/bin/false"})
    assert again.returncode == 0, again.stdout + again.stderr
    assert "torch.compile failed" not in again.stdout
    assert "phm:2\tfinished\t6\t" in (tmp_path / "out" / "converge-summary.txt").read_text()


def test_parallel_starts_the_next_model_when_one_ends(tmp_path):
    """``--parallel 1`` with two models: the second starts only after the first has ended, both finish, and each
    trains with all the call's threads (and the run settings converge.sh adds)."""
    plan = _tiny_plan(tmp_path)
    result = _converge(tmp_path, "--plan", str(plan), "--models", "phm:1 phm:2", "--parallel", "1", "--cpus", "2",
                       "--budget-s", "200")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 model(s) at a time, 2 thread(s) each" in result.stdout
    out = result.stdout
    assert out.index("phm:1 started after") < out.index("phm:2 started after")
    records = tmp_path / "work" / "records" / "tinyplan" / "phm"
    first = json.loads((records / "seed1" / "experiment.json").read_text())["segments"][-1]
    second = json.loads((records / "seed2" / "experiment.json").read_text())["segments"][0]
    assert second["start"] >= first["start"] + first["seconds"]  # seed 2 began after seed 1's training ended
    assert first["command"].endswith("--override=--training.num_threads=2 --override=--training.last_at_validation"
                                     "=false --override=--training.compile=false")
    summary = (tmp_path / "out" / "converge-summary.txt").read_text()
    assert "phm:1\tfinished\t6\t" in summary and "phm:2\tfinished\t6\t" in summary


def test_a_second_call_resumes_a_model_the_first_stopped_at_its_budget(tmp_path):
    """Call 1 stops a model at its budget (SIGTERM: the trainer saves ``last``, which converge.sh's runs write only
    then); call 2 into the same --work validates that folder against the plan (the run settings converge.sh adds,
    such as ``training.last_at_validation=false``, are not a different config) and resumes it."""
    plan = _tiny_plan(tmp_path, max_steps=10**6, validation_every=50, log_every=50)
    # the budget counts from the script's start, its checks included: 45 s leave the model ≥ 30 s to start in
    first = _converge(tmp_path, "--plan", str(plan), "--models", "phm:1", "--budget-s", "45")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "phm:1\tunfinished\t" in (tmp_path / "out" / "converge-summary.txt").read_text()
    run = tmp_path / "work" / "runs" / "tinyplan" / "phm" / "seed1"
    stopped = load_checkpoint(run / "last.safetensors").extra["trainer"]["step"]
    assert stopped > 0
    second = _converge(tmp_path, "--plan", str(plan), "--models", "phm:1", "--budget-s", "45")
    assert second.returncode == 0, second.stdout + second.stderr
    log = (tmp_path / "work" / "logs" / "phm-seed1.log").read_text()
    assert f"resumed from {run / 'last.safetensors'} at step {stopped}," in (run / "train.log").read_text(), log
    assert load_checkpoint(run / "last.safetensors").extra["trainer"]["step"] > stopped


def test_a_carried_compile_cache_spares_the_next_call_the_compilation(tmp_path):
    """``--compile on`` (on the CPU, Inductor's C++ backend): call 1 brings torch.compile's cache back as
    compile-cache.tar.gz; call 2, on a fresh --work with that file as --compile-cache, seeds its cache from it and
    trains the same model without compiling a graph of its own (no new Inductor graph entry), to the same loss; a
    truncated carried file is refused with a message and leaves the cache as it was."""
    plan = _tiny_plan(tmp_path)
    budget = "300"  # a bound, not a duration: the tiny model compiles and trains in well under a minute unloaded
    first = _converge(tmp_path, "--plan", str(plan), "--models", "phm:1", "--compile", "on", "--budget-s", budget)
    assert first.returncode == 0, first.stdout + first.stderr
    assert (tmp_path / "work" / "compile-cache" / "fxgraph").is_dir()  # in --work, wherever that is
    assert "compile-cache.tar.gz holds torch.compile's cache (" in first.stdout
    carried = tmp_path / "carried.tar.gz"
    (tmp_path / "out" / "compile-cache.tar.gz").rename(carried)
    with tarfile.open(carried) as tar:
        seeded = {member.name for member in tar.getmembers() if member.name.startswith("fxgraph/") and member.isfile()}
    assert seeded, "the cache holds no compiled graph"
    second = _converge(tmp_path, "--plan", str(plan), "--models", "phm:1", "--compile", "on", "--budget-s", budget,
                       "--work", str(tmp_path / "work2"), "--compile-cache", str(carried))
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"torch.compile's cache seeded from {carried}" in second.stdout
    cache = tmp_path / "work2" / "compile-cache"
    compiled = {str(p.relative_to(cache)) for p in (cache / "fxgraph").rglob("*") if p.is_file()}
    assert compiled == seeded, "call 2 compiled graphs the carried cache should have held"
    losses = []
    for work in ("work", "work2"):
        metrics = (tmp_path / work / "records" / "tinyplan" / "phm" / "seed1" / "metrics.csv").read_text()
        losses.append([line for line in metrics.splitlines() if ",train,loss," in line])
    assert losses[0] and losses[0] == losses[1]
    # a truncated carried file: nothing of it reaches the cache (the model, recorded in this --work, does not train)
    truncated = tmp_path / "truncated.tar.gz"
    truncated.write_bytes(carried.read_bytes()[: carried.stat().st_size // 2])
    shutil.copytree(tmp_path / "work2" / "records", tmp_path / "work3" / "records")
    third = _converge(tmp_path, "--plan", str(plan), "--models", "phm:1", "--compile", "on", "--budget-s", budget,
                      "--work", str(tmp_path / "work3"), "--compile-cache", str(truncated))
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"converge.sh: {truncated} could not be unpacked; compiling without it" in third.stdout
    assert not any((tmp_path / "work3" / "compile-cache").iterdir())
    assert not (tmp_path / "work3" / "compile-cache.seeded").exists()
    assert not (tmp_path / "work3" / "compile-cache.unpack").exists()


def test_check_validates_the_models_and_the_plan_and_trains_nothing(tmp_path):
    """--check: what a call would refuse, found in seconds; a valid list exits 0 with nothing trained or packed."""
    ok = _converge(tmp_path, "--plan", PLAN, "--models", "base_phm4:1 base_transformer:2", "--check")
    assert ok.returncode == 0, ok.stderr
    assert "--check: the plan, rows base_phm4,base_transformer and models base_phm4:1 base_transformer:2 are valid" \
        in ok.stdout
    assert not (tmp_path / "work" / "runs" / "multi30k_converged").exists() or not any(
        (tmp_path / "work" / "runs" / "multi30k_converged").iterdir())
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())
    bad = _converge(tmp_path, "--plan", PLAN, "--models", "base_phm5:1", "--check")
    assert bad.returncode == 2 and "the plan does not validate" in bad.stderr and "base_phm5" in bad.stderr
    unplanned = _converge(tmp_path, "--plan", PLAN, "--models", "base_phm4:1 base_phm4:4", "--check")
    assert unplanned.returncode == 2 and "the plan does not validate" in unplanned.stderr
    assert "seed 4 is not in" in unplanned.stderr


def test_checked_skips_the_plans_dry_run_and_a_bad_row_then_fails_as_its_model(tmp_path):
    """--checked (check.sh, after its own --check) does not dry-run the plan again; were the row wrong after all,
    its model fails in training and the summary says so, instead of the call dying before collect."""
    result = _converge(tmp_path, "--plan", PLAN, "--models", "base_phm5:1", "--checked", "--budget-s", "60")
    assert "--checked: the plan's dry run for rows base_phm5 is skipped" in result.stdout
    assert "the plan does not validate" not in result.stderr
    assert not (tmp_path / "work" / "logs" / "validate.log").exists()
    assert "base_phm5" in (tmp_path / "work" / "logs" / "base_phm5-seed1.log").read_text()
    summary = (tmp_path / "out" / "converge-summary.txt").read_text()
    assert any(line.startswith("base_phm5:1\tfailed") for line in summary.splitlines()), summary
