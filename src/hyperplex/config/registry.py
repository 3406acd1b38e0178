"""The two plugin tables of an experiment: architectures (``model.architecture``) and tasks (``data.task``).

Each entry names its module and classes as strings, imported only when a config uses it, so a config
error never imports every model, and this module (at the configuration layer) depends on none of
them. Adding a model or a task is one new module plus one :func:`register_architecture` /
:func:`register_task` call (or one line in the tables below); the config's valid choices, its error
messages and ``docs/config.md`` are read from these tables, so they stay true by construction.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, field

from hyperplex.config.core import ConfigError

__all__ = [
    "ModelConfig", "Architecture", "TaskEntry", "ARCHITECTURES", "TASKS", "register_architecture", "register_task",
    "get_architecture", "get_task", "architecture_names", "task_names",
]


def _load(module: str, name: str):
    return getattr(importlib.import_module(module), name)


@dataclass(frozen=True)
class Architecture:
    """``model.architecture`` → its config dataclass and model class (``family``: the group of tasks that can
    train it, e.g. seq2seq, classifier, pair, embedder; cross_encoder: one text, or a pair read as one sequence,
    so the single-text and the pair tasks both train it). ``recurrent``: its forward loops over time steps in
    Python (the LSTMs), which ``training.compile`` would unroll for every sequence length, so it is refused."""

    module: str
    config_class: str
    model_class: str
    family: str
    description: str
    recurrent: bool = False

    def load(self) -> tuple[type, type]:
        """``(config class, model class)``."""
        return _load(self.module, self.config_class), _load(self.module, self.model_class)


@dataclass(frozen=True)
class TaskEntry:
    """``data.task`` → its :class:`~hyperplex.train.task.Task` subclass and the model families it trains."""

    module: str
    task_class: str
    families: tuple[str, ...]
    description: str

    def load(self) -> type:
        return _load(self.module, self.task_class)


ARCHITECTURES: dict[str, Architecture] = {}
TASKS: dict[str, TaskEntry] = {}


def register_architecture(name: str, entry: Architecture) -> None:
    """Add (or replace) an architecture under ``name``."""
    ARCHITECTURES[name] = entry


def register_task(name: str, entry: TaskEntry) -> None:
    """Add (or replace) a task under ``name``."""
    TASKS[name] = entry


def architecture_names() -> tuple[str, ...]:
    return tuple(ARCHITECTURES)


def task_names() -> tuple[str, ...]:
    return tuple(TASKS)


def _unknown(what: str, name, valid) -> ConfigError:
    close = difflib.get_close_matches(str(name), list(valid), n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ConfigError(f"{what}: unknown {what.split('.')[-1]} {name!r}{hint}; valid: {', '.join(valid)}")


def get_task(name: str) -> TaskEntry:
    if name not in TASKS:
        raise _unknown("data.task", name, TASKS)
    return TASKS[name]


def get_architecture(name: str | None, task: str | None = None) -> Architecture:
    """Look ``name`` up; with ``task``, also check that the task can train it. Errors list the valid names."""
    valid = [k for k, a in ARCHITECTURES.items() if task is None or task not in TASKS or
             a.family in TASKS[task].families]
    if not name:
        raise ConfigError(f"model.architecture is required; valid{f' for task {task!r}' if task else ''}: "
                          f"{', '.join(valid)}")
    if name not in ARCHITECTURES:
        raise _unknown("model.architecture", name, ARCHITECTURES)
    if name not in valid:
        raise ConfigError(f"model.architecture {name!r} cannot do task {task!r}; valid for it: {', '.join(valid)}")
    return ARCHITECTURES[name]


@dataclass
class ModelConfig:
    """Base of every architecture's config dataclass: the ``model:`` section of a YAML file becomes the
    subclass that ``architecture`` names, once, at load (:meth:`resolve_class`)."""

    architecture: str = field(default="", metadata={
        "help": "the model; its keys are the ones listed for it below", "choices": architecture_names})

    @classmethod
    def resolve_class(cls, value, key: str) -> type:
        """The config class of ``value["architecture"]`` (called by the config loader for ``model:``)."""
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping with `architecture:` and its keys, got {value!r}")
        config_class, _ = get_architecture(value.get("architecture")).load()
        return config_class


for _name, _entry in {
    "rnn_translator": Architecture("hyperplex.models.rnn_translator", "RNNTranslatorConfig", "RNNTranslator",
                                   "seq2seq", "(PHM-)LSTM encoder-decoder with Luong attention (thesis ch. 3)",
                                   recurrent=True),
    "transformer": Architecture("hyperplex.models.transformer", "TransformerConfig", "TransformerTranslator",
                                "seq2seq", "Transformer / PHM-Transformer / Quaternion Transformer encoder-decoder"),
    "transformer_classifier": Architecture("hyperplex.models.transformer", "TransformerConfig",
                                           "TransformerClassifier", "classifier",
                                           "Transformer-family encoder + pooling + linear classifier"),
    "nli_encoder": Architecture("hyperplex.models.classifiers", "NLIEncoderConfig", "NLIEncoderClassifier", "pair",
                                "shared (PHM-)LSTM sentence encoder + MLP (PHM paper App. B.1)", recurrent=True),
    "decomposable_attention": Architecture("hyperplex.models.classifiers", "DecomposableAttentionConfig",
                                           "DecomposableAttention", "pair", "DeAtt (Parikh et al. 2016)"),
    "quaternion_attention": Architecture("hyperplex.models.classifiers", "QuaternionAttentionConfig",
                                         "QuaternionAttentionModel", "pair", "Q-Att (Tay et al. 2019 §3.2)"),
    "pretrained_student": Architecture("hyperplex.models.pretrained_student", "PretrainedStudentConfig",
                                       "PretrainedStudent", "embedder",
                                       "a pretrained SentenceTransformer with PHM / low-rank layers"),
    "pretrained_classifier": Architecture("hyperplex.models.pretrained_classifier", "PretrainedClassifierConfig",
                                          "PretrainedClassifier", "cross_encoder",
                                          "a pretrained encoder + linear head on one text, or on a text pair read "
                                          "as one sequence (a cross-encoder), fine-tuned through a PHM adapter, "
                                          "peft LoRA / LoKr, fully, or head only"),
}.items():
    register_architecture(_name, _entry)

for _task_name, _task_entry in {
    "translation": TaskEntry("hyperplex.tasks.translation", "TranslationTask", ("seq2seq",),
                             "sequence-to-sequence (also style transfer and the arithmetic task)"),
    "classification": TaskEntry("hyperplex.tasks.classification", "ClassificationTask",
                                ("classifier", "cross_encoder"), "one text → label (sentiment, agreement)"),
    "pair_classification": TaskEntry("hyperplex.tasks.classification", "PairClassificationTask",
                                     ("pair", "cross_encoder"), "two texts → label (NLI)"),
    "ranking": TaskEntry("hyperplex.tasks.classification", "RankingTask", ("pair", "cross_encoder"),
                         "question/answer pairs scored and ranked per question (WikiQA)"),
    "distillation": TaskEntry("hyperplex.tasks.distillation", "DistillationTask", ("embedder",),
                              "a converted pretrained encoder matches its teacher's sentence embeddings"),
}.items():
    register_task(_task_name, _task_entry)
