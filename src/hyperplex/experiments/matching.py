"""``match_params: ROW``: a row's model must have the parameters of another row's model.

Both counts come from :func:`hyperplex.models.params.parameter_breakdown` of the models the rows'
configs build (``Row.params``, set by :func:`hyperplex.experiments.runs.validate`), total and without
embeddings; more than :data:`PARAM_MATCH_TOLERANCE` apart is a plan error found before any training.
"""

from __future__ import annotations

from hyperplex.experiments.plan import Plan

__all__ = ["PARAM_MATCH_TOLERANCE", "MATCHED_COUNTS", "param_match", "check_param_matches"]

#: Largest relative difference of parameters (total, and without embeddings) that ``match_params`` accepts.
PARAM_MATCH_TOLERANCE = 0.02
#: The counts compared.
MATCHED_COUNTS = ("total", "total_without_embeddings")


def param_match(counts: dict[str, int], reference: dict[str, int]) -> dict[str, float]:
    """Relative difference ``counts / reference − 1`` of the total and of the count without embeddings."""
    return {key: counts[key] / reference[key] - 1.0 for key in MATCHED_COUNTS}


def check_param_matches(plan: Plan) -> list[str]:
    """Problems with ``match_params`` rows: parameters (total, and without embeddings) further than
    :data:`PARAM_MATCH_TOLERANCE` from the named row's, counted on the models the configs build."""
    by_name = {r.name: r for r in plan.rows}
    problems = []
    for row in plan.rows:
        ref = by_name.get(row.match_params) if row.match_params else None
        if ref is None or not row.params or not ref.params:
            continue
        for key, diff in param_match(row.params, ref.params).items():
            if abs(diff) > PARAM_MATCH_TOLERANCE:
                problems.append(f"{plan.path}: row {row.name!r}: {key} {row.params[key]:,} is {diff:+.2%} from row "
                                f"{ref.name!r} ({ref.params[key]:,}); match_params allows "
                                f"±{PARAM_MATCH_TOLERANCE:.0%}")
    return problems
