"""The timing harness every benchmark uses: one clock, interleaved rounds, medians and spread, peak memory, and the
machine header.

A benchmark hands the harness the calls to compare (``{name: fn}``); the harness times them in ``rounds`` rounds, the
order rotating every round (:func:`rotations`), so that drift on a shared machine hits every call alike, and returns
:class:`Timings` (seconds per call, one sample per round). A ratio is the median over rounds of (time / the baseline's
time in the same round), so drift cancels; a time is the median over rounds; the spread is (max − min) / median.

On CUDA a time comes from CUDA events recorded around the calls (the queue is drained first), peak memory from
``torch.cuda.max_memory_allocated``; on the CPU from ``time.perf_counter`` (or the process's CPU time, ``clock="cpu"``)
and the allocation events of PyTorch's profiler. :func:`machine` says what ran it: CPU model, cores, threads, torch
version, and on CUDA the card, driver, CUDA and Triton versions.

Benchmarks are scripts, not a package: each puts this file's folder on ``sys.path`` before importing it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import torch

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
MiB = 2**20


# ----------------------------------------------------------------------------- command line
def add_arguments(parser, *, device: bool = True, out: bool = True, threads: bool = True) -> None:
    """The options every benchmark shares: ``--device {cpu,cuda}``, ``--threads N``, ``--out PATH`` (JSON; ``--json``
    is the same option)."""
    if device:
        parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where to run (default cpu)")
    if threads:
        parser.add_argument("--threads", type=int, metavar="N", help="torch.set_num_threads(N) (default: torch's)")
    if out:
        parser.add_argument("--out", "--json", dest="out", metavar="PATH",
                            help="also write the results and the machine header to this JSON file")


def setup(args) -> torch.device:
    """Apply ``--threads`` and check ``--device``; returns the device. Exits with a message where CUDA is asked for
    and absent."""
    if getattr(args, "threads", None) is not None:
        if args.threads < 1:
            raise SystemExit(f"--threads must be positive, not {args.threads}")
        torch.set_num_threads(args.threads)
    device = torch.device(getattr(args, "device", "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: this torch sees no CUDA device (torch.cuda.is_available() is False)")
    return device


# ----------------------------------------------------------------------------- timing
def sync(device: torch.device | str) -> None:
    """Wait for the device's queue to drain (a no-op on the CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_per_call(fn: Callable[[], object], number: int = 1, device: torch.device | str = "cpu",
                  clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds per call of ``fn`` over ``number`` back-to-back calls (CUDA events on a GPU)."""
    if torch.device(device).type == "cuda":
        sync(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / number
    start_s = clock()
    for _ in range(number):
        fn()
    return (clock() - start_s) / number


#: A first call longer than this is taken as the call's time, not repeated (see :func:`calls_per_block`).
COLD_CALL_S = 2.0


def calls_per_block(fn: Callable[[], object], target_s: float, device: torch.device | str = "cpu",
                    clock: Callable[[], float] = time.perf_counter, limit: int = 100_000) -> tuple[int, float]:
    """(back-to-back calls that make a timed block of about ``target_s``, seconds of one call), from a second timed
    call after a warm-up one. The first call can be cold by seconds (a Triton kernel compiled, cuBLAS or oneDNN
    set up), so it is timed on its own only when it took over 2 s and over ``4 · target_s``: a call that slow is
    not repeated for calibration."""
    warm = time_per_call(fn, 1, device, clock)
    once = warm if warm > max(4 * target_s, COLD_CALL_S) else time_per_call(fn, 1, device, clock)
    return max(1, min(limit, round(target_s / max(once, 1e-7)))), once


#: What names a timed call: a string, or a tuple such as ``(size, kind)`` where a script sweeps a grid.
Name = TypeVar("Name", bound=Hashable)


def rotations(names: list[Name], rounds: int) -> Iterator[list[Name]]:
    """The order of ``names`` in each of ``rounds`` rounds, rotated by one every round."""
    for r in range(rounds):
        shift = r % len(names) if names else 0
        yield names[shift:] + names[:shift]


def interleave(calls: Mapping[Name, Callable[[], object]], rounds: int, *, device: torch.device | str = "cpu",
               number: int | Mapping[Name, int] = 1, warmup: int = 1, clock: Callable[[], float] = time.perf_counter,
               context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
               before: Callable[[Name], object] | None = None) -> Timings[Name]:
    """Time every call in ``rounds`` interleaved rounds (:func:`rotations`), each sample a block of ``number`` calls
    (per name where a dict), after ``warmup`` untimed calls each; every call runs under ``context()``, and
    ``before(name)``, where given, untimed before each of ``name``'s samples."""
    names = list(calls)
    per_name = number if isinstance(number, Mapping) else dict.fromkeys(names, number)
    with context():
        for name in names:
            for _ in range(warmup):
                calls[name]()
        sync(device)
        timings: Timings[Name] = Timings({name: [] for name in names})
        for order in rotations(names, rounds):
            for name in order:
                if before is not None:
                    before(name)
                timings.samples[name].append(time_per_call(calls[name], per_name[name], device, clock))
    return timings


@dataclass
class Timings(Generic[Name]):
    """Seconds per call, one sample per round, by name (:func:`interleave`)."""

    samples: dict[Name, list[float]] = field(default_factory=dict)

    def median(self, name: Name) -> float:
        return statistics.median(self.samples[name])

    def spread(self, name: Name) -> float:
        return spread(self.samples[name])

    def ratio(self, name: Name, baseline: Name) -> float:
        """Median over rounds of (``name``'s time / ``baseline``'s time in the same round); below 1 = faster."""
        return paired_ratio(self.samples[name], self.samples[baseline])

    def summary(self, baseline: Name | None = None, scale: float = 1.0) -> dict[Name, dict]:
        """Per name: median, min and spread of the samples (× ``scale``: 1e3 for ms), the samples, and the ratio to
        ``baseline``."""
        out: dict[Name, dict] = {}
        for name, samples in self.samples.items():
            out[name] = {"median": self.median(name) * scale, "min": min(samples) * scale, "spread": spread(samples),
                         "samples": [s * scale for s in samples]}
            if baseline is not None:
                out[name]["ratio"] = self.ratio(name, baseline)
        return out


def paired_ratio(samples: list[float], baseline: list[float]) -> float:
    """Median of ``samples[i] / baseline[i]`` (the same round's pair)."""
    if len(samples) != len(baseline) or not samples:
        raise ValueError(f"paired_ratio: {len(samples)} samples against {len(baseline)} baseline samples")
    return statistics.median(s / b for s, b in zip(samples, baseline))


def spread(samples: list[float]) -> float:
    """(max − min) / median: how far the rounds disagree (0 for a single sample)."""
    middle = statistics.median(samples)
    return (max(samples) - min(samples)) / middle if middle else math.nan


# ----------------------------------------------------------------------------- memory
def peak_bytes(step: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Peak bytes PyTorch's allocator held during ``step()`` above the level before it: on CUDA
    ``max_memory_allocated`` after ``reset_peak_memory_stats``; on the CPU the running sum of the allocation events of
    ``torch.profiler.profile(profile_memory=True)`` — exact for PyTorch's tensors, blind to scratch that BLAS or
    oneDNN allocate themselves."""
    device = torch.device(device)
    if device.type == "cuda":
        sync(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        step()
        sync(device)
        return float(torch.cuda.max_memory_allocated(device) - base)
    from torch.profiler import ProfilerActivity, profile

    with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "trace.json")
        with _quiet_stderr():
            prof.export_chrome_trace(path)
        with open(path) as fh:
            events = json.load(fh).get("traceEvents", [])
    return float(running_peak(e["args"]["Bytes"] for e in sorted(
        (e for e in events if e.get("name") == "[memory]" and e.get("args", {}).get("Device Type", 0) == 0),
        key=lambda e: e["ts"])))


def running_peak(deltas) -> int:
    """The highest running sum of allocation deltas (bytes allocated > 0, freed < 0), from 0."""
    level = peak = 0
    for delta in deltas:
        level += delta
        peak = max(peak, level)
    return peak


def max_resident_bytes() -> int:
    """This process's peak resident memory so far (``ru_maxrss``; it only rises)."""
    import resource

    scale = 1 if sys.platform == "darwin" else 1024  # macOS reports bytes, Linux KiB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


@contextlib.contextmanager
def _quiet_stderr():
    """Silence file descriptor 2 (the profiler backend prints start/stop lines there)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def disable_malloc_mmap() -> bool:
    """Make glibc serve every allocation from its heap and keep freed memory (``mallopt``), so large tensors are not
    ``mmap``-ed and page-faulted afresh on each call. True on success."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_max = -1, -4  # from <malloc.h>
        return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 2**31 - 1))
    except (OSError, AttributeError):
        return False


FALLBACK_LLC_MIB = 32  # when neither sysfs nor lscpu says (a common server L3 per CCX/socket)


def parse_size(text: str) -> int:
    """``"32768K"`` / ``"32 MiB"`` / ``"33554432"`` → bytes."""
    text = text.strip().replace("iB", "").replace("B", "").replace(" ", "")
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:].upper(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def last_level_cache() -> tuple[int, str]:
    """Bytes of the largest data/unified CPU cache, and where that number came from."""
    sizes = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            if (index / "type").read_text().strip() != "Instruction":
                sizes.append(parse_size((index / "size").read_text()))
        except (OSError, ValueError):
            continue
    if sizes:
        return max(sizes), "sysfs"
    import subprocess

    try:
        text = subprocess.run(["lscpu", "-B", "-C=NAME,ONE-SIZE,TYPE"], capture_output=True, text=True,
                              timeout=10).stdout
        sizes = [int(f[1]) for f in (ln.split() for ln in text.splitlines()[1:])
                 if len(f) >= 3 and f[1].isdigit() and f[2] != "Instruction"]
        if sizes:
            return max(sizes), "lscpu"
    except (OSError, ValueError, subprocess.SubprocessError):
        pass
    return FALLBACK_LLC_MIB * MiB, f"fallback guess, {FALLBACK_LLC_MIB} MiB"


# ----------------------------------------------------------------------------- the machine
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the architecture."""
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.machine()


def busy_cores_elsewhere(seconds: float = 0.5) -> float | None:
    """Cores kept busy by other processes while this one sleeps (Linux ``/proc/stat``), else ``None``."""
    def busy_idle():
        with open("/proc/stat") as fh:
            v = [int(x) for x in fh.readline().split()[1:]]
        idle = v[3] + v[4]  # idle + iowait
        return sum(v[:8]) - idle, idle
    try:
        b0, i0 = busy_idle()
        time.sleep(seconds)
        b1, i1 = busy_idle()
    except (OSError, ValueError, IndexError):
        return None
    total = (b1 - b0) + (i1 - i0)
    return (os.cpu_count() or 1) * (b1 - b0) / total if total > 0 else None


def _driver_version() -> str | None:
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[0] if out else None


def machine(device: torch.device | str = "cpu") -> dict:
    """What ran the benchmark: CPU model and the vector instructions torch's CPU kernels use (``AVX2``, ``AVX512``:
    "AMD EPYC" alone names neither, and the CPU paths' ratios depend on them), logical and usable cores, torch
    threads, torch and Python versions, the load average; on CUDA also the card, its memory, the driver, CUDA and
    Triton versions."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    info: dict[str, Any] = {"cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "logical_cores": os.cpu_count(), "usable_cores": usable,
            "threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
            "device": str(device),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}
    if torch.device(device).type == "cuda":
        props = torch.cuda.get_device_properties(device)
        try:
            import triton

            triton_version = triton.__version__
        except ImportError:
            triton_version = None
        info.update(card=props.name, card_memory_gib=round(props.total_memory / 2**30, 1),
                    capability=f"{props.major}.{props.minor}", driver=_driver_version(), cuda=torch.version.cuda,
                    triton=triton_version)
    return info


def header(info: dict) -> str:
    """One line of :func:`machine`'s answer."""
    capability = f" ({info['cpu_capability']})" if info.get("cpu_capability") else ""
    text = (f"machine: {info['cpu']}{capability}, {info['usable_cores']} of {info['logical_cores']} cores, "
            f"{info['threads']} torch threads; torch {info['torch']}, Python {info['python']}")
    if "card" in info:
        text += (f"; {info['card']} ({info['card_memory_gib']} GiB, compute {info['capability']}), driver "
                 f"{info['driver'] or '?'}, CUDA {info['cuda']}, Triton {info['triton'] or 'absent'}")
    if info.get("load_average"):
        text += "; load average " + " ".join(f"{x:.2f}" for x in info["load_average"])
    return text


def command_line(argv: list[str] | None, script: str) -> str:
    """The command that ran the benchmark, quoted for a shell (``argv``: as given to ``main``, or ``sys.argv``)."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", *(shlex.quote(a) for a in [script, *args])])


def write_json(path: str | os.PathLike, payload: dict, device: torch.device | str = "cpu", **meta) -> dict:
    """Write ``payload`` with a ``meta`` entry (date, machine, and ``meta``); NaN becomes null. Returns what was
    written."""
    record = {"meta": {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                       "machine": machine(device), **meta}, **payload}
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        json.dump(_no_nan(record), fh, indent=1, default=str)
    return record


def _no_nan(value):
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {(k if isinstance(k, str | int | float | bool) or k is None else str(k)): _no_nan(v)
                for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_no_nan(v) for v in value]
    return value
