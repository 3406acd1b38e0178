"""Process setup for training: the torchrun/DDP environment, the device, a writable model folder."""

from __future__ import annotations

import atexit
import gc
import os
import platform
from pathlib import Path

import torch
import torch.distributed as dist

if dist.is_available():
    # Imported here, before a caller can have made a process group: on first import this module captures the
    # default group in ten default arguments (``group=group.WORLD``), and a group captured there outlives
    # destroy_process_group, its gloo threads running into interpreter teardown (see shutdown_distributed).
    # DDP imports it lazily, which is too late when a user's script made the group before calling train().
    import torch.distributed.nn  # noqa: F401

__all__ = ["distributed", "is_main_process", "shutdown_distributed", "resolve_device", "check_writable",
           "cpu_has_fast_bf16", "slow_precision_warning"]


def distributed() -> tuple[int, int]:
    """(rank, world size) from the torchrun environment; initialises the process group once."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return 0, 1
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() and os.environ.get("HYPERPLEX_BACKEND") != "gloo" else "gloo"
        dist.init_process_group(backend=backend)
        # The group lives for the process (several runs in one process share it) and is destroyed at exit,
        # before interpreter teardown, whether the CLI or a user's script called train().
        atexit.register(shutdown_distributed)
    return dist.get_rank(), dist.get_world_size()


def is_main_process() -> bool:
    """True outside a torchrun group and on its rank 0: the process that writes a run's shared files."""
    return not dist.is_initialized() or dist.get_rank() == 0


def shutdown_distributed() -> None:
    """Destroy the process group, if one was made, so that its worker threads are joined while the
    interpreter is still alive.

    Left running into interpreter teardown, a gloo worker thread can still be releasing the last collective's
    tensors; it then needs the GIL, which finalisation no longer hands out, and the process aborts
    ("terminate called without an active exception", SIGABRT) after its work is done, so torchrun reports
    the whole run as failed. No barrier first: a rank that stopped with an error must not wait for the others."""
    if dist.is_available() and dist.is_initialized():
        gc.collect()  # a finished DDP wrapper (reference cycles) still holds the group through its reducer
        dist.destroy_process_group()


def resolve_device(name: str, rank: int = 0) -> torch.device:
    """``auto`` → CUDA (this rank's GPU under torchrun) if available, else CPU; unknown devices are errors."""
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        device = None
    if device is None or device.type not in ("cpu", "cuda"):  # mps, xpu, meta: no path of the trainer is built for them
        raise ValueError(f"training.device: unknown device {name!r} (expected auto, cpu, cuda or cuda:N)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"training.device is {name!r} but CUDA is not available on this machine")
    return device


def cpu_has_fast_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions: on x86 AVX512_BF16 or AMX, elsewhere oneDNN's own check
    (Arm's bf16 extension).

    oneDNN's check alone is not enough on x86: it accepts any AVX-512 CPU, and there, without AVX512_BF16, a bf16
    matrix product under CPU autocast is emulated 3.5–3.9× slower than float32's; on an AVX2-only CPU it is 6×
    (``benchmarks/probes/bench_bf16_cpu.py`` measures it, ``benchmarks/NOTES.md`` has both). Unknown (a torch
    without the checks) counts as fast, so that nothing is said that cannot be backed."""
    try:
        if platform.machine().lower() in _X86:
            return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return True


_X86 = frozenset({"x86_64", "amd64", "i386", "i686", "x86"})


def slow_precision_warning(precision: str, device: torch.device) -> str | None:
    """The warning for a precision this device runs much more slowly than float32, or None."""
    if precision != "bf16" or device.type != "cpu" or cpu_has_fast_bf16():
        return None
    capability = torch.backends.cpu.get_cpu_capability()
    return (f"training.precision is bf16 but this CPU has no fast bf16 kernels (torch's CPU capability: "
            f"{capability}; x86 needs AVX512_BF16 or AMX, Arm its bf16 extension): autocast falls back to kernels "
            f"several times slower than float32's; training.precision: fp32 trains faster here")


def check_writable(model_dir: Path) -> None:
    """Create the model folder and prove it is writable before any work is done."""
    try:
        model_dir.mkdir(parents=True, exist_ok=True)
        probe = model_dir / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise OSError(f"model folder {model_dir} is not writable: {err.strerror or err}") from None
