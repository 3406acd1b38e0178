#!/usr/bin/env bash
# Copy the models a frozen copy's lanes have finished into this working tree's records, never over a record here.
#
#   bash experiments/lanes/collect.sh [--into DIR] COPY_DIR PLAN_NAME [PLAN_NAME ...]
#
# For each PLAN_NAME, every COPY_DIR/experiments/records/PLAN_NAME/ROW/seedK/ that holds a record.json (a finished,
# evaluated model) and is not yet in DIR/PLAN_NAME/ here is copied; one that is there already is left alone (and
# named if its record.json differs, which means two trainings of the same model). DIR is experiments/records, or
# with --into a staging folder such as experiments/retrain, where a re-training's finished models wait (committed,
# so that a new machine does not lose them) until the plan's old records are replaced. Prints what it copied; then
# make the report with the plan's commands (its section of docs/results.md or its notebook).
set -euo pipefail
usage="usage: bash experiments/lanes/collect.sh [--into DIR] COPY_DIR PLAN_NAME [PLAN_NAME ...]"
into=experiments/records
if [[ ${1:-} == --into ]]; then
    [[ $# -ge 2 ]] || { echo "$usage" >&2; exit 2; }
    into=$2; shift 2
fi
if [[ $# -lt 2 ]]; then
    echo "$usage" >&2
    exit 2
fi
copy=$(cd "$1" 2>/dev/null && pwd) || { echo "collect.sh: no folder $1" >&2; exit 2; }
shift
if [[ $into != experiments/records ]]; then
    [[ -d $into ]] || { echo "collect.sh: --into: no folder $into" >&2; exit 2; }
    into=$(cd "$into" && pwd)
fi
cd "$(dirname "$0")/../.."
[[ -d $copy/experiments/records ]] || { echo "collect.sh: $copy has no experiments/records (a lane's frozen copy?)" >&2; exit 2; }
status=0
for plan in "$@"; do
    [[ $plan =~ ^[A-Za-z0-9_.-]+$ && -f experiments/$plan.yaml ]] \
        || { echo "collect.sh: no plan experiments/$plan.yaml here" >&2; status=2; continue; }
    source_dir="$copy/experiments/records/$plan"
    [[ -d $source_dir ]] || { echo "collect.sh: $plan: nothing recorded in the copy yet"; continue; }
    copied=0
    for record in "$source_dir"/*/seed*/record.json; do
        [[ -f $record ]] || continue
        model=$(dirname "$record"); seed=$(basename "$model"); row=$(basename "$(dirname "$model")")
        target="$into/$plan/$row/$seed"
        if [[ -e $target ]]; then
            cmp -s "$record" "$target/record.json" \
                || { echo "collect.sh: $plan/$row/$seed is in $into already and differs from the copy's: left alone" >&2; status=1; }
            continue
        fi
        mkdir -p "$(dirname "$target")"
        rm -rf "$target.partial"
        cp -r "$model" "$target.partial" && mv "$target.partial" "$target"
        echo "collect.sh: copied $plan/$row/$seed into $into"
        copied=$((copied + 1))
    done
    echo "collect.sh: $plan: $copied model(s) copied"
done
exit $status
