"""How a pretrained encoder is fine-tuned: a PHM adapter, peft's LoRA or LoKr, all weights, or the head only.

:class:`FineTuneConfig` is the ``model.adapter`` section of a config; :func:`attach` applies it to an
encoder and returns a :class:`FineTuneReport` (what was adapted, trainable counts, the peft rank chosen).
peft's rows go through peft's own API (``LoraConfig`` / ``LoKrConfig`` + ``inject_adapter_in_model``);
nothing of LoRA or LoKr is re-implemented here, and their trainable parameters are counted on peft's
own layers.

The kinds are a registry, :data:`FINETUNE_KINDS` (name → :class:`FineTuneKind`, like ``LINEAR_KINDS``): a new
kind is one attach function and one :func:`register_finetune_kind` call; the ``kind`` key's choices follow it,
and so do what a model says of the kind (:meth:`FineTuneKind.describe`) and what its checkpoints hold
(:attr:`FineTuneKind.trains_base`).
The peft kinds are one more table, :data:`PEFT_METHODS` (peft's config, its layer class, its parameter prefix).

Matched trainable parameters (``peft_rank: 0``): the target is the PHM adapter that ``n``, ``rank`` and
``shared_rule`` describe on the same layers (:func:`~hyperplex.adapters.adapter_parameter_count`).
LoRA takes the ``r`` whose count is closest to it (ties: the smaller ``r``). LoKr takes the
``(r, decompose_factor)`` whose count is closest over every ``r ≥ 1`` and ``decompose_factor`` in -1
(peft's default), 2, 4, 8, 16, 32 (those dividing every adapted layer's sizes; or only ``factor`` when
it is set); ties: the smaller ``r``, then the earlier factor. LoKr's count is piecewise affine in ``r``
(a layer's ``w₂`` becomes a full matrix at about half its larger side), so the search evaluates each
piece's ends and the ``r`` nearest its crossing of the target (``tests/models/test_finetune.py``
checks it against every ``r``). Counts come from peft layers built on the ``meta`` device (no memory),
one per distinct layer size.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from hyperplex.adapters.config import PHMAdapterConfig, adapter_parameter_count, check_adapter_fields, check_int
from hyperplex.adapters.layer import tensors_sha256
from hyperplex.adapters.model import add_adapter
from hyperplex.adapters.targets import resolve_targets
from hyperplex.layers.selection import dense_sizes, glob_patterns
from hyperplex.pretrained import PEFT_EXTRA

__all__ = [
    "ADAPTER_NAME",
    "FINETUNE_KINDS",
    "LOKR_FACTORS",
    "PEFT_METHODS",
    "FineTuneConfig",
    "FineTuneKind",
    "FineTuneReport",
    "PeftMethod",
    "attach",
    "finetune_kind_names",
    "match_peft_rank",
    "peft_count",
    "register_finetune_kind",
    "weights_signature",
]

#: Name of the adapter the fine-tuning attaches (PHM and peft alike).
ADAPTER_NAME = "default"
#: LoKr ``decompose_factor`` values tried when matching (``-1``: peft's near-square split).
LOKR_FACTORS = (-1, 2, 4, 8, 16, 32)


def _where(report: FineTuneReport) -> str:
    """`` on 4 layers (a, b, …)`` (nothing for a report without layers)."""
    shown = ", ".join(report.layers[:2]) + (", …" if len(report.layers) > 2 else "")
    return f" on {len(report.layers)} layers ({shown})" if report.layers else ""


def _describe_adapter(report: FineTuneReport, config: FineTuneConfig) -> str:
    return f"{report.kind}{_where(report)}: {report.adapter:,} trainable parameters"


@dataclass(frozen=True)
class FineTuneKind:
    """A registered fine-tuning kind: ``attach(encoder, config) → FineTuneReport`` makes the encoder trainable
    as the kind says (in place), raising before any change when the config does not fit it;
    ``describe(report, config) → str`` says what trains (a ``train.log`` / ``hyperplex params`` line; default: the
    kind, its layers and its adapter parameters); ``trains_base``: every base weight trains, so a checkpoint
    holds the whole model (otherwise only the trainable tensors, beside the base's SHA-256)."""

    attach: Callable[[nn.Module, FineTuneConfig], FineTuneReport]
    describe: Callable[[FineTuneReport, FineTuneConfig], str] = _describe_adapter
    trains_base: bool = False


#: kind name → :class:`FineTuneKind`; read by :class:`FineTuneConfig` (choices), :func:`attach` and the
#: fine-tuned models (:class:`~hyperplex.models.pretrained_classifier.PretrainedClassifier`: describe, checkpoints).
FINETUNE_KINDS: dict[str, FineTuneKind] = {}


def register_finetune_kind(name: str, kind: FineTuneKind) -> None:
    """Add (or replace) a fine-tuning kind under ``name``."""
    FINETUNE_KINDS[name] = kind


def finetune_kind_names() -> tuple[str, ...]:
    return tuple(FINETUNE_KINDS)


@dataclass
class FineTuneConfig:
    """The ``model.adapter`` section: what of the pretrained encoder is trained, and how."""

    kind: str = field(default="phm", metadata={
        "choices": finetune_kind_names,
        "help": "phm: PHM delta adapter (hyperplex.adapters); lora / lokr: peft's LoRA / LoKr; full: every weight "
                "trained; none: the encoder frozen, only the head trained"})
    n: int = field(default=4, metadata={
        "help": "PHM n (must divide every target's in and out features); lora/lokr with peft_rank 0: the n of the "
                "PHM adapter whose trainable parameters they match"})
    rank: int | None = field(default=None, metadata={
        "help": "PHM Sᵢ: null = full (k/n × d/n), r = low rank Lᵢ Rᵢ (tensors left, right); lora/lokr with "
                "peft_rank 0: that of the PHM adapter they match"})
    peft_rank: int = field(default=0, metadata={
        "help": "lora/lokr: peft's r; 0 = chosen so the trainable parameters are closest to the PHM adapter "
                "(n, rank, shared_rule) on the same layers (logged with both counts)"})
    factor: int = field(default=0, metadata={
        "help": "lokr: peft's decompose_factor (-1 = near-square split); 0 = chosen with r when peft_rank is 0, "
                "else -1"})
    targets: list[str] = field(default_factory=lambda: ["query", "value"], metadata={
        "help": "glob patterns on the encoder's module names (`query` also matches `….query`); every pattern must "
                "match a linear layer (phm, lora, lokr)"})
    exclude: list[str] = field(default_factory=list, metadata={
        "help": "glob patterns of linear layers the targets select but that stay unadapted; every pattern must "
                "match a linear layer"})
    shared_rule: bool = field(default=False, metadata={
        "help": "phm: one set of rules Aᵢ for every adapted layer (Compacter)"})
    scale: float = field(default=1.0, metadata={"help": "phm: s in y = W x + b + s·ΔW x"})
    alpha: float = field(default=0.0, metadata={
        "help": "lora/lokr: peft's alpha (the delta is scaled by alpha/r); 0 = r (scaling 1)"})
    dropout: float = field(default=0.0, metadata={
        "help": "dropout on the adapter's input (phm; lora: lora_dropout; lokr: rank_dropout)"})

    def __post_init__(self) -> None:
        if self.kind not in FINETUNE_KINDS:
            raise ValueError(f"kind: unknown {self.kind!r}; valid: {', '.join(FINETUNE_KINDS)}")
        self.n, self.rank, targets, self.dropout = check_adapter_fields(
            "", self.n, self.rank, self.targets, self.dropout, none_rank="null (full Sᵢ)")
        self.targets = list(targets)
        self.exclude = list(glob_patterns(self.exclude, "exclude"))
        check_int(self.peft_rank, "peft_rank", minimum=0)
        if isinstance(self.factor, bool) or not isinstance(self.factor, int) or self.factor < -1 or self.factor == 1:
            raise ValueError(f"factor must be 0 (chosen), -1 (peft's default) or an integer ≥ 2, got {self.factor!r}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be ≥ 0 (0 = r), got {self.alpha!r}")

    @property
    def phm(self) -> PHMAdapterConfig:
        """The PHM adapter this section describes (the one a ``phm`` run trains and ``peft_rank: 0`` matches)."""
        return PHMAdapterConfig(n=self.n, rank=self.rank, targets=tuple(self.targets), exclude=tuple(self.exclude),
                                scale=self.scale, shared_rule=self.shared_rule, dropout=self.dropout)

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
    return tensors_sha256(sorted(module.state_dict().items()))


# ---------------------------------------------------------------------------- peft
def _peft():
    try:
        import peft
    except ImportError:
        raise ImportError(f"model.adapter.kind lora/lokr needs peft: {PEFT_EXTRA}") from None
    return peft


@dataclass(frozen=True)
class PeftMethod:
    """A peft method the fine-tuning offers: ``label`` its name in reports, ``config(peft, r, factor, alpha,
    dropout, targets)`` builds peft's own config for exact module names, ``layer()`` imports peft's layer class,
    parameters whose name holds ``prefix`` are the adapter's, ``match(sizes, target, factor) → (r, factor, count)``
    picks the rank, and ``has_factor`` says whether the method takes a ``decompose_factor`` (reported only then)."""

    label: str
    config: Callable[..., object]
    layer: Callable[[], type]
    prefix: str
    match: Callable[[list[tuple[int, int]], int, int], tuple[int, int, int]]
    has_factor: bool = False


def _peft_method(kind: str) -> PeftMethod:
    if kind not in PEFT_METHODS:
        raise ValueError(f"model.adapter.kind: {kind!r} is not a peft kind ({', '.join(PEFT_METHODS)})")
    return PEFT_METHODS[kind]


def peft_config(kind: str, rank: int, factor: int, alpha: float, dropout: float, targets: list[str]):
    """peft's own ``LoraConfig`` / ``LoKrConfig`` for exact module names ``targets`` (alpha 0 → r)."""
    return _peft_method(kind).config(_peft(), rank, factor, alpha or rank, dropout, list(targets))


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
    return _peft_method(kind).match(sizes, target, factor)


def _match_lora(sizes: list[tuple[int, int]], target: int, factor: int = 0) -> tuple[int, int, int]:
    """LoRA's count is ``r`` times its rank-1 count: the nearest ``r`` and its neighbours."""
    per_rank = peft_count("lora", sizes, 1)
    guess = max(1, round(target / per_rank))
    ranks = {max(1, guess - 1), guess, guess + 1}
    best = min((abs(peft_count("lora", sizes, r) - target), r) for r in ranks)
    return best[1], -1, peft_count("lora", sizes, best[1])


def _match_lokr(sizes: list[tuple[int, int]], target: int, factor: int = 0) -> tuple[int, int, int]:
    """Every allowed factor; per factor the ends of each affine piece of the count and its crossing of ``target``."""
    factors = [factor] if factor else [f for f in LOKR_FACTORS
                                       if f == -1 or all(d % f == 0 and k % f == 0 for d, k in sizes)]
    full = max(max(d, k) for d, k in sizes)  # r at which every w₂ is a full matrix
    best = None
    for order, f in enumerate(factors):
        points = _lokr_breakpoints(sizes, f, full)
        ranks = set(points)
        for a, b in itertools.pairwise(points):  # the count is affine in r on [a, b]
            ca, cb = peft_count("lokr", sizes, a, f), peft_count("lokr", sizes, b, f)
            if b > a + 1 and cb != ca:
                crossing = a + (target - ca) * (b - a) / (cb - ca)
                ranks.update(r for r in (int(crossing), int(crossing) + 1) if a < r < b)
        for r in sorted(ranks):
            count = peft_count("lokr", sizes, r, f)
            key = (abs(count - target), r, order)
            if best is None or key < best[0]:
                best = (key, (r, f, count))
    if best is None:
        raise ValueError(f"no LoKr rank and factor fit layers of sizes {sizes} (factor {factor})")
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
    layers = resolve_targets(encoder, config.targets, n=n, key="model.adapter", exclude=config.exclude)
    modules = dict(encoder.named_modules())
    return layers, [dense_sizes(modules[name]) for name in layers]


def _phm_count(config: FineTuneConfig, sizes: list[tuple[int, int]]) -> int:
    return sum(adapter_parameter_count(d, k, config.n, config.rank, rule=not config.shared_rule or i == 0)
               for i, (d, k) in enumerate(sizes))


def attach(encoder: nn.Module, config: FineTuneConfig) -> FineTuneReport:
    """Make ``encoder`` fine-tunable as ``config`` says (in place), through its kind's entry in
    :data:`FINETUNE_KINDS`: ``requires_grad`` is set on exactly the parameters that train (``full``: all;
    ``none``: none; otherwise the adapter's). Errors name the ``model.adapter`` key (a pattern matching no
    linear layer, an ``n`` that does not divide a layer) before the encoder is changed."""
    if config.kind not in FINETUNE_KINDS:
        raise ValueError(f"model.adapter.kind: unknown {config.kind!r}; valid: {', '.join(FINETUNE_KINDS)}")
    return FINETUNE_KINDS[config.kind].attach(encoder, config)


def _attach_full(encoder: nn.Module, config: FineTuneConfig) -> FineTuneReport:
    for p in encoder.parameters():
        p.requires_grad_(True)
    return FineTuneReport(config.kind, [], sum(p.numel() for p in encoder.parameters()))


def _attach_none(encoder: nn.Module, config: FineTuneConfig) -> FineTuneReport:
    for p in encoder.parameters():
        p.requires_grad_(False)
    return FineTuneReport(config.kind, [], 0)


def _attach_phm(encoder: nn.Module, config: FineTuneConfig) -> FineTuneReport:
    layers, _ = _target_layers(encoder, config, config.n)
    add_adapter(encoder, ADAPTER_NAME, config.phm, layers=layers)  # freezes everything else
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    return FineTuneReport(config.kind, layers, trainable)


def _attach_peft(encoder: nn.Module, config: FineTuneConfig) -> FineTuneReport:
    kind, method = config.kind, _peft_method(config.kind)
    matched = config.peft_rank == 0
    layers, sizes = _target_layers(encoder, config, config.n if matched else 1)
    phm_count: int | None = None
    if matched:
        phm_count = _phm_count(config, sizes)
        rank, factor, _ = match_peft_rank(kind, sizes, phm_count, config.factor)
    else:
        rank, factor = config.peft_rank, config.factor or -1
    for p in encoder.parameters():
        p.requires_grad_(False)
    peft_cfg = peft_config(kind, rank, factor, config.alpha, config.dropout, layers)
    _peft().inject_adapter_in_model(peft_cfg, encoder, ADAPTER_NAME)
    modules = dict(encoder.named_modules())
    wrong = [name for name in layers if not isinstance(modules.get(name), method.layer())]
    if wrong:
        raise RuntimeError(f"peft did not wrap {', '.join(wrong[:3])} in its {kind} layer")
    for name, p in encoder.named_parameters():  # peft's own marking, made explicit: only its adapter trains
        p.requires_grad_(method.prefix in name)
    trainable = sum(p.numel() for p in encoder.parameters() if p.requires_grad)
    expected = peft_count(kind, sizes, rank, factor)
    if trainable != expected:  # the meta-device count must be the real one, or the match would be wrong
        raise RuntimeError(f"peft {kind} r={rank}: {trainable} trainable parameters, but {expected} were counted")
    return FineTuneReport(kind, layers, trainable, phm_count, rank, factor if method.has_factor else None,
                          config.alpha or rank)


def _lora_layer() -> type:
    from peft.tuners.lora import LoraLayer
    return LoraLayer


def _lokr_layer() -> type:
    from peft.tuners.lokr import LoKrLayer
    return LoKrLayer


#: peft method name → :class:`PeftMethod` (the kinds ``lora`` and ``lokr`` of :data:`FINETUNE_KINDS`).
PEFT_METHODS: dict[str, PeftMethod] = {
    "lora": PeftMethod(
        label="LoRA", config=lambda peft, r, factor, alpha, dropout, targets: peft.LoraConfig(
            r=r, lora_alpha=alpha, lora_dropout=dropout, target_modules=targets, bias="none"),
        layer=_lora_layer, prefix="lora_", match=_match_lora),
    "lokr": PeftMethod(
        label="LoKr", config=lambda peft, r, factor, alpha, dropout, targets: peft.LoKrConfig(
            r=r, alpha=alpha, rank_dropout=dropout, decompose_factor=factor, target_modules=targets),
        layer=_lokr_layer, prefix="lokr_", match=_match_lokr, has_factor=True),
}

# ---------------------------------------------------------------------------- describe
def _describe_full(report: FineTuneReport, config: FineTuneConfig) -> str:
    return f"full (every encoder weight trains: {report.adapter:,})"


def _describe_none(report: FineTuneReport, config: FineTuneConfig) -> str:
    return "frozen encoder, head only"


def _describe_phm(report: FineTuneReport, config: FineTuneConfig) -> str:
    return f"{config.describe_phm()} adapter{_where(report)}: {report.adapter:,} adapter parameters"


def _describe_peft(report: FineTuneReport, config: FineTuneConfig) -> str:
    """peft's method, rank (and factor), alpha, layers and count; matched rows add the PHM count they match."""
    factor = f", decompose_factor {report.peft_factor}" if report.peft_factor is not None else ""
    text = (f"peft {PEFT_METHODS[report.kind].label} r={report.peft_rank}{factor} (alpha {report.alpha:g})"
            f"{_where(report)}: {report.adapter:,} adapter parameters")
    if report.phm_count is not None:
        gap = 100.0 * (report.adapter - report.phm_count) / report.phm_count
        text += (f"; matched to the {config.describe_phm()} adapter on the same layers: {report.phm_count:,} "
                 f"({gap:+.2f}%; rule: the peft count closest to PHM's)")
    return text


register_finetune_kind("phm", FineTuneKind(_attach_phm, _describe_phm))
register_finetune_kind("lora", FineTuneKind(_attach_peft, _describe_peft))
register_finetune_kind("lokr", FineTuneKind(_attach_peft, _describe_peft))
register_finetune_kind("full", FineTuneKind(_attach_full, _describe_full, trains_base=True))
register_finetune_kind("none", FineTuneKind(_attach_none, _describe_none))
