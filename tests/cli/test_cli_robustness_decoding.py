"""Robustness of decoding, translation and thread use, driven through
``hyperplex.cli.main`` like ``tests/cli/test_cli_robustness.py``: exit code, stdout and every stderr
line are checked.

- A line longer than the Transformer's positions is cut with one warning naming it; every
  other line is translated; one output line per input line; the same from stdin.
- A model that ranks ``<s>``/``<pad>`` first never emits them (it ends at ``</s>``);
  ``evaluate`` and file translation draw a progress bar on a terminal's stderr and nothing otherwise.
- ``--threads`` for ``evaluate``/``translate``/``demo`` (0 = the rule of
  ``hyperplex.threads``; negative or non-integer: one error line naming ``--threads``), and
  ``training.num_threads: 0`` choosing one thread for a tiny model.
- More hostile inputs for translate/evaluate: blank-only files, CRLF, a BOM, NUL bytes, invalid
  UTF-8 on stdin vs ``-i``, a 100,000-character token, Unicode line separators, a directory as
  input, an unknown checkpoint, bad beam sizes, a model folder without a vocabulary.

One tiny word-level Transformer (``max_positions`` 8, so 7 source tokens) is trained for 40 steps
once per module, until it copies the mapping ``wI wJ wK → vK vJ vI``-like pairs of its 16 training
sentences; tests that change a model work on a copy.
"""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from hyperplex.cli import main
from hyperplex.train.checkpoint import load_model_weights, save_model_weights
from hyperplex.train.run import train

EN = [f"w{i} w{(3 * i) % 7} w{(5 * i) % 11}" for i in range(16)]
DE = [f"v{(5 * i) % 11} v{(3 * i) % 7} v{i}" for i in range(16)]
LIMIT = 7  # max_positions 8, one position for </s>
CUT_WARNING = ("longer than the model's 7 tokens (model.max_positions=8, one position kept for </s>); "
               "translated its first 7 tokens")


def mt_config(data: Path, architecture: dict, **training) -> dict:
    return {"name": "mt", "seed": 3,
            "data": {"task": "translation", "format": "parallel", "train": str(data / "train"),
                     "dev": str(data / "dev"), "src": "en", "tgt": "de", "tokenizer": "word", "vocab_size": 100},
            "model": architecture,
            "training": {"lr": 0.01, "batch_size": 32, "max_steps": 40, "validation_every": 40, "log_every": 40,
                         "num_threads": 0, "progress_bar": False, "plots": False, "device": "cpu", **training},
            "testing": {"beam_size": 1, "max_output_length": 8, "batch_size": 16}}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Data files and two trained model folders: ``mt`` (Transformer, 8 positions, untied output layer)
    and ``lstm`` (an LSTM translator, no position limit, 2 steps). Training with ``num_threads: 0``
    must leave torch at one thread (the rule, for a 16-wide model)."""
    root = tmp_path_factory.mktemp("decoding")
    data = root / "data"
    data.mkdir()
    for name, lines in (("train.en", EN), ("train.de", DE), ("dev.en", EN[:4]), ("dev.de", DE[:4])):
        (data / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    transformer = {"architecture": "transformer", "d_model": 16, "num_heads": 2, "d_ff": 32, "encoder_layers": 1,
                   "decoder_layers": 1, "dropout": 0.0, "max_positions": 8, "tie_embeddings": False}
    lstm = {"architecture": "rnn_translator", "embedding_dim": 8, "hidden_size": 8, "encoder_layers": 1,
            "decoder_layers": 1, "dropout": 0.0}
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for name, arch, extra in (("mt", transformer, {}), ("lstm", lstm, {"max_steps": 2, "validation_every": 2})):
            path = root / f"{name}.yaml"
            path.write_text(yaml.safe_dump(mt_config(data, arch, **extra)), encoding="utf-8")
            train(str(path), model_dir=str(root / name))
        threads_after_training = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    return SimpleNamespace(root=root, data=data, mt=root / "mt", lstm=root / "lstm",
                           threads_after_training=threads_after_training)


def run(capsys, *argv, stdin: bytes | None = None, monkeypatch=None) -> tuple[int, str, list[str]]:
    """``hyperplex ARGV`` in-process (stdin from bytes if given): (exit code, stdout, stderr lines)."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    return code, out, err.splitlines()


def fail(capsys, *argv, **kwargs) -> str:
    """Exit code 1 and exactly one stderr line ``hyperplex VERB: error: …``; returns what follows."""
    code, out, err = run(capsys, *argv, **kwargs)
    prefix = f"hyperplex {argv[0]}: error: "
    assert code == 1 and len(err) == 1 and err[0].startswith(prefix), (code, err)
    return err[0][len(prefix):]


def translate_file(capsys, model: Path, tmp_path: Path, content: bytes, *options) -> tuple[list[str], list[str]]:
    """Translate ``content`` as a file with ``-i``/``-o``; exit 0 and empty stdout are checked;
    returns (output lines, stderr lines)."""
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(content)
    code, stdout, err = run(capsys, "translate", model, "-i", src, "-o", out, *options)
    assert code == 0 and stdout == "", err
    text = out.read_text(encoding="utf-8")
    assert text.endswith("\n") or text == ""
    return text.splitlines(), err


def translations(capsys, model: Path, lines: list[str], tmp_path: Path) -> list[str]:
    """Reference outputs: ``lines`` (none of them over-long) translated one file per line."""
    outputs = []
    for line in lines:
        got, err = translate_file(capsys, model, tmp_path, (line + "\n").encode())
        assert err == [] and len(got) == 1
        outputs.append(got[0])
    return outputs


# ---------------------------------------------------------------------------- over-long lines
LONG = " ".join(f"w{i}" for i in range(1, 13))  # 12 tokens; the first 7 are w1 … w7
FIRST_7 = " ".join(f"w{i}" for i in range(1, 8))


def test_the_trained_model_translates(world, capsys, tmp_path):
    """The fixture's model must produce real sentences, or the checks below would compare empty lines."""
    got = translations(capsys, world.mt, EN[:3], tmp_path)
    assert got == DE[:3]


def test_an_over_long_line_is_cut_with_a_warning_and_the_rest_translated(world, capsys, tmp_path):
    content = f"{EN[1]}\n\n{LONG}\n   \n{EN[2]}\n".encode()
    got, err = translate_file(capsys, world.mt, tmp_path, content)
    assert err == [f"hyperplex translate: warning: line 3 (12 tokens): {CUT_WARNING}"]
    expected_long = translations(capsys, world.mt, [FIRST_7], tmp_path)[0]
    assert got == [DE[1], "", expected_long, "", DE[2]]


def test_over_long_lines_from_stdin_behave_as_from_a_file(world, capsys, tmp_path, monkeypatch):
    content = f"{LONG}\n{EN[4]}\n{LONG} w13\n".encode()
    from_file, file_err = translate_file(capsys, world.mt, tmp_path, content)
    code, out, err = run(capsys, "translate", world.mt, stdin=content, monkeypatch=monkeypatch)
    assert code == 0 and out.splitlines() == from_file and len(from_file) == 3 and from_file[1] == DE[4]
    assert err == file_err == [
        "hyperplex translate: warning: line 1 (12 tokens), line 3 (13 tokens): longer than the model's 7 tokens "
        "(model.max_positions=8, one position kept for </s>); translated the first 7 tokens of each"]


def test_many_over_long_lines_are_named_in_one_warning(world, capsys, tmp_path):
    content = "".join(f"{LONG}\n" for _ in range(12)).encode()
    got, err = translate_file(capsys, world.mt, tmp_path, content)
    assert len(got) == 12 and len(set(got)) == 1
    assert len(err) == 1 and err[0].startswith("hyperplex translate: warning: line 1 (12 tokens), line 2 (12")
    assert "line 10 (12 tokens) and 2 more: longer than" in err[0] and "line 11" not in err[0]


def test_evaluate_a_split_with_an_over_long_pair(world, capsys, tmp_path):
    (tmp_path / "test.en").write_text(f"{EN[0]}\n{LONG}\n{EN[5]}\n", encoding="utf-8")
    (tmp_path / "test.de").write_text(f"{DE[0]}\n{LONG.replace('w', 'v')}\n{DE[5]}\n", encoding="utf-8")
    code, out, err = run(capsys, "evaluate", world.mt, "--split", tmp_path / "test")
    assert code == 0, err
    assert err == [f"hyperplex evaluate: warning: pairs of {tmp_path / 'test'}: pair 2 (12 source / 12 target "
                   f"tokens): longer than the model's 7 tokens (model.max_positions=8, one position kept for </s>); "
                   f"cut to fit (the references are scored whole)"]
    metrics = json.loads(out)
    assert metrics["accuracy"] == pytest.approx(200 / 3)  # pairs 1 and 3 are exact


def test_the_lstm_translator_has_no_position_limit(world, capsys, tmp_path):
    long_line = " ".join(f"w{i % 16}" for i in range(300))
    got, err = translate_file(capsys, world.lstm, tmp_path, f"{EN[0]}\n{long_line}\n".encode())
    assert err == [] and len(got) == 2


# ---------------------------------------------------------------------------- <s>/<pad> and progress
@pytest.fixture(scope="module")
def specials_model(world, tmp_path_factory):
    """A copy of the model whose output layer ranks <s> first and <pad> second everywhere and </s>
    third — what an undertrained model did — so decoding must end every sentence at once."""
    folder = Path(shutil.copytree(world.mt, tmp_path_factory.mktemp("specials") / "mt"))
    for name in ("best.safetensors", "last.safetensors"):
        state = load_model_weights(folder / name)
        bias = state["output_projection.bias"]
        bias.zero_()
        bias[2], bias[0], bias[3] = 400.0, 300.0, 200.0  # <s>, <pad>, </s>
        (folder / name).unlink()  # best.safetensors may be a hard link of best-40: write a new file
        save_model_weights(folder / name, state)
    return folder


@pytest.mark.parametrize("beam", ["1", "3"])
def test_a_model_ranking_specials_first_never_emits_them(specials_model, capsys, tmp_path, beam):
    got, err = translate_file(capsys, specials_model, tmp_path, f"{EN[0]}\n{EN[1]}\n\n".encode(), "--beam-size", beam)
    assert got == ["", "", ""] and err == []
    code, out, err = run(capsys, "evaluate", specials_model, "--beam-size", beam)
    assert code == 0 and err == []
    metrics = json.loads(out)
    assert metrics["bleu"] == 0.0 and metrics["accuracy"] == 0.0


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal_and_nothing_otherwise(world, capsys, tmp_path, monkeypatch):
    content = "".join(f"{line}\n" for line in EN).encode()
    # not a terminal (capsys): stderr stays empty
    assert translate_file(capsys, world.mt, tmp_path, content)[1] == []
    code, out, err = run(capsys, "evaluate", world.mt)
    assert code == 0 and err == [] and json.loads(out)["accuracy"] == 100.0
    # a terminal: a tqdm bar counting sentences; stdout (the JSON) unchanged
    for argv, total in ((["translate", world.mt, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt"], 16),
                        (["evaluate", world.mt], 4)):
        terminal = FakeTerminal()
        monkeypatch.setattr(sys, "stderr", terminal)
        assert main([str(a) for a in argv]) == 0
        monkeypatch.undo()
        assert "decoding: 100%" in terminal.getvalue() and f"{total}/{total}" in terminal.getvalue()
        capsys.readouterr()


# ---------------------------------------------------------------------------- threads
def test_training_with_num_threads_0_uses_one_thread_for_a_tiny_model(world):
    assert world.threads_after_training == 1


@pytest.mark.parametrize("value", ["-1", "two", "1.5", ""])
@pytest.mark.parametrize("verb", ["evaluate", "translate", "demo"])
def test_bad_threads_value_is_one_error_naming_the_option(world, capsys, tmp_path, verb, value):
    args = {"evaluate": [world.mt], "translate": [world.mt, "-i", tmp_path / "x", "-o", tmp_path / "o"],
            "demo": ["--quick", "--out", tmp_path / "demo"]}[verb]
    msg = fail(capsys, verb, *args, "--threads", value)
    assert msg == f"--threads must be an integer ≥ 0 (0 = chosen from the work size and the " \
                  f"{len(__import__('os').sched_getaffinity(0))} available cores), got {value!r}"
    assert not (tmp_path / "demo").exists() and not (tmp_path / "o").exists()


@pytest.mark.parametrize("value, expected", [("0", 1), ("1", 1), ("2", 2)])
def test_threads_option_sets_torch(world, capsys, tmp_path, value, expected):
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)
        got, err = translate_file(capsys, world.mt, tmp_path, f"{EN[0]}\n".encode(), "--threads", value)
        assert got == [DE[0]] and err == [] and torch.get_num_threads() == expected
        torch.set_num_threads(3)
        code, _, err = run(capsys, "evaluate", world.mt, "--threads", value)
        assert code == 0 and err == [] and torch.get_num_threads() == expected
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------- more hostile inputs
def test_a_file_of_blank_lines_gives_as_many_blank_lines(world, capsys, tmp_path):
    got, err = translate_file(capsys, world.mt, tmp_path, b"\n  \n\t\n\n")
    assert got == ["", "", "", ""] and err == []


def test_an_empty_file_gives_an_empty_output_file(world, capsys, tmp_path):
    got, err = translate_file(capsys, world.mt, tmp_path, b"")
    assert got == [] and err == [] and (tmp_path / "out.txt").read_bytes() == b""


def test_crlf_and_a_byte_order_mark_translate_like_plain_lines(world, capsys, tmp_path, monkeypatch):
    plain = translate_file(capsys, world.mt, tmp_path, f"{EN[6]}\n{EN[7]}\n".encode())[0]
    assert plain == DE[6:8]
    for content in (f"{EN[6]}\r\n{EN[7]}\r\n".encode(), b"\xef\xbb\xbf" + f"{EN[6]}\n{EN[7]}".encode()):
        assert translate_file(capsys, world.mt, tmp_path, content) == (plain, [])
        code, out, err = run(capsys, "translate", world.mt, stdin=content, monkeypatch=monkeypatch)
        assert code == 0 and out.splitlines() == plain and err == []


def test_nul_bytes_and_a_huge_token_are_unknown_words(world, capsys, tmp_path):
    """A NUL is a symbol token of its own (the word tokeniser splits ``w\\x003`` into ``w``, NUL, ``3``)
    and a 100,000-character word is one token; all are unknown, so each line translates exactly as
    with unknown words ``zzz`` in their place, one output line per input line."""
    huge = "w" + "9" * 100_000
    lines = [f"w1 w{chr(0)}3 w5", f"w2 {huge} w4", f"{chr(0)}"]
    got, err = translate_file(capsys, world.mt, tmp_path, "\n".join(lines).encode() + b"\n")
    assert err == [] and len(got) == 3
    assert got == translations(capsys, world.mt, ["w1 zzz zzz zzz w5", "w2 zzz w4", "zzz"], tmp_path)


def test_unicode_line_separators_do_not_split_lines(world, capsys, tmp_path):
    got, err = translate_file(capsys, world.mt, tmp_path, f"{EN[0]}\u2028{EN[1]}\n{EN[2]}\x85\n".encode())
    assert len(got) == 2 and err == []


def test_invalid_utf8_fails_alike_from_stdin_and_from_a_file(world, capsys, tmp_path, monkeypatch):
    content = b"w1 w2\nw3 \xc3\x28 w4\n"
    (tmp_path / "in.txt").write_bytes(content)
    from_file = fail(capsys, "translate", world.mt, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    from_stdin = fail(capsys, "translate", world.mt, stdin=content, monkeypatch=monkeypatch)
    reason = "line 2: invalid UTF-8 (byte c3 at column 4); the file must be UTF-8 text"
    assert from_file == f"{tmp_path / 'in.txt'}, {reason}" and from_stdin == f"<stdin>, {reason}"
    assert not (tmp_path / "out.txt").exists()


def test_a_directory_as_input(world, capsys, tmp_path):
    msg = fail(capsys, "translate", world.mt, "-i", tmp_path, "-o", tmp_path / "out.txt")
    assert msg == f"{tmp_path}: is a folder, not a regular file; a text file is expected"


@pytest.mark.parametrize("verb", ["evaluate", "translate"])
def test_an_unknown_checkpoint(world, capsys, tmp_path, verb):
    msg = fail(capsys, verb, world.mt, "--checkpoint", "nope", *(["-i", tmp_path / "x"] if verb == "translate" else []))
    assert msg == f"checkpoint 'nope' not found in {world.mt} (expected {world.mt / 'nope'})"


@pytest.mark.parametrize("beam", ["0", "-3"])
@pytest.mark.parametrize("verb", ["evaluate", "translate"])
def test_beam_size_zero_or_negative(world, capsys, verb, beam):
    assert fail(capsys, verb, world.mt, "--beam-size", beam) == f"--beam-size must be ≥ 1 (1 = greedy), got {beam}"


@pytest.mark.parametrize("missing", ["tgt_vocab.json", "src.json"])
def test_a_model_folder_without_a_vocabulary_or_tokeniser_file(world, capsys, tmp_path, missing):
    model = Path(shutil.copytree(world.mt, tmp_path / "mt"))
    (model / missing).unlink()
    (tmp_path / "in.txt").write_text(f"{EN[0]}\n", encoding="utf-8")
    msg = fail(capsys, "translate", model, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert msg.startswith(f"file not found: {model / missing} (")  # then the files looked for, and where
    assert not (tmp_path / "out.txt").exists()


def test_plot_attention_skips_a_blank_first_line(world, capsys, tmp_path):
    got, err = translate_file(capsys, world.mt, tmp_path, f"\n{EN[3]}\n".encode(),
                              "--plot-attention", tmp_path / "att.png")
    assert got == ["", DE[3]] and err == [] and (tmp_path / "att.png").stat().st_size > 0


def test_plot_attention_of_blank_input_is_refused_before_writing(world, capsys, tmp_path):
    (tmp_path / "in.txt").write_text("\n\n", encoding="utf-8")
    msg = fail(capsys, "translate", world.mt, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt",
               "--plot-attention", tmp_path / "att.png")
    assert msg == "--plot-attention: no input line has tokens to plot"
    assert not (tmp_path / "out.txt").exists() and not (tmp_path / "att.png").exists()


# ---------------------------------------------------------------------------- bounds of decoding
def test_a_huge_line_for_a_model_without_positions_is_cut_to_the_named_limit(world, capsys, tmp_path):
    """An LSTM has no position table: a line of a million tokens would run its encoder and every step's attention
    over all of them. It is cut at UNPOSITIONED_LINE_LIMIT with the usual warning, and the output equals the
    translation of the cut line."""
    from hyperplex.tasks.translation import UNPOSITIONED_LINE_LIMIT

    words = [f"w{i % 16}" for i in range(UNPOSITIONED_LINE_LIMIT + 5000)]
    got, err = translate_file(capsys, world.lstm, tmp_path, (" ".join(words) + "\n").encode())
    assert err == [f"hyperplex translate: warning: line 1 ({len(words)} tokens): longer than the "
                   f"{UNPOSITIONED_LINE_LIMIT} tokens a line is decoded with by a model without a position table "
                   f"(hyperplex.tasks.translation.UNPOSITIONED_LINE_LIMIT); translated its first "
                   f"{UNPOSITIONED_LINE_LIMIT} tokens"]
    cut, _ = translate_file(capsys, world.lstm, tmp_path, (" ".join(words[:UNPOSITIONED_LINE_LIMIT]) + "\n").encode())
    assert got == cut and len(got) == 1


@pytest.mark.parametrize("verb", ["evaluate", "translate"])
def test_a_beam_wider_than_the_target_vocabulary_is_refused_naming_both(world, capsys, tmp_path, verb):
    from hyperplex.inference.load import load_model

    _, task, _ = load_model(str(world.mt), "best", read_data=False)
    size = len(task.tgt_vocab)
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_text(EN[1] + "\n")
    extra = ["-i", src, "-o", out] if verb == "translate" else []
    message = fail(capsys, verb, world.mt, "--beam-size", 100_000, *extra)
    assert message == (f"beam size 100,000 (--beam-size / testing.beam_size) is more than the {size:,} tokens of "
                       f"the model's target vocabulary; at most {size:,}")
    assert not out.exists()
    code, _, _ = run(capsys, verb, world.mt, "--beam-size", size, *extra)  # the widest beam still runs
    assert code == 0


def test_an_evaluation_file_with_a_huge_pair_is_scored_cut_for_a_model_without_positions(world, capsys, tmp_path):
    from hyperplex.tasks.translation import UNPOSITIONED_LINE_LIMIT

    words = " ".join(f"w{i % 16}" for i in range(UNPOSITIONED_LINE_LIMIT + 100))
    (tmp_path / "test.en").write_text(f"{EN[1]}\n{words}\n")
    (tmp_path / "test.de").write_text(f"{DE[1]}\n{DE[2]}\n")
    code, out, err = run(capsys, "evaluate", world.lstm, "--split", tmp_path / "test")
    assert code == 0 and "bleu" in json.loads(out)
    assert any(f"pair 2 ({UNPOSITIONED_LINE_LIMIT + 100} source / 3 target tokens): longer than the "
               f"{UNPOSITIONED_LINE_LIMIT} tokens" in line for line in err), err
