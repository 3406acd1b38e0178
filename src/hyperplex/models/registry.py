"""Architecture registry: the ``model.architecture`` config key → config class and model class.

A new model is one entry here. Modules are imported lazily so that a config error never has
to import every model.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from hyperplex.config import ConfigError, from_dict


@dataclass(frozen=True)
class Architecture:
    module: str
    config_class: str
    model_class: str
    family: str  # seq2seq | classifier | pair
    description: str

    def load(self):
        module = importlib.import_module(self.module)
        return getattr(module, self.config_class), getattr(module, self.model_class)


ARCHITECTURES: dict[str, Architecture] = {
    "rnn_translator": Architecture("hyperplex.models.rnn_translator", "RNNTranslatorConfig", "RNNTranslator", "seq2seq",
                                   "(PHM-)LSTM encoder-decoder with Luong attention (thesis ch. 3)"),
    "transformer": Architecture("hyperplex.models.transformer", "TransformerConfig", "TransformerTranslator", "seq2seq",
                                "Transformer / PHM-Transformer / Quaternion Transformer encoder-decoder"),
    "transformer_classifier": Architecture("hyperplex.models.transformer", "TransformerConfig", "TransformerClassifier",
                                           "classifier", "Transformer-family encoder + pooling + linear classifier"),
    "nli_encoder": Architecture("hyperplex.models.classifiers", "NLIEncoderConfig", "NLIEncoderClassifier", "pair",
                                "shared (PHM-)LSTM sentence encoder + MLP (PHM paper App. B.1)"),
    "decomposable_attention": Architecture("hyperplex.models.classifiers", "DecomposableAttentionConfig",
                                           "DecomposableAttention", "pair", "DeAtt (Parikh et al. 2016)"),
    "quaternion_attention": Architecture("hyperplex.models.classifiers", "QuaternionAttentionConfig",
                                         "QuaternionAttentionModel", "pair", "Q-Att (Tay et al. 2019 §3.2)"),
}

#: Which model families each task accepts.
TASK_FAMILIES = {"translation": ("seq2seq",), "classification": ("classifier",),
                 "pair_classification": ("pair",), "ranking": ("pair",)}


def get_architecture(name: str | None, task: str | None = None) -> Architecture:
    """Look up ``name``; errors list the valid names (for ``task`` if given)."""
    valid = [k for k, a in ARCHITECTURES.items() if task is None or a.family in TASK_FAMILIES.get(task, ())]
    if not name:
        raise ConfigError(f"model.architecture is required; valid for task {task!r}: {', '.join(valid)}")
    if name not in ARCHITECTURES:
        raise ConfigError(f"model.architecture: unknown architecture {name!r}; valid: {', '.join(ARCHITECTURES)}")
    if name not in valid:
        raise ConfigError(f"model.architecture {name!r} cannot do task {task!r}; valid for it: {', '.join(valid)}")
    return ARCHITECTURES[name]


def model_config_from_dict(raw: dict, task: str | None = None):
    """``{"architecture": ..., **keys}`` → that architecture's validated config dataclass."""
    raw = dict(raw or {})
    arch = get_architecture(raw.pop("architecture", None), task)
    config_class, _ = arch.load()
    return from_dict(config_class, raw, "model")
