"""Optional hooks: what a model or a task may add to the :class:`~hyperplex.train.task.Task` contract, who
implements each one, and who calls it.

Models live below this layer (:mod:`hyperplex.models`) and are plain ``nn.Module`` subclasses, so their hooks
are :class:`typing.Protocol` classes: a model has a hook by defining its methods (no import, no base class),
and the caller asks ``isinstance(model, Hook)`` (``issubclass(model_class, Hook)`` for a hook of the model
class, called before any model exists). A model without the hook is handled as if the feature did not
exist: a plain ``state_dict``, no description, the task's own tokenizer.

Hooks every task answers (``checkpoint_record``, ``load_vocabularies``) are attributes and methods with a
default on :class:`~hyperplex.train.task.Task`; the ones only some tasks have are Protocols below too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:  # annotations only: importing the hooks needs no torch
    from torch import Tensor, nn

__all__ = [
    "TextTokenizer", "PairTextTokenizer", "OwnTokenizer", "FitsWhenBuilt", "CustomCheckpointState", "Describes",
    "PretrainedEmbeddings", "EvaluatesFiles", "SignsMetrics", "Translates",
]


# ---------------------------------------------------------------------------- tokenizers a model brings
class TextTokenizer(Protocol):
    """A model's own tokenizer (what :meth:`OwnTokenizer.text_tokenizer` returns). Implemented by
    :class:`hyperplex.models.pretrained_classifier.PretrainedTokenizer`; called by the classification tasks
    (:mod:`hyperplex.tasks.classification`), which then pass the text as written (no ``data.lowercase``,
    ``data.tokenizer``, ``data.vocab_size`` or ``data.truncate``) and save no vocabulary files."""

    #: The id that pads a batch.
    pad_index: int

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        """Token ids of each text, special tokens added, cut at the model's maximum length."""
        ...

    def __len__(self) -> int:
        """The vocabulary size."""
        ...

    def describe(self) -> str:
        """One phrase for ``train.log`` naming the tokenizer and its cut."""
        ...


@runtime_checkable
class PairTextTokenizer(TextTokenizer, Protocol):
    """A model's own tokenizer that joins a text pair into one sequence as the encoder was pretrained on pairs
    (a cross-encoder). Implemented by :class:`~hyperplex.models.pretrained_classifier.PretrainedTokenizer`;
    the pair tasks (``pair_classification``, ``ranking``) refuse an own tokenizer without it."""

    def encode_pair_batch(self, first: list[str], second: list[str]) -> tuple[list[list[int]], list[list[int]] | None]:
        """``(ids, token types or None)`` of each pair ``(first[i], second[i])`` joined into one sequence."""
        ...


# ---------------------------------------------------------------------------- hooks of a model class
@runtime_checkable
class OwnTokenizer(Protocol):
    """A model class that brings its own tokenizer (a pretrained encoder's vocabulary). Implemented by
    :class:`~hyperplex.models.pretrained_classifier.PretrainedClassifier`; called by the classification tasks
    (to encode text) and by ``hyperplex params`` (:mod:`hyperplex.inference.parameters`, for the vocabulary size).
    Check with ``issubclass(model_class, OwnTokenizer)``."""

    @classmethod
    def text_tokenizer(cls, config) -> TextTokenizer:
        """The tokenizer text must be encoded with, built from the model config alone."""
        ...


@runtime_checkable
class FitsWhenBuilt(Protocol):
    """A model class whose constructor fits weights to data (a distillation student with ``init: activation``
    or ``blockwise_steps``). Implemented by :class:`~hyperplex.models.pretrained_student.PretrainedStudent`;
    called by ``hyperplex params`` (:mod:`hyperplex.inference.parameters`), which counts parameters and needs the
    layers only. Check with ``issubclass(model_class, FitsWhenBuilt)``."""

    @classmethod
    def build_without_fit(cls, config, vocab_size: int, num_outputs: int) -> nn.Module:
        """The model with the same layers as the constructor builds, skipping the fit (as before loading a
        checkpoint)."""
        ...


# ---------------------------------------------------------------------------- hooks of a model
@runtime_checkable
class CustomCheckpointState(Protocol):
    """A model whose checkpoint holds something other than its ``state_dict`` (a frozen pretrained base with an
    adapter: only the trainable tensors and a signature of the base). Implemented by
    :class:`~hyperplex.models.pretrained_classifier.PretrainedClassifier`; called by
    :func:`hyperplex.train.checkpoint.format.model_state` (saving) and
    :func:`~hyperplex.train.checkpoint.format.load_into` (loading, after the keys and shapes were checked
    against :meth:`checkpoint_state_dict`)."""

    def checkpoint_state_dict(self) -> dict[str, Tensor]:
        """The tensors a checkpoint stores."""
        ...

    def load_checkpoint_state_dict(self, state: dict[str, Tensor]) -> None:
        """Inverse of :meth:`checkpoint_state_dict`; ``ValueError`` when ``state`` does not fit this model."""
        ...


@runtime_checkable
class Describes(Protocol):
    """A model with more to say than its parameter table (what trains, matched parameter counts). Implemented
    by :class:`~hyperplex.models.pretrained_classifier.PretrainedClassifier`; called by the classification tasks
    when they build the model (a ``train.log`` line) and by ``hyperplex params`` (after the table)."""

    def describe(self) -> str:
        """A paragraph of plain text."""
        ...


@runtime_checkable
class PretrainedEmbeddings(Protocol):
    """A model whose word embeddings can start from pretrained vectors (``data.embeddings``, GloVe text).
    Implemented by the sentence-pair classifiers of :mod:`hyperplex.models.classifiers`; called by the
    classification tasks when a fresh model is built. ``data.embeddings`` with a model without it is an error."""

    def load_pretrained_embeddings(self, vectors: Tensor, mask: Tensor | None = None) -> None:
        """Copy the rows of ``vectors (V, E)`` where ``mask (V,)`` is true into the embedding table."""
        ...


# ---------------------------------------------------------------------------- hooks of a task
@runtime_checkable
class EvaluatesFiles(Protocol):
    """A task that can score any file in its data format, not only its validation split. Implemented by the
    classification and translation tasks; called by ``hyperplex evaluate --split FILE``
    (:func:`hyperplex.inference.verbs.evaluate`) and by plan rows with ``eval_split``
    (:mod:`hyperplex.experiments.evaluation`). ``--split FILE`` with a task without it is an error."""

    def use_evaluation_file(self, path: str) -> None:
        """Make the file (or parallel prefix) ``path`` the split ``validate`` scores."""
        ...


@runtime_checkable
class SignsMetrics(Protocol):
    """A task whose metrics carry the signature of the tool that computed them (sacreBLEU). Implemented by
    :class:`~hyperplex.tasks.translation.TranslationTask`; read by ``hyperplex evaluate`` (``NAME_signature``
    keys) and by plan evaluations (their ``signatures``). A task without it reports none."""

    #: ``{metric: signature}`` of the last validation.
    signatures: dict[str, str]


@runtime_checkable
class Translates(Protocol):
    """A task that decodes text into text. Implemented by :class:`~hyperplex.tasks.translation.TranslationTask`;
    called by ``hyperplex translate`` and by ``hyperplex evaluate``, which decodes with ``testing.beam_size``
    (:func:`hyperplex.inference.verbs.translate`). ``translate`` on another task is an error."""

    def translate(self, model: nn.Module, lines: list[str], beam_size: int | None = None, **kwargs):
        """Raw source lines → detokenised outputs, one per line (``return_attention``: with the details)."""
        ...

    def source_tokens(self, lines: list[str], warn: bool = True) -> list[list[str]]:
        """The source tokens of each line, as the model reads them."""
        ...

    def validate(self, model: nn.Module, beam_size: int | None = None, progress: bool = False) -> dict[str, float]:
        """Metrics on the evaluation split, decoded with ``beam_size``."""
        ...
