"""The checks every verb that writes, and every name that becomes a path, goes through.

* :func:`check_output` — a file a verb is about to write is not one of its inputs, not a folder, FIFO or
  device, and not a file of a model folder the verb does not own (a checkpoint, ``config.yaml``,
  ``config.json`` …): replacing it would break that model.
* :func:`check_output_folder` — a folder a verb writes a model into does not hold another model (one the
  verb did not write, or the very model being saved was loaded from).
* :func:`write_set` — several files that belong together (a corpus and its report, weights and their
  spec) are all written to temporary files first and only then renamed into place, the one that marks the
  set complete last: a failure while writing (a full disk) leaves every old file as it was.
* :func:`check_name` — a name read from a plan, a config or the command line that becomes one folder or
  file name (``OUT/NAME``) is one plain path component: not empty, ``.``, ``..``, nor holding a separator.
* :func:`check_finite` — the one rule for NaN and infinite weights, applied when converted, quantised and
  adapter files are saved and when they are loaded.
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
from collections.abc import Callable, Iterable, Sequence

from hyperplex.fileio import LOCK_NAME, WriteError, _fsync_dir, default_file_mode, temporary_sibling

__all__ = ["OutputError", "check_output", "check_output_folder", "model_folder_kind", "write_set", "check_name",
           "check_finite", "NonFiniteError", "describe_file_type", "check_outputs", "check_distinct",
           "input_file_problem", "check_input_file", "InputFileError"]

#: Files whose presence makes a folder a model folder, most specific first: (file name, what it is).
MODEL_MARKERS = (
    ("hyperplex_quantize.json", "int8 model written by save_quantized"),
    ("hyperplex_convert.json", "converted model written by save_converted"),
    ("adapter.json", "adapter written by save_adapter"),
    ("checkpoints.json", "model folder of `hyperplex train`"),
    ("config.yaml", "model folder of `hyperplex train`"),
    (LOCK_NAME, "model folder of `hyperplex train`"),
    ("modules.json", "SentenceTransformer model"),
    ("config.json", "Hugging Face model"),
)
#: Weight files of any library: a folder holding one is a model folder.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".onnx")


class OutputError(ValueError):
    """An output would replace an input, another model's file, or something that is not a regular file."""


def describe_file_type(mode: int) -> str:
    """``a folder``, ``a FIFO``, ``a device`` … for an ``st_mode`` that is not a regular file's."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a file" if stat.S_ISREG(mode) else "not a regular file"


def model_folder_kind(folder: str | os.PathLike) -> tuple[str, str] | None:
    """``(marker file, description)`` of the model ``folder`` holds, or ``None`` when it holds none."""
    folder = os.fspath(folder)
    try:
        names = set(os.listdir(folder))
    except OSError:
        return None
    for marker, what in MODEL_MARKERS:
        if marker in names:
            return marker, what
    weights = sorted(n for n in names if n.endswith(WEIGHT_SUFFIXES))
    return (weights[0], "model weights") if weights else None


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)


def check_output(path: str | os.PathLike, option: str, inputs: Iterable = (), owns: Sequence[str] = ()) -> str:
    """Refuse (:class:`OutputError` naming ``option`` and ``path``) a file output that is one of ``inputs``
    (files or folders read by the same command), an existing folder, FIFO or device, or an existing file of a
    model folder (:func:`model_folder_kind`) whose name matches none of the ``owns`` patterns. A new file in a
    model folder is allowed. Nothing is written; returns ``path``."""
    path = os.fspath(path)
    for source in inputs:
        if source is not None and os.path.exists(source) and _same(source, path):
            raise OutputError(f"{option} {path}: is also an input of this command ({os.fspath(source)}); "
                              f"write to another file")
    if not os.path.lexists(path):
        return path
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise OutputError(f"{option} {path}: a broken symbolic link; write to another file") from None
    if not stat.S_ISREG(mode):
        raise OutputError(f"{option} {path}: is {describe_file_type(mode)}; a file to write is expected")
    real = os.path.realpath(path)
    kind = model_folder_kind(os.path.dirname(real))
    if kind is not None and kind[1] == "model weights" and not real.endswith(WEIGHT_SUFFIXES):
        kind = None  # a folder of checkpoints only: its weight files are its model, other files are not
    if kind is not None and not any(fnmatch.fnmatch(os.path.basename(real), p) for p in owns):
        raise OutputError(f"{option} {path}: is a file of the {kind[1]} in {os.path.dirname(real)} ({kind[0]}); "
                          f"replacing it would change that model. Write to another file")
    return path


def check_distinct(outputs: dict[str, str | os.PathLike | None]) -> None:
    """Refuse two options naming the same output file (``{option: path}``; ``None`` is skipped)."""
    seen: dict[str, str] = {}
    for option, path in outputs.items():
        if path is None:
            continue
        key = os.path.realpath(path)
        if key in seen:
            raise OutputError(f"{option} {path}: is also the output of {seen[key]}; give each output its own file")
        seen[key] = option


def check_outputs(outputs: dict[str, str | os.PathLike | None], inputs: Iterable = (),
                  owns: Sequence[str] = ()) -> None:
    """:func:`check_distinct` and :func:`check_output` for each ``{option: path}`` (``None``: not written)."""
    check_distinct(outputs)
    inputs = [i for i in inputs if i is not None]
    for option, path in outputs.items():
        if path is not None:
            check_output(path, option, inputs, owns)


def check_output_folder(folder: str | os.PathLike, option: str, own_marker: str | tuple[str, ...],
                        inputs: Iterable = ()) -> str:
    """Refuse (:class:`OutputError`) a model folder output that exists and is not a folder, is a folder one
    of ``inputs`` names (the folder a model was loaded from), or holds a model (:func:`model_folder_kind`)
    other than one marked by ``own_marker`` (the spec file, or files, the verb writes). Nothing is written."""
    folder = os.fspath(folder)
    if os.path.lexists(folder):
        try:
            mode = os.stat(folder).st_mode
        except OSError:
            raise OutputError(f"{option} {folder}: a broken symbolic link; a folder is expected") from None
        if not stat.S_ISDIR(mode):
            raise OutputError(f"{option} {folder}: is {describe_file_type(mode)}, not a model folder")
    for source in inputs:
        if source is not None and os.path.isdir(source) and _same(source, folder):
            raise OutputError(f"{option} {folder}: is the folder this model was loaded from; writing there would "
                              f"replace the original. Choose another folder")
    kind = model_folder_kind(folder)
    own = (own_marker,) if isinstance(own_marker, str) else own_marker
    if kind is not None and kind[0] not in own:
        raise OutputError(f"{option} {folder}: holds a {kind[1]} ({kind[0]}), not one this command writes; "
                          f"choose another folder")
    return folder


def write_set(items: Sequence[tuple[str | os.PathLike, Callable[[str], object]]]) -> None:
    """Write several files as one set: each ``write(tmp_path)`` fills a temporary file beside its target, and
    only when every one has been written (and fsynced) are they renamed into place, in order, so the last
    item (the report, the spec) appears last. A writer that fails (a full disk) leaves every target as it
    was; :class:`~hyperplex.fileio.WriteError` names the file."""
    staged: list[tuple[str, str, str]] = []
    replaced: list[str] = []
    current = os.fspath(items[0][0]) if items else ""  # the file being staged or replaced, for the message
    try:
        for path, write in items:
            path = current = os.fspath(path)
            tmp_dir = temporary_sibling(path)
            os.mkdir(tmp_dir)
            tmp = os.path.join(tmp_dir, os.path.basename(path))
            staged.append((tmp_dir, tmp, path))
            try:
                write(tmp)
                os.chmod(tmp, default_file_mode())
                fd = os.open(tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except OSError as err:
                raise WriteError(f"{path}: cannot write ({err.strerror or err}); nothing of this set was "
                                 f"replaced") from err
        for _, tmp, path in staged:
            current = path
            os.replace(tmp, path)  # a rename within one folder: fails only in exotic cases, never for space
            replaced.append(path)
        for directory in {os.path.dirname(os.path.abspath(path)) for _, _, path in staged}:
            _fsync_dir(directory)
    except OSError as err:
        if isinstance(err, WriteError):
            raise
        done = (f"{len(replaced)} of {len(staged)} files were replaced" if replaced
                else "nothing of this set was replaced")
        raise WriteError(f"{current}: cannot write ({err.strerror or err}); {done}") from err
    finally:
        for tmp_dir, _, _ in staged:
            shutil.rmtree(tmp_dir, ignore_errors=True)


def input_file_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be read as a file — ``"does not exist"``, ``"is a folder"``, ``"is a FIFO"`` … — or
    ``None`` for a regular file (symbolic links followed). Nothing is opened, so a FIFO never blocks."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "is a broken symbolic link" if os.path.islink(path) else "does not exist"
    except OSError as err:
        return f"cannot be read ({err.strerror or err})"
    return None if stat.S_ISREG(mode) else f"is {describe_file_type(mode)}, not a regular file"


def check_input_file(path: str | os.PathLike, what: str) -> str:
    """``path`` when it is a regular file; else ``FileNotFoundError`` (missing) or :class:`InputFileError`
    (a folder, FIFO, device …), each naming ``what`` (the option or key) and the path."""
    problem = input_file_problem(path)
    if problem == "does not exist":
        raise FileNotFoundError(f"{what}: {os.fspath(path)} does not exist")
    if problem is not None:
        raise InputFileError(f"{what}: {os.fspath(path)} {problem}; a file is expected")
    return os.fspath(path)


class InputFileError(ValueError):
    """A path given as an input file is a folder, a FIFO, a device or a broken link."""


def check_name(name, where: str) -> str:
    """``name`` (read from ``where``) as one plain path component: a non-empty string that is not ``.`` or
    ``..`` and holds no ``/``, ``\\``, NUL or control character; otherwise :class:`ValueError` naming
    ``where``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"{where}: {name!r} is not a name; expected a non-empty folder name")
    if name in (".", "..") or any(c in name for c in "/\\") or any(ord(c) < 32 for c in name):
        raise ValueError(f"{where}: {name!r} cannot be a folder name (no '.', '..', path separators or control "
                         f"characters); it becomes a folder of the output")
    return name


class NonFiniteError(ValueError):
    """A tensor to save or load holds NaN or infinite values; the message names the file and the tensor."""


def check_finite(tensors, where: str) -> None:
    """Refuse (:class:`NonFiniteError` naming ``where`` and the first tensor) floating tensors holding NaN or
    infinity: such weights give NaN outputs, and a file holding them could never be loaded. ``tensors``: a
    mapping or ``(name, tensor)`` pairs; integer tensors are skipped."""
    import torch

    items = tensors.items() if hasattr(tensors, "items") else tensors
    for name, tensor in items:
        if isinstance(tensor, torch.Tensor) and tensor.is_floating_point() and tensor.device.type != "meta":
            if not bool(torch.isfinite(tensor).all()):
                bad = int((~torch.isfinite(tensor)).sum())
                raise NonFiniteError(f"{where}: tensor {name!r} holds NaN or infinite values ({bad:,} of "
                                     f"{tensor.numel():,}); weights must be finite")
