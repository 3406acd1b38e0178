"""hyperplex.experiments.matching: ``match_params`` compares the parameter counts of the models the rows build."""

from pathlib import Path

import pytest

from hyperplex.experiments.matching import param_match
from hyperplex.experiments.plan import PlanError, load_plan
from hyperplex.experiments.runs import validate

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def test_param_match_is_checked_from_the_built_models(tmp_path, write_plan):
    rows = [{"name": "phm2", "config": "tiny.yaml"},
            {"name": "phm2_again", "config": "tiny.yaml", "match_params": "phm2"},  # the same model: 0%
            {"name": "dense", "config": "tiny.yaml", "overrides": ["--model.linear.kind=dense"],
             "match_params": "phm2"}]
    plan = load_plan(write_plan(tmp_path, rows=rows))
    with pytest.raises(PlanError) as err:
        validate(plan, None, None, tmp_path / "out", [], False)
    counts = {r.name: r.params for r in plan.rows}
    for row in plan.rows:  # the counts compared are those the `hyperplex params` table of the row shows
        assert f"| total | {row.params['total']:,} |" in row.params_table
        assert f"| total_without_embeddings | {row.params['total_without_embeddings']:,} |" in row.params_table
    assert counts["dense"]["total_without_embeddings"] > counts["phm2"]["total_without_embeddings"]
    diff = counts["dense"]["total_without_embeddings"] / counts["phm2"]["total_without_embeddings"] - 1
    assert f"row 'dense': total_without_embeddings {counts['dense']['total_without_embeddings']:,} is {diff:+.2%}" \
        in str(err.value)
    # the tiny task's real vocabulary (21 characters) leaves the embeddings small: the totals differ as well
    assert "2 problem(s)" in str(err.value) and "row 'dense': total " in str(err.value)
    assert "phm2_again" not in str(err.value)
    assert param_match(counts["phm2_again"], counts["phm2"]) == {"total": 0.0, "total_without_embeddings": 0.0}
    with pytest.raises(PlanError, match="match_params 'nope'"):
        load_plan(write_plan(tmp_path, rows=[{"name": "a", "config": "tiny.yaml", "match_params": "nope"}]))


@pytest.mark.parametrize("plan_name", ["multi30k_transformer", "multi30k_lstm", "shakespeare_transformer", "sst2",
                                       "agreement", "snli", "imdb"])
def test_shipped_low_rank_rows_match_their_phm_row_within_2_percent(plan_name, tmp_path):
    plan = load_plan(EXPERIMENTS / f"{plan_name}.yaml")
    validate(plan, None, None, tmp_path / "out", [], False)  # raises if a match is off by > 2%
    matched = [r for r in plan.rows if r.match_params]
    assert matched and all("kind=lowrank" in " ".join(r.overrides) for r in matched)
    by_name = {r.name: r for r in plan.rows}
    for row in matched:
        assert "--model.linear.kind=phm" in by_name[row.match_params].overrides
        n = next(o for o in row.overrides if o.startswith("--model.linear.n="))
        assert n in by_name[row.match_params].overrides  # the same n as its PHM row
        diffs = param_match(row.params, by_name[row.match_params].params)
        assert all(abs(d) <= 0.02 for d in diffs.values()), (row.name, diffs)
