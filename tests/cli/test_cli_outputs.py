"""One output guard for every verb that writes: an output that is an input, a file of a model folder the verb
does not own, or a folder holding another model is refused before any work, and the disk is as it was; files
that belong together are written as a set or not at all."""

from __future__ import annotations

import errno
import gzip
import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import disk_state as snapshot
from torch import nn

from hyperplex import cli


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from conftest import write_tiny_config

    tmp = tmp_path_factory.mktemp("outputs")
    config = write_tiny_config(tmp, max_steps=4, validation_every=2, keep_best=2)
    model_dir = tmp / "model"
    assert cli.main(["train", str(config), "--model-dir", str(model_dir)]) == 0
    return config, model_dir


@pytest.fixture
def model(trained, tmp_path):
    folder = tmp_path / "model"
    shutil.copytree(trained[1], folder)
    return folder


def refused(capsys, argv, match) -> str:
    assert cli.main(argv) == 1
    err = capsys.readouterr().err
    assert match in err and len(err.strip().splitlines()) == 1, err
    return err


# -- translate ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["-o", "--plot-attention"])
@pytest.mark.parametrize("name", ["best.safetensors", "last.safetensors", "config.yaml", "checkpoints.json"])
def test_translate_never_writes_over_a_file_of_the_model_folder(model, tmp_path, capsys, option, name):
    source = tmp_path / "in.txt"
    source.write_text("1+2\n")
    before = snapshot(model)
    refused(capsys, ["translate", str(model), "-i", str(source), option, str(model / name)],
            f"{option} {model / name}: is a file of the model folder of `hyperplex train`")
    assert snapshot(model) == before and source.read_text() == "1+2\n"
    assert cli.main(["evaluate", str(model)]) == 0  # the model still loads


def test_translate_output_that_is_its_input_or_its_plot_is_refused(model, tmp_path, capsys):
    source = tmp_path / "in.txt"
    source.write_text("1+2\n3+4\n")
    refused(capsys, ["translate", str(model), "-i", str(source), "-o", str(source)],
            f"-o {source}: is also an input of this command")
    assert source.read_text() == "1+2\n3+4\n"
    out = tmp_path / "out.txt"
    refused(capsys, ["translate", str(model), "-i", str(source), "-o", str(out), "--plot-attention", str(out)],
            "is also the output of -o")
    assert not out.exists()
    refused(capsys, ["translate", str(model), "-i", str(source), "-o", str(tmp_path)], "is a folder")
    checkpoint = model / "best.safetensors"
    outside = tmp_path / "copy.safetensors"
    shutil.copy(checkpoint, outside)
    refused(capsys, ["translate", str(outside), "-i", str(source), "-o", str(outside)], "is also an input")
    assert cli.main(["translate", str(model), "-i", str(source), "-o", str(out)]) == 0
    assert len(out.read_text().splitlines()) == 2


# -- average -----------------------------------------------------------------------------------------------------------
def test_average_into_another_models_config_is_refused(model, trained, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(trained[1], other)
    before = snapshot(other)
    best = sorted(str(p) for p in model.glob("best-*.safetensors"))
    refused(capsys, ["average", *best, "-o", str(other / "config.yaml")], "is a file of the model folder")
    assert snapshot(other) == before
    assert cli.main(["evaluate", str(other)]) == 0
    assert cli.main(["average", *best, "-o", str(model)]) == 0  # the folder form: averaged.safetensors
    assert cli.main(["average", *best, "-o", str(model)]) == 0  # and again: its own file is replaced


def test_the_python_call_behind_average_has_the_same_guard(model, trained, tmp_path):
    """``write_average`` is ``hyperplex average`` without the parsing: another model's config is refused there too."""
    from hyperplex.guards import OutputError
    from hyperplex.train.checkpoint import write_average

    other = tmp_path / "other"
    shutil.copytree(trained[1], other)
    before = snapshot(other)
    best = sorted(model.glob("best-*.safetensors"))
    with pytest.raises(OutputError, match="is a file of the model folder"):
        write_average(best, other / "config.yaml")
    assert snapshot(other) == before
    assert write_average(best, tmp_path / "avg.safetensors") == tmp_path / "avg.safetensors"
    assert write_average(best, tmp_path / "avg.safetensors") == tmp_path / "avg.safetensors"  # its own: replaced


# -- corpus ------------------------------------------------------------------------------------------------------------
def test_corpus_refuses_one_of_its_sources_as_out(tmp_path, capsys):
    source = tmp_path / "data" / "multi30k_en_de" / "train.en.gz"
    source.parent.mkdir(parents=True)
    source.write_bytes(gzip.compress(b"Two dogs play.\n"))
    before = source.read_bytes()
    refused(capsys, ["corpus", str(source), "--data-root", str(tmp_path / "data"), "--quiet"],
            f"OUT {source}: is also an input of this command")
    assert source.read_bytes() == before and sorted(os.listdir(source.parent)) == ["train.en.gz"]


def test_a_full_disk_between_corpus_and_report_leaves_both_old_files(tmp_path, monkeypatch):
    from hyperplex.data.corpus import CorpusReport, report_path, write_corpus
    from hyperplex.fileio import WriteError

    out = tmp_path / "corpus.txt"
    write_corpus(out, ["old one", "old two"], CorpusReport(seed=1, min_sentences=1))
    report = report_path(out)
    before = snapshot(tmp_path)

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)  # the report's writer fails after the corpus was written
    with pytest.raises(WriteError, match=r"corpus.report.json: cannot write \(No space left on device\); nothing of "
                                         r"this set was replaced"):
        write_corpus(out, ["new one"], CorpusReport(seed=2, min_sentences=1))
    assert snapshot(tmp_path) == before and report.is_file()  # no new corpus beside a stale report, no temp files


# -- experiment --append-to --------------------------------------------------------------------------------------------
def test_experiment_append_to_its_own_plan_or_config_is_refused(tmp_path, capsys):
    import yaml
    from conftest import write_tiny_config

    from hyperplex.experiments.plan import load_plan

    config = write_tiny_config(tmp_path)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"title": "t", "metrics": ["loss"], "rows": [{"name": "a", "config": "tiny.yaml"}]}))
    before = snapshot(tmp_path)
    for target in (plan, config):
        assert cli.main(["experiment", str(plan), "--out", str(tmp_path / "out"), "--append-to", str(target)]) == 1
        assert f"--append-to {target}: is also an input of this command" in capsys.readouterr().err
    assert snapshot(tmp_path) == before and load_plan(plan).rows[0].name == "a"


# -- save_quantized ----------------------------------------------------------------------------------------------------
def _float_model():
    from hyperplex.layers import PHMLinear

    torch.manual_seed(0)
    return nn.Sequential(PHMLinear(16, 32, 4), nn.GELU(), nn.Linear(32, 8))


def test_save_quantized_never_writes_over_the_float_folder_it_came_from(tmp_path):
    from hyperplex.convert import load_converted, save_converted
    from hyperplex.guards import OutputError
    from hyperplex.int8 import quantize, save_quantized

    folder = tmp_path / "float"
    save_converted(_float_model(), folder)
    before = snapshot(folder)
    model = quantize(load_converted(folder, model=_float_model()))
    with pytest.raises(OutputError, match="is the folder this model was loaded from"):
        save_quantized(model, folder)
    assert snapshot(folder) == before
    x = torch.randn(2, 16)
    assert torch.equal(load_converted(folder, model=_float_model())(x), load_converted(folder, model=_float_model())(x))
    model.hyperplex_loaded_from = None  # the record lost: the float model's spec still protects the folder
    for module in model.modules():
        module.__dict__.pop("hyperplex_loaded_from", None)
    with pytest.raises(OutputError, match=r"holds a converted model written by save_converted "
                                          r"\(hyperplex_convert.json\)"):
        save_quantized(model, folder)
    assert snapshot(folder) == before
    save_quantized(model, tmp_path / "int8")
    save_quantized(model, tmp_path / "int8")  # its own folder: replaced


def test_save_quantized_into_a_hugging_face_folder_is_refused(tmp_path):
    from hyperplex.guards import OutputError
    from hyperplex.int8 import quantize, save_quantized

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    (folder / "model.safetensors").write_bytes(b"weights")
    before = snapshot(folder)
    with pytest.raises(OutputError, match=r"holds a Hugging Face model \(config.json\)"):
        save_quantized(quantize(_float_model()), folder)
    assert snapshot(folder) == before


def test_a_full_disk_while_saving_leaves_the_old_converted_folder(tmp_path, monkeypatch):
    from hyperplex.convert import load_converted, save_converted
    from hyperplex.fileio import WriteError

    folder = tmp_path / "converted"
    old = _float_model()
    save_converted(old, folder)
    before = snapshot(folder)
    new = _float_model()
    with torch.no_grad():
        new[2].weight.add_(1)
    import safetensors.torch

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    with pytest.raises(WriteError, match="No space left on device"):
        save_converted(new, folder)
    assert snapshot(folder) == before
    monkeypatch.undo()
    assert torch.equal(load_converted(folder, model=_float_model())[2].weight, old[2].weight)


def test_experiment_out_that_is_a_model_folder_is_refused(trained, tmp_path, capsys):
    import yaml
    from conftest import write_tiny_config

    write_tiny_config(tmp_path)
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({"title": "t", "metrics": ["loss"], "rows": [{"name": "a", "config": "tiny.yaml"}]}))
    folder = tmp_path / "model"
    shutil.copytree(trained[1], folder)
    before = snapshot(folder)
    for option in ("--out", "--records"):
        argv = ["experiment", str(plan), "--dry-run"] + (["--out", str(folder)] if option == "--out" else
                                                          ["--out", str(tmp_path / "o"), "--records", str(folder)])
        assert cli.main(argv) == 1
        assert f"{option} {folder}: holds a model folder of `hyperplex train`" in capsys.readouterr().err
    assert snapshot(folder) == before


@pytest.mark.parametrize("module,argv", [
    ("frontier", ["RESULTS", "--table", "RESULTS"]), ("budget", ["RESULTS", "--curve", "a=x", "--figure", "RESULTS"]),
    ("summary", ["RESULTS", "--write", "RESULTS"]), ("plot", ["RESULTS", "RESULTS"])])
def test_report_scripts_never_write_over_the_results_they_read(tmp_path, capsys, module, argv):
    import importlib

    results = tmp_path / "results.json"
    results.write_text('{"plan": {}, "rows": []}')
    main = importlib.import_module(f"hyperplex.experiments.{module}").main
    assert main([str(results) if a == "RESULTS" else a for a in argv]) in (1, 2)
    assert "is also an input of this command" in capsys.readouterr().err
    assert results.read_text() == '{"plan": {}, "rows": []}'


def test_average_replaces_its_own_earlier_average_but_no_other_checkpoint(model, tmp_path, capsys):
    best = sorted(model.glob("best-*.safetensors"))
    folder = tmp_path / "ckpts"
    folder.mkdir()
    for path in best:
        shutil.copy(path, folder / path.name)
    inputs = [str(folder / p.name) for p in best]
    assert cli.main(["average", *inputs, "-o", str(folder / "mine.safetensors")]) == 0
    assert cli.main(["average", *inputs, "-o", str(folder / "mine.safetensors")]) == 0  # its own: replaced
    shutil.copy(best[0], folder / "other.safetensors")
    before = (folder / "other.safetensors").read_bytes()
    refused(capsys, ["average", *inputs, "-o", str(folder / "other.safetensors")], "is a file of the model weights")
    assert (folder / "other.safetensors").read_bytes() == before


def test_score_encoder_json_over_a_students_spec_is_refused_before_loading(tmp_path, capsys):
    student = tmp_path / "student"
    student.mkdir()
    (student / "hyperplex_convert.json").write_text('{"format": "x"}')
    refused(capsys, ["score-encoder", str(student), "--json", str(student / "hyperplex_convert.json")],
            "is a file of the converted model written by save_converted")
    assert (student / "hyperplex_convert.json").read_text() == '{"format": "x"}'


def test_demo_never_draws_into_a_model_folder(model, capsys):
    before = snapshot(model)
    refused(capsys, ["demo", "--quick", "--out", str(model)],
            f"--out {model}: holds a model folder of `hyperplex train`")
    assert snapshot(model) == before
