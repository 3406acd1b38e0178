"""Training toolkit: the trainer, safetensors checkpoints, optimisers and schedules, plots. Metrics are
:mod:`hyperplex.metrics`; the verbs that use a trained model without training it are :mod:`hyperplex.inference`."""

from hyperplex.train import process as _process  # noqa: F401  before any process group: see its import notes
from hyperplex.train.checkpoint import (
    Checkpoint,
    CheckpointError,
    CheckpointManager,
    atomic_write,
    average_checkpoints,
    capture_rng,
    checkpoint_info,
    load_checkpoint,
    load_model_weights,
    restore_rng,
    save_checkpoint,
    save_model_weights,
)
from hyperplex.train.optim import (
    OPTIMIZERS,
    SCHEDULES,
    Constant,
    Halving,
    InverseSqrt,
    LinearDecay,
    Schedule,
    apply_lr,
    build_optimizer,
    build_schedule,
)
from hyperplex.train.plots import plot_attention, plot_metrics, plot_phm_rules

__all__ = [
    # checkpoints
    "Checkpoint", "CheckpointError", "CheckpointManager", "atomic_write", "average_checkpoints", "capture_rng",
    "checkpoint_info", "load_checkpoint", "load_model_weights", "restore_rng", "save_checkpoint", "save_model_weights",
    # optimisers and schedules
    "OPTIMIZERS", "SCHEDULES", "Constant", "Halving", "InverseSqrt", "LinearDecay", "Schedule", "apply_lr",
    "build_optimizer", "build_schedule",
    # plots
    "plot_attention", "plot_metrics", "plot_phm_rules",
]

from hyperplex._deprecated import attribute_getter  # noqa: E402  names that moved out, for one release

__getattr__ = attribute_getter("hyperplex.train")
