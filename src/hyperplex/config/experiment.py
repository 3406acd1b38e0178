"""The experiment config: one YAML file per experiment, validated into these dataclasses.

Sections: ``data`` (:class:`DataConfig`), ``model`` (``architecture`` plus that architecture's
config class, see :mod:`hyperplex.config.registry`), ``training`` (:class:`TrainingConfig`) and
``testing`` (:class:`TestingConfig`). ``hyperplex train CONFIG --training.lr=3e-4`` overrides
any key; the resolved config is saved as ``config.yaml`` in the model folder.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from hyperplex.config.core import ConfigError, from_dict, load_yaml, located, merge, parse_overrides, to_dict
from hyperplex.config.registry import ARCHITECTURES, TASKS, ModelConfig, get_architecture, task_names


@dataclass
class DataConfig:
    """Where the data is and how it becomes token ids."""

    task: str = field(
        default="translation", metadata={"choices": task_names,  # help: the task table's own descriptions
                                         "help": "; ".join(f"{name}: {entry.description}"
                                                           for name, entry in TASKS.items())})
    format: Literal["parallel", "tsv", "jsonl", "agreement", "arithmetic"] = field(
        default="parallel", metadata={"help": "parallel: aligned PREFIX.SRC / PREFIX.TGT text files (plain or .gz); "
                                      "tsv / jsonl: one example per line with named fields; agreement: Linzen "
                                      "`VBZ|VBP<TAB>prefix`; arithmetic: generated on the fly (no files)"})
    train: str = field(default="", metadata={"help": "training file (or prefix for parallel data), relative to the "
                                             "data root unless absolute"})
    dev: str = field(default="", metadata={"help": "validation file/prefix; empty = carve `dev_fraction` of train"})
    src: str = field(default="", metadata={"help": "parallel data: source suffix/language, "
                                                   "e.g. `en` reads PREFIX.en(.gz)"})
    tgt: str = field(default="", metadata={"help": "parallel data: target suffix/language"})
    text_field: str = field(default="sentence", metadata={"help": "tsv/jsonl classification: the text column"})
    a_field: str = field(default="premise", metadata={"help": "pair tasks: first text column (premise / question)"})
    b_field: str = field(default="hypothesis", metadata={"help": "pair tasks: second text column "
                                                                 "(hypothesis / answer)"})
    label_field: str = field(default="label", metadata={"help": "label column"})
    group_field: str = field(default="qid", metadata={"help": "ranking: the question-id column"})
    labels: list[str] = field(default_factory=list, metadata={
        "help": "known labels in class-index order; empty = the sorted set found in train. A label outside the set is "
                "an error naming the file and line"})
    dev_fraction: float = field(default=0.0, metadata={"help": "if `dev` is empty: fraction of train held out as the "
                                                        "validation split (fixed by `split_seed`)"})
    split_seed: int = field(default=1, metadata={"help": "seed of the validation split carved by `dev_fraction` "
                                                 "(and of the generated arithmetic data), separate from `seed` so "
                                                 "that runs with different seeds share one split. A model folder whose "
                                                 "config has no `split_seed` carved with its "
                                                 "`seed`, and still does when resumed or evaluated"})
    carve: Literal["random", "grouped", "sentences"] = field(default="random", metadata={
        "help": "how `dev_fraction` is carved (classification): random = random examples; grouped = whole groups of "
                "examples that share their first text (a premise with all its hypotheses, every copy of a repeated "
                "text; `dev_fraction` of the groups), so that no validation text is also trained on; sentences = "
                "SST-2 style phrase files: validation is drawn from the whole sentences (texts inside no other text "
                "of the file) and every training text contained in a validation sentence is dropped (no leak)"})
    exclude: list[str] = field(default_factory=list, metadata={
        "help": "distillation: evaluation files whose sentences are never trained on (text, one per line; .jsonl: "
                "the question/answer/premise/hypothesis/sentence/text fields; .tsv: the sentence or text column), "
                "relative to the data root. A training sentence equal to one of them or to a dev sentence, compared "
                "after folding case, accents and spacing as an uncased BERT tokenizer does, is dropped and counted "
                "in train.log"})
    leak_check: Literal["drop", "error"] = field(default="drop", metadata={
        "help": "distillation: what a training sentence equal (after that folding) to a sentence of the `dev` file "
                "or an `exclude` file does: drop = removed from training and counted in train.log; error = the run "
                "stops before training, naming the file and line (for a corpus meant to be clean, e.g. one "
                "written by `hyperplex corpus`)"})
    max_train_examples: int = field(default=0, metadata={"help": "use only this many training examples (a seeded "
                                                              "random subset, reported in train.log); 0 = all"})
    tokenizer: Literal["word", "char", "bpe", "unigram"] = field(
        default="word", metadata={"help": "word: whitespace/punctuation words with a top-K vocabulary and <unk> "
                                  "(the thesis); char: characters (arithmetic); bpe / unigram: sentencepiece "
                                  "trained on the training split and saved with the model"})
    lowercase: bool = field(default=False, metadata={"help": "lowercase text before tokenising"})
    embeddings: str = field(default="", metadata={"help": "classification/pair tasks: pre-trained word vectors in "
                                                  "GloVe text format (`word v1 … vd` per line, plain or .gz) to "
                                                  "initialise the embeddings when training starts; words not in the "
                                                  "file keep their random init. Empty = train from scratch"})
    vocab_size: int = field(default=32000, metadata={"help": "word: keep the K most frequent words; "
                                                     "bpe/unigram: sentencepiece vocabulary size"})
    min_freq: int = field(default=1, metadata={"help": "word: drop words seen fewer times than this"})
    shared_vocab: bool = field(default=False, metadata={"help": "translation: one vocabulary for source and target"})
    max_length: int = field(default=100, metadata={"help": "translation: training pairs with a side longer than "
                                                    "this (in tokens) are dropped and the count is logged"})
    truncate: int = field(default=0, metadata={"help": "classification: keep only the first N tokens of each text "
                                                "(IMDb); 0 = keep all"})
    arithmetic_train_size: int = field(default=20000, metadata={"help": "arithmetic: generated training samples"})
    arithmetic_dev_size: int = field(default=1000, metadata={"help": "arithmetic: generated validation samples "
                                                             "(disjoint from train)"})

    def __post_init__(self) -> None:
        if not 0.0 <= self.dev_fraction < 1.0:
            raise ValueError(f"dev_fraction must be in [0, 1), got {self.dev_fraction}")
        for key in ("vocab_size", "min_freq", "max_length"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be ≥ 1, got {getattr(self, key)}")
        if self.format == "parallel" and self.task == "translation" and (not self.src or not self.tgt):
            raise ValueError("parallel data needs `src` and `tgt` suffixes (e.g. src: en, tgt: de)")


@dataclass
class TrainingConfig:
    """Optimisation, batching, validation, early stopping and checkpointing."""

    optimizer: Literal["adam", "adamw", "sgd"] = field(default="adam", metadata={"help": "optimiser"})
    lr: float = field(default=1e-3, metadata={"help": "peak learning rate (the thesis' SGD: 1.0)"})
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98], metadata={"help": "Adam/AdamW betas"})
    eps: float = field(default=1e-9, metadata={"help": "Adam/AdamW epsilon"})
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay (decoupled for adamw)"})
    momentum: float = field(default=0.0, metadata={"help": "SGD momentum"})
    schedule: Literal["constant", "inverse_sqrt", "halving", "linear_decay"] = field(
        default="constant", metadata={"help": "learning-rate schedule: inverse_sqrt (linear warmup, then ∝ 1/√step); "
                                      "halving (the thesis: halve every epoch after `halve_after_epoch`); "
                                      "linear_decay (warmup, then linear to 0 at max_steps)"})
    warmup_steps: int = field(default=0, metadata={"help": "warmup steps for inverse_sqrt / linear_decay"})
    halve_after_epoch: int = field(default=8, metadata={"help": "halving: first epoch whose end halves the lr"})
    batch_size: int = field(default=64, metadata={"help": "examples (batch_type sentence) or padded tokens "
                                                  "(batch_type token) per batch, over all processes"})
    batch_type: Literal["sentence", "token"] = field(default="sentence", metadata={"help": "how batch_size counts"})
    accum_steps: int = field(default=1, metadata={"help": "batches accumulated per optimiser step"})
    max_steps: int = field(default=0, metadata={"help": "stop after this many optimiser steps; 0 = no step limit. "
                                                "With max_epochs also set, whichever comes first ends the run "
                                                "(train.log says which at the start and at the end)"})
    max_epochs: int = field(default=0, metadata={"help": "stop after this many epochs; 0 = no epoch limit. At "
                                                 "least one of max_steps / max_epochs must be set"})
    clip_grad_norm: float = field(default=0.0, metadata={"help": "clip the global gradient norm; 0 = off"})
    label_smoothing: float = field(default=0.0, metadata={"help": "label smoothing of the cross-entropy"})
    precision: Literal["fp32", "bf16", "fp16"] = field(default="fp32", metadata={
        "help": "autocast dtype; bf16 on CPU or CUDA, fp16 only on CUDA (with loss scaling)"})
    compile: bool = field(default=False, metadata={
        "help": "torch.compile the training forward and backward passes (validation and decoding stay eager); "
                "the first steps pay the compilation, dropout draws differ from eager ones"})
    validation_every: int = field(default=0, metadata={"help": "validate (and checkpoint) every N optimiser steps; "
                                                       "0 = at the end of every epoch"})
    checkpoint_every: int = field(default=0, metadata={"help": "also save last.safetensors every N steps between "
                                                       "validations; 0 = only at validations (last_at_validation)"})
    last_at_validation: bool = field(default=True, metadata={
        "help": "write last.safetensors (weights, optimiser state, RNG: what --resume reads) at every validation; "
                "false: only when the run ends or is stopped by SIGINT/SIGTERM (and every checkpoint_every steps), for "
                "runs with a large state that are stopped by a signal, as converge.sh's GPU calls are: a crash then "
                "loses the steps since the last write"})
    early_stopping_metric: str = field(default="", metadata={
        "help": "validation metric that picks the best checkpoint and drives early stopping: loss, ppl, bleu, chrf, "
                "accuracy, map, mrr; empty = the task's default (bleu, accuracy or map)"})
    patience: int = field(default=0, metadata={"help": "stop after this many validations without improvement; "
                                                       "0 = never"})
    keep_best: int = field(default=1, metadata={"help": "keep the k best checkpoints by the validation metric"})
    log_every: int = field(default=50, metadata={"help": "log training loss every N steps"})
    device: str = field(default="auto", metadata={"help": "auto (cuda if available), cpu, cuda, cuda:1 …"})
    num_threads: int = field(default=0, metadata={"help": "CPU threads for torch; 0 = chosen from the model width, "
                                                  "the batch and the available cores (hyperplex/threads.py: one "
                                                  "thread for small models)"})
    deterministic: bool = field(default=False, metadata={"help": "torch.use_deterministic_algorithms (exact resume)"})
    shuffle: bool = field(default=True, metadata={"help": "shuffle training batches every epoch (seeded)"})
    bucket: bool = field(default=True, metadata={"help": "group examples of similar length into batches"})
    progress_bar: bool = field(default=True, metadata={"help": "tqdm progress bar on stderr"})
    plots: bool = field(default=True, metadata={"help": "write loss/metric curves and PHM-rule plots as PNG"})

    def __post_init__(self) -> None:
        for key in ("batch_size", "accum_steps", "keep_best", "log_every"):
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be ≥ 1, got {getattr(self, key)}")
        for key in ("max_steps", "max_epochs", "warmup_steps", "validation_every", "checkpoint_every", "patience",
                    "num_threads"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be ≥ 0, got {getattr(self, key)}")
        if not self.max_steps and not self.max_epochs:
            raise ValueError("max_steps and max_epochs are both 0, so the run would never stop; set at least one "
                             "(e.g. --training.max_steps=10000)")
        if self.lr <= 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        # what torch's optimisers refuse, refused here, before the data is read and the model built
        for key in ("eps", "weight_decay", "momentum", "clip_grad_norm"):
            if getattr(self, key) < 0:
                raise ValueError(f"{key} must be ≥ 0, got {getattr(self, key)}")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if len(self.betas) != 2:
            raise ValueError(f"betas must have two values, got {self.betas}")
        if not all(0.0 <= beta < 1.0 for beta in self.betas):
            raise ValueError(f"betas must each be in [0, 1), got {self.betas}")


@dataclass
class TestingConfig:
    """Decoding and evaluation. Every decoding setting is read from here, and the beam width is
    checked in one place (:func:`check_beam_size`), for the YAML key and the CLI's ``--beam-size``."""

    beam_size: int = field(default=5, metadata={"help": "beam width of `hyperplex evaluate` / `translate` (and "
                                                "the experiment reports); 1 = greedy"})
    validation_beam_size: int = field(default=1, metadata={
        "help": "beam width of the validation BLEU/chrF computed during training (1 = greedy: fast, and what "
                "picks the best checkpoint); train.log states it at the start"})
    beam_alpha: float = field(default=0.6, metadata={"help": "length penalty ((5+|Y|)/6)^alpha (Wu et al. 2016)"})
    max_output_length: int = field(default=100, metadata={"help": "longest output in tokens"})
    batch_size: int = field(default=32, metadata={"help": "sentences per decoding/evaluation batch"})
    replace_unk: bool = field(default=False, metadata={"help": "replace each output <unk> by the most-attended "
                                                       "source token (thesis §3.6)"})
    unk_dictionary: str = field(default="", metadata={"help": "optional `source<TAB>target` dictionary used by "
                                                      "replace_unk"})
    quantize: Literal["none", "int8"] = field(default="none", metadata={
        "help": "the form a trained model is evaluated and served in: int8 = PyTorch's dynamic int8 quantisation "
                "of its dense, low-rank and PHM layers (hyperplex.int8), applied after loading, no "
                "training; `hyperplex compress` then writes student/ in int8 (load_quantized)"})

    def __post_init__(self) -> None:
        check_beam_size(self.beam_size, "beam_size")
        check_beam_size(self.validation_beam_size, "validation_beam_size")
        if self.max_output_length < 1 or self.batch_size < 1:
            raise ValueError("max_output_length and batch_size must be ≥ 1")
        if self.beam_alpha < 0:
            raise ValueError(f"beam_alpha must be ≥ 0, got {self.beam_alpha}")

    def with_beam_size(self, beam_size: int | None, name: str = "--beam-size") -> TestingConfig:
        """This config with ``beam_size`` replaced (``None``: unchanged), checked as ``name``."""
        if beam_size is None:
            return self
        check_beam_size(beam_size, name)
        return replace(self, beam_size=beam_size)


def check_beam_size(value, name: str) -> None:
    """The one check of a beam width (``name``: the key or flag it came from)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be ≥ 1 (1 = greedy), got {value}")


@dataclass
class ExperimentConfig:
    """A whole experiment."""

    name: str = field(default="experiment", metadata={"help": "name shown in logs"})
    model_dir: str = field(default="", metadata={"help": "model folder (checkpoints, logs, vocabularies); "
                                                 "`--model-dir` overrides"})
    seed: int = field(default=1, metadata={"help": "seed for initialisation, data order, dropout and splits"})
    data: DataConfig = field(default_factory=DataConfig, metadata={"help": "data section"})
    model: ModelConfig = field(default=None, metadata={  # type: ignore[assignment]
        "help": "`architecture:` plus that architecture's keys (see the model sections below); becomes the "
                "architecture's own config dataclass at load"})
    training: TrainingConfig = field(default_factory=TrainingConfig, metadata={"help": "training section"})
    testing: TestingConfig = field(default_factory=TestingConfig, metadata={"help": "testing section"})

    def __post_init__(self) -> None:
        if self.model is None:
            get_architecture(None, self.data.task)  # raises: model.architecture is required (valid: …)


def default_data_root() -> str | None:
    """``$HYPERPLEX_DATA``, else ``../shared/data`` (relative to the working directory) if it exists."""
    env = os.environ.get("HYPERPLEX_DATA")
    if env:
        return env
    candidate = Path("..") / "shared" / "data"
    return str(candidate) if candidate.is_dir() else None


def resolve_data_path(path: str, data_root: str | None) -> Path:
    """A data path from a config: absolute paths as they are; relative ones under the data root
    (or the working directory). Raises :class:`ConfigError` listing where it looked."""
    p = Path(path).expanduser()
    if p.is_absolute() or not data_root:
        return p
    rooted = Path(data_root) / p
    return rooted if rooted.parent.is_dir() or not p.parent.is_dir() else p


def build_experiment(raw: dict) -> ExperimentConfig:
    """Validate a raw dict into an :class:`ExperimentConfig`; ``model`` becomes its architecture's dataclass.

    The cross-section rule that the task must be able to train the architecture is checked first, so a
    mismatch is reported as such rather than as the other architecture's unknown keys; then that
    ``training.compile`` is not asked of a recurrent architecture."""
    data, model = raw.get("data"), raw.get("model")
    task = data.get("task", "translation") if isinstance(data, dict) else "translation"
    if isinstance(model, dict) and model.get("architecture") and task in task_names():
        get_architecture(model["architecture"], task)
    cfg = from_dict(ExperimentConfig, raw)
    architecture = getattr(cfg.model, "architecture", "")
    if cfg.training.compile and architecture in ARCHITECTURES and ARCHITECTURES[architecture].recurrent:
        raise ConfigError(f"training.compile: model.architecture {architecture!r} runs its LSTM one time step at a "
                          f"time in Python, which torch.compile unrolls anew for every sequence length (minutes of "
                          f"compilation even for a toy model); train it with training.compile: false")
    return cfg


def _overridden(err: ConfigError, message: str, given: dict[str, Any]) -> str | None:
    """The override that ``err`` is about, if one is: the key at fault (``err.key``; a list item's list, a key
    under a section given whole) when the error names it, else the first override its message names."""
    if err.key is not None:
        parts = re.sub(r"\[\d+\]", "", err.key).split(".")
        return next((key for key in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if key in given), None)
    return next((key for key in given if message.startswith(f"{key}:") or f"'{key}'" in message), None)


def load_experiment(path: str | Path, overrides: list[str] | None = None,
                    model_dir: str | None = None) -> ExperimentConfig:
    """Read ``path``, apply dotted ``overrides`` and ``model_dir``, validate everything."""
    raw = load_yaml(path)
    parsed = parse_overrides(overrides) if overrides else {}
    given = flatten(parsed)
    if parsed:
        raw = merge(raw, parsed)
    if model_dir:
        raw["model_dir"] = model_dir
    try:
        cfg = build_experiment(raw)
    except ConfigError as err:
        message = str(err)
        # a bad key or value that came from the command line is the override's, not the file's
        blamed = _overridden(err, message, given)
        if blamed is not None:
            raise ConfigError(f"override --{blamed}={given[blamed]}: {message} (on top of {path})",
                              key=err.key) from None
        raise ConfigError(f"{located(path, err)}: {message}", key=err.key) from None
    if not cfg.model_dir:
        raise ConfigError(f"{path}: no model folder: set `model_dir:` in the config or pass --model-dir DIR")
    return cfg


def experiment_dict(cfg: ExperimentConfig) -> dict:
    """The resolved config as a plain dict (what ``config.yaml`` in the model folder holds)."""
    return to_dict(cfg)


#: Keys a resumed run may change: its budget, how it reports and what runs it (device, threads, compilation:
#: the rounding changes, not the model or its optimisation), never what it computes.
RESUMABLE_KEYS = frozenset({
    "name", "model_dir",
    "training.max_steps", "training.max_epochs", "training.patience", "training.validation_every",
    "training.checkpoint_every", "training.last_at_validation", "training.log_every", "training.keep_best",
    "training.num_threads", "training.device", "training.compile", "training.progress_bar", "training.plots",
    "testing.batch_size",
})


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """Nested dict → ``{"a.b.c": value}`` (lists are leaves)."""
    out: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted))
        else:
            out[dotted] = value
    return out


#: Model keys a saved folder of an earlier version may hold, read under their new name (a config a user writes
#: is refused with the new name instead: ``renamed_keys``). ``include`` is ``targets``, the one selection
#: vocabulary of conversion, int8 and adapters.
SAVED_KEY_RENAMES = {"pretrained_student": {"include": "targets"}}
#: Model keys added with a default that changed what is computed: a saved config without one was made before it,
#: with the value here (``balance_factors``: the SVD split's factors as fitted, unbalanced), so it compares as such
#: against a plan instead of taking today's default.
SAVED_KEY_BEFORE = {"pretrained_student": {"balance_factors": False}}


def upgrade_saved_config(raw: dict) -> None:
    """In place, in the config of a saved model folder: rename the model keys of :data:`SAVED_KEY_RENAMES`, and give
    the keys of :data:`SAVED_KEY_BEFORE` that it lacks the value they had before they existed."""
    model = raw.get("model")
    if not isinstance(model, dict):
        return
    architecture = model.get("architecture", "")
    for old, new in SAVED_KEY_RENAMES.get(architecture, {}).items():
        if old in model and new not in model:
            model[new] = model.pop(old)
    for key, before in SAVED_KEY_BEFORE.get(architecture, {}).items():
        model.setdefault(key, before)


def resume_experiment(model_dir: str | Path, path: str | Path, overrides: list[str] | None = None) -> tuple[
        ExperimentConfig, list[str]]:
    """The config of a resumed run: the saved ``config.yaml`` of ``model_dir``, with the budget keys
    (:data:`RESUMABLE_KEYS`) that the YAML file ``path`` or ``overrides`` set explicitly applied on top.

    Any other key set explicitly to a value that differs from the saved run raises :class:`ConfigError`
    naming every such key (a resumed run keeps its data, model and optimisation; a changed one belongs
    in a new model folder). Keys the file leaves at their defaults are not compared, so a default that
    changed between versions never blocks a resume. Returns ``(config, ["key: old → new", ...])``.
    """
    model_dir = Path(model_dir)
    saved_path = model_dir / "config.yaml"
    saved_raw = load_yaml(saved_path)
    upgrade_saved_config(saved_raw)
    saved_raw["model_dir"] = str(model_dir)
    try:
        saved = build_experiment(saved_raw)
    except ConfigError as err:
        raise ConfigError(f"{located(saved_path, err)}: {err}", key=err.key) from None
    explicit = load_yaml(path)
    if overrides:
        explicit = merge(explicit, parse_overrides(overrides))
    explicit["model_dir"] = str(model_dir)
    try:
        requested = build_experiment(merge(experiment_dict(saved), explicit))
    except ConfigError as err:
        raise ConfigError(f"{located(path, err)}: {err}", key=err.key) from None
    old, new = flatten(experiment_dict(saved)), flatten(experiment_dict(requested))
    asked = flatten(explicit)
    touched = {k for k in new if any(k == a or k.startswith(a + ".") or a.startswith(k + ".") for a in asked)}
    differing = sorted(k for k in touched if old.get(k) != new.get(k))
    refused = [k for k in differing if k not in RESUMABLE_KEYS]
    if refused:
        shown = "; ".join(f"{k}: saved {old.get(k)!r}, now {new.get(k)!r}" for k in refused)
        raise ConfigError(f"--resume: {shown} — a resumed run keeps its data, model and optimisation settings "
                          f"(saved in {saved_path}); only {', '.join(sorted(RESUMABLE_KEYS - {'name', 'model_dir'}))}"
                          f" may change. Train into a new --model-dir to change the others")
    changes = [f"{k}: {old.get(k)!r} → {new.get(k)!r}" for k in differing if k not in ("name", "model_dir")]
    return requested, changes

