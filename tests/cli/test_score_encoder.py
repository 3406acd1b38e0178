"""``hyperplex score-encoder`` (hyperplex/scoring/encoders.py, its table hyperplex/cli/score_encoder.py) on a tiny
random BERT teacher saved as a SentenceTransformer folder and its PHM / low-rank conversions, with tiny synthetic
agreement, WikiQA and SST-2 files: the teacher row, the n = 1 conversion scoring exactly as the teacher, parameter
counts and file sizes against an independent count, the JSON equal to the printed table, `hyperplex compress` folders
(student/ and the best checkpoint, teacher from their config), and one clear error line for each bad input."""

from __future__ import annotations

import contextlib
import fnmatch
import gzip
import io
import json
import os
import random
import shutil
from pathlib import Path

import pytest
import yaml

pytest.importorskip("transformers")
sentence_transformers = pytest.importorskip("sentence_transformers")
pytest.importorskip("sklearn")

from conftest import TINY_BERT_WORDS as WORDS
from conftest import write_tiny_bert, write_tiny_sentence_transformer

from hyperplex.cli import main
from hyperplex.scoring import DEFAULT_FILES

try:  # sentence-transformers 6 moved the modules; 3-5 have them in .models
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
except ImportError:
    from sentence_transformers.models import Pooling, Transformer

INCLUDE = "*encoder.layer*"
PROBE = ["--probe-train", "8", "--probe-test", "6", "--split-seed", "1"]
METRICS = ["agreement", "wikiqa_map", "wikiqa_mrr", "sst2_probe"]


def sentences(count: int, seed: int, low: int = 3, high: int = 8) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high))) for _ in range(count)]


def write_data(root: Path) -> None:
    """The three default files under the data root (so the defaults are what is read), and distillation text."""
    for name in DEFAULT_FILES.values():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(root / DEFAULT_FILES["agreement"], "wt") as handle:
        handle.write("\n".join(sentences(12, 3) + ["", *sentences(2, 3)]) + "\n")  # a blank and 2 repeated lines
    records = []
    for qid in range(4):
        question, answers = sentences(1, 10 + qid)[0], sentences(3, 20 + qid)
        records += [{"qid": qid, "question": question, "answer": a, "label": int(i == qid % 3)}
                    for i, a in enumerate(answers)]
    records.append({"qid": 9, "question": "the cat", "answer": "a dog", "label": 0})  # no correct answer: skipped
    with gzip.open(root / DEFAULT_FILES["wikiqa"], "wt") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    rows = []
    for i, text in enumerate(sentences(20, 4, 6, 9)):
        label = int("good" in text.split()) if i % 3 else i % 2
        rows += [(text, label), (" ".join(text.split()[1:4]), label)]  # the sentence and one of its phrases
    with gzip.open(root / DEFAULT_FILES["sst2"], "wt") as handle:
        handle.write("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    (root / "train.txt").write_text("\n".join(sentences(30, 1)) + "\n")
    (root / "dev.txt").write_text("\n".join(sentences(10, 2)) + "\n")


def converted(teacher: Path, folder: Path, kind: str, n: int) -> Path:
    from hyperplex import LowRankConfig, PHMConfig, compress
    from hyperplex.convert import save_converted

    model = sentence_transformers.SentenceTransformer(os.fspath(teacher), device="cpu")
    compress(model, (PHMConfig if kind == "phm" else LowRankConfig)(n=n, targets=INCLUDE, min_features=8))
    save_converted(model, folder)
    return folder


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """(teacher folder, data root, {name: save_converted student folder})."""
    bert = tmp_path_factory.mktemp("bert")
    write_tiny_bert(bert)
    teacher = tmp_path_factory.mktemp("teacher")
    write_tiny_sentence_transformer(teacher, bert, normalize=False)
    data = tmp_path_factory.mktemp("data")
    write_data(data)
    students = tmp_path_factory.mktemp("students")
    folders = {name: converted(teacher, students / name, kind, n)
               for name, kind, n in (("phm1", "phm", 1), ("phm2", "phm", 2), ("lowrank2", "lowrank", 2))}
    return teacher, data, folders


@pytest.fixture(scope="module")
def scored(setup, tmp_path_factory):
    """(result JSON, printed table) of the teacher and the three students."""
    teacher, data, folders = setup
    out = tmp_path_factory.mktemp("scored") / "scores.json"
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):  # capsys is per test; this fixture is per module
        code = main(["score-encoder", *map(os.fspath, folders.values()), "--teacher", os.fspath(teacher),
                     "--data-root", os.fspath(data), *PROBE, "--json", os.fspath(out), "--threads", "1"])
    assert code == 0
    return json.loads(out.read_text()), stdout.getvalue()


def rows_by_role(result: dict) -> dict:
    return {row["name"] if row["role"] == "student" else "teacher": row for row in result["rows"]}


def test_teacher_row_first_and_the_n1_student_scores_as_the_teacher(scored, setup):
    result, _ = scored
    rows = rows_by_role(result)
    folders = setup[2]
    assert [r["role"] for r in result["rows"]] == ["teacher", "student", "student", "student"]
    teacher, phm1 = rows["teacher"], rows[os.fspath(folders["phm1"])]
    assert teacher["agreement"] == pytest.approx(1.0, abs=1e-6)
    for metric in METRICS:  # n = 1: H = A ⊗ S is W up to float rounding, so every metric is the teacher's
        assert phm1[metric] == pytest.approx(teacher[metric], abs=1e-6), metric
    assert phm1["params"] == teacher["params"] and phm1["selected_params"] == teacher["selected_params"]
    assert rows[os.fspath(folders["phm2"])]["agreement"] < 1 - 1e-5  # n = 2 changes the embeddings
    assert (teacher["conversion"], phm1["conversion"], rows[os.fspath(folders["phm2"])]["conversion"]) == \
        ("dense (teacher)", "phm n=1", "phm n=2")
    # the data actually read: distinct non-blank sentences, questions with a correct answer, whole sentences
    assert result["details"]["agreement"] == {"sentences": 12}
    assert result["details"]["wikiqa"] == {"questions": 4, "skipped": 1, "candidates": 13}
    assert result["details"]["sst2_probe"] == {"train": 8, "test": 6, "split_seed": 1, "carve": "sentences",
                                               "pool": 20}
    assert result["files"] == {m: os.fspath(setup[1] / f) for m, f in DEFAULT_FILES.items()}


def test_the_metrics_are_those_of_the_library_functions(scored, setup):
    """The verb's numbers are hyperplex.scoring.quality's, computed here directly on a reloaded student."""
    from hyperplex.convert import load_converted
    from hyperplex.scoring.quality import (
        mean_cosine,
        sentence_transformer_embedder,
        sst2_probe,
        wikiqa_ranking,
    )

    teacher_folder, data, folders = setup
    teacher = sentence_transformers.SentenceTransformer(os.fspath(teacher_folder), device="cpu")
    student = sentence_transformer_embedder(load_converted(folders["phm2"]))
    row = rows_by_role(scored[0])[os.fspath(folders["phm2"])]
    with gzip.open(data / DEFAULT_FILES["agreement"], "rt") as handle:
        agree = list(dict.fromkeys(line for line in handle.read().split("\n") if line))
    assert row["agreement"] == pytest.approx(mean_cosine(student, sentence_transformer_embedder(teacher), agree),
                                             abs=1e-6)
    ranking = wikiqa_ranking(student, data / DEFAULT_FILES["wikiqa"])
    assert (row["wikiqa_map"], row["wikiqa_mrr"]) == pytest.approx((ranking["map"], ranking["mrr"]), abs=1e-9)
    probe = sst2_probe(student, data / DEFAULT_FILES["sst2"], 8, 6, 1, carve="sentences")
    assert row["sst2_probe"] == pytest.approx(probe["accuracy"], abs=1e-9)


def test_parameters_and_file_sizes_match_an_independent_count(scored, setup):
    from torch import nn

    from hyperplex.layers.lowrank import matching_rank

    teacher_folder, _, folders = setup
    model = sentence_transformers.SentenceTransformer(os.fspath(teacher_folder), device="cpu")
    total = sum(p.numel() for p in model.parameters())
    shapes = [(m.in_features, m.out_features) for name, m in model.named_modules()
              if isinstance(m, nn.Linear) and fnmatch.fnmatchcase(name, INCLUDE)]
    assert len(shapes) == 12  # 2 blocks × (query, key, value, attention output, intermediate, output)
    dense = sum(d * k + k for d, k in shapes)
    phm2 = sum(d * k // 2 + 2 ** 3 + k for d, k in shapes)  # S: k·d/n, A: n³, bias k
    lowrank2 = sum(matching_rank(d, k, 2) * (d + k) + k for d, k in shapes)
    rows = rows_by_role(scored[0])
    expected = {"teacher": (total, 0, dense), os.fspath(folders["phm1"]): (total, 12, dense),
                os.fspath(folders["phm2"]): (total - dense + phm2, 12, phm2),
                os.fspath(folders["lowrank2"]): (total - dense + lowrank2, 12, lowrank2)}
    for name, counts in expected.items():
        row = rows[name]
        assert (row["params"], row["converted_layers"], row["selected_params"]) == counts, name
        assert 4 * row["params"] <= row["file_bytes"] <= 4 * row["params"] + 32_000, name  # float32 + header
    for name, folder in folders.items():  # the same writer: the student folder's own weights file
        assert rows[os.fspath(folder)]["file_bytes"] == (folder / "model.safetensors").stat().st_size, name


def test_the_json_holds_the_printed_tables_numbers(scored):
    result, printed = scored
    table = [line for line in printed.splitlines() if line.startswith("| ")]
    header = [cell.strip() for cell in table[0].strip("|").split("|")]
    assert header == ["model", "conversion", "agreement", "WikiQA MAP", "WikiQA MRR", "SST-2 probe", "params",
                      "converted layers", "params of converted layers", "file size"]
    keys = ["agreement", "wikiqa_map", "wikiqa_mrr", "sst2_probe", "params", "converted_layers",
            "selected_params", "file_bytes"]
    assert len(table) == 1 + len(result["rows"])
    for line, row in zip(table[1:], result["rows"]):
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        assert cells[:2] == [row["name"], row["conversion"]]
        for key, cell in zip(keys, cells[2:]):
            if key == "file_bytes":
                assert cell.endswith(" MB") and float(cell[:-3]) == round(row[key] / 1e6, 1)
            elif key in ("params", "converted_layers", "selected_params"):
                assert int(cell.replace(",", "")) == row[key], key
            else:
                assert float(cell) == round(row[key], 4), key
    assert "12 distinct sentences" in printed and "4 questions with a correct answer (1 without" in printed


@pytest.fixture(scope="module")
def compressed(setup, tmp_path_factory):
    """A `hyperplex compress` model folder (PHM n=2, 2 healing steps) whose config records the teacher."""
    teacher, data, _ = setup
    folder = tmp_path_factory.mktemp("compress")
    config = folder / "distill.yaml"
    config.write_text(yaml.safe_dump({
        "name": "tiny_compress", "seed": 1, "model_dir": os.fspath(folder / "model"),
        "data": {"task": "distillation", "train": "train.txt", "dev": "dev.txt"},
        "model": {"architecture": "pretrained_student", "path": os.fspath(teacher), "kind": "phm", "n": 2,
                  "targets": [INCLUDE], "min_features": 8},
        "training": {"lr": 3e-3, "batch_size": 8, "max_steps": 2, "validation_every": 2, "log_every": 1,
                     "num_threads": 1, "progress_bar": False, "plots": False, "device": "cpu"},
        "testing": {"batch_size": 8}}))
    assert main(["compress", os.fspath(config), "--data-root", os.fspath(data)]) == 0
    return folder / "model"


def test_compress_folders_score_their_student_and_record_their_teacher(setup, compressed, tmp_path, capsys):
    teacher, data, _ = setup
    copy = tmp_path / "no_student"  # a run without student/ yet: its best checkpoint
    shutil.copytree(compressed, copy)
    shutil.rmtree(copy / "student")
    out = tmp_path / "scores.json"
    args = [os.fspath(compressed), os.fspath(compressed / "student"), os.fspath(copy), "--data-root", os.fspath(data),
            *PROBE, "--json", os.fspath(out), "--threads", "1"]
    assert main(["score-encoder", *args]) == 0  # no --teacher: config.yaml's model.path
    result = json.loads(out.read_text())
    assert (result["teacher"], result["teacher_from"]) == (os.fspath(teacher),
                                                           f"model.path in {compressed / 'config.yaml'}")
    teacher_row, whole, student, best = result["rows"]
    assert (whole["source"], student["source"], best["source"]) == \
        (os.fspath(compressed / "student"), os.fspath(compressed / "student"), os.fspath(copy / "best.safetensors"))
    for metric in METRICS:  # student/ is the best checkpoint's student, written by save_converted
        assert whole[metric] == student[metric] == pytest.approx(best[metric], abs=1e-6), metric
    assert whole["conversion"] == "phm n=2" and whole["agreement"] < teacher_row["agreement"]
    assert whole["params"] == best["params"] and whole["file_bytes"] == best["file_bytes"]
    assert "| teacher (" in capsys.readouterr().out


def one_error(capsys, args: list[str]) -> str:
    capsys.readouterr()  # what the test's own setup printed (transformers' bars when it saves a model)
    code = main(["score-encoder", *args])
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 1 and len(lines) == 1, captured.err
    assert lines[0].startswith("hyperplex score-encoder: error: ") and "Traceback" not in captured.err
    assert captured.out == ""
    return lines[0]


def test_bad_inputs_fail_with_one_clear_line_before_any_work(setup, compressed, tmp_path, capsys):
    teacher, data, folders = setup
    common = ["--data-root", os.fspath(data), *PROBE, "--json", os.fspath(tmp_path / "out.json")]
    student, with_teacher = os.fspath(folders["phm2"]), ["--teacher", os.fspath(teacher)]
    (tmp_path / "neither").mkdir()
    (tmp_path / "neither" / "notes.txt").write_text("x")
    message = one_error(capsys, [os.fspath(tmp_path / "neither"), *with_teacher, *common])
    assert "neither a save_converted folder (no hyperplex_convert.json) nor a `hyperplex compress` model folder" \
        in message and "expected a folder written by hyperplex.convert.save_converted" in message
    assert "no such folder" in one_error(capsys, [os.fspath(tmp_path / "missing"), *with_teacher, *common])
    # a data file that is not there names its flag
    message = one_error(capsys, [student, *with_teacher, *common, "--wikiqa", "nowhere.jsonl.gz"])
    assert message.startswith("hyperplex score-encoder: error: --wikiqa: file not found: ") and "nowhere" in message
    empty = tmp_path / "empty_root"
    empty.mkdir()
    message = one_error(capsys, [student, *with_teacher, *common[:1], os.fspath(empty), *PROBE])
    assert "--agreement: file not found" in message and DEFAULT_FILES["agreement"] in message
    # a save_converted folder records no teacher
    assert "records no teacher" in one_error(capsys, [student, *common]) and "--teacher" in one_error(
        capsys, [student, *common])
    # embeddings of another width than the teacher's
    import transformers

    from hyperplex.convert import save_converted

    narrow = tmp_path / "narrow_bert"  # the tiny BERT's vocabulary and tokenizer, its model replaced by hidden 16
    narrow.mkdir()
    write_tiny_bert(narrow)
    config = transformers.BertConfig(vocab_size=len((narrow / "vocab.txt").read_text().split()), hidden_size=16,
                                     num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                                     max_position_embeddings=32)
    transformers.BertModel(config).save_pretrained(narrow)
    save_converted(sentence_transformers.SentenceTransformer(
        modules=[Transformer(os.fspath(narrow)), Pooling(16, "mean")], device="cpu"), tmp_path / "narrow")
    message = one_error(capsys, [os.fspath(tmp_path / "narrow"), *with_teacher, *common])
    assert "its embeddings have 16 dimensions but the teacher's" in message and "have 32" in message
    # a model folder of another task
    (tmp_path / "classifier").mkdir()
    (tmp_path / "classifier" / "config.yaml").write_text(yaml.safe_dump({"data": {"task": "classification"}}))
    message = one_error(capsys, [os.fspath(tmp_path / "classifier"), *with_teacher, *common])
    assert "has data.task 'classification'; a `hyperplex compress` model folder has data.task: distillation" in message
    # a probe larger than the whole sentences, an unknown metric, a teacher that is not a model folder
    message = one_error(capsys, [student, *with_teacher, *common, "--probe-train", "15"])
    assert "--probe-train + --probe-test = 21 exceeds the 20 whole sentences" in message
    assert "--metrics: 'sts' is not a metric" in one_error(capsys, [student, *with_teacher, *common, "--metrics",
                                                                     "agreement,sts"])
    message = one_error(capsys, [os.fspath(compressed), "--teacher", os.fspath(tmp_path / "neither"), *common])
    assert message.startswith("hyperplex score-encoder: error: the teacher (--teacher): ") and \
        "is not a model folder" in message
    assert not (tmp_path / "out.json").exists()


def test_a_subset_of_metrics_and_the_help(setup, tmp_path, capsys):
    teacher, data, folders = setup
    out = tmp_path / "s.json"
    assert main(["score-encoder", os.fspath(folders["phm2"]), "--teacher", os.fspath(teacher), "--metrics", "wikiqa",
                 "--data-root", os.fspath(data), "--json", os.fspath(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert set(rows[0]) >= {"wikiqa_map", "wikiqa_mrr", "params"} and "agreement" not in rows[0] and \
        "sst2_probe" not in rows[0]
    assert "| model | conversion | WikiQA MAP | WikiQA MRR | params |" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "score-encoder" in capsys.readouterr().out


def test_hostile_folders_are_refused_and_nothing_outside_them_changes(setup, compressed, tmp_path, capsys):
    """A student folder whose modules.json points at another model, a FIFO in a student, a converted folder
    given as the teacher, `evaluate --split FILE` on a compress folder: one line each, no file changed."""
    import hashlib

    def snapshot(folder):
        return {os.path.relpath(os.path.join(r, f), folder):
                hashlib.sha256(open(os.path.join(r, f), "rb").read()).hexdigest()
                for r, _, fs in os.walk(folder) for f in fs}

    teacher, data, folders = setup
    common = ["--data-root", os.fspath(data), *PROBE, "--json", os.fspath(tmp_path / "out.json")]
    victim = tmp_path / "victim"
    shutil.copytree(teacher, victim)
    before = snapshot(victim)
    hostile = tmp_path / "hostile"
    shutil.copytree(folders["phm2"], hostile)
    modules = json.loads((hostile / "modules.json").read_text())
    modules[0]["path"] = "../victim"
    (hostile / "modules.json").write_text(json.dumps(modules))
    message = one_error(capsys, [os.fspath(hostile), "--teacher", os.fspath(teacher), *common])
    assert "modules.json: entry 0 key 'path'" in message and "steps out of" in message
    assert snapshot(victim) == before
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo"
        shutil.copytree(folders["phm2"], fifo)
        os.mkfifo(fifo / "notes.md")
        assert "notes.md: a FIFO, not a regular file" in one_error(
            capsys, [os.fspath(fifo), "--teacher", os.fspath(teacher), *common])
    message = one_error(capsys, [os.fspath(folders["phm2"]), "--teacher", os.fspath(folders["phm1"]), *common])
    assert "is a converted model" in message and "load_converted" in message
    assert not (tmp_path / "out.json").exists()
    before = snapshot(compressed)
    assert main(["evaluate", os.fspath(compressed), "--split", os.fspath(data / "dev.txt"),
                 "--data-root", os.fspath(data)]) == 1
    assert "--split" in capsys.readouterr().err and snapshot(compressed) == before


def test_compress_refuses_a_converted_teacher_before_creating_its_folder(setup, tmp_path, capsys):
    teacher, data, folders = setup
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump({
        "name": "converted_teacher", "seed": 1, "model_dir": os.fspath(tmp_path / "model"),
        "data": {"task": "distillation", "train": "train.txt", "dev": "dev.txt"},
        "model": {"architecture": "pretrained_student", "path": os.fspath(folders["phm2"]), "kind": "phm", "n": 2},
        "training": {"max_steps": 1, "device": "cpu", "progress_bar": False, "plots": False}}))
    assert main(["compress", os.fspath(config), "--data-root", os.fspath(data)]) == 1
    err = capsys.readouterr().err
    assert "model.path: " in err and "is a converted model" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "model").exists()


def test_params_of_a_student_reports_the_teachers_vocabulary(setup, tmp_path, capsys):
    teacher, _, _ = setup
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump({
        "name": "student", "data": {"task": "distillation", "train": "train.txt", "dev": "dev.txt", "vocab_size": 8000},
        "model": {"architecture": "pretrained_student", "path": os.fspath(teacher), "kind": "phm", "n": 2,
                  "min_features": 8}, "training": {"max_steps": 1}}))
    assert main(["params", os.fspath(config)]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert "vocabulary 8000" not in header and f"(vocabulary {len(WORDS) + 5})" in header  # 5 special tokens


def test_compress_into_a_folder_another_run_holds_stops_and_writes_nothing(setup, tmp_path, capsys):
    import subprocess
    import sys

    teacher, data, _ = setup
    model_dir = tmp_path / "model"
    config = tmp_path / "distill.yaml"
    config.write_text(yaml.safe_dump({
        "name": "busy", "seed": 2, "model_dir": os.fspath(model_dir),
        "data": {"task": "distillation", "train": "train.txt", "dev": "dev.txt"},
        "model": {"architecture": "pretrained_student", "path": os.fspath(teacher), "kind": "phm", "n": 2,
                  "targets": [INCLUDE], "min_features": 8},
        "training": {"max_steps": 1, "device": "cpu", "progress_bar": False, "plots": False}}))
    code = ("import sys, time\nfrom hyperplex.fileio import folder_lock\n"
            "with folder_lock(sys.argv[1], 'hyperplex compress seed1.yaml'):\n    print('held', flush=True)\n"
            "    time.sleep(120)\n")
    other = subprocess.Popen([sys.executable, "-c", code, os.fspath(model_dir)], stdout=subprocess.PIPE, text=True)
    try:
        assert other.stdout.readline().strip() == "held"
        before = sorted(p.name for p in model_dir.iterdir())
        assert main(["compress", os.fspath(config), "--data-root", os.fspath(data)]) == 1
        err = capsys.readouterr().err
        assert f"pid {other.pid}, `hyperplex compress seed1.yaml`" in err
        assert sorted(p.name for p in model_dir.iterdir()) == before == [".hyperplex.lock"]
    finally:
        other.kill()
        other.wait()


def test_an_int8_student_folder_is_scored_in_int8(setup, tmp_path, capsys):
    """A save_quantized folder scores as its int8 model (load_quantized), labelled ', int8', with the int8 weight
    file's bytes; load_converted refuses it by name instead of calling its weights missing."""
    import torch

    from hyperplex.convert import load_converted
    from hyperplex.convert.serialize import LoadError
    from hyperplex.int8 import factorised_layers, load_quantized, quantize, save_quantized
    from hyperplex.scoring.quality import embed_batched, read_sentences, sentence_transformer_embedder

    teacher, data, folders = setup
    student = quantize(load_converted(folders["phm2"]))
    folder = tmp_path / "phm2_int8"
    save_quantized(student, folder)
    with pytest.raises(LoadError, match="int8 folder.*load_quantized"):
        load_converted(folder)
    out = tmp_path / "scores.json"
    assert main(["score-encoder", os.fspath(folder), "--teacher", os.fspath(teacher), "--data-root", os.fspath(data),
                 *PROBE, "--json", os.fspath(out), "--threads", "1", "--metrics", "agreement"]) == 0
    row = rows_by_role(json.loads(out.read_text()))[os.fspath(folder)]
    assert row["conversion"] == "phm n=2, int8"
    shapes = [(e["in_features"], e["out_features"]) for e in factorised_layers(student)]
    assert shapes and row["selected_params"] == sum(d * k // 2 + 2 ** 3 + k for d, k in shapes)
    assert row["file_bytes"] == sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
    sentences = read_sentences(data / DEFAULT_FILES["agreement"])
    reloaded = sentence_transformer_embedder(load_quantized(folder), 8)
    teachers = sentence_transformer_embedder(
        sentence_transformers.SentenceTransformer(os.fspath(teacher), device="cpu"), 8)
    expected = torch.nn.functional.cosine_similarity(embed_batched(reloaded, sentences, 8),
                                                     embed_batched(teachers, sentences, 8), dim=-1).mean()
    assert row["agreement"] == pytest.approx(float(expected), abs=1e-5)


def test_compress_refuses_an_int8_teacher_before_creating_its_folder(setup, tmp_path, capsys):
    """Healing asked of an int8 model: one line naming model.path, no model folder."""
    from hyperplex.convert import load_converted
    from hyperplex.int8 import quantize, save_quantized

    teacher, data, folders = setup
    int8 = tmp_path / "int8"
    save_quantized(quantize(load_converted(folders["phm2"])), int8)
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump({
        "model_dir": str(tmp_path / "m"), "data": {"task": "distillation", "train": "agree.txt", "dev_fraction": 0.2},
        "model": {"architecture": "pretrained_student", "path": str(int8)}, "training": {"max_steps": 2}}))
    capsys.readouterr()  # the progress bars of saving the int8 folder
    assert main(["compress", str(config), "--data-root", str(data)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.path" in err[0] and "is an int8 model" in err[0]
    assert not (tmp_path / "m").exists()
