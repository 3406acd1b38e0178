#!/usr/bin/env bash
# One resumable one-thread CPU lane over some models of a plan, trained one after another.
#
#   bash experiments/lanes/lane.sh PLAN_NAME ROW:SEED [ROW:SEED ...]
#
# Run it from a frozen copy of the repository (see experiments/lanes/README.md), so that the code a
# lane trains with does not change under it while the tree is being edited. Each model is trained
# with `hyperplex experiment experiments/PLAN_NAME.yaml --rows ROW --seeds SEED --resume` into
# runs/PLAN_NAME/ROW/seedSEED, evaluated as soon as it finishes, and recorded (config, logs, metrics,
# evaluation; no checkpoint) in experiments/records/PLAN_NAME/ROW/seedSEED. A finished or recorded
# model is skipped, an unfinished one resumes from its last checkpoint, so the same command can be
# started again after the machine or the session stopped. A model that fails is logged and the lane
# goes on with the next one; the exit status is 1 if any failed.
#
# Environment: HYPERPLEX_PYTHON (default: python3) is the interpreter that has hyperplex's
# dependencies; the package itself is taken from this copy's src/. HYPERPLEX_RECORDS_ALSO=DIR (e.g. the working
# tree's experiments/records): a model already recorded there, by a GPU session or another lane, is skipped too.
set -uo pipefail
if [[ $# -lt 2 ]]; then
    echo "usage: bash experiments/lanes/lane.sh PLAN_NAME ROW:SEED [ROW:SEED ...]" >&2
    exit 2
fi
cd "$(dirname "$0")/../.."
plan_name=$1; shift
plan="experiments/$plan_name.yaml"
[[ -f $plan ]] || { echo "lane: no plan file $plan (PLAN_NAME is the file's stem)" >&2; exit 2; }
python=${HYPERPLEX_PYTHON:-python3}
also=${HYPERPLEX_RECORDS_ALSO:-}
[[ -z $also || -d $also ]] || { echo "lane: HYPERPLEX_RECORDS_ALSO: no folder '$also'" >&2; exit 2; }
export PYTHONPATH="$PWD/src" OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 PYTHONUNBUFFERED=1
failed=0
for model in "$@"; do
    row=${model%%:*}; seed=${model##*:}
    if [[ -z $row || -z $seed || $row == "$model" || ! $seed =~ ^[0-9]+$ ]]; then
        echo "lane: '$model' is not ROW:SEED (e.g. small_phm4:1)" >&2; failed=1; continue
    fi
    if [[ -n $also && -f $also/$plan_name/$row/seed$seed/record.json ]]; then
        echo "lane: $plan_name $row seed $seed is recorded in $also/$plan_name/$row/seed$seed: skipped"; continue
    fi
    echo "lane: $(date -u +%FT%TZ) start $plan_name $row seed $seed"
    if ! "$python" -m hyperplex experiment "$plan" --rows "$row" --seeds "$seed" --resume --evaluate-each \
            --no-report --records "experiments/records/$plan_name" --out "runs/$plan_name" \
            --override=--training.num_threads=1; then
        echo "lane: $(date -u +%FT%TZ) FAILED $plan_name $row seed $seed" >&2; failed=1
    fi
    echo "lane: $(date -u +%FT%TZ) end $plan_name $row seed $seed"
done
exit $failed
