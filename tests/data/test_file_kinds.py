"""A FIFO, a folder or a device given where a data file is expected is named as such, never "file not found",
and is never opened (a FIFO would block the read for ever)."""

from __future__ import annotations

import os

import pytest

from hyperplex.data.readers import DataError, DataFileNotFoundError, read_lines
from hyperplex.tasks.common import data_file

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@pytest.fixture
def kinds(tmp_path):
    os.mkfifo(tmp_path / "fifo.txt")
    (tmp_path / "folder.txt").mkdir()
    (tmp_path / "broken.txt").symlink_to(tmp_path / "nowhere")
    return tmp_path


@pytest.mark.parametrize("name,kind", [("fifo.txt", "is a FIFO, not a regular file"),
                                       ("folder.txt", "is a folder, not a regular file"),
                                       ("broken.txt", "is a broken symbolic link")])
def test_readers_and_config_files_name_what_the_path_is(kinds, name, kind):
    with pytest.raises(DataError, match=f"{name}: {kind}; a text file is expected") as err:
        read_lines(kinds / name)
    assert not isinstance(err.value, DataFileNotFoundError)
    with pytest.raises(DataError, match=f"data.train: .*{name} {kind}; a data file is expected"):
        data_file(str(kinds / name), None)


def test_a_device_is_not_a_data_file(kinds):
    with pytest.raises(DataError, match=r"/dev/null: is a device, not a regular file"):
        read_lines("/dev/null")
    with pytest.raises(DataFileNotFoundError, match="file not found"):
        read_lines(kinds / "missing.txt")


def test_corpus_names_a_fifo_exclusion_file_and_writes_nothing(kinds, capsys):
    from hyperplex.cli.main import main

    assert main(["corpus", str(kinds / "out.txt"), "--data-root", str(kinds), "--exclude", str(kinds / "fifo.txt"),
                 "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "fifo.txt: is a FIFO, not a regular file; a data file is expected" in err
    assert sorted(os.listdir(kinds)) == ["broken.txt", "fifo.txt", "folder.txt"]
