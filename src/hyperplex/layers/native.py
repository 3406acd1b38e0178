"""An optional compiled kernel for PHM inference at few rows: the *streamed* product.

At one row (a decoder step, a single short sentence) a large PHM layer is bound by reading its weights, and PHM's
gain is that it has ``n×`` fewer of them. PyTorch's own products cannot collect that gain at ``n ≥ 8``: the structured
path runs ``n²`` small products, and the one GEMM against the ``Sᵢ`` side by side (:func:`phm_linear_premixed`) makes
BLAS pack its weight operand first, which reads and writes the factors once more (docs/performance.md). The kernel in
``phm_stream.cpp`` streams every ``Sᵢ`` from memory exactly once, in the layout in which it is stored, and does the
dense layer's multiply-adds in registers.

It is compiled on first use with :mod:`torch.utils.cpp_extension` (a C++ compiler and ``ninja``, from
``pip install 'hyperplex[native]'``; about a minute, then cached in ``TORCH_EXTENSIONS_DIR``), with
``-march=native``: the build fits the machine that made it. A later process on the same CPU, source and torch
loads the cached library directly, with no compiler or ninja installed. Nothing is compiled unless asked for:

- :func:`install_native_kernels` (the ``hyperplex native`` command) builds it, checks it against the Kronecker
  product (:func:`self_check`) and marks that build *installed*: from then on every process on this machine (same
  CPU, source and torch) in which ``HYPERPLEX_NATIVE`` is unset lets ``auto`` take it, as
  :func:`enable_native_kernels` would — it is loaded from the cache, never compiled, and a library that changed
  since it was checked is not used (with a warning). :func:`uninstall_native_kernels` (``hyperplex native
  --uninstall``) takes the mark away; a serving image built with ``hyperplex native`` starts with it on and needs
  no compiler at run time;
- :func:`enable_native_kernels` builds it and lets every :class:`~hyperplex.layers.PHMLinear` in ``forward_mode="auto"``
  take it in inference where it applies (CPU, float32, no gradient needed, at most
  :data:`STREAMED_ROW_LIMIT` rows on layers with large factors, :data:`STREAMED_MIN_FACTORS`), and not under
  autocast, ``torch.compile``, tracing or ONNX export;
- the environment variable ``HYPERPLEX_NATIVE=1`` does the same without a change to the program (a serving
  container, say): the kernel is built at the first call that ``auto`` would hand to it, and a build that fails
  raises there, naming the variable (it is tried once a process: later calls raise the same error without
  compiling again). ``HYPERPLEX_NATIVE=0`` leaves it off even where it is installed; unset (or ``auto``), it is
  on exactly where it is installed. A call of :func:`enable_native_kernels` overrides the variable either way;
- :func:`build_native_kernels` builds it (or loads the cached build) without turning it on or installing it;
- ``forward_mode="streamed"`` on a layer asks for it always (and fails with a clear error where it cannot run);
- :func:`phm_linear_streamed` is the functional form.

The result equals the other paths up to float32 rounding (the same sums in another order). Like the premixed path,
it holds the pre-mixed rows while it runs: ``rows·n·d`` floats (256 KiB a row at d = 4096, n = 16), which is why
it is meant for few rows.
"""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import torch
from torch import Tensor

from hyperplex.layers.functional import cpu_inference_reason, refuse_off_cpu

__all__ = ["ENV_VAR", "INSTALL_MARKER", "SELF_CHECK_SHAPES", "SELF_CHECK_TOLERANCE", "STREAMED_MIN_FACTORS",
           "STREAMED_ROW_LIMIT", "build_native_kernels", "enable_native_kernels", "install_native_kernels",
           "installed_native_kernel", "native_kernels_enabled", "phm_linear_streamed", "self_check", "streamable",
           "uninstall_native_kernels"]

SOURCE = Path(__file__).with_name("phm_stream.cpp")
#: ``auto`` takes the streamed path in inference for at most ``STREAMED_ROW_LIMIT`` rows (tokens × batch), on a
#: layer whose factors hold at least ``STREAMED_MIN_FACTORS`` numbers (``k·d/n``: 1 MiB in float32, e.g. 1024² at
#: n = 4, 4096² at any n ≤ 16, 4096 → 1024 at n ≤ 16). Measured on this project's CPU (stacks of layers whose factors
#: overflow the last-level cache, 2 threads; docs/performance.md, and the tables in benchmarks/NOTES.md, "Cold: the
#: streamed kernel" and "Cold: where auto takes the kernel"): with ``benchmarks/bench_phm.py --mode cold --native``
#: at 4096², 1 and 4 rows, the kernel took 0.10–0.18× the dense layer's time against the structured path's 0.15–0.35×;
#: with ``benchmarks/probes/bench_streamed_shapes.py`` it beat ``auto``'s own path at every point of 4096 → 1024, 3072 →
#: 768 and 1024 → 4096 that qualifies (0.10–0.30× against 0.23–0.42×), and lost at 4 rows on 3072 → 768 at n = 16
#: (147,456 factor numbers: 0.54× against 0.35×), which the bound keeps out. It also beat the structured path at 16 rows
#: and on 1024², but there ``auto`` would otherwise take the premixed or materialised path, which neither benchmark
#: times against it at those points, so the limits stay.
STREAMED_ROW_LIMIT = 4
STREAMED_MIN_FACTORS = 2 ** 18

#: The environment variable that turns the kernel on for ``auto`` without a call of :func:`enable_native_kernels`.
ENV_VAR = "HYPERPLEX_NATIVE"
_ON, _OFF, _INSTALLED = ("1", "true", "yes", "on"), ("0", "false", "no", "off"), ("", "auto")
#: The file, beside the cached library, that marks the build :func:`install_native_kernels` checked.
INSTALL_MARKER = "hyperplex_installed.json"
#: The file, beside the cached library, recording the SHA-256 of the library this package compiled. A cached
#: library is loaded only when its SHA-256 is the one this file or :data:`INSTALL_MARKER` records: loading a
#: truncated or replaced shared library can kill the process (SIGBUS) before Python can report anything.
BUILD_MARKER = "hyperplex_build.json"

_lock = threading.Lock()
_module = None
_enabled: bool | None = None  # None: no call of enable_native_kernels yet, so ENV_VAR decides
_env_failure: tuple[str, BaseException] | None = None  # the build ENV_VAR asked for failed: raised again, not retried
_installed: bool | None = None  # whether an installed build was found and loaded; None: not looked for yet


# -fopenmp: at::parallel_for is OpenMP in PyTorch's CPU builds, and the extension then shares the libgomp that torch
# loaded (same soname), so it runs on torch's threads (torch.set_num_threads).
_CFLAGS, _LDFLAGS = ("-O3", "-march=native", "-fopenmp"), ("-fopenmp",)


def _build(verbose: bool = False):
    global _module
    with _lock:
        if _module is None:
            name = _library_name()
            _module = _load_cached(name)  # a build made earlier for this CPU, source and torch: no compiler needed
            if _module is None:
                _module = _compile(name, verbose)
                _record_build(Path(_module.__file__))
    return _module


def _record_build(library: Path) -> None:
    """Write :data:`BUILD_MARKER` beside the library just compiled: later processes load it only if unchanged."""
    import json

    from hyperplex.fileio import atomic_write_text

    try:
        atomic_write_text(library.parent / BUILD_MARKER, json.dumps(
            {"library": library.name, "sha256": _sha256(library), "torch": torch.__version__}, indent=1) + "\n")
    except OSError:  # a read-only cache: the build is used in this process, and compiled again in the next
        pass


def _recorded_checksums(folder: Path) -> set[str]:
    """The library checksums :data:`BUILD_MARKER` and :data:`INSTALL_MARKER` in ``folder`` record."""
    import json

    from hyperplex.fileio import read_bounded

    found = set()
    for marker in (BUILD_MARKER, INSTALL_MARKER):
        try:
            record = json.loads(read_bounded(folder / marker, 1 << 20))
            found.add(record["sha256"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return found


def _verified_library(name: str) -> Path | None:
    """:func:`_cached_library` if its SHA-256 is one a mark records; else ``None``, and a library there that no
    mark vouches for (a build cut short, a truncated or replaced file) is removed with a warning, so that the
    next build links it again instead of loading it. Nothing is loaded."""
    library = _cached_library(name)
    if library is None:
        return None
    if _sha256(library) in _recorded_checksums(library.parent):
        return library
    import warnings

    warnings.warn(f"hyperplex's native PHM kernel {library} is not the library this package built (its SHA-256 "
                  f"matches neither {BUILD_MARKER} nor {INSTALL_MARKER}: damaged, cut short or replaced), so it is not "
                  "loaded; it is removed and built again where a compiler is available", RuntimeWarning, stacklevel=3)
    for path in (library, library.parent / BUILD_MARKER, library.parent / INSTALL_MARKER):
        try:
            path.unlink(missing_ok=True)
        except OSError:
            pass
    return None


def _compile(name: str, verbose: bool):
    compiler = os.environ.get("CXX", "c++")  # what torch.utils.cpp_extension will call
    missing = [tool for tool in (compiler, "ninja") if shutil.which(tool) is None and
               not (tool == "ninja" and _ninja_from_pip())]
    if missing:
        raise RuntimeError(
            f"hyperplex's native PHM kernel needs {' and '.join(missing)} to compile {SOURCE.name}: "
            "install a C++ compiler and `pip install 'hyperplex[native]'` (ninja), or leave the kernel off "
            "(every PHM path in PyTorch stays available)")
    from torch.utils import cpp_extension

    return cpp_extension.load(name=name, sources=[str(SOURCE)], extra_cflags=list(_CFLAGS),
                              extra_ldflags=list(_LDFLAGS), verbose=verbose)


def _library_name() -> str:
    """The extension's name, which is also its cache folder's: this CPU (:func:`_machine_tag`) and a hash of the
    source, the flags and the torch version, so that a cached library is only ever loaded by the code it was
    built from and against the torch it was built for."""
    import hashlib

    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(repr((_CFLAGS, _LDFLAGS, torch.__version__)).encode())
    return f"hyperplex_phm_stream_{_machine_tag()}_{digest.hexdigest()[:12]}"


def _cached_library(name: str) -> Path | None:
    """The compiled library that ``cpp_extension.load(name=name, …)`` left in ``TORCH_EXTENSIONS_DIR`` (or the
    default cache), if it is there and no build of it is under way (``cpp_extension`` holds a ``lock`` file
    while it builds)."""
    from torch.utils import cpp_extension

    folder = _build_folder(name)
    library = folder / f"{name}{cpp_extension.LIB_EXT}"
    return library if library.is_file() and not (folder / "lock").exists() else None


def _build_folder(name: str) -> Path:
    """The folder in which ``cpp_extension.load(name=name, …)`` builds: torch's rule (its private
    ``_get_build_directory``, which a test compares with this), without creating the folder as that helper does,
    so that looking for a build leaves nothing behind on a machine that never made one."""
    import sys

    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR")
    if root is None:
        if torch.version.hip is not None:
            accelerator = f"rocm{torch.version.hip.replace('.', '')}"
        elif torch.version.cuda is not None:
            accelerator = f"cu{torch.version.cuda.replace('.', '')}"
        else:
            accelerator = "cpu"
        python = f"py{sys.version_info.major}{sys.version_info.minor}{getattr(sys, 'abiflags', '')}"
        root = os.path.join(cpp_extension.get_default_build_root(), f"{python}_{accelerator}")
    return Path(root) / name


def _load_cached(name: str):
    """Import the cached library of :func:`_cached_library` directly, as ``cpp_extension`` does after a build,
    without calling the compiler or ninja (``cpp_extension.load`` runs both in every new process, even when the
    build is up to date): a serving image made by ``hyperplex native`` needs no compiler at run time. ``None``
    when there is no such library, its SHA-256 is not the one recorded when it was built or installed
    (:func:`_verified_library`, checked before the library is opened), or it does not import: then it is
    compiled again."""
    import importlib.util

    library = _verified_library(name)
    if library is None:
        return None
    try:
        spec = importlib.util.spec_from_file_location(name, library)
        if spec is None or spec.loader is None:
            raise ImportError(f"{library} is not a loadable extension module")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except (ImportError, OSError):
        return None
    return module if hasattr(module, "phm_stream") else None


def _machine_tag() -> str:
    """A short hash of this CPU's model and feature flags: the build cache is per user, and a ``-march=native``
    binary made on one CPU may stop with an illegal instruction on another that shares the home folder."""
    import hashlib
    import platform

    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            text += "".join(line for line in fh if line.startswith(("model name", "flags", "Features")))
    except OSError:
        text += platform.processor()
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _ninja_from_pip() -> bool:
    try:
        import ninja  # the PyPI package ships the binary in ninja.BIN_DIR; torch looks for it on PATH
    except ImportError:
        return False
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    return True


def enable_native_kernels(enabled: bool = True, *, verbose: bool = False) -> None:
    """Build the streamed kernel (once per machine; cached) and let ``forward_mode="auto"`` PHM layers use it in
    inference at few rows; ``enabled=False`` turns that off again. Raises :class:`RuntimeError`, naming what is
    missing, when it cannot be built; nothing is changed then."""
    global _enabled, _env_failure
    if enabled:
        _build(verbose)
    _enabled = bool(enabled)
    _env_failure = None


def native_kernels_enabled() -> bool:
    """Whether ``auto`` PHM layers may take the streamed kernel: as :func:`enable_native_kernels` last set it, or,
    before any call of it, as ``HYPERPLEX_NATIVE`` says. Unset (or ``auto``): on if :func:`install_native_kernels`
    installed the build for this CPU, source and torch (looked for once per process, loaded without a compiler).
    On (``1``): this builds the kernel the first time it is asked (``auto`` asks only for a call the kernel would
    take) and raises :class:`RuntimeError`, naming the variable, if it cannot; a failed build is tried once per
    process, later calls raise the same error without compiling again. Off (``0``): off. An unrecognised value
    raises :class:`ValueError`."""
    global _enabled, _env_failure
    if _enabled is not None:
        return _enabled
    mode = _env_mode()
    if mode == "off":
        return False
    if mode == "installed":
        return _load_installed()
    if _env_failure is None:
        try:
            _build()
        except Exception as err:
            _env_failure = (f"{ENV_VAR}={os.environ[ENV_VAR]} asks for hyperplex's native PHM kernel, which could not "
                            f"be built: {err} (unset {ENV_VAR} or set it to 0 to run on PyTorch's paths)", err)
    if _env_failure is not None:
        message, cause = _env_failure
        raise RuntimeError(message) from cause
    _enabled = True
    return True


def _env_mode() -> str:
    """``"on"``, ``"off"`` or ``"installed"``, as ``HYPERPLEX_NATIVE`` says."""
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value in _ON:
        return "on"
    if value in _OFF:
        return "off"
    if value in _INSTALLED:
        return "installed"
    raise ValueError(f"environment variable {ENV_VAR}={os.environ[ENV_VAR]!r}: expected one of "
                     f"{', '.join(v for v in _ON + _OFF + _INSTALLED if v)} (or empty)")


def _sha256(path: Path) -> str:
    from hyperplex.fileio import sha256_file

    return sha256_file(path)


def installed_native_kernel() -> Path | None:
    """The compiled library that :func:`install_native_kernels` installed for this CPU, source and torch, if its
    mark is there and the library is the one it checked (same SHA-256); else ``None``. Loads nothing."""
    name = _library_name()
    marker = _build_folder(name) / INSTALL_MARKER
    library = _cached_library(name)
    if library is None or not marker.is_file():
        return None
    import json
    import warnings

    try:
        record = json.loads(marker.read_text())
        checked = record["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        checked = None
    if checked != _sha256(library):
        warnings.warn(f"hyperplex's native PHM kernel {library} is not the build that `hyperplex native` checked "
                      f"({marker} does not match it), so it is not used; run `hyperplex native` again to check and "
                      "install it", RuntimeWarning, stacklevel=2)
        return None
    return library


def _load_installed() -> bool:
    """Load the installed build once per process (``HYPERPLEX_NATIVE`` unset): ``True`` if there is one and it
    imports. Nothing is compiled; a library that does not import is left off with a warning."""
    global _installed, _module
    with _lock:
        if _installed is None:
            _installed = False
            library = installed_native_kernel()
            if library is not None:
                module = _module or _load_cached(_library_name())
                if module is None:
                    import warnings

                    warnings.warn(f"hyperplex's native PHM kernel {library} is installed but does not import, so it "
                                  "is not used; run `hyperplex native` again", RuntimeWarning, stacklevel=2)
                else:
                    _module, _installed = module, True
    return _installed


def streamable(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None) -> str | None:
    """``None`` if :func:`phm_linear_streamed` can run on these tensors, else the reason it cannot."""
    return cpu_inference_reason(x, rule, weight, bias)


def build_native_kernels(verbose: bool = False) -> str:
    """Build the streamed kernel, or load the copy cached for this machine, without turning it on or installing it
    (:func:`install_native_kernels` does both the build and the install); returns the path of the compiled
    library. Raises :class:`RuntimeError`, naming what is missing, when it cannot be built."""
    return _build(verbose).__file__


#: The shapes :func:`self_check` runs: ``(n, d, k, rows)``, covering the kernel's tiles and tails, a narrowing and
#: a widening layer, and ``n`` up to 16.
SELF_CHECK_SHAPES = ((2, 96, 100, 5), (3, 33, 12, 7), (4, 4096, 4096, 1), (8, 136, 72, 3), (16, 512, 256, 2),
                     (16, 80, 48, 1))


#: :func:`self_check`'s bound on the largest error relative to the largest output (float32 sums of up to 4,096
#: terms: about 1e-6 on a sound build).
SELF_CHECK_TOLERANCE = 1e-5


def self_check(tolerance: float = SELF_CHECK_TOLERANCE) -> list[dict]:
    """Run the built kernel on random layers of :data:`SELF_CHECK_SHAPES` (with a bias) against the Kronecker
    product in float64, and return one ``{"n", "d", "k", "rows", "error"}`` per shape, ``error`` the largest
    difference relative to the largest output. A ``-march=native`` binary that miscompiles or runs on the wrong
    CPU shows here rather than in a model's outputs: an error over ``tolerance`` raises :class:`RuntimeError`.
    Builds the kernel if needed; does not turn it on."""
    from hyperplex.layers.functional import phm_linear_reference

    module = _build()
    generator = torch.Generator().manual_seed(0)
    results = []
    for n, d, k, rows in SELF_CHECK_SHAPES:
        rule = torch.randn(n, n, n, generator=generator)
        weight = torch.randn(n, k // n, d // n, generator=generator) / d ** 0.5
        bias = torch.randn(k, generator=generator)
        x = torch.randn(rows, d, generator=generator)
        with torch.no_grad():
            y = module.phm_stream(x, rule, weight, bias)
            ref = phm_linear_reference(x.double(), rule.double(), weight.double(), bias.double())
        error = ((y.double() - ref).abs().max() / ref.abs().max()).item()
        results.append({"n": n, "d": d, "k": k, "rows": rows, "error": error})
        if not error <= tolerance:  # NaN fails too
            raise RuntimeError(f"the native PHM kernel ({module.__file__}) is wrong at n={n}, {d} -> {k}, {rows} "
                               f"rows: largest difference from the Kronecker product {error:.2e} of the largest "
                               f"output (tolerance {tolerance:.0e}); leave the kernel off and report this")
    return results


def install_native_kernels(verbose: bool = False) -> dict:
    """Build the streamed kernel (or load the copy cached for this machine), run :func:`self_check`, and mark this
    build installed: processes on this machine with ``HYPERPLEX_NATIVE`` unset then let ``auto`` PHM layers take
    it, loading it without a compiler. Returns ``{"library", "marker", "self_check"}``. A build that fails the
    self-check raises :class:`RuntimeError` and is not installed (an earlier mark for it is removed); so does a
    build that cannot be made. Does not turn the kernel on in this process (:func:`enable_native_kernels` does)."""
    import datetime
    import json

    from hyperplex.fileio import atomic_write_text

    global _installed
    _env_mode()  # an unrecognised HYPERPLEX_NATIVE is refused before a minute of compiling, not after
    name = _library_name()
    _build(verbose)
    library = _cached_library(name)  # the file later processes load: the one the mark vouches for
    marker = _build_folder(name) / INSTALL_MARKER
    if library is None:
        raise RuntimeError(f"hyperplex's native PHM kernel is built, but not found in {marker.parent}, where torch's "
                           "cache rule puts it (a build under way, or torch changed that rule): not installed; turn "
                           f"it on with {ENV_VAR}=1 or enable_native_kernels() instead")
    try:
        results = self_check()
    except RuntimeError:
        marker.unlink(missing_ok=True)
        raise
    record = {"library": library.name, "sha256": _sha256(library), "torch": torch.__version__,
              "installed": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
              "tolerance": SELF_CHECK_TOLERANCE, "self_check": results}
    atomic_write_text(marker, json.dumps(record, indent=1) + "\n")  # a reader sees the whole mark or none
    with _lock:
        _installed = None  # this process looks again when next asked
    return {"library": str(library), "marker": str(marker), "self_check": results}


def uninstall_native_kernels() -> str | None:
    """Remove the mark :func:`install_native_kernels` left for this CPU, source and torch (the compiled library
    stays cached); returns its path, or ``None`` if there was none. Processes started afterwards with
    ``HYPERPLEX_NATIVE`` unset stay on PyTorch's paths; this one does from its next call."""
    global _installed
    marker = _build_folder(_library_name()) / INSTALL_MARKER
    with _lock:
        _installed = None
    if not marker.is_file():
        return None
    marker.unlink()
    return str(marker)


def phm_linear_streamed(x: Tensor, rule: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``x Hᵀ + b`` with ``H = Σᵢ rule[i] ⊗ weight[i]``, through the compiled kernel (built on first call).
    ``x``: ``(..., d)`` → ``(..., k)``. Inference only: CPU, float32, no gradient (:class:`ValueError` for a tensor
    off the CPU, :class:`RuntimeError` for the rest)."""
    refuse_off_cpu("phm_linear_streamed (the native kernel)", "on a GPU leave the layer in forward_mode='auto', which "
                   "takes the GPU paths", x, rule, weight, bias)
    reason = streamable(x, rule, weight, bias)
    if reason is not None:
        raise RuntimeError(f"the streamed PHM kernel cannot run here: {reason}")
    n, k_n, _ = weight.shape
    y = _build().phm_stream(x.reshape(-1, x.shape[-1]), rule, weight, bias)
    return y.reshape(*x.shape[:-1], n * k_n)
