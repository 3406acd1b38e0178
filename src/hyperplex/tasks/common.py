"""Pieces every task shares: locating files, carving splits, tokenisers and vocabularies."""

from __future__ import annotations

import random
from pathlib import Path

from hyperplex.config import load_yaml
from hyperplex.config.experiment import DataConfig, ExperimentConfig, resolve_data_path
from hyperplex.data.readers import DataError
from hyperplex.data.tokenizers import Tokenizer, build_tokenizer, load_tokenizer
from hyperplex.data.vocab import Vocabulary
from hyperplex.train.process import is_main_process


def data_file(path: str, data_root: str | None, suffix: str = "", key: str = "data.train") -> Path:
    """The file a config names, trying ``PATH.SUFFIX`` then ``PATH.SUFFIX.gz``; a clear error if absent."""
    if not path:
        raise DataError(f"{key} is empty: the config must name a file")
    base = resolve_data_path(path, data_root)
    name = f"{base}.{suffix}" if suffix else str(base)
    from hyperplex.guards import input_file_problem

    for candidate in (Path(name), Path(name + ".gz")):
        problem = input_file_problem(candidate)
        if problem is None:
            return candidate
        if problem != "does not exist":  # a FIFO would block, a folder is not "not found"
            raise DataError(f"{key}: {candidate} {problem}; a data file is expected")
    root = f" (data root {data_root})" if data_root else " (no data root: set --data-root or HYPERPLEX_DATA)"
    raise DataError(f"{key}: file not found: {name}{'' if name.endswith('.gz') else ' or ' + name + '.gz'}{root}")


def carve_random(examples: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, dev): a seeded random ``fraction`` of ``examples`` held out (at least one example); the
    ``data.carve: random`` validation split of every task."""
    order = list(range(len(examples)))
    random.Random(seed).shuffle(order)
    n_dev = max(1, round(len(examples) * fraction))
    if n_dev >= len(examples):
        raise DataError(f"dev_fraction {fraction} leaves no training examples out of {len(examples)}")
    dev = sorted(order[:n_dev])
    keep = sorted(order[n_dev:])
    return [examples[i] for i in keep], [examples[i] for i in dev]


def carve_groups(examples: list, keys: list, fraction: float, seed: int) -> tuple[list, list]:
    """(train, dev): a seeded random ``fraction`` of the distinct ``keys`` (one per example) held out with every
    example of each, so that no group is split between the two."""
    _, dev_keys = carve_random(sorted(set(keys)), fraction, seed)
    held = set(dev_keys)
    return [e for e, k in zip(examples, keys) if k not in held], [e for e, k in zip(examples, keys) if k in held]


def carve_seed(cfg: ExperimentConfig, model_dir: Path, fresh: bool) -> int:
    """The seed of the carved validation split: ``data.split_seed``, except for a model folder whose
    saved ``config.yaml`` predates that key (``fresh`` False): those runs carved with ``seed``, so
    resuming or evaluating them must carve the same way."""
    saved = Path(model_dir) / "config.yaml"
    if not fresh and saved.is_file() and "split_seed" not in (load_yaml(saved).get("data") or {}):
        return cfg.seed
    return cfg.data.split_seed


def subset(examples: list, size: int, seed: int) -> list:
    """A seeded random subset of ``size`` examples in corpus order (all if ``size`` is 0 or too large)."""
    if not size or size >= len(examples):
        return examples
    order = sorted(random.Random(seed + 7919).sample(range(len(examples)), size))
    return [examples[i] for i in order]


def tokenizer_options(cfg: DataConfig) -> dict:
    if cfg.tokenizer in ("bpe", "unigram"):
        return {"vocab_size": cfg.vocab_size, "model_type": cfg.tokenizer}
    if cfg.tokenizer == "word":
        return {"lowercase": cfg.lowercase}
    return {}


def tokenizer_and_vocab(cfg: DataConfig, lines: list[str] | None, model_dir: Path, name: str,
                        fresh: bool) -> tuple[Tokenizer, Vocabulary]:
    """Train/build (``fresh``) and save, or load, the tokeniser ``name`` and its vocabulary.

    Under torchrun every rank builds the same tokeniser from the same lines (sentencepiece's training is
    deterministic), but only rank 0 saves it: the other ranks may get here before rank 0 has made the
    model folder, and two ranks need not write one file."""
    if fresh:
        if lines is None:
            raise ValueError(f"building tokenizer {name!r} needs its training lines")
        kind = "sentencepiece" if cfg.tokenizer in ("bpe", "unigram") else cfg.tokenizer
        tokenizer = build_tokenizer(kind, lines, **tokenizer_options(cfg))
        max_size = cfg.vocab_size if cfg.tokenizer == "word" else None
        vocab = tokenizer.build_vocab(lines, max_size=max_size, min_freq=cfg.min_freq)
        if is_main_process():
            tokenizer.save(model_dir, name)
            vocab.save(model_dir / f"{name}_vocab.json")
        return tokenizer, vocab
    return load_tokenizer(model_dir, name), Vocabulary.load(model_dir / f"{name}_vocab.json")


def vocabulary_files(cfg: DataConfig, name: str) -> dict[str, str]:
    """The files the tokeniser/vocabulary ``name`` is saved as (what :func:`tokenizer_and_vocab` writes):
    ``{"tokenizer": "NAME.json", "vocabulary": "NAME_vocab.json"}`` plus ``"model": "NAME.model"`` for
    sentencepiece. Tasks record these in every checkpoint, so a copied checkpoint says what to copy with it."""
    files = {"tokenizer": f"{name}.json", "vocabulary": f"{name}_vocab.json"}
    if cfg.tokenizer in ("bpe", "unigram"):
        files["model"] = f"{name}.model"
    return files


def load_saved_vocabularies(cfg: DataConfig, folder: Path, names: tuple[str, ...],
                            recorded: dict | None = None) -> dict[str, tuple[Tokenizer, Vocabulary]]:
    """``{name: (tokeniser, vocabulary)}`` read from ``folder`` by the file names a checkpoint ``recorded``
    (its task metadata's ``"files"``), or by the standard names (:func:`vocabulary_files`) for a checkpoint
    that records none. Every file is looked for before any is read, so a missing one is
    one error naming all the missing files and the folder (FileNotFoundError)."""
    recorded = recorded or {}
    files = {name: recorded.get(name) or vocabulary_files(cfg, name) for name in names}
    wanted = [f for entry in files.values() for f in entry.values()]
    from hyperplex.guards import check_input_file

    missing = [f for f in wanted if not (Path(folder) / f).exists()]
    for f in wanted:
        if f not in missing:
            check_input_file(Path(folder) / f, "a tokeniser or vocabulary file of the model")  # a FIFO, a folder
    if missing:
        raise FileNotFoundError(f"file{'s' if len(missing) > 1 else ''} not found: "
                                f"{', '.join(str(Path(folder) / f) for f in missing)} (the model's tokeniser and "
                                f"vocabulary files are read from beside its checkpoint, {folder}: {', '.join(wanted)})")
    return {name: (load_tokenizer(folder, Path(entry["tokenizer"]).stem),
                   Vocabulary.load(Path(folder) / entry["vocabulary"])) for name, entry in files.items()}


def lowercase_if(cfg: DataConfig, text: str) -> str:
    """Apply ``data.lowercase`` to raw text (sources, targets and references alike, so BLEU compares
    lowercased output with lowercased references)."""
    return text.lower() if cfg.lowercase else text
