"""Process setup: the DDP process group is torn down, worker threads joined, before the process exits."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Each rank: join the group the way the trainer does, train a DDP step, drop the wrapper, shut down, and
# print the gloo threads still alive (thread names from /proc). Threads left running into interpreter
# teardown are what made a finished torchrun job abort with SIGABRT now and then.
RANK_SCRIPT = """
import os, torch, torch.nn as nn
from hyperplex.train.process import distributed, shutdown_distributed

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
print(f"rank {rank}: during {during} after {gloo_threads()}", flush=True)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc to list threads")
def test_shutdown_joins_gloo_threads_after_ddp(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
           "OMP_NUM_THREADS": "1", "HYPERPLEX_BACKEND": "gloo"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                           str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(":")[0] for line in lines] == ["rank 0", "rank 1"], proc.stdout
    for line in lines:
        during, after = line.split(": during ")[1].split(" after ")
        assert "gloo" in during, line  # the check can see the threads it looks for
        assert after == "[]", line
