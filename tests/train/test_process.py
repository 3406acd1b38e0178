"""Process setup: the DDP process group is torn down, worker threads joined, before the process exits."""

from pathlib import Path

import pytest
from conftest import torchrun

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
