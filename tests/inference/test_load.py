"""hyperplex.inference.load: a model loads from its folder or its checkpoint alone, driven through
:func:`hyperplex.inference.verbs.evaluate` and :func:`~hyperplex.inference.verbs.translate`.

Both take a model folder or a checkpoint file. From a file, the config is the one the checkpoint stored
and the tokeniser/vocabulary files are read from beside it, by the names the checkpoint records (the
standard names for a checkpoint without that record). A folder without ``config.yaml`` uses its checkpoint's
stored config; a folder with one keeps using it, and a model section that differs from the checkpoint's is
an error even when the shapes fit. Errors are the exceptions whose first line the CLI prints.

Two tiny models (the fixtures of ``test_cli_robustness.py``: a word-level Transformer translator and a
Transformer classifier) are trained once per module; every test works on copies.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from test_cli_robustness import EN, cls_config, mt_config, write_config, write_data

from hyperplex.inference import verbs as inference
from hyperplex.train.checkpoint import checkpoint_info, load_checkpoint, save_checkpoint, save_model_weights
from hyperplex.train.run import train

MT_FILES = ["src.json", "src_vocab.json", "tgt.json", "tgt_vocab.json"]
CLS_FILES = ["text.json", "text_vocab.json"]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoint_only")
    data = write_data(root)
    # 4 steps: a model that is not uniform, so equal outputs of two loading paths mean something
    mt_yaml = write_config(root / "mt.yaml", mt_config(data, training={"max_steps": 4}))
    cls_yaml = write_config(root / "cls.yaml", cls_config(data, training={"max_steps": 4}))
    train(str(mt_yaml), model_dir=str(root / "mt_model"))
    train(str(cls_yaml), model_dir=str(root / "cls_model"))
    (root / "in.txt").write_text("\n".join(EN[:6]) + "\n\n" + EN[9] + "\n", encoding="utf-8")
    return SimpleNamespace(root=root, data=data, mt=root / "mt_model", cls=root / "cls_model", src=root / "in.txt")


def checkpoint_alone(model: Path, files: list[str], dest: Path) -> Path:
    """``best.safetensors`` and ``files`` copied into a fresh folder ``dest``; returns the copied checkpoint."""
    dest.mkdir()
    for name in ["best.safetensors", *files]:
        shutil.copy2(model / name, dest / name)
    return dest / "best.safetensors"


def translate(model, src: Path, out: Path, **options) -> list[str]:
    inference.translate(str(model), str(src), str(out), beam_size=2, **options)
    return out.read_text(encoding="utf-8").splitlines()


def evaluate(model, **options) -> dict:
    """The metrics as ``hyperplex evaluate`` prints them (4 decimals)."""
    metrics = inference.evaluate(str(model), **{k: str(v) for k, v in options.items()})
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in metrics.items()}


def fail(call, model, **options) -> str:
    """The first line of the error ``call(MODEL, **options)`` raises (what the CLI prints after
    ``error:``); the error is one the CLI reports without a traceback hint."""
    with pytest.raises(Exception) as info:
        call(str(model), **{k: str(v) for k, v in options.items()})
    assert isinstance(info.value, (ValueError, OSError, RuntimeError)), repr(info.value)
    return str(info.value).splitlines()[0]


def forget_files_record(path: Path) -> None:
    """Rewrite ``path`` as a checkpoint without the record of its vocabulary file names (same weights,
    optimiser, RNG and config; task metadata without ``files``), through save_checkpoint."""
    ckpt = load_checkpoint(path)
    extra = dict(ckpt.extra)
    extra["task"] = {k: v for k, v in extra["task"].items() if k != "files"}
    save_checkpoint(path, ckpt.model_state, ckpt.optimizer_state, extra, rng=False)
    assert "files" not in checkpoint_info(path)["extra"]["task"]


# ---------------------------------------------------------------------------- what a checkpoint records
def test_checkpoints_record_their_config_and_vocabulary_files(world):
    mt, cls = checkpoint_info(world.mt / "best.safetensors"), checkpoint_info(world.cls / "best.safetensors")
    assert mt["extra"]["task"]["files"] == {"src": {"tokenizer": "src.json", "vocabulary": "src_vocab.json"},
                                            "tgt": {"tokenizer": "tgt.json", "vocabulary": "tgt_vocab.json"}}
    assert cls["extra"]["task"]["files"] == {"text": {"tokenizer": "text.json", "vocabulary": "text_vocab.json"}}
    assert mt["extra"]["config"] == yaml.safe_load((world.mt / "config.yaml").read_text())


# ---------------------------------------------------------------------------- a copied checkpoint file
def test_translate_a_copied_checkpoint_equals_the_full_folder(world, tmp_path):
    ckpt = checkpoint_alone(world.mt, MT_FILES, tmp_path / "copy")
    full = translate(world.mt, world.src, tmp_path / "full.txt")
    alone = translate(ckpt, world.src, tmp_path / "alone.txt")
    assert alone == full and len(full) == 8 and full[6] == ""  # one line per input line, blank for blank
    assert any(full)  # a model that says something, so the equality compares real decodings
    assert sorted(p.name for p in ckpt.parent.iterdir()) == sorted(["best.safetensors", *MT_FILES])  # nothing written


def test_evaluate_a_copied_checkpoint_on_a_file(world, tmp_path):
    ckpt = checkpoint_alone(world.mt, MT_FILES, tmp_path / "copy")
    dev = world.data / "dev"
    full = evaluate(world.mt, split=dev)
    alone = evaluate(ckpt, split=dev)
    assert alone == full and {"bleu", "chrf", "loss", "ppl"} <= set(full)
    assert full == evaluate(world.mt)  # the dev split named as a file scores as the configured dev


def test_evaluate_a_copied_classifier_checkpoint(world, tmp_path):
    ckpt = checkpoint_alone(world.cls, CLS_FILES, tmp_path / "copy")
    full = evaluate(world.cls)
    assert evaluate(ckpt, split=world.data / "dev.tsv") == full
    assert evaluate(ckpt) == full  # its stored config names the dev file too
    assert set(full) == {"accuracy", "loss"}


def test_a_file_in_its_model_folder_equals_the_folder(world, tmp_path):
    by_file = translate(world.mt / "last.safetensors", world.src, tmp_path / "a.txt")
    by_flag = translate(world.mt, world.src, tmp_path / "b.txt", checkpoint="last")
    assert by_file == by_flag


def test_a_folder_without_config_yaml_uses_its_checkpoints_config(world, tmp_path):
    model = Path(shutil.copytree(world.mt, tmp_path / "mt"))
    (model / "config.yaml").unlink()
    assert translate(model, world.src, tmp_path / "a.txt") == \
        translate(world.mt, world.src, tmp_path / "b.txt")
    assert evaluate(model, checkpoint="last") == evaluate(world.mt, checkpoint="last")


# ---------------------------------------------------------------------------- checkpoints without the files record
def test_a_checkpoint_without_the_files_record_uses_the_standard_names(world, tmp_path):
    ckpt = checkpoint_alone(world.mt, MT_FILES, tmp_path / "copy")
    expected = translate(ckpt, world.src, tmp_path / "new.txt")
    forget_files_record(ckpt)
    assert translate(ckpt, world.src, tmp_path / "old.txt") == expected
    cls = checkpoint_alone(world.cls, CLS_FILES, tmp_path / "cls")
    forget_files_record(cls)
    assert evaluate(cls, split=world.data / "dev.tsv") == evaluate(world.cls)


def test_the_recorded_file_names_are_the_ones_read(world, tmp_path):
    """Files renamed, and the checkpoint's record saying so, load: the record is what is looked up."""
    ckpt = checkpoint_alone(world.mt, MT_FILES, tmp_path / "copy")
    expected = translate(ckpt, world.src, tmp_path / "a.txt")
    (ckpt.parent / "tgt_vocab.json").rename(ckpt.parent / "german_vocab.json")
    c = load_checkpoint(ckpt)
    c.extra["task"]["files"]["tgt"]["vocabulary"] = "german_vocab.json"
    save_checkpoint(ckpt, c.model_state, c.optimizer_state, c.extra, rng=False)
    assert translate(ckpt, world.src, tmp_path / "b.txt") == expected


# ---------------------------------------------------------------------------- which config wins
def test_config_yaml_still_sets_decoding(world, tmp_path):
    model = Path(shutil.copytree(world.mt, tmp_path / "mt"))
    cfg = yaml.safe_load((model / "config.yaml").read_text())
    cfg["testing"]["max_output_length"] = 1
    (model / "config.yaml").write_text(yaml.safe_dump(cfg))
    short = translate(model, world.src, tmp_path / "a.txt")
    assert all(len(line.split()) <= 1 for line in short)
    assert short != translate(world.mt, world.src, tmp_path / "b.txt")


def test_a_model_section_that_differs_from_the_checkpoints_is_refused(world, tmp_path):
    """A key that leaves every tensor shape as it was (here the dropout): without the check the model
    would load and run as a model it was not trained as."""
    model = Path(shutil.copytree(world.mt, tmp_path / "mt"))
    cfg = yaml.safe_load((model / "config.yaml").read_text())
    saved = cfg["model"]["dropout"]
    cfg["model"]["dropout"] = 0.25
    (model / "config.yaml").write_text(yaml.safe_dump(cfg))
    (tmp_path / "x.txt").write_text("w1\n")
    msg = fail(inference.translate, model, input_path=tmp_path / "x.txt", output_path=tmp_path / "out.txt")
    assert msg.startswith(f"{model / 'config.yaml'} does not match the config {model / 'best.safetensors'} was "
                          f"trained with: model.dropout is 0.25 there but {saved!r} "
                          f"in the checkpoint")
    assert not (tmp_path / "out.txt").exists()


# ---------------------------------------------------------------------------- errors
def test_weights_without_a_config_and_no_config_yaml(world, tmp_path):
    (tmp_path / "m").mkdir()
    weights = tmp_path / "m" / "averaged.safetensors"
    save_model_weights(weights, load_checkpoint(world.mt / "best.safetensors").model_state)
    msg = fail(inference.evaluate, weights)
    assert msg == (f"{weights} stores no config (a weights file, e.g. written by `hyperplex average`) and "
                   f"{tmp_path / 'm' / 'config.yaml'} does not exist: put the training run's config.yaml beside it")


def test_weights_without_a_config_beside_a_config_yaml_load(world, tmp_path):
    model = Path(shutil.copytree(world.mt, tmp_path / "mt"))
    save_model_weights(model / "w.safetensors", load_checkpoint(model / "best.safetensors").model_state)
    assert translate(model / "w.safetensors", world.src, tmp_path / "a.txt") == \
        translate(world.mt, world.src, tmp_path / "b.txt")


@pytest.mark.parametrize("missing", [["tgt_vocab.json"], ["src.json", "tgt.json"]])
def test_vocabulary_files_missing_beside_the_checkpoint(world, tmp_path, missing):
    ckpt = checkpoint_alone(world.mt, [f for f in MT_FILES if f not in missing], tmp_path / "copy")
    (tmp_path / "in.txt").write_text("w1\n")
    msg = fail(inference.translate, ckpt, input_path=tmp_path / "in.txt", output_path=tmp_path / "out.txt")
    folder = ckpt.parent
    assert msg == (f"file{'s' if len(missing) > 1 else ''} not found: {', '.join(str(folder / f) for f in missing)} "
                   f"(the model's tokeniser and vocabulary files are read from beside its checkpoint, {folder}: "
                   f"{', '.join(MT_FILES)})")
    assert not (tmp_path / "out.txt").exists()


def test_classifier_vocabulary_missing(world, tmp_path):
    ckpt = checkpoint_alone(world.cls, ["text.json"], tmp_path / "copy")
    msg = fail(inference.evaluate, ckpt, split=world.data / "dev.tsv")
    assert msg.startswith(f"file not found: {ckpt.parent / 'text_vocab.json'} (")


@pytest.mark.parametrize("verb", ["evaluate", "translate"])
def test_a_file_that_is_not_a_hyperplex_checkpoint(world, tmp_path, verb):
    import torch
    from safetensors.torch import save_file

    plain = tmp_path / "plain.safetensors"
    save_file({"w": torch.zeros(2)}, str(plain))
    msg = fail(getattr(inference, verb), plain, **({"input_path": world.src} if verb == "translate" else {}))
    assert msg == f"{plain}: not a hyperplex checkpoint (safetensors metadata 'format' is None, " \
                  f"expected 'hyperplex-checkpoint')"
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    msg = fail(getattr(inference, verb), text, **({"input_path": world.src} if verb == "translate" else {}))
    assert msg.startswith(f"{text}: not a readable safetensors file")


def test_a_missing_checkpoint_file_and_a_second_checkpoint(world, tmp_path):
    assert fail(inference.evaluate, tmp_path / "gone.safetensors") == \
        f"checkpoint file not found: {tmp_path / 'gone.safetensors'}"
    msg = fail(inference.evaluate, world.mt / "best.safetensors", checkpoint="last")
    assert msg == f"{world.mt / 'best.safetensors'} is a checkpoint file; --checkpoint last cannot choose another"
