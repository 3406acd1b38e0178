"""What a trained or converted model is used for, without training it: the verbs ``evaluate``, ``translate``,
``export`` and ``params`` as Python calls.

* :func:`load_model` — a trained model rebuilt from its model folder (:mod:`.load`);
* :func:`evaluate` / :func:`translate` — ``hyperplex evaluate`` / ``hyperplex translate`` (:mod:`.verbs`);
* :func:`export` — ``hyperplex export``: a saved model as ONNX (:mod:`.export`);
* :func:`params` — ``hyperplex params``: the parameter table of a config's model (:mod:`.parameters`).
"""

from hyperplex.inference.export import export
from hyperplex.inference.load import load_model
from hyperplex.inference.parameters import params, params_report
from hyperplex.inference.verbs import evaluate, translate

__all__ = ["load_model", "evaluate", "translate", "export", "params", "params_report"]
