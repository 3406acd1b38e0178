"""hyperplex.guards: the one output guard, the one set writer, the one name rule and the one finite-weights rule."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch

from hyperplex.fileio import LOCK_NAME, TMP_PATTERN, WriteError
from hyperplex.guards import (
    InputFileError,
    NonFiniteError,
    OutputError,
    check_finite,
    check_input_file,
    check_name,
    check_output,
    check_output_folder,
    check_outputs,
    model_folder_kind,
    write_set,
)


def listing(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("marker,what", [("hyperplex_quantize.json", "int8 model"), ("config.json", "Hugging Face"),
                                         ("checkpoints.json", "hyperplex train"), (LOCK_NAME, "hyperplex train")])
def test_a_file_of_a_model_folder_is_refused_a_new_file_beside_it_is_not(tmp_path, marker, what):
    (tmp_path / marker).write_text("{}")
    (tmp_path / "notes.txt").write_text("keep")
    assert what in model_folder_kind(tmp_path)[1]
    with pytest.raises(OutputError, match=rf"-o {tmp_path / 'notes.txt'}: is a file of the .*{what}.* in {tmp_path}"):
        check_output(tmp_path / "notes.txt", "-o")
    assert check_output(tmp_path / "notes.txt", "-o", owns=("*.txt",)) == str(tmp_path / "notes.txt")
    assert check_output(tmp_path / "new.txt", "-o") == str(tmp_path / "new.txt")
    assert (tmp_path / "notes.txt").read_text() == "keep"


def test_an_input_a_folder_a_link_to_an_input_and_two_equal_outputs_are_refused(tmp_path):
    source = tmp_path / "in.txt"
    source.write_text("x")
    (tmp_path / "link.txt").symlink_to(source)
    for path in (source, tmp_path / "link.txt"):
        with pytest.raises(OutputError, match="is also an input of this command"):
            check_output(path, "-o", inputs=[source])
    with pytest.raises(OutputError, match="is a folder; a file to write is expected"):
        check_output(tmp_path, "-o")
    with pytest.raises(OutputError, match="--plot-attention .*: is also the output of -o"):
        check_outputs({"-o": tmp_path / "a", "--plot-attention": tmp_path / "a"})
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        with pytest.raises(OutputError, match="is a FIFO"):
            check_output(tmp_path / "fifo", "-o")


def test_a_folder_output_holding_another_model_or_the_source_is_refused(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "hyperplex_convert.json").write_text("{}")
    with pytest.raises(OutputError, match="is the folder this model was loaded from"):
        check_output_folder(tmp_path / "src", "save_converted", "hyperplex_convert.json", [tmp_path / "src"])
    with pytest.raises(OutputError, match=r"holds a converted model written by save_converted"):
        check_output_folder(tmp_path / "src", "save_quantized", "hyperplex_quantize.json")
    assert check_output_folder(tmp_path / "src", "save_converted", "hyperplex_convert.json")
    assert check_output_folder(tmp_path / "new", "save_converted", "hyperplex_convert.json")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="is a file, not a model folder"):
        check_output_folder(tmp_path / "file", "OUT", ())


def test_a_set_is_written_whole_or_not_at_all(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.json"
    write_set([(a, lambda t: Path(t).write_text("a1")), (b, lambda t: Path(t).write_text("b1"))])
    assert listing(tmp_path) == {"a.txt": b"a1", "b.json": b"b1"}

    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(WriteError, match=r"b.json: cannot write \(No space left on device\); nothing of this set"):
        write_set([(a, lambda t: Path(t).write_text("a2")), (b, full)])
    assert listing(tmp_path) == {"a.txt": b"a1", "b.json": b"b1"}
    assert not [p for p in os.listdir(tmp_path) if TMP_PATTERN.match(p)]  # no temporary folder left
    with pytest.raises(ZeroDivisionError):  # any other error of a writer: the same, propagated unchanged
        write_set([(a, lambda t: Path(t).write_text("a3")), (b, lambda t: 1 / 0)])
    assert listing(tmp_path) == {"a.txt": b"a1", "b.json": b"b1"}


def test_a_set_whose_second_folder_refuses_names_that_folders_file(tmp_path, monkeypatch):
    """The failing file is named, not the one staged before it (a records folder that is read-only)."""
    ok, blocked = tmp_path / "out", tmp_path / "records"
    ok.mkdir(), blocked.mkdir()
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):
        if os.path.dirname(os.fspath(path)) == str(blocked):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    with pytest.raises(WriteError, match=r"records/results.json: cannot write \(Read-only file system\); nothing"):
        write_set([(ok / "results.md", lambda t: Path(t).write_text("x")),
                   (blocked / "results.json", lambda t: Path(t).write_text("y"))])
    assert listing(ok) == {} and listing(blocked) == {}


@pytest.mark.parametrize("name", ["", " ", ".", "..", "a/b", "..\\x", "a\x00", "tab\there", None, 3])
def test_names_that_are_not_one_plain_path_component_are_refused(name):
    with pytest.raises(ValueError, match="plan.yaml: row"):
        check_name(name, "plan.yaml: row")


def test_plain_names_pass():
    for name in ("seed1", "phm_n4", "lr1e-05", "a.b", "+x"):
        assert check_name(name, "row") == name


def test_the_finite_rule_names_the_tensor_and_skips_integers():
    check_finite({"a": torch.ones(3), "i": torch.tensor([1, 2])}, "f")
    with pytest.raises(NonFiniteError, match=r"f: tensor 'b' holds NaN or infinite values \(2 of 3\)"):
        check_finite([("a", torch.ones(2)), ("b", torch.tensor([1.0, float("nan"), float("-inf")]))], "f")


def test_input_files_are_named_by_what_they_are(tmp_path):
    (tmp_path / "f").write_text("x")
    assert check_input_file(tmp_path / "f", "--x") == str(tmp_path / "f")
    with pytest.raises(FileNotFoundError, match=r"--x: .*missing does not exist"):
        check_input_file(tmp_path / "missing", "--x")
    with pytest.raises(InputFileError, match=r"--x: .* is a folder, not a regular file; a file is expected"):
        check_input_file(tmp_path, "--x")


def test_in_a_folder_of_checkpoints_only_the_weights_are_the_model(tmp_path):
    (tmp_path / "a.safetensors").write_bytes(b"w")
    (tmp_path / "out.txt").write_text("old translation")
    assert check_output(tmp_path / "out.txt", "-o") == str(tmp_path / "out.txt")
    with pytest.raises(OutputError, match="is a file of the model weights"):
        check_output(tmp_path / "a.safetensors", "-o")
