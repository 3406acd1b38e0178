"""The parameter table of the model a config describes (``hyperplex params``), built without reading data:
the vocabulary sizes come from the arguments, the config, or a pretrained encoder's own tokenizer. The
counting is :mod:`hyperplex.models.params`'.
"""

from __future__ import annotations

from hyperplex.config.experiment import load_experiment
from hyperplex.config.registry import get_architecture
from hyperplex.models.params import format_breakdown, parameter_breakdown
from hyperplex.train.protocols import Describes, FitsWhenBuilt, OwnTokenizer

__all__ = ["params", "params_report"]


#: The largest vocabulary or output size a model is built for in memory when it cannot be built on the ``meta``
#: device (an embedding of 10**12 rows would end the process in the allocator).
MAX_MATERIALIZED_SIZE = 10_000_000


def _build_for_counting(model_class, cfg, vocabulary: int, outputs: int):
    """The model, built on the ``meta`` device (counting needs its shapes only: no memory whatever the sizes);
    in memory only where that fails and the sizes are at most :data:`MAX_MATERIALIZED_SIZE`. A model whose init
    fits to data (a student with init: activation) builds its layers without that fit, as it does before
    loading a checkpoint."""
    import torch

    def build():
        if issubclass(model_class, FitsWhenBuilt):
            return model_class.build_without_fit(cfg.model, vocabulary, outputs)
        return model_class(cfg.model, vocabulary, outputs)

    try:
        with torch.device("meta"):
            return build()
    except Exception:  # noqa: BLE001 - some builders need real tensors; an error of the config recurs below
        if max(vocabulary, outputs) > MAX_MATERIALIZED_SIZE:
            raise ValueError(f"--vocab-size / --tgt-vocab-size / --num-classes: {max(vocabulary, outputs):,} is more "
                             f"than the {MAX_MATERIALIZED_SIZE:,} a {model_class.__name__} is built for in memory "
                             f"to count its parameters") from None
        return build()


def params(config: str, overrides: list[str] | None = None, vocab_size: int | None = None,
           tgt_vocab_size: int | None = None, num_classes: int | None = None) -> str:
    """``hyperplex params``: the parameter table of the model a config describes (no data is read)."""
    return params_report(config, overrides, vocab_size, tgt_vocab_size, num_classes)[0]


def params_report(config: str, overrides: list[str] | None = None, vocab_size: int | None = None,
                  tgt_vocab_size: int | None = None, num_classes: int | None = None) -> tuple[str, dict[str, int]]:
    """(the table of :func:`params`, the :func:`~hyperplex.models.params.parameter_breakdown` it shows)."""
    for flag, value in (("--vocab-size", vocab_size), ("--tgt-vocab-size", tgt_vocab_size),
                        ("--num-classes", num_classes)):
        if value is not None and value < (2 if flag == "--num-classes" else 1):
            raise ValueError(f"{flag} must be ≥ {2 if flag == '--num-classes' else 1}, got {value}")
    cfg = load_experiment(config, overrides, model_dir="(params)")
    arch = get_architecture(cfg.model.architecture, cfg.data.task)
    _, model_class = arch.load()
    v = cfg.data.vocab_size if vocab_size is None else vocab_size
    if vocab_size is None and cfg.data.format == "arithmetic":  # generated data: its characters are known
        from hyperplex.data.arithmetic import ArithmeticSpec
        from hyperplex.data.vocab import SPECIALS

        v = len(SPECIALS) + len(ArithmeticSpec().characters)
    own_tokenizer = issubclass(model_class, OwnTokenizer)  # a pretrained encoder brings its vocabulary
    if vocab_size is None and issubclass(model_class, OwnTokenizer):
        v = len(model_class.text_tokenizer(cfg.model))
    if arch.family == "seq2seq":  # the second size is the target vocabulary
        outputs = v if tgt_vocab_size is None else tgt_vocab_size
    elif cfg.data.task == "ranking":  # one relevance score
        outputs = 1
    else:
        outputs = num_classes if num_classes is not None else max(2, len(cfg.data.labels))
    model = _build_for_counting(model_class, cfg, v, outputs)
    teacher_tokenizer = getattr(getattr(model, "encoder", None), "tokenizer", None)
    if vocab_size is None and not own_tokenizer and teacher_tokenizer is not None:
        v = len(teacher_tokenizer)  # a pretrained student tokenises as its teacher: data.vocab_size is unused
    header = f"{cfg.name}: {cfg.model.architecture} (vocabulary {v}"
    header += f", target vocabulary {v if tgt_vocab_size is None else tgt_vocab_size})" \
        if arch.family == "seq2seq" else ")"
    breakdown = parameter_breakdown(model)
    table = header + "\n" + format_breakdown(breakdown)
    if isinstance(model, Describes):  # a fine-tuned pretrained encoder: what trains, matched counts
        table += "\n\n" + model.describe()
    return table, breakdown
