"""Training toolkit: metrics, safetensors checkpoints, optimisers and schedules, plots."""

from hyperplex.train.checkpoint import (
    Checkpoint, CheckpointError, CheckpointManager, atomic_write, average_checkpoints, capture_rng,
    checkpoint_info, load_checkpoint, load_model_weights, restore_rng, save_checkpoint, save_model_weights,
)
from hyperplex.metrics import (
    BleuResult, ChrfResult, CorpusScore, accuracy, corpus_bleu, corpus_chrf, mean_average_precision,
    mean_reciprocal_rank, perplexity, ranking_metrics,
)
from hyperplex.train.optim import (
    OPTIMIZERS, SCHEDULES, Constant, Halving, InverseSqrt, LinearDecay, Schedule, apply_lr, build_optimizer,
    build_schedule,
)
from hyperplex.train.plots import plot_attention, plot_metrics, plot_phm_rules

__all__ = [
    # checkpoints
    "Checkpoint", "CheckpointError", "CheckpointManager", "atomic_write", "average_checkpoints", "capture_rng",
    "checkpoint_info", "load_checkpoint", "load_model_weights", "restore_rng", "save_checkpoint", "save_model_weights",
    # metrics
    "BleuResult", "ChrfResult", "CorpusScore", "accuracy", "corpus_bleu", "corpus_chrf", "mean_average_precision",
    "mean_reciprocal_rank", "perplexity", "ranking_metrics",
    # optimisers and schedules
    "OPTIMIZERS", "SCHEDULES", "Constant", "Halving", "InverseSqrt", "LinearDecay", "Schedule", "apply_lr",
    "build_optimizer", "build_schedule",
    # plots
    "plot_attention", "plot_metrics", "plot_phm_rules",
]
