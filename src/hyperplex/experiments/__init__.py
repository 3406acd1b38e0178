"""Experiment plans: train N seeds of every row of a plan, evaluate, and report mean ± t-interval.

``hyperplex experiment PLAN.yaml`` (:mod:`~hyperplex.experiments.cli`) runs a plan; one concept per module:

- :mod:`~hyperplex.experiments.plan`: the plan file's schema (validated like every hyperplex YAML) and
  :func:`~hyperplex.experiments.plan.load_plan`;
- :mod:`~hyperplex.experiments.state`: the state of a model folder or record (new … finished, trained or not);
- :mod:`~hyperplex.experiments.runs`: the models of a plan and the checks made before anything trains;
- :mod:`~hyperplex.experiments.matching`: ``match_params``, parameter counts compared between rows;
- :mod:`~hyperplex.experiments.execution` and :mod:`~hyperplex.experiments.provenance`: training one model
  and recording where, when and by which command;
- :mod:`~hyperplex.experiments.timing`: training time from the recorded segments and ``train.log``;
- :mod:`~hyperplex.experiments.evaluation`: evaluating a model, cached per row in its folder;
- :mod:`~hyperplex.experiments.records`: a finished model's small files kept without its checkpoint;
- :mod:`~hyperplex.experiments.stability`: divergence and gradient-norm spikes of sweep models;
- :mod:`~hyperplex.scoring.plan_metrics`: the ``quality:`` key (sentence-encoder metrics of distilled models);
- :mod:`~hyperplex.experiments.intervals`: mean ± std with a 95% t-interval over seeds;
- :mod:`~hyperplex.experiments.results` and :mod:`~hyperplex.experiments.markdown`: ``results.json`` and its
  markdown; :mod:`~hyperplex.experiments.plot`: the sweep figure;
- :mod:`~hyperplex.experiments.summary`: the cross-plan table (PHM vs low-rank vs dense);
- :mod:`~hyperplex.experiments.frontier`: the size–quality frontier of a compression plan;
- :mod:`~hyperplex.experiments.demo`: the PHM paper's Figure 2 on generated data (``hyperplex demo``).

Plan files and committed records live in the repository's ``experiments/`` folder.
"""

from hyperplex.experiments.plan import Plan, PlanError, load_plan

__all__ = ["Plan", "PlanError", "load_plan"]
