"""Files that are replaced whole or not at all: the one write-then-rename helper of the package.

Every file hyperplex writes into a model folder (checkpoints, vocabularies, tokenisers, metrics,
translations, converted models, adapters) goes through :func:`atomic_write`: the writer fills a
temporary file in a private folder beside the target, the file is fsynced and moved onto the
target with ``os.replace`` (atomic on POSIX), and the folder is fsynced. A kill at any instant
leaves either the old complete file or the new complete file, never a half-written one.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import shutil
from collections.abc import Callable

__all__ = ["WriteError", "default_file_mode", "temporary_sibling", "atomic_write", "atomic_write_text",
           "atomic_write_bytes", "TMP_PATTERN", "UnsafePathError", "inside", "check_folder_files", "read_bounded",
           "sha256_file", "FolderBusyError", "folder_lock", "LOCK_NAME"]

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


def default_file_mode() -> int:
    """The mode a plain ``open(path, "w")`` gives a new file: ``0o666`` less the umask. Writers that go through
    ``mkstemp`` leave ``0o600``; files put in place by hyperplex get this mode instead."""
    return 0o666 & ~_umask()


def temporary_sibling(path: str | os.PathLike) -> str:
    """A fresh private name ``.<name>.tmp-<pid>-<hex>`` next to ``path`` (it matches :data:`TMP_PATTERN`, so a
    folder left there by a killed process is recognised): where a file or folder is built before being renamed
    onto ``path``."""
    path = os.path.abspath(os.fspath(path))
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp-{os.getpid()}-{secrets.token_hex(4)}")


def atomic_write(path: str | os.PathLike, write: Callable[[str], object]) -> None:
    """Call ``write(tmp_path)``, fsync, then move the file onto ``path`` atomically (``os.replace``).

    ``tmp_path`` lies in a private folder ``.<name>.tmp-<pid>-<hex>/`` next to ``path`` (so any
    temporary file the writer makes itself lands there too); the folder is removed afterwards.
    Folders left by a killed process match :data:`TMP_PATTERN`. Raises :class:`WriteError` naming
    ``path`` when the file cannot be written (any exception from ``write`` other than ``OSError``
    propagates unchanged, after the temporary folder is removed).
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    tmp_dir = temporary_sibling(path)
    tmp = os.path.join(tmp_dir, os.path.basename(path))
    try:
        os.mkdir(tmp_dir)
        write(tmp)
        # Writers that go through mkstemp (safetensors, some savers) leave 0600; give the file the mode
        # a plain open() would (0666 less the umask), so a model folder stays readable by its group.
        os.chmod(tmp, default_file_mode())
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


# ---------------------------------------------------------------------------- untrusted folders
class UnsafePathError(ValueError):
    """A file name read from a file points outside its folder, or names something that is not a regular file."""


def inside(folder: str | os.PathLike, name, where: str) -> str:
    """The path of ``name`` (a file name read from ``where``) inside ``folder``.

    ``name`` must be a non-empty relative path string without ``..`` steps out of the folder, and must not
    resolve (symbolic links included) outside it; otherwise :class:`UnsafePathError` naming ``where``.
    Nothing is read or created."""
    if not isinstance(name, str) or not name or "\x00" in name:
        raise UnsafePathError(f"{where}: expected a file name inside {os.fspath(folder)}, got {_short(name)}")
    if os.path.isabs(name) or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafePathError(f"{where}: {name!r} is an absolute path; a name inside {os.fspath(folder)} is expected")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise UnsafePathError(f"{where}: {name!r} steps out of {os.fspath(folder)} ('..'); "
                              "a name inside it is expected")
    root = os.path.realpath(folder)
    path = os.path.join(os.fspath(folder), name)
    real = os.path.realpath(path)
    if real != root and not real.startswith(root + os.sep):
        raise UnsafePathError(f"{where}: {name!r} resolves to {real}, outside {root} (a symbolic link?)")
    return path


def _short(value) -> str:
    import reprlib

    return reprlib.repr(value)


def check_folder_files(folder: str | os.PathLike, max_entries: int = 10_000) -> None:
    """Refuse a model folder holding anything but regular files and folders inside it.

    FIFOs, sockets and device files would block or never end when read; a symbolic link may point
    outside the folder (``/dev/zero``, another model). Links that resolve to a regular file or folder
    inside ``folder`` are allowed. :class:`UnsafePathError` names the entry; nothing is opened."""
    import stat

    root = os.path.realpath(folder)
    count = 0
    for current, dirs, files in os.walk(os.fspath(folder), followlinks=False):
        for name in dirs + files:
            count += 1
            if count > max_entries:
                raise UnsafePathError(f"{os.fspath(folder)}: more than {max_entries} files; not a model folder")
            path = os.path.join(current, name)
            rel = os.path.relpath(path, folder)
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode):
                real = os.path.realpath(path)
                if real != root and not real.startswith(root + os.sep):
                    raise UnsafePathError(f"{path}: a symbolic link to {real}, outside the model folder {root}")
                try:
                    info = os.stat(path)
                except OSError:
                    raise UnsafePathError(f"{path}: a broken symbolic link") from None
            if not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                kind = "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device or socket"
                raise UnsafePathError(f"{path}: {kind}, not a regular file; a model folder holds regular files "
                                      f"only ({rel})")


def read_bounded(path: str | os.PathLike, limit: int, where: str | None = None) -> bytes:
    """The bytes of the regular file ``path``, refused (:class:`UnsafePathError`) when it is not a regular
    file or is larger than ``limit`` bytes; a FIFO is detected without blocking."""
    import stat

    path = os.fspath(path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnsafePathError(f"{where or path}: not a regular file")
        if info.st_size > limit:
            raise UnsafePathError(f"{where or path}: {info.st_size:,} bytes, more than the {limit:,} a file of this "
                                  f"kind may have")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise UnsafePathError(f"{where or path}: more than {limit:,} bytes")
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of a file's bytes, read in 1 MiB blocks."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ---------------------------------------------------------------------------- one owner per model folder
#: The lock file a run keeps open (and ``flock``-ed) in the model folder it writes.
LOCK_NAME = ".hyperplex.lock"
_HELD: dict[str, list] = {}  # realpath -> [fd, depth]: the locks this process holds (re-entered, not re-taken)


class FolderBusyError(RuntimeError):
    """Another live process holds the model folder's lock; the message names its pid and command."""


def _open_lock(folder: str) -> int:
    """Open (creating) ``folder/.hyperplex.lock`` without following a symbolic link and without blocking on a
    FIFO; refuse (:class:`UnsafePathError`) a lock that is not a regular file, which truncating or writing
    would damage outside the folder or block on."""
    import stat

    path = os.path.join(folder, LOCK_NAME)
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        info = None
    if info is not None and not stat.S_ISREG(info.st_mode):
        kind = ("a symbolic link" if stat.S_ISLNK(info.st_mode) else "a folder" if stat.S_ISDIR(info.st_mode)
                else "a FIFO" if stat.S_ISFIFO(info.st_mode) else "a device or socket")
        raise UnsafePathError(f"{path}: the lock file is {kind}, not a regular file; remove it (hyperplex "
                              f"creates a plain file there)")
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as err:
        if err.errno == errno.ELOOP:  # replaced by a link between the check and the open
            raise UnsafePathError(f"{path}: the lock file is a symbolic link, not a regular file; remove it") from None
        raise WriteError(f"model folder {folder} is not writable: {err.strerror or err} (its lock file "
                         f"{LOCK_NAME})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UnsafePathError(f"{path}: the lock file is not a regular file; remove it")
    return fd


@contextlib.contextmanager
def folder_lock(folder: str | os.PathLike, command: str, transient: tuple[str, ...] = ()):
    """Hold an exclusive advisory lock (``fcntl.flock``) on ``folder/.hyperplex.lock`` for the ``with`` body.

    Every verb that writes a model folder takes it, so two runs never mix their files in one folder. The
    file records the holder's pid, start time and ``command`` for the message another process gets
    (:class:`FolderBusyError`). The kernel drops the lock when its process ends, however it ends, so a
    killed run leaves no live lock: a lock file whose lock can be taken is stale and simply taken over.
    Re-entrant within one process. A folder created here and left holding only the lock file (and the
    ``transient`` files, e.g. the log a run opens before it checks its data) is removed again on the way
    out, so a run refused before writing its config or a checkpoint leaves nothing. ``ValueError`` when
    ``folder`` exists and is not a folder."""
    folder = os.fspath(folder)
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(f"{folder}: is a file, not a model folder")
    key = os.path.realpath(folder)
    if key in _HELD:
        _HELD[key][1] += 1
        try:
            yield
        finally:
            _HELD[key][1] -= 1
        return
    created = not os.path.exists(folder)
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        raise WriteError(f"model folder {folder} is not writable: {err.strerror or err}") from None
    fd = _open_lock(folder)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - no flock on this platform: runs are not guarded
        fcntl = None  # type: ignore[assignment]
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pass  # a file system without flock (some network mounts): runs there are not guarded
            else:
                holder = os.read(fd, 4096).decode("utf-8", "replace").strip() or "unknown"
                os.close(fd)
                raise FolderBusyError(f"{folder} is in use by another hyperplex run ({holder}); wait for it to end "
                                      f"or choose another model folder") from None
    import datetime
    import time

    started = datetime.datetime.fromtimestamp(time.time(), datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()}, `{command}`, since {started}\n".encode(), 0)
    _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        del _HELD[key]
        left = os.listdir(folder)
        if created and set(left) <= {LOCK_NAME, *transient}:
            try:
                for name in left:
                    os.unlink(os.path.join(folder, name))
                os.rmdir(folder)
            except OSError:
                pass
        else:
            os.ftruncate(fd, 0)
        os.close(fd)  # releases the flock
