"""Robustness of the command line: bad inputs driven through ``hyperplex.cli.main``.

Every case must end with exit code 1 and ONE line on stderr, ``hyperplex <verb>: error: ...``, that
says what is wrong and where (file and line, key, counts, label); no traceback (only with
``--debug``); and nothing already saved may be lost or changed. Cases that fail after the trainer
has started may print its log lines first: each of those must also be in the model's ``train.log``
(they are the run's log, not part of the error report).

Two tiny model folders (a word-level Transformer translator on 16 generated sentence pairs and a
Transformer classifier on a 16-row tsv) are trained once per module; tests that damage a model work
on a copy, and the ``mt_model`` / ``cls_model`` fixtures check after each test that the originals
are byte-for-byte unchanged.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

from hyperplex.cli import main
from hyperplex.config import ConfigError, merge
from hyperplex.train.checkpoint import load_checkpoint, load_model_weights, save_model_weights
from hyperplex.train.run import train

# ---------------------------------------------------------------------------- data and configs
EN = [f"w{i} w{(3 * i) % 7} w{(5 * i) % 11}" for i in range(16)]
DE = [f"v{(5 * i) % 11} v{(3 * i) % 7} v{i}" for i in range(16)]
TSV = "sentence\tlabel\n" + "".join(
    f"{'good fine' if i % 2 else 'bad awful'} film {i}\t{'pos' if i % 2 else 'neg'}\n" for i in range(16))
DEV_TSV = "sentence\tlabel\ngood film\tpos\nbad film\tneg\nfine film\tpos\n"

TINY_TRANSFORMER = {"architecture": "transformer", "d_model": 16, "num_heads": 2, "d_ff": 32, "encoder_layers": 1,
                    "decoder_layers": 1, "dropout": 0.0}
TRAINING = {"lr": 3e-3, "batch_size": 32, "max_steps": 2, "validation_every": 2, "log_every": 1, "num_threads": 1,
            "progress_bar": False, "plots": False, "device": "cpu"}


def mt_config(data: Path, **sections) -> dict:
    """A seconds-long word-level translation experiment on the module's generated parallel files."""
    cfg = {"name": "mt", "seed": 3,
           "data": {"task": "translation", "format": "parallel", "train": str(data / "train"),
                    "dev": str(data / "dev"), "src": "en", "tgt": "de", "tokenizer": "word", "vocab_size": 100},
           "model": TINY_TRANSFORMER, "training": TRAINING,
           "testing": {"beam_size": 1, "max_output_length": 8, "batch_size": 16}}
    return merge(cfg, sections)


def cls_config(data: Path, **sections) -> dict:
    """A seconds-long tsv sentiment experiment."""
    cfg = {"name": "cls", "seed": 3,
           "data": {"task": "classification", "format": "tsv", "train": str(data / "train.tsv"),
                    "dev": str(data / "dev.tsv"), "tokenizer": "word", "vocab_size": 100},
           "model": {**TINY_TRANSFORMER, "architecture": "transformer_classifier"}, "training": TRAINING}
    return merge(cfg, sections)


def write_config(path: Path, cfg: dict) -> Path:
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (relative path → bytes)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def write_data(root: Path) -> Path:
    """``root/data``: the parallel EN–DE files and the classification TSVs the configs above read."""
    data = root / "data"
    data.mkdir()
    for name, lines in (("train.en", EN), ("train.de", DE), ("dev.en", EN[:4]), ("dev.de", DE[:4])):
        (data / name).write_text("\n".join(lines) + "\n", encoding="utf-8")
    (data / "train.tsv").write_text(TSV, encoding="utf-8")
    (data / "dev.tsv").write_text(DEV_TSV, encoding="utf-8")
    return data


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Generated data files, their configs, and a trained translation and classification model folder."""
    root = tmp_path_factory.mktemp("robustness")
    data = write_data(root)
    mt_yaml = write_config(root / "mt.yaml", mt_config(data))
    cls_yaml = write_config(root / "cls.yaml", cls_config(data))
    train(str(mt_yaml), model_dir=str(root / "mt_model"))
    train(str(cls_yaml), model_dir=str(root / "cls_model"))
    return SimpleNamespace(root=root, data=data, mt_yaml=mt_yaml, cls_yaml=cls_yaml,
                           mt=root / "mt_model", cls=root / "cls_model")


@pytest.fixture
def mt_model(world):
    """The trained translation model folder; the test must leave it byte-for-byte unchanged."""
    before = snapshot(world.mt)
    yield world.mt
    assert snapshot(world.mt) == before, "a failed command changed the saved translation model"


@pytest.fixture
def cls_model(world):
    """The trained classification model folder; the test must leave it byte-for-byte unchanged."""
    before = snapshot(world.cls)
    yield world.cls
    assert snapshot(world.cls) == before, "a failed command changed the saved classification model"


def copy_model(folder: Path, tmp_path: Path) -> Path:
    """A private copy of a model folder (hard-linked best.safetensors becomes its own file)."""
    return Path(shutil.copytree(folder, tmp_path / folder.name))


def fail(capsys, *argv, log_dir: Path | None = None) -> str:
    """Run ``hyperplex ARGV`` in-process; check exit code 1, one ``hyperplex VERB: error:`` line and no
    traceback; return the message after the prefix. With ``log_dir``, lines before the error are
    allowed only if they are the run's log (each one is in ``log_dir/train.log``)."""
    verb = str(argv[0])
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, err
    assert code == 1, f"exit code {code}; stderr: {err}"
    lines = err.splitlines()
    prefix = f"hyperplex {verb}: error: "
    assert lines and lines[-1].startswith(prefix), err
    assert sum(prefix in line for line in lines) == 1, err
    if log_dir is None:
        assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    elif len(lines) > 1:
        log = (log_dir / "train.log").read_text(encoding="utf-8")
        for line in lines[:-1]:
            assert line in log, f"stderr line {line!r} is neither the error nor in train.log"
    return lines[-1][len(prefix):]


def no_checkpoint(folder: Path) -> None:
    """Nothing half-written: no checkpoint, index or temporary file in ``folder`` (if it exists)."""
    if folder.exists():
        names = [p.name for p in folder.iterdir()]
        assert not [n for n in names if n.endswith(".safetensors") or n == "checkpoints.json" or ".tmp" in n], names


# ---------------------------------------------------------------------------- configs and the command line
def test_missing_config_file(tmp_path, capsys):
    msg = fail(capsys, "train", tmp_path / "nope.yaml", "--model-dir", tmp_path / "m")
    assert "config file not found" in msg and str(tmp_path / "nope.yaml") in msg
    assert not (tmp_path / "m").exists()


def test_malformed_yaml_names_file_and_line(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ntraining:\n  lr: 0.1\n batch_size: 3\n", encoding="utf-8")
    msg = fail(capsys, "train", path, "--model-dir", tmp_path / "m")
    assert msg.startswith(f"malformed YAML at {path}:4:"), msg
    assert not (tmp_path / "m").exists()


def test_unknown_key_names_it_and_the_closest_valid_key(world, tmp_path, capsys):
    path = write_config(tmp_path / "typo.yaml", mt_config(world.data, training={"lrr": 0.1}))
    msg = fail(capsys, "train", path, "--model-dir", tmp_path / "m")
    assert str(path) in msg and "unknown config key 'training.lrr'" in msg and "did you mean 'lr'" in msg
    assert not (tmp_path / "m").exists()


def test_wrong_type_names_key_and_expected_type(world, tmp_path, capsys):
    path = write_config(tmp_path / "type.yaml", mt_config(world.data, training={"lr": "abc"}))
    msg = fail(capsys, "train", path, "--model-dir", tmp_path / "m")
    assert str(path) in msg and "training.lr: expected float" in msg and "'abc'" in msg
    assert not (tmp_path / "m").exists()


def test_scientific_notation_is_a_float(world, tmp_path):
    """PyYAML reads ``3e-4`` (no dot) as a string; the loader must still take it as the float the user meant."""
    from hyperplex.config.experiment import load_experiment

    path = write_config(tmp_path / "sci.yaml", mt_config(world.data))
    path.write_text(path.read_text().replace("lr: 0.003", "lr: 3e-3"))
    assert "lr: 3e-3" in path.read_text()
    cfg = load_experiment(path, ["training.eps=1E-8"], model_dir=str(tmp_path / "m"))
    assert cfg.training.lr == 3e-3 and cfg.training.eps == 1e-8


CONFIG_CASES = {
    # id: (overrides, fragments the message must contain)
    "unknown_architecture": (["--model.architecture=transfomer"],
                             ["model.architecture", "unknown architecture 'transfomer'", "transformer"]),
    "architecture_cannot_do_task": (["--model.architecture=nli_encoder"],
                                    ["model.architecture 'nli_encoder' cannot do task 'translation'",
                                     "rnn_translator"]),
    "beam_size_0": (["--testing.beam_size=0"], ["testing", "beam_size must be ≥ 1 (1 = greedy), got 0"]),
    "dev_fraction_above_1": (["--data.dev_fraction=1.5"], ["data", "dev_fraction must be in [0, 1), got 1.5"]),
    "dev_fraction_negative": (["--data.dev_fraction=-0.1"], ["dev_fraction must be in [0, 1), got -0.1"]),
    "unknown_choice": (["--training.precision=fp61"], ["training.precision", "'fp61'", "did you mean 'fp16'"]),
    "unknown_override_key": (["--testing.beam=3"], ["unknown config key 'testing.beam'", "'beam_size'"]),
    "override_without_value": (["--training.lr"], ["'--training.lr'", "--section.key=value"]),
    "override_of_a_whole_section": (["--training=3"], ["training: expected a mapping", "3"]),
    "int_key_given_text": (["--training.max_steps=ten"], ["training.max_steps: expected int", "'ten'"]),
}


@pytest.mark.parametrize("case", CONFIG_CASES)
def test_invalid_config_value_is_refused_before_anything_is_written(world, tmp_path, capsys, case):
    overrides, fragments = CONFIG_CASES[case]
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", *overrides)
    for fragment in fragments:
        assert fragment in msg, (fragment, msg)
    assert not (tmp_path / "m").exists()


def test_n_not_dividing_d_model(world, tmp_path, capsys):
    model_dir = tmp_path / "m"
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", model_dir, "--model.linear.kind=phm",
               "--model.linear.n=5")
    assert "d_model=16" in msg and "linear.n=5" in msg and "multiple" in msg and "model.linear.n" in msg
    assert not model_dir.exists()  # caught while validating the config, before any data is read


def test_n_not_dividing_d_model_in_params(world, capsys):
    msg = fail(capsys, "params", world.mt_yaml, "--model.linear.kind=phm", "--model.linear.n=5")
    assert "d_model=16" in msg and "n=5" in msg


def test_fp16_on_cpu(world, tmp_path, capsys):
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", "--training.precision=fp16",
               "--training.device=cpu")
    assert "training.precision fp16 needs a CUDA device" in msg
    assert not (tmp_path / "m").exists()


def test_debug_raises_the_same_error_with_its_traceback(world, tmp_path, capsys):
    path = write_config(tmp_path / "typo.yaml", mt_config(world.data, training={"lrr": 0.1}))
    with pytest.raises(ConfigError, match=r"unknown config key 'training.lrr'; did you mean 'lr'"):
        main(["train", "--debug", str(path), "--model-dir", str(tmp_path / "m")])
    assert capsys.readouterr().err == ""


# ---------------------------------------------------------------------------- data files
def test_missing_parallel_file_names_the_path_tried(world, tmp_path, capsys):
    prefix = tmp_path / "corpus" / "train"
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", f"--data.train={prefix}")
    assert msg.startswith("data.train: file not found") and f"{prefix}.en or {prefix}.en.gz" in msg
    no_checkpoint(tmp_path / "m")


def test_mismatched_line_counts_name_both_files_and_counts(world, tmp_path, capsys):
    (tmp_path / "c.en").write_text("a b\nc d\ne f\ng h\ni j\n")
    (tmp_path / "c.de").write_text("a b\nc d\ne f\ng h\n")
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", f"--data.train={tmp_path / 'c'}")
    assert f"{tmp_path / 'c.en'} has 5 lines" in msg and f"{tmp_path / 'c.de'} has 4 lines" in msg
    no_checkpoint(tmp_path / "m")


def test_empty_corpus(world, tmp_path, capsys):
    (tmp_path / "c.en").write_text("")
    (tmp_path / "c.de").write_text("")
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", f"--data.train={tmp_path / 'c'}")
    assert "empty corpus" in msg and str(tmp_path / "c.en") in msg
    no_checkpoint(tmp_path / "m")


def test_invalid_utf8_names_file_and_line(world, tmp_path, capsys):
    (tmp_path / "c.en").write_bytes(b"a b\nc d\ne \xff f\n")
    (tmp_path / "c.de").write_text("a b\nc d\ne f\n")
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", f"--data.train={tmp_path / 'c'}")
    assert f"{tmp_path / 'c.en'}, line 3" in msg and "invalid UTF-8" in msg and "ff" in msg
    no_checkpoint(tmp_path / "m")


def test_unknown_label_in_dev_tsv_names_label_known_set_and_line(world, tmp_path, capsys):
    dev = tmp_path / "dev.tsv"
    dev.write_text("sentence\tlabel\ngood film\tpos\nbad film\tneg\nso so film\tmaybe\n")
    msg = fail(capsys, "train", world.cls_yaml, "--model-dir", tmp_path / "m", f"--data.dev={dev}")
    assert f"{dev}, line 4" in msg and "unknown label 'maybe'" in msg and "{'neg', 'pos'}" in msg
    no_checkpoint(tmp_path / "m")


def test_tsv_without_the_text_column(world, tmp_path, capsys):
    train = tmp_path / "train.tsv"
    train.write_text("text\tlabel\ngood film\tpos\n")
    msg = fail(capsys, "train", world.cls_yaml, "--model-dir", tmp_path / "m", f"--data.train={train}")
    assert f"{train}, line 1" in msg and "column 'sentence' not in the header" in msg
    no_checkpoint(tmp_path / "m")


def test_no_validation_data(world, tmp_path, capsys):
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", "--data.dev=")
    assert "no validation data" in msg and "data.dev" in msg and "data.dev_fraction" in msg
    no_checkpoint(tmp_path / "m")


def test_dev_fraction_that_leaves_no_training_data(world, tmp_path, capsys):
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", "--data.dev=",
               "--data.dev_fraction=0.99")
    assert "dev_fraction 0.99 leaves no training examples out of 16" in msg
    no_checkpoint(tmp_path / "m")


# ---------------------------------------------------------------------------- training
def test_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(world, tmp_path, capsys):
    """SGD with lr·weight_decay = 100 multiplies every weight by (1 - 100) = -99 per step besides the
    gradient step, so the weights overflow float32 within ~20 steps whatever the data; validating after
    every step, the first step leaves a finite checkpoint behind."""
    model_dir = tmp_path / "nan"
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", model_dir, "--training.optimizer=sgd",
               "--training.lr=10", "--training.weight_decay=10", "--training.validation_every=1",
               "--training.max_steps=40", "--training.max_epochs=40", log_dir=model_dir)
    found = re.search(r"loss became (nan|inf|-inf) at step (\d+)", msg)
    assert found, msg
    assert f"the last good checkpoint {model_dir / 'last.safetensors'}" in msg and "is intact" in msg
    bad_step = int(found.group(2))
    ckpt = load_checkpoint(model_dir / "last.safetensors")
    assert 1 <= ckpt.extra["trainer"]["step"] < bad_step
    assert all(torch.isfinite(t).all() for t in ckpt.model_state.values())
    assert not [p.name for p in model_dir.iterdir() if ".tmp" in p.name]
    # loadable by the CLI alone, with a finite validation loss
    assert main(["evaluate", str(model_dir), "--checkpoint", "last"]) == 0
    out = capsys.readouterr().out
    assert math.isfinite(yaml.safe_load(out)["loss"])


def test_resume_without_a_checkpoint(world, tmp_path, capsys):
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "m", "--resume")
    assert msg == f"--resume: no checkpoint {tmp_path / 'm' / 'last.safetensors'} to resume from"
    assert not (tmp_path / "m").exists()


def test_training_into_a_trained_model_folder_is_refused(world, mt_model, capsys):
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", mt_model)
    assert f"{mt_model} already holds a trained model (last.safetensors)" in msg and "--resume" in msg


def test_model_folder_not_writable(world, tmp_path, capsys):
    parent = tmp_path / "locked"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("chmod does not stop this user (root) from writing")
        msg = fail(capsys, "train", world.mt_yaml, "--model-dir", parent / "m")
        assert f"model folder {parent / 'm'} is not writable" in msg and "Permission denied" in msg
        assert not (parent / "m").exists()
    finally:
        parent.chmod(0o700)


def test_model_folder_under_a_file(world, tmp_path, capsys):
    """A model folder that cannot be created (its parent is a file): refused before anything is written."""
    (tmp_path / "file").write_text("keep me\n")
    msg = fail(capsys, "train", world.mt_yaml, "--model-dir", tmp_path / "file" / "m")
    assert f"model folder {tmp_path / 'file' / 'm'} is not writable" in msg and "Not a directory" in msg
    assert (tmp_path / "file").read_text() == "keep me\n"


# ---------------------------------------------------------------------------- saved models
@pytest.mark.parametrize("verb", ["evaluate", "translate"])
def test_truncated_checkpoint_names_the_file(mt_model, tmp_path, capsys, verb):
    model = copy_model(mt_model, tmp_path)
    best = model / "best.safetensors"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    before = snapshot(model)
    (tmp_path / "in.txt").write_text("w1 w3 w5\n")
    extra = ["-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt"] if verb == "translate" else []
    msg = fail(capsys, verb, model, *extra)
    assert str(best) in msg, msg
    assert snapshot(model) == before
    assert not (tmp_path / "out.txt").exists()


def test_corrupted_checkpoint_bytes_name_the_file(mt_model, tmp_path, capsys):
    model = copy_model(mt_model, tmp_path)
    best = model / "best.safetensors"
    data = bytearray(best.read_bytes())
    header_size = int.from_bytes(data[:8], "little")  # safetensors: u64 header length, JSON header, tensor data
    header = json.loads(data[8: 8 + header_size])
    name = next(k for k in header if k.startswith("model."))
    begin, end = header[name]["data_offsets"]
    data[8 + header_size + (begin + end) // 2] ^= 0xFF  # one byte in the middle of a weight
    best.write_bytes(bytes(data))
    before = snapshot(model)
    msg = fail(capsys, "evaluate", model)
    assert msg == f"{best}: corrupted checkpoint: checksum mismatch for tensor {name!r}"
    assert snapshot(model) == before


def test_evaluate_a_missing_model_folder(tmp_path, capsys):
    msg = fail(capsys, "evaluate", tmp_path / "nowhere")
    assert msg == f"model folder not found: {tmp_path / 'nowhere'}"
    assert not (tmp_path / "nowhere").exists()


def test_model_folder_without_its_config(mt_model, tmp_path, capsys):
    """Without config.yaml the checkpoint's stored config is used (tests/cli/test_checkpoint_only.py);
    a weights-only file stores none, so that is an error naming both."""
    model = copy_model(mt_model, tmp_path)
    (model / "config.yaml").unlink()
    save_model_weights(model / "w.safetensors", load_model_weights(model / "best.safetensors"))
    before = snapshot(model)
    msg = fail(capsys, "evaluate", model, "--checkpoint", "w.safetensors")
    assert msg.startswith(f"{model / 'w.safetensors'} stores no config") and str(model / "config.yaml") in msg
    assert snapshot(model) == before


def test_evaluate_a_missing_checkpoint_name(mt_model, capsys):
    msg = fail(capsys, "evaluate", mt_model, "--checkpoint", "best-999.safetensors")
    assert "checkpoint 'best-999.safetensors' not found" in msg and str(mt_model / "best-999.safetensors") in msg


@pytest.mark.parametrize("verb", ["evaluate", "translate"])
def test_beam_size_0_on_the_command_line(mt_model, capsys, verb):
    msg = fail(capsys, verb, mt_model, "--beam-size", "0")
    assert msg.startswith("--beam-size must be ≥ 1") and "got 0" in msg


def test_translate_with_a_classification_model(cls_model, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("good film\n")
    msg = fail(capsys, "translate", cls_model, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert f"{cls_model} holds a classification model" in msg and "translation model" in msg
    assert not (tmp_path / "out.txt").exists()


def test_translate_input_with_invalid_utf8_keeps_the_old_output(mt_model, tmp_path, capsys):
    src, out = tmp_path / "in.txt", tmp_path / "out.txt"
    src.write_bytes(b"w1 w2\nw3 \xc3\x28 w4\n")
    out.write_text("previous translations\n")
    msg = fail(capsys, "translate", mt_model, "-i", src, "-o", out)
    assert f"{src}, line 2" in msg and "invalid UTF-8" in msg
    assert out.read_text() == "previous translations\n"


def test_translate_output_into_a_missing_folder(mt_model, tmp_path, capsys):
    (tmp_path / "in.txt").write_text("w1 w3 w5\n")
    out = tmp_path / "missing" / "out.txt"
    msg = fail(capsys, "translate", mt_model, "-i", tmp_path / "in.txt", "-o", out)
    assert msg == f"{out}: cannot write (No such file or directory); the previous file, if any, is unchanged"


def test_malformed_unk_dictionary_names_file_and_line(mt_model, tmp_path, capsys):
    model = copy_model(mt_model, tmp_path)
    dictionary = tmp_path / "unk.dict"
    dictionary.write_text("# source<TAB>target\nw1\tv1\nw2 v2 extra\n")
    cfg = yaml.safe_load((model / "config.yaml").read_text())
    cfg["testing"].update(replace_unk=True, unk_dictionary=str(dictionary))
    (model / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "in.txt").write_text("w1 w3 w5\n")
    before = snapshot(model)
    msg = fail(capsys, "translate", model, "-i", tmp_path / "in.txt", "-o", tmp_path / "out.txt")
    assert snapshot(model) == before
    assert f"{dictionary}:3" in msg and "source<TAB>target" in msg and "'w2 v2 extra'" in msg
    assert not (tmp_path / "out.txt").exists()


def test_average_checkpoints_of_different_architectures_names_the_key(mt_model, cls_model, tmp_path, capsys):
    a, b = mt_model / "best.safetensors", cls_model / "best.safetensors"
    out = tmp_path / "avg.safetensors"
    msg = fail(capsys, "average", a, b, "-o", out)
    key = re.search(r"key '([^']+)' is missing", msg)
    assert key, msg
    assert key.group(1) in set(load_model_weights(a)) ^ set(load_model_weights(b))
    assert str(a) in msg and str(b) in msg and "cannot average" in msg
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_average_of_a_missing_checkpoint(mt_model, tmp_path, capsys):
    msg = fail(capsys, "average", mt_model / "best.safetensors", tmp_path / "gone.safetensors",
               "-o", tmp_path / "avg.safetensors")
    assert msg == f"checkpoint not found: {tmp_path / 'gone.safetensors'}"
    assert not (tmp_path / "avg.safetensors").exists()
