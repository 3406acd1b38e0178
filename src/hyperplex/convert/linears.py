"""Swap a model's dense layers for PHM or low-rank layers in place, and back.

:func:`convert_linears` walks any ``nn.Module`` and replaces each selected ``nn.Linear`` (and
``transformers``' GPT-2 ``Conv1D``, whose weight is stored transposed) by a :class:`PHMLinear`
initialised with the best ``n``-term Kronecker sum of its weight, or by a :class:`LowRankLinear`
holding its truncated SVD at the PHM layer's parameter count. :func:`to_dense` is the exact
inverse: each converted layer becomes a dense layer whose weight is the converted layer's
effective matrix ``H``. Every replacement carries the attribute ``hyperplex_converted_from``
(``"linear"`` or ``"conv1d"``), which :func:`to_dense` and :func:`conversion_spec` read.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from hyperplex.convert.report import ConversionReport, LayerReport
from hyperplex.layers.lowrank import LowRankLinear, matching_rank
from hyperplex.layers.phm import PHMLinear, RuleSpec
from hyperplex.layers.selection import (
    conv1d_class,
    dense_sizes,
    dense_source,
    dense_tensors,
    glob_patterns,
    name_matches,
)

__all__ = ["convert_linears", "to_dense", "conversion_spec", "apply_spec", "KINDS", "INITS", "CONVERTED_FROM"]

KINDS = ("phm", "lowrank")
INITS = ("svd", "random", "activation", "whitened", "whitened_als")
#: Inits that fit each layer to inputs captured while ``calibrate`` runs.
CALIBRATED_INITS = ("activation", "whitened", "whitened_als")
#: Attribute set on every layer :func:`convert_linears` puts in a model: ``"linear"`` or ``"conv1d"``.
CONVERTED_FROM = "hyperplex_converted_from"


@dataclass
class _Dense:
    """A dense layer seen as ``y = x Wᵀ + b``: ``weight`` is ``(out, in)`` whatever the storage."""

    weight: Tensor
    bias: Tensor | None
    in_features: int
    out_features: int


def _dense_view(layer: nn.Module, source: str) -> _Dense:
    weight, bias = dense_tensors(layer)
    if source == "conv1d":  # Conv1D computes x @ W + b with W: (in, out), i.e. a Linear of weight Wᵀ
        return _Dense(weight.t(), bias, *dense_sizes(layer))
    return _Dense(weight, bias, *dense_sizes(layer))


def _param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())  # parameters() counts tied weights once


def _relative_error(weight: Tensor, effective: Tensor) -> float:
    W, H = weight.detach().double(), effective.detach().double()
    norm = torch.linalg.norm(W)
    return float(torch.linalg.norm(W - H) / norm) if norm > 0 else float(torch.linalg.norm(H) > 0)


def _plan(module: nn.Module, kind: str, n: int, rank: int | None, include: list[str], exclude: list[str],
          min_features: int, key: str | None = None) -> tuple[list[LayerReport], dict[str, nn.Module]]:
    """Decide, without touching the model, which layers to convert; raise for bad selections. ``key`` (a config
    name, :func:`hyperplex.compress`) makes an ``exclude`` pattern that matches no layer an error too, and the
    errors name ``key.targets`` / ``key.exclude``."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"expected the model as a torch.nn.Module, got {type(module).__name__}")
    owners: dict[int, list[str]] = {}  # parameter id -> every dotted name it is registered under
    for name, param in module.named_parameters(remove_duplicate=False):
        owners.setdefault(id(param), []).append(name)
    module_names: dict[int, list[str]] = {}
    for name, sub in module.named_modules(remove_duplicate=False):
        module_names.setdefault(id(sub), []).append(name)
    parents = {id(child): parent for _, parent in module.named_modules() for child in parent.children()}

    rows, layers, matched, excluded = [], {}, {p: 0 for p in include}, {p: 0 for p in exclude}
    for name, layer in module.named_modules():
        source = dense_source(layer)
        if source is None:
            continue
        view = _dense_view(layer, source)
        d, k = view.in_features, view.out_features
        row = LayerReport(name, source, d, k, "skipped", params_before=_param_count(layer))
        rows.append(row)
        hits = [p for p in include if name_matches(name, p)]
        for p in hits:
            matched[p] += 1
        for p in exclude:
            excluded[p] += name_matches(name, p)
        tied = [o for o in owners[id(layer.weight)] if o != (f"{name}.weight" if name else "weight")]
        if name == "":
            row.reason = "the root module cannot be replaced in place"
        elif include and not hits:
            row.reason = "not matched by " + ("include" if key is None else "targets")
        elif any(name_matches(name, p) for p in exclude):
            row.reason = f"excluded by {next(p for p in exclude if name_matches(name, p))!r}"
        elif min(d, k) < min_features:
            row.reason = f"min(in, out) = {min(d, k)} < min_features={min_features}"
        elif isinstance(parents.get(id(layer)), nn.MultiheadAttention):
            row.reason = "nn.MultiheadAttention reads out_proj.weight directly"
        elif len(module_names[id(layer)]) > 1:
            row.reason = f"the same module is also registered as {module_names[id(layer)][1]}"
        elif tied:
            row.reason = f"weight tied to {tied[0]}"
        elif rank is None and (d % n or k % n):
            row.reason = f"n={n} does not divide {k}x{d}"
        elif rank is not None and rank > min(d, k):
            row.reason = f"rank={rank} exceeds min(in, out) = {min(d, k)}"
        else:
            row.status = "converted"
            layers[name] = layer
            continue

    names = [r.name for r in rows]
    unmatched = [("include" if key is None else f"{key}.targets", p) for p, c in matched.items() if c == 0]
    unmatched += [(f"{key}.exclude", p) for p, c in excluded.items() if c == 0 and key is not None]
    for field, pattern in unmatched[:1]:
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        what = "include pattern" if key is None else f"{field}: pattern"
        raise ValueError(f"{what} {pattern!r} matches no nn.Linear/Conv1D layer; the "
                         f"{len(names)} layers are named like: {shown or '(none)'}")
    if not names:
        done = sum(isinstance(m, (PHMLinear, LowRankLinear)) for m in module.modules())
        raise ValueError(f"{type(module).__name__} holds no nn.Linear or Conv1D layer to convert"
                         + (f"; its {done} PHM / low-rank layer(s) are converted already (to_dense puts them back)"
                            if done else ""))
    if not layers:
        undivided = [r for r in rows if r.reason.startswith(f"n={n} does not divide")]
        if undivided:
            sizes = sorted({f"{r.out_features}x{r.in_features}" for r in undivided})
            raise ValueError(f"n={n} divides none of the {len(undivided)} selected layers "
                             f"(sizes {', '.join(sizes[:8])}); "
                             f"choose an n that divides both sizes of some layer")
        reasons = sorted({r.reason for r in rows})
        raise ValueError("no layer selected for conversion; reasons: " + "; ".join(reasons[:6]))
    return rows, layers


def _check_weights(layers: dict[str, nn.Module], sources: dict[str, str]) -> None:
    """Every selected layer's weight and bias must hold finite values on a real device; checked for all of them
    before any is replaced, so a bad layer leaves the model as it was (ValueError naming the layer)."""
    for name, layer in layers.items():
        view = _dense_view(layer, sources[name])
        for what, tensor in (("weight", view.weight), ("bias", view.bias)):
            if tensor is None:
                continue
            if tensor.device.type == "meta":
                raise ValueError(f"layer {name!r}: its {what} is on the meta device (no values to convert); load the "
                                 f"model's weights first")
            finite = torch.isfinite(tensor.detach())
            if not bool(finite.all()):
                bad = tensor.detach()[~finite]
                kinds = sorted({"NaN" if bool(v.isnan()) else ("+inf" if float(v) > 0 else "-inf") for v in bad[:1000]})
                raise ValueError(f"layer {name!r}: its {what} holds {int((~finite).sum())} non-finite value(s) "
                                 f"({', '.join(kinds)}); no layer was converted")


def _build(view: _Dense, kind: str, n: int, rank: int | None, rule: RuleSpec,
           init: str) -> tuple[PHMLinear | LowRankLinear, int | None]:
    """The replacement layer for one dense layer (same dtype and device), and its rank (low-rank)."""
    W = view.weight.detach()
    bias = view.bias is not None
    layer: PHMLinear | LowRankLinear
    if kind == "phm":
        if init == "random":
            layer = PHMLinear(view.in_features, view.out_features, n, bias=bias, rule=rule, device=W.device,
                              dtype=W.dtype)
        else:
            linear_like = _Dense(W, view.bias, view.in_features, view.out_features)
            layer, _ = PHMLinear.from_linear(linear_like, n, rule)
        used_rank = None
    else:
        used_rank = rank if rank is not None else matching_rank(view.in_features, view.out_features, n, rule, bias)
        if init == "random":
            layer = LowRankLinear(view.in_features, view.out_features, used_rank, bias=bias, device=W.device,
                                  dtype=W.dtype)
        else:
            layer, _ = LowRankLinear.from_linear(_Dense(W, view.bias, view.in_features, view.out_features), used_rank)
    if layer.bias is not None and view.bias is not None:
        # the bias is not factorised: a random init keeps the pretrained one too (ablations isolate H)
        with torch.no_grad():
            layer.bias.copy_(view.bias.detach())
    return layer, used_rank


def _keep_flags(new: nn.Module, old: nn.Module, weight_grad: bool, bias_grad: bool | None) -> None:
    for pname, param in new.named_parameters():
        param.requires_grad_(bias_grad if pname == "bias" and bias_grad is not None else weight_grad)
    new.train(old.training)


def convert_linears(
    module: nn.Module,
    kind: str = "phm",
    n: int = 4,
    *,
    rank: int | None = None,
    rule: RuleSpec = "learned",
    include: str | Sequence[str] | None = None,
    exclude: str | Sequence[str] | None = None,
    min_features: int = 32,
    init: str = "svd",
    calibrate: Callable[[nn.Module], object] | None = None,
    refine_steps: int = 200,
    als_sweeps: int = 4,
    ridge: float | None = None,
) -> ConversionReport:
    """Replace ``module``'s dense layers by PHM or low-rank layers, in place.

    Args:
        module: any ``nn.Module`` (a ``transformers`` model, a ``SentenceTransformer``, your own).
        kind: ``"phm"`` (:class:`PHMLinear`, ``H = Σᵢ Aᵢ ⊗ Sᵢ``) or ``"lowrank"`` (:class:`LowRankLinear`).
        n: the PHM ``n``; for ``"lowrank"`` the rank is ``matching_rank(d, k, n)`` (no more
            parameters than the PHM layer) unless ``rank`` is given.
        rank: explicit rank, ``"lowrank"`` only.
        rule: PHM multiplication rule (``"learned"``, an algebra name such as ``"quaternion"``).
        include: glob pattern(s) on the dotted module name, in the dialect of
            :mod:`hyperplex.layers.selection` (``fnmatch``, ``*`` also crosses dots, and ``P`` also matches
            names ending in ``.P``); only matching layers are converted. Each pattern must match some layer.
        exclude: glob pattern(s) in the same dialect; matching layers stay dense.
        min_features: layers with ``min(in, out) < min_features`` stay dense (small heads hold few
            weights, and their error costs the most).
        init: ``"svd"`` (Kronecker-sum SVD for PHM, truncated SVD for low-rank: the best fit in
            Frobenius norm), ``"random"`` (the layer's own init; the bias is still copied), or
            ``"activation"`` (``"svd"``, then the factors are refined to minimise ‖(W − H) X‖_F on
            inputs captured while ``calibrate(module)`` runs; see :mod:`hyperplex.convert.activation`),
            ``"whitened"`` (closed-form fit to the same error: low-rank by the SVD of ``W S`` with
            ``S Sᵀ = Xᵀ X``, which is optimal; PHM by a Kronecker-sum SVD whitened with a
            Kronecker-factored ``Xᵀ X ≈ G₁ ⊗ G₂``) or ``"whitened_als"`` (``"whitened"``, then
            ``als_sweeps`` sweeps of alternating least squares on the exact error for PHM; the same
            as ``"whitened"`` for low-rank).
        calibrate: a callable that runs ``module`` on calibration data (``calibrate(module)``), needed by
            the ``activation`` and ``whitened*`` inits; with any init it makes the report carry each
            layer's relative output error on those inputs.
        refine_steps: Adam steps per layer for ``init="activation"``.
        als_sweeps: alternating-least-squares sweeps per layer for ``init="whitened_als"``.
        ridge: the ``whitened*`` inits fit to ``Xᵀ X + λ (tr(Xᵀ X) / d) I``; ``None`` = the default λ of
            the kind, :data:`hyperplex.convert.activation.RIDGE` (0.1 for PHM, 1e-6 for low-rank).

    Layers left dense, with the reason, are listed in the report: not matched by ``include``,
    excluded, too small, sizes ``n`` does not divide, weights tied to another module (GPT-2's
    ``lm_head``), a module registered twice, ``nn.MultiheadAttention.out_proj``. Dtype, device,
    bias, train/eval mode and ``requires_grad`` (weight and bias separately) are kept.

    Deprecated: use ``hyperplex.compress(model, PHMConfig(...))`` (or ``LowRankConfig``), which takes the same
    options as a typed config and selects layers with ``targets`` / ``exclude``.

    Returns:
        a :class:`ConversionReport`.

    Raises:
        ValueError: bad ``kind``/``init``/``n``/``rank``; an include pattern that matches no layer
            (the message shows real layer names); an ``n`` that divides no selected layer; nothing
            left to convert; a selected layer with NaN/inf values or on the meta device. Raised before the
            model is changed.
    """
    import warnings

    warnings.warn("hyperplex.convert.convert_linears is deprecated and will be removed in the next release; use "
                  "hyperplex.compress(model, PHMConfig(...)) or hyperplex.compress(model, LowRankConfig(...))",
                  DeprecationWarning, stacklevel=2)
    return convert_layers(module, kind, n, rank=rank, rule=rule, include=include, exclude=exclude,
                          min_features=min_features, init=init, calibrate=calibrate, refine_steps=refine_steps,
                          als_sweeps=als_sweeps, ridge=ridge)


def convert_layers(module: nn.Module, kind: str, n: int, *, rank: int | None = None, rule: RuleSpec = "learned",
                   include=None, exclude=None, min_features: int = 32, init: str = "svd",
                   calibrate: Callable[[nn.Module], object] | None = None, refine_steps: int = 200,
                   als_sweeps: int = 4, ridge: float | None = None, key: str | None = None) -> ConversionReport:
    """The conversion itself, shared by :func:`hyperplex.compress` and the deprecated :func:`convert_linears`
    (whose arguments it takes); ``key`` names the config in selection errors and makes ``exclude`` patterns
    that match nothing an error (:func:`_plan`)."""
    _check_arguments(kind, n, rank, rule, init, calibrate, als_sweeps, ridge)
    rows, layers = _plan(module, kind, n, rank, list(glob_patterns(include, "include")),
                         list(glob_patterns(exclude, "exclude")), min_features, key)
    _check_weights(layers, {r.name: r.source for r in rows})
    before = _param_count(module)
    factors = None
    if calibrate is not None:  # inputs of the dense layers, before any is replaced
        from hyperplex.convert.activation import capture_inputs
        factors = capture_inputs(module, layers, calibrate)

    by_name = {r.name: r for r in rows}
    built: dict[str, tuple[PHMLinear | LowRankLinear, int | None, float]] = {}
    for name, old in layers.items():  # every new layer first: a layer that cannot be built leaves the model as it was
        row = by_name[name]
        view = _dense_view(old, row.source)
        try:
            new, used_rank = _build(view, kind, n, rank, rule, "svd" if init in CALIBRATED_INITS else init)
            if factors is not None:
                new = _fit_to_inputs(new, view, row, factors[name], kind, n, used_rank, rule, init, refine_steps,
                                     als_sweeps, ridge)
        except (ValueError, RuntimeError) as err:
            raise ValueError(f"layer {name!r} ({view.in_features} → {view.out_features}): cannot convert it to "
                             f"{kind} (n={n}): {err}; the model is unchanged") from err
        _keep_flags(new, old, view.weight.requires_grad, None if view.bias is None else view.bias.requires_grad)
        setattr(new, CONVERTED_FROM, row.source)
        built[name] = new, used_rank, _relative_error(view.weight, new.dense_weight())
    for name, (layer, used_rank, error) in built.items():
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name), child, layer)
        row = by_name[name]
        row.kind, row.n, row.rank = kind, (n if kind == "phm" else None), used_rank
        row.params_after = _param_count(layer)
        row.relative_error = error
    return ConversionReport(rows, before, _param_count(module))


def _check_arguments(kind: str, n: int, rank: int | None, rule: RuleSpec, init: str, calibrate, als_sweeps: int,
                     ridge: float | None) -> None:
    """The errors :func:`convert_linears` raises for its arguments alone, before any layer is looked at."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; valid: {', '.join(repr(k) for k in KINDS)}")
    if init not in INITS:
        raise ValueError(f"unknown init {init!r}; valid: {', '.join(repr(i) for i in INITS)}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if rank is not None:
        if kind != "lowrank":
            raise ValueError(f"rank={rank} applies to kind='lowrank' only (kind={kind!r})")
        if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
            raise ValueError(f"rank must be a positive integer, got {rank!r}")
    if calibrate is not None and not callable(calibrate):
        raise ValueError(f"calibrate must be a callable that runs the model on calibration inputs, got {calibrate!r}")
    if init in CALIBRATED_INITS and calibrate is None:
        raise ValueError(f"init={init!r} needs calibrate=, a callable that runs the model on calibration inputs")
    if not isinstance(als_sweeps, int) or isinstance(als_sweeps, bool) or als_sweeps < 0:
        raise ValueError(f"als_sweeps must be a non-negative integer, got {als_sweeps!r}")
    if ridge is not None and not ridge >= 0:
        raise ValueError(f"ridge must be ≥ 0, got {ridge!r}")
    if kind == "phm" and rule != "learned":
        PHMLinear(n, n, n, rule=rule)  # validates the rule name against n before anything changes


def _fit_to_inputs(new: PHMLinear | LowRankLinear, view: _Dense, row: LayerReport, inputs, kind: str, n: int,
                   used_rank: int | None, rule: RuleSpec, init: str, refine_steps: int, als_sweeps: int,
                   ridge: float | None) -> PHMLinear | LowRankLinear:
    """With calibration ``inputs`` (the layer's captured factors): the ``whitened*`` inits' closed-form layer
    in place of ``new``, or ``new`` refined by ``activation``; ``row`` gets the relative output errors (of
    the SVD start, and of the layer returned)."""
    from hyperplex.convert.activation import refine, relative_output_error, whitened_layer
    if init in ("whitened", "whitened_als"):  # the same structure, fitted in closed form
        row.output_error_svd = relative_output_error(view.weight, new.dense_weight(), inputs)
        new = whitened_layer(view, kind, n, used_rank, rule, inputs,
                             als_sweeps=als_sweeps if init == "whitened_als" else 0, ridge=ridge)
    if init == "activation":
        row.output_error_svd, row.output_error = refine(new, view.weight.detach(), inputs, steps=refine_steps)
    else:
        row.output_error = relative_output_error(view.weight, new.dense_weight(), inputs)
    return new


def _dense_from(layer: PHMLinear | LowRankLinear, source: str) -> nn.Module:
    """A dense layer with weight exactly ``layer.dense_weight()`` and the same bias."""
    H = layer.dense_weight().detach()
    if source == "conv1d":
        conv1d = conv1d_class()
        if conv1d is None:  # pragma: no cover - a Conv1D-converted layer without transformers loaded
            raise RuntimeError("this layer came from a transformers Conv1D, but transformers is not imported")
        dense = conv1d(layer.out_features, layer.in_features).to(device=H.device, dtype=H.dtype)
        with torch.no_grad():
            dense.weight.copy_(H.t())
            if layer.bias is not None:
                dense.bias.copy_(layer.bias)
            else:  # Conv1D always has a bias; a bias-free source had none, so zero reproduces it
                dense.bias.zero_()
        return dense
    dense = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None, device=H.device,
                      dtype=H.dtype)
    with torch.no_grad():
        dense.weight.copy_(H)
        if layer.bias is not None:
            dense.bias.copy_(layer.bias)
    return dense


def to_dense(module: nn.Module) -> ConversionReport:
    """Turn every layer :func:`convert_linears` made back into ``nn.Linear`` (or ``Conv1D`` where it
    came from one), in place; the dense weight is exactly the converted layer's ``H``, so outputs are
    unchanged up to float rounding of the different multiplication order (bit-equal for PHM ``n = 1``).

    Layers the user built as ``PHMLinear`` themselves (without the ``hyperplex_converted_from``
    mark) are left alone. Returns a :class:`ConversionReport` whose rows have ``kind="dense"`` and
    ``relative_error`` 0 (the dense weight *is* ``H``).
    """
    before = _param_count(module)
    rows = []
    for name, layer in list(module.named_modules()):
        source = getattr(layer, CONVERTED_FROM, None)
        if source is None or name == "":
            continue
        if not isinstance(layer, (PHMLinear, LowRankLinear)):
            raise TypeError(f"layer {name!r} is marked {CONVERTED_FROM}={source!r} but is a {type(layer).__name__}, "
                            "not a PHMLinear or LowRankLinear; to_dense cannot form its dense weight")
        dense = _dense_from(layer, source)
        factors = [p for pname, p in layer.named_parameters() if pname != "bias"]
        _keep_flags(dense, layer, any(p.requires_grad for p in factors),
                    None if layer.bias is None else layer.bias.requires_grad)
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name), child, dense)
        rows.append(LayerReport(name, source, layer.in_features, layer.out_features, "converted", kind="dense",
                                params_before=_param_count(layer), params_after=_param_count(dense),
                                relative_error=0.0))
    return ConversionReport(rows, before, _param_count(module))


def conversion_spec(module: nn.Module) -> list[dict]:
    """JSON-ready description of every converted layer in ``module`` (what :func:`apply_spec` rebuilds):
    ``{"name", "kind", "n", "rule", "rank", "in_features", "out_features", "bias", "from_conv1d"}``."""
    spec = []
    for name, layer in module.named_modules():
        source = getattr(layer, CONVERTED_FROM, None)
        if source is None:
            continue
        phm = isinstance(layer, PHMLinear)
        spec.append({
            "name": name, "kind": "phm" if phm else "lowrank",
            "n": layer.n if phm else None, "rule": layer.rule_name if phm else None,
            "rank": None if phm else layer.rank,
            "in_features": layer.in_features, "out_features": layer.out_features,
            "bias": layer.bias is not None, "from_conv1d": source == "conv1d",
        })
    return spec


def apply_spec(module: nn.Module, spec: list[dict], where: str = "the spec") -> None:
    """Give ``module`` (the dense architecture) the structure ``spec`` describes, with freshly
    initialised layers whose values are meant to be overwritten by a state dict.

    Raises ``ValueError`` naming ``where`` and the layer when a named layer does not exist, is not
    a dense layer of the recorded kind, or has other sizes — the signs of a model folder of another
    architecture. Checks every entry before changing anything.
    """
    targets = []
    for i, entry in enumerate(spec):
        name = entry["name"]
        try:
            old = module.get_submodule(name)
        except AttributeError:
            raise ValueError(f"{where}: layer {name!r} (layers[{i}]) does not exist in the rebuilt "
                             f"{type(module).__name__}; is this a model folder of another architecture?") from None
        source = dense_source(old)
        expected = "conv1d" if entry["from_conv1d"] else "linear"
        if source != expected:
            raise ValueError(f"{where}: layer {name!r} is a {type(old).__name__} in the rebuilt model, expected "
                             f"{'Conv1D' if expected == 'conv1d' else 'nn.Linear'}; "
                             "a model folder of another architecture?")
        view = _dense_view(old, source)
        if (view.in_features, view.out_features, view.bias is not None) != (
                entry["in_features"], entry["out_features"], entry["bias"]):
            raise ValueError(f"{where}: layer {name!r} is {view.out_features}x{view.in_features} "
                             f"(bias={view.bias is not None}) in the rebuilt model but "
                             f"{entry['out_features']}x{entry['in_features']} (bias={entry['bias']}) in the spec")
        if entry["kind"] not in KINDS:
            raise ValueError(f"{where}: layers[{i}] ({name!r}) has kind {entry['kind']!r}; valid: {', '.join(KINDS)}")
        targets.append((i, entry, old, view))
    built = []
    for i, entry, old, view in targets:  # every layer first: one the spec cannot build leaves the model as it was
        W = view.weight
        d, k, bias = entry["in_features"], entry["out_features"], entry["bias"]
        new: PHMLinear | LowRankLinear
        try:
            if entry["kind"] == "phm":
                rule = entry["rule"]
                if rule == "custom":  # a buffer restored from the weights; any non-zero placeholder of its shape
                    rule = torch.ones(entry["n"], entry["n"], entry["n"])
                new = PHMLinear(d, k, entry["n"], bias=bias, rule=rule, device=W.device, dtype=W.dtype)
            else:
                new = LowRankLinear(d, k, entry["rank"], bias=bias, device=W.device, dtype=W.dtype)
        except ValueError as err:
            raise ValueError(f"{where}: layers[{i}] ({entry['name']!r}): {err}") from None
        _keep_flags(new, old, W.requires_grad, None if view.bias is None else view.bias.requires_grad)
        setattr(new, CONVERTED_FROM, "conv1d" if entry["from_conv1d"] else "linear")
        built.append((entry["name"], new))
    for name, new in built:
        parent_name, _, child = name.rpartition(".")
        setattr(module.get_submodule(parent_name), child, new)
