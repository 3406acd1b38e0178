"""Process setup: the DDP process group is torn down, worker threads joined, before the process exits; the
warning for a precision the CPU runs slowly."""

from pathlib import Path

import pytest
from conftest import torchrun, write_tiny_config

# Each rank: join the group the way the trainer does, train a DDP step, drop the wrapper, shut down, and
# print the gloo threads still alive (thread names from /proc). Threads left running into interpreter
# teardown are what made a finished torchrun job abort with SIGABRT now and then. Automatic garbage
# collection is off, so only shutdown_distributed's own collection can free the dropped wrapper (a DDP
# module sits in reference cycles, and its reducer holds the group).
RANK_SCRIPT = """
import gc, os, sys, torch, torch.nn as nn
from hyperplex.train.process import distributed, shutdown_distributed

gc.disable()

def gloo_threads():
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    return sorted(n for n in names if "gloo" in n)

torch.manual_seed(0)
rank, world = distributed()
assert world == 2, world
ddp = nn.parallel.DistributedDataParallel(nn.Linear(4, 4))
ddp(torch.randn(3, 4)).sum().backward()
during = gloo_threads()
del ddp
shutdown_distributed()
with open(os.path.join(sys.argv[1], f"rank{rank}.txt"), "w") as f:  # one file each: stdout lines interleave
    f.write(f"during {during} after {gloo_threads()}")
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to list threads")
def test_shutdown_joins_gloo_threads_after_ddp(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    proc = torchrun(script, tmp_path, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for rank in (0, 1):
        line = (tmp_path / f"rank{rank}.txt").read_text()
        during, after = line.removeprefix("during ").split(" after ")
        assert "gloo" in during, (rank, line)  # the check can see the threads it looks for
        assert after == "[]", (rank, line)


# Each rank: `hyperplex.train.run.train` called from a script, as a user's own torchrun entry point would; with
# argv[3] the script made the process group itself first. The script's exit handler is registered before train()
# runs, so it runs after any handler that hyperplex registers (last in, first out) and sees what is left at exit.
# A caller's group must be freed by its own destroy_process_group: a group still referenced then (by a DDP
# wrapper's reducer, or captured by torch.distributed.nn's default arguments) keeps its gloo threads running into
# interpreter teardown, where rank 1 aborted now and then. Automatic garbage collection is off, so the check does
# not depend on when a collection happens to run.
TRAIN_SCRIPT = """
import atexit, gc, os, sys, weakref
import torch.distributed as dist
from hyperplex.train.run import train

gc.disable()
seen = []
def left_at_exit():
    freed = None
    at_exit = dist.is_initialized()
    if at_exit:  # the script's own group: a well-behaved caller destroys what it made
        group = weakref.ref(dist.group.WORLD)
        dist.destroy_process_group()
        freed = group() is None
    with open(os.path.join(sys.argv[2], f"group{os.environ['RANK']}.txt"), "w") as f:
        f.write(f"after runs {seen[0] if seen else None}, at exit {at_exit}, freed {freed}")

atexit.register(left_at_exit)
if len(sys.argv) > 3:
    dist.init_process_group("gloo")
train(sys.argv[1], model_dir=sys.argv[2])
train(sys.argv[1], model_dir=sys.argv[2] + "-again")  # a second run in the same process reuses the group
seen.append(dist.is_initialized())
"""


@pytest.mark.parametrize("own_group", [False, True])
def test_the_group_train_made_is_destroyed_at_exit_and_a_callers_group_is_left_alone(tmp_path, own_group):
    """A script that called train() under torchrun and then exited aborted now and then at interpreter teardown
    (rank 1 SIGABRT after "finished at step 8"): only the CLI shut the group down. The second run in one process
    also checks that rank 1, ahead of rank 0, does not write into the folder rank 0 has not made yet."""
    script = tmp_path / "train_script.py"
    script.write_text(TRAIN_SCRIPT)
    config = write_tiny_config(tmp_path, max_steps=4, validation_every=4, batch_size=16)
    proc = torchrun(script, config, tmp_path / "m", *(["own"] if own_group else []), timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for rank in (0, 1):
        freed = True if own_group else None  # hyperplex's own group is gone before the script's handler runs
        assert (tmp_path / "m" / f"group{rank}.txt").read_text() == \
            f"after runs True, at exit {own_group}, freed {freed}", rank


def test_bf16_is_warned_of_only_on_a_cpu_without_fast_bf16(monkeypatch):
    import torch

    from hyperplex.train import process

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.setattr(process, "cpu_has_fast_bf16", lambda: False)
    warning = process.slow_precision_warning("bf16", cpu)
    assert warning is not None and warning.startswith("training.precision is bf16 but this CPU has no fast bf16")
    assert torch.backends.cpu.get_cpu_capability() in warning and "training.precision: fp32" in warning
    assert process.slow_precision_warning("fp32", cpu) is None
    assert process.slow_precision_warning("bf16", cuda) is None  # CUDA's bf16 is the GPU's business
    monkeypatch.setattr(process, "cpu_has_fast_bf16", lambda: True)
    assert process.slow_precision_warning("bf16", cpu) is None


def test_the_fast_bf16_check_wants_bf16_instructions_on_x86_and_counts_unknown_as_fast(monkeypatch):
    import platform

    import torch

    from hyperplex.train import process

    def cpu(machine, avx512_bf16=False, amx=False, onednn=True):
        monkeypatch.setattr(platform, "machine", lambda: machine)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
        monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: onednn)
        return process.cpu_has_fast_bf16()

    # oneDNN accepts any AVX-512 CPU, where bf16 is emulated several times slower than float32: not fast
    assert cpu("x86_64", onednn=True) is False
    assert cpu("AMD64", avx512_bf16=True, onednn=False) is True
    assert cpu("x86_64", amx=True) is True
    assert cpu("aarch64", onednn=True) is True and cpu("aarch64", avx512_bf16=True, onednn=False) is False
    monkeypatch.undo()

    class NoCheck:
        def __getattr__(self, name):
            raise AttributeError(name)

    monkeypatch.setattr(torch.ops, "mkldnn", NoCheck())
    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    assert process.cpu_has_fast_bf16() is True
    monkeypatch.setattr(torch, "cpu", NoCheck())
    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    assert process.cpu_has_fast_bf16() is True
