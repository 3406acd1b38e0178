"""How a pretrained encoder is fine-tuned: a PHM adapter, peft's LoRA or LoKr, all weights, or the head only.

:class:`FineTuneConfig` is the ``model.adapter`` section of a config; :func:`attach` applies it to an
encoder and returns a :class:`FineTuneReport` (what was adapted, trainable counts, the peft rank chosen).
peft's rows go through peft's own API (``LoraConfig`` / ``LoKrConfig`` + ``inject_adapter_in_model``);
nothing of LoRA or LoKr is re-implemented here, and their trainable parameters are counted on peft's
own layers.

Matched trainable parameters (``peft_rank: 0``): the target is the PHM adapter that ``n``, ``rank`` and
``shared_rule`` describe on the same layers (:func:`~hyperplex.adapters.adapter_parameter_count`).
LoRA takes the ``r`` whose count is closest to it (ties: the smaller ``r``). LoKr takes the
``(r, decompose_factor)`` whose count is closest over every ``r ≥ 1`` and ``decompose_factor`` in -1
(peft's default), 2, 4, 8, 16, 32 (those dividing every adapted layer's sizes; or only ``factor`` when
it is set); ties: the smaller ``r``, then the earlier factor. LoKr's count is piecewise affine in ``r``
(a layer's ``w₂`` becomes a full matrix at about half its larger side), so the search evaluates each
piece's ends and the ``r`` nearest its crossing of the target (``tests/adapters/test_finetune.py``
checks it against every ``r``). Counts come from peft layers built on the ``meta`` device (no memory),
one per distinct layer size.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
from dataclasses import dataclass, field
from typing import Literal

import torch
from torch import nn

from hyperplex.adapters.config import PHMAdapterConfig, adapter_parameter_count
from hyperplex.adapters.layer import linear_sizes
from hyperplex.adapters.model import add_adapter, resolve_targets
from hyperplex.pretrained import PEFT_EXTRA

__all__ = [
    "ADAPTER_NAME",
    "LOKR_FACTORS",
    "FineTuneConfig",
    "FineTuneReport",
    "attach",
    "match_peft_rank",
    "peft_count",
    "weights_signature",
]

#: Name of the adapter the fine-tuning attaches (PHM and peft alike).
ADAPTER_NAME = "default"
#: LoKr ``decompose_factor`` values tried when matching (``-1``: peft's near-square split).
LOKR_FACTORS = (-1, 2, 4, 8, 16, 32)
_PEFT_PREFIX = {"lora": "lora_", "lokr": "lokr_"}


@dataclass
class FineTuneConfig:
    """The ``model.adapter`` section: what of the pretrained encoder is trained, and how."""

    kind: Literal["phm", "lora", "lokr", "full", "none"] = field(default="phm", metadata={
        "help": "phm: PHM delta adapter (hyperplex.adapters); lora / lokr: peft's LoRA / LoKr; full: every weight "
                "trained; none: the encoder frozen, only the head trained"})
    n: int = field(default=4, metadata={
        "help": "PHM n (must divide every target's in and out features); lora/lokr with peft_rank 0: the n of the "
                "PHM adapter whose trainable parameters they match"})
    rank: int | None = field(default=None, metadata={
        "help": "PHM Sᵢ: null = full (k/n × d/n), r = low rank uᵢ vᵢ; lora/lokr with peft_rank 0: that of the "
                "PHM adapter they match"})
    peft_rank: int = field(default=0, metadata={
        "help": "lora/lokr: peft's r; 0 = chosen so the trainable parameters are closest to the PHM adapter "
                "(n, rank, shared_rule) on the same layers (logged with both counts)"})
    factor: int = field(default=0, metadata={
        "help": "lokr: peft's decompose_factor (-1 = near-square split); 0 = chosen with r when peft_rank is 0, "
                "else -1"})
    targets: list[str] = field(default_factory=lambda: ["query", "value"], metadata={
        "help": "glob patterns on the encoder's module names (`query` also matches `….query`); every pattern must "
                "match a linear layer (phm, lora, lokr)"})
    shared_rule: bool = field(default=False, metadata={
        "help": "phm: one set of rules Aᵢ for every adapted layer (Compacter)"})
    scale: float = field(default=1.0, metadata={"help": "phm: s in y = W x + b + s·ΔW x"})
    alpha: float = field(default=0.0, metadata={
        "help": "lora/lokr: peft's alpha (the delta is scaled by alpha/r); 0 = r (scaling 1)"})
    dropout: float = field(default=0.0, metadata={
        "help": "dropout on the adapter's input (phm; lora: lora_dropout; lokr: rank_dropout)"})

    def __post_init__(self) -> None:
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"n must be a positive integer, got {self.n!r}")
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 1):
            raise ValueError(f"rank must be null (full Sᵢ) or a positive integer, got {self.rank!r}")
        if isinstance(self.peft_rank, bool) or not isinstance(self.peft_rank, int) or self.peft_rank < 0:
            raise ValueError(f"peft_rank must be 0 (matched) or a positive integer, got {self.peft_rank!r}")
        if isinstance(self.factor, bool) or not isinstance(self.factor, int) or self.factor < -1 or self.factor == 1:
            raise ValueError(f"factor must be 0 (chosen), -1 (peft's default) or an integer ≥ 2, got {self.factor!r}")
        if isinstance(self.targets, str) or not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise ValueError(f"targets must be a non-empty list of glob patterns, got {self.targets!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be ≥ 0 (0 = r), got {self.alpha!r}")

    @property
    def phm(self) -> PHMAdapterConfig:
        """The PHM adapter this section describes (the one a ``phm`` run trains and ``peft_rank: 0`` matches)."""
        return PHMAdapterConfig(n=self.n, rank=self.rank, targets=tuple(self.targets), scale=self.scale,
                                shared_rule=self.shared_rule, dropout=self.dropout)

    def describe_phm(self) -> str:
        return f"PHM n={self.n}, {'full Sᵢ' if self.rank is None else f'rank-{self.rank} Sᵢ'}" + \
            (", shared rule" if self.shared_rule else "")


@dataclass
class FineTuneReport:
    """What :func:`attach` did: ``layers`` adapted (dotted names in the encoder), ``adapter`` trainable
    parameters it added (``full``: every encoder parameter; ``none``: 0), ``phm_count`` the matched PHM
    adapter's count (lora/lokr; ``None`` otherwise), and peft's ``peft_rank`` / ``peft_factor`` used."""

    kind: str
    layers: list[str]
    adapter: int
    phm_count: int | None = None
    peft_rank: int | None = None
    peft_factor: int | None = None
    alpha: float | None = None


def weights_signature(module: nn.Module) -> str:
    """SHA-256 (hex) of ``module``'s state dict: every name, dtype, shape and byte, in name order. Recorded
    in adapter-only checkpoints so that loading onto another base is an error."""
    digest = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().to("cpu").contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        if t.numel():
            digest.update(memoryview(t.reshape(-1).view(torch.uint8).numpy()))
    return digest.hexdigest()


# ---------------------------------------------------------------------------- peft
def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError(f"model.adapter.kind lora/lokr needs peft: {PEFT_EXTRA}") from None
    return peft


def peft_config(kind: str, rank: int, factor: int, alpha: float, dropout: float, targets: list[str]):
    """peft's own ``LoraConfig`` / ``LoKrConfig`` for exact module names ``targets`` (alpha 0 → r)."""
    peft = _peft()
    alpha = alpha or rank
    if kind == "lora":
        return peft.LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets),
                               bias="none")
    if kind == "lokr":
        return peft.LoKrConfig(r=rank, alpha=alpha, rank_dropout=dropout, decompose_factor=factor,
                               target_modules=list(targets))
    raise ValueError(f"model.adapter.kind: {kind!r} is not a peft kind (lora, lokr)")


def _layer_classes(kind: str) -> tuple[type, ...]:
    if kind == "lora":
        from peft.tuners.lora import LoraLayer
        return (LoraLayer,)
    from peft.tuners.lokr import LoKrLayer
    return (LoKrLayer,)


class _Skeleton(nn.Module):
    """One ``meta``-device ``nn.Linear`` per layer size: peft counts its parameters without memory."""

    def __init__(self, sizes: tuple[tuple[int, int], ...]) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(d, k, device="meta") for d, k in sizes])


@functools.lru_cache(maxsize=4096)
def _count(kind: str, sizes: tuple[tuple[int, int], ...], rank: int, factor: int) -> tuple[int, ...]:
    # peft's initialisers draw from the global RNG even on `meta`: counting (cached) must not move the seeded
    # stream, or the real adapter's init would depend on what was counted before in this process
    with torch.random.fork_rng(devices=[]):
        skeleton = _Skeleton(sizes)
        names = [f"layers.{i}" for i in range(len(sizes))]
        _peft().inject_adapter_in_model(peft_config(kind, rank, factor, 0.0, 0.0, names), skeleton, ADAPTER_NAME)
        return tuple(sum(p.numel() for p in layer.parameters() if p.requires_grad) for layer in skeleton.layers)


def peft_count(kind: str, sizes: list[tuple[int, int]], rank: int, factor: int = -1) -> int:
    """Trainable parameters peft's ``kind`` (lora/lokr) adds to linear layers of ``sizes`` ((in, out) each,
    repeats allowed), counted on peft's own layers (one ``meta`` layer per distinct size)."""
    distinct = tuple(sorted(set(sizes)))
    per_size = dict(zip(distinct, _count(kind, distinct, rank, factor)))
    return sum(per_size[s] for s in sizes)


def match_peft_rank(kind: str, sizes: list[tuple[int, int]], target: int, factor: int = 0) -> tuple[int, int, int]:
    """``(r, decompose_factor, count)`` of peft's ``kind`` whose trainable count on layers ``sizes`` is closest
    to ``target`` (the rule of the module docstring; LoRA's factor is reported as -1)."""
    if kind == "lora":
        per_rank = peft_count(kind, sizes, 1)
        guess = max(1, round(target / per_rank))
        ranks = {max(1, guess - 1), guess, guess + 1}
        best = min((abs(peft_count(kind, sizes, r) - target), r) for r in ranks)
        return best[1], -1, peft_count(kind, sizes, best[1])
    factors = [factor] if factor else [f for f in LOKR_FACTORS
                                       if f == -1 or all(d % f == 0 and k % f == 0 for d, k in sizes)]
    full = max(max(d, k) for d, k in sizes)  # r at which every w₂ is a full matrix
    best = None
    for order, f in enumerate(factors):
        points = _lokr_breakpoints(sizes, f, full)
        ranks = set(points)
        for a, b in itertools.pairwise(points):  # the count is affine in r on [a, b]
            ca, cb = peft_count(kind, sizes, a, f), peft_count(kind, sizes, b, f)
            if b > a + 1 and cb != ca:
                crossing = a + (target - ca) * (b - a) / (cb - ca)
                ranks.update(r for r in (int(crossing), int(crossing) + 1) if a < r < b)
        for r in sorted(ranks):
            count = peft_count(kind, sizes, r, f)
            key = (abs(count - target), r, order)
            if best is None or key < best[0]:
                best = (key, (r, f, count))
    return best[1]


def _lokr_breakpoints(sizes: list[tuple[int, int]], factor: int, full: int) -> list[int]:
    """Ranks around which peft's LoKr count stops being affine in ``r``: where a layer's ``w₂`` (``out_k × in_n``
    by peft's own ``factorization``) switches from low rank to full (at about half its larger side), with
    1 and ``full``. Between consecutive points the count is affine, so its ends and the crossing of the
    target are the only candidates."""
    from peft.tuners.lokr.layer import factorization

    points = {1, full}
    for d, k in sizes:
        for side in (factorization(d, factor)[1], factorization(k, factor)[1]):
            half = (side + 1) // 2
            points.update(r for r in (half - 1, half, half + 1) if 1 <= r <= full)
    return sorted(points)


# ---------------------------------------------------------------------------- attach
def _target_layers(encoder: nn.Module, config: FineTuneConfig, n: int) -> tuple[list[str], list[tuple[int, int]]]:
    layers = resolve_targets(encoder, config.targets, n=n, key="model.adapter")
    modules = dict(encoder.named_modules())
    return layers, [linear_sizes(modules[name]) for name in layers]


def _phm_count(config: FineTuneConfig, sizes: list[tuple[int, int]]) -> int:
    return sum(adapter_parameter_count(d, k, config.n, config.rank, rule=not config.shared_rule or i == 0)
               for i, (d, k) in enumerate(sizes))


def attach(encoder: nn.Module, config: FineTuneConfig) -> FineTuneReport:
    """Make ``encoder`` fine-tunable as ``config`` says (in place): ``requires_grad`` is set on exactly the
    parameters that train (``full``: all; ``none``: none; otherwise the adapter's). Errors name the
    ``model.adapter`` key (a pattern matching no linear layer, an ``n`` that does not divide a layer)
    before the encoder is changed."""
    kind = config.kind
    if kind == "full":
        for p in encoder.parameters():
            p.requires_grad_(True)
        return FineTuneReport(kind, [], sum(p.numel() for p in encoder.parameters()))
    if kind == "none":
        for p in encoder.parameters():
            p.requires_grad_(False)
        return FineTuneReport(kind, [], 0)
    if kind == "phm":
        layers, sizes = _target_layers(encoder, config, config.n)
        add_adapter(encoder, ADAPTER_NAME, config.phm, layers=layers)  # freezes everything else
        trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
        return FineTuneReport(kind, layers, trainable)
    if kind not in _PEFT_PREFIX:
        raise ValueError(f"model.adapter.kind: unknown {kind!r}; valid: phm, lora, lokr, full, none")
    matched = config.peft_rank == 0
    layers, sizes = _target_layers(encoder, config, config.n if matched else 1)
    phm_count = _phm_count(config, sizes) if matched else None
    if matched:
        rank, factor, _ = match_peft_rank(kind, sizes, phm_count, config.factor)
    else:
        rank, factor = config.peft_rank, config.factor or -1
    for p in encoder.parameters():
        p.requires_grad_(False)
    peft_cfg = peft_config(kind, rank, factor, config.alpha, config.dropout, layers)
    _peft().inject_adapter_in_model(peft_cfg, encoder, ADAPTER_NAME)
    modules = dict(encoder.named_modules())
    wrong = [name for name in layers if not isinstance(modules.get(name), _layer_classes(kind))]
    if wrong:
        raise RuntimeError(f"peft did not wrap {', '.join(wrong[:3])} in its {kind} layer")
    prefix = _PEFT_PREFIX[kind]
    for name, p in encoder.named_parameters():  # peft's own marking, made explicit: only its adapter trains
        p.requires_grad_(prefix in name)
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    expected = peft_count(kind, sizes, rank, factor)
    if trainable != expected:  # the meta-device count must be the real one, or the match would be wrong
        raise RuntimeError(f"peft {kind} r={rank}: {trainable} trainable parameters, but {expected} were counted")
    return FineTuneReport(kind, layers, trainable, phm_count, rank, factor if kind == "lokr" else None,
                          config.alpha or rank)
