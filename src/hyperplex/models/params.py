"""Parameter counts by component, as the papers' ``#Params`` columns report them.

:func:`parameter_breakdown` sorts every trainable parameter (shared parameters once) into one
disjoint component by its module path, so the components sum to ``total``:

=================  ==========================================================================
component          parameters whose qualified name …
=================  ==========================================================================
``phm_rules``      end in ``phm_rule`` (the learned ``Aᵢ`` of every ``PHMLinear``; fixed
                   rules are buffers and count nothing)
``embeddings``     contain ``embed`` but not ``norm`` (token embeddings; an output projection tied
                   to them is counted here once, as the papers do)
``attention``      contain ``attn`` or ``attention`` (projections, their biases)
``ffn``            contain ``ffn``, ``feed_forward`` or ``mlp``
``norms``          contain ``norm`` (LayerNorm gains and biases)
``output_layer``   contain ``output``, ``generator``, ``classifier`` or ``head``
``other``          anything else
=================  ==========================================================================

``total_without_embeddings = total − embeddings`` is what Tay et al. Table 3 reports ("Parameter size excludes
word embeddings") and what the PHM paper's Table 2 column reproduces; see ``docs/parameter_counts.md``.
"""

from __future__ import annotations

from torch import nn

__all__ = ["COMPONENTS", "parameter_breakdown", "format_breakdown", "classify_parameter"]

#: Component names in table order; the first matching rule wins (rules before embeddings etc.).
COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("phm_rules", ("phm_rule",)),
    ("embeddings", ("embed",)),
    ("attention", ("attn", "attention")),
    ("ffn", ("ffn", "feed_forward", "mlp")),
    ("norms", ("norm",)),
    ("output_layer", ("output", "generator", "classifier", "head")),
)


def classify_parameter(name: str) -> str:
    """Component of a parameter from its qualified name (``encoder.layers.0.ffn.linear1.phm_weight`` → ``ffn``)."""
    lowered = name.lower()
    if lowered.rsplit(".", 1)[-1] == "phm_rule":
        return "phm_rules"
    if "embed" in lowered and "norm" in lowered:  # a Hugging Face `embeddings.LayerNorm`: a norm, not a token vector
        return "norms"
    for component, patterns in COMPONENTS[1:]:
        if any(p in lowered for p in patterns):
            return component
    return "other"


def parameter_breakdown(model: nn.Module, trainable_only: bool = True) -> dict[str, int]:
    """Parameters of ``model`` per component (see the module docstring), plus ``total`` and
    ``total_without_embeddings``. Tied/shared parameters are counted once (first registered name)."""
    counts = {component: 0 for component, _ in COMPONENTS}
    counts["other"] = 0
    for name, param in model.named_parameters():  # de-duplicates shared tensors
        if trainable_only and not param.requires_grad:
            continue
        counts[classify_parameter(name)] += param.numel()
    total = sum(counts.values())
    counts["total"] = total
    counts["total_without_embeddings"] = total - counts["embeddings"]
    return counts


def _human(count: int) -> str:
    for unit, scale in (("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.2f}{unit}"
    return str(count)


def format_breakdown(breakdown: dict[str, int], title: str | None = None, baseline: dict[str, int] | None = None,
                     ) -> str:
    """Markdown table of a :func:`parameter_breakdown`: count, human-readable count, share of the
    total and, with ``baseline`` (e.g. the dense model), the ratio to the baseline's count."""
    header = "| component | parameters | | share |" + (" × baseline |" if baseline else "")
    rule = "|---|---:|---:|---:|" + ("---:|" if baseline else "")
    lines = ([f"**{title}**", ""] if title else []) + [header, rule]
    total = breakdown.get("total", 0) or 1
    for key, value in breakdown.items():
        share = "" if key.startswith("total") else f"{100 * value / total:.1f}%"
        row = f"| {key} | {value:,} | {_human(value)} | {share} |"
        if baseline:
            base = baseline.get(key, 0)
            row += f" {value / base:.3f} |" if base else " – |"
        lines.append(row)
    return "\n".join(lines)
