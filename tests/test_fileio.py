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
