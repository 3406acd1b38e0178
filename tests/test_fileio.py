"""hyperplex.fileio.atomic_write: the old file survives a failing writer, no temporary folder is left,
and the new file gets the mode a plain open() would give (0666 less the umask), not mkstemp's 0600."""

import os
import stat
import tempfile

import pytest

from hyperplex.fileio import TMP_PATTERN, WriteError, atomic_write, atomic_write_bytes, atomic_write_text


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
def test_file_mode_is_that_of_open_not_mkstemp(tmp_path):
    def write_private(tmp: str) -> None:  # as tempfile.mkstemp-based writers do
        fd, scratch = tempfile.mkstemp(dir=os.path.dirname(tmp))
        os.write(fd, b"weights")
        os.close(fd)
        os.replace(scratch, tmp)

    target = tmp_path / "model.safetensors"
    atomic_write(target, write_private)
    assert target.read_bytes() == b"weights"
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~_umask()
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    atomic_write_text(tmp_path / "atomic.txt", "x")
    assert stat.S_IMODE((tmp_path / "atomic.txt").stat().st_mode) == stat.S_IMODE(plain.stat().st_mode)


def test_failing_writer_keeps_the_old_file_and_leaves_no_temporary_folder(tmp_path):
    target = tmp_path / "last.safetensors"
    atomic_write_bytes(target, b"old")

    def broken(tmp: str) -> None:
        with open(tmp, "wb") as handle:
            handle.write(b"half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError, match="killed mid-write"):
        atomic_write(target, broken)
    assert target.read_bytes() == b"old"
    assert not [p for p in os.listdir(tmp_path) if TMP_PATTERN.match(p)]


def test_unwritable_folder_is_a_write_error_naming_the_file(tmp_path):
    target = tmp_path / "missing_folder" / "vocab.json"
    with pytest.raises(WriteError, match="missing_folder/vocab.json: cannot write"):
        atomic_write_text(target, "{}")


# ---------------------------------------------------------------------------- untrusted folders
def test_inside_keeps_names_in_their_folder(tmp_path):
    from hyperplex.fileio import UnsafePathError, inside

    (tmp_path / "sub").mkdir()
    assert inside(tmp_path, "sub/a.json", "spec: key 'x'") == os.path.join(os.fspath(tmp_path), "sub/a.json")
    for name in ("../a", "/etc/passwd", "sub/../../a", "", None, 5, "a\x00b"):
        with pytest.raises(UnsafePathError, match="spec: key 'x'"):
            inside(tmp_path, name, "spec: key 'x'")
    os.symlink("/etc", tmp_path / "link")
    with pytest.raises(UnsafePathError, match="outside"):
        inside(tmp_path, "link/passwd", "spec: key 'x'")


def test_read_bounded_refuses_fifos_and_large_files_without_blocking(tmp_path):
    from hyperplex.fileio import UnsafePathError, read_bounded

    (tmp_path / "small").write_bytes(b"abc")
    assert read_bounded(tmp_path / "small", 3) == b"abc"
    with pytest.raises(UnsafePathError, match="4 bytes, more than the 3"):
        (tmp_path / "big").write_bytes(b"abcd")
        read_bounded(tmp_path / "big", 3)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(UnsafePathError, match="not a regular file"):
            read_bounded(tmp_path / "fifo", 10)
