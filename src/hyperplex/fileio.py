"""Files that are replaced whole or not at all: the one write-then-rename helper of the package.

Every file hyperplex writes into a model folder (checkpoints, vocabularies, tokenisers, metrics,
translations, converted models, adapters) goes through :func:`atomic_write`: the writer fills a
temporary file in a private folder beside the target, the file is fsynced and moved onto the
target with ``os.replace`` (atomic on POSIX), and the folder is fsynced. A kill at any instant
leaves either the old complete file or the new complete file, never a half-written one.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable

__all__ = ["WriteError", "atomic_write", "atomic_write_text", "atomic_write_bytes", "TMP_PATTERN"]

#: Names of the private temporary folders :func:`atomic_write` makes (left behind only by a kill).
TMP_PATTERN = re.compile(r"^\..+\.tmp-\d+-[0-9a-f]{8}$")


class WriteError(OSError):
    """A file could not be written; the message names it and says the old file is unchanged."""


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # platforms without directory handles (Windows)
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read it is to set it; restored at once
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[str], None]) -> None:
    """Call ``write(tmp_path)``, fsync, then move the file onto ``path`` atomically (``os.replace``).

    ``tmp_path`` lies in a private folder ``.<name>.tmp-<pid>-<hex>/`` next to ``path`` (so any
    temporary file the writer makes itself lands there too); the folder is removed afterwards.
    Folders left by a killed process match :data:`TMP_PATTERN`. Raises :class:`WriteError` naming
    ``path`` when the file cannot be written (any exception from ``write`` other than ``OSError``
    propagates unchanged, after the temporary folder is removed).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp_dir = os.path.join(directory, f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
    tmp = os.path.join(tmp_dir, os.path.basename(path))
    try:
        os.mkdir(tmp_dir)
        write(tmp)
        # Writers that go through mkstemp (safetensors, some savers) leave 0600; give the file the mode
        # a plain open() would (0666 less the umask), so a model folder stays readable by its group.
        os.chmod(tmp, 0o666 & ~_umask())
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)  # the data reaches the disk before the rename makes it visible
        finally:
            os.close(fd)
        os.replace(tmp, path)
        _fsync_dir(directory)
    except OSError as e:
        reason = e.strerror or e
        raise WriteError(f"{path}: cannot write ({reason}); the previous file, if any, is unchanged") from e
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` through :func:`atomic_write`."""
    def write(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            handle.write(data)
    atomic_write(path, write)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8, ``\\n`` line ends kept as given) to ``path`` through :func:`atomic_write`."""
    atomic_write_bytes(path, text.encode("utf-8"))
